"""The shipped multimodal checkpoint: rebuilt bit for bit by its command, and the shim that lets torchvision load."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from actors.eagle.compat import check_head_fits_target, target_text_config
from actors.eagle.spec import load_head_spec
from tests.conftest import MODELS, ROOT
from training import multimodal

MM = MODELS / multimodal.MM_DIR


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_shipped_layout_and_heads_fit():
    cfg = json.loads((MM / "config.json").read_text())
    assert cfg["architectures"] == ["Llama4ForConditionalGeneration"]
    text = target_text_config(MM)
    assert text["vocab_size"] == 4096 + len(multimodal.IMAGE_TOKENS)
    tok = json.loads((MM / "tokenizer.json").read_text())
    ids = {a["content"]: a["id"] for a in tok["added_tokens"]}
    assert [ids[t] for t in multimodal.IMAGE_TOKENS] == list(range(4096, 4102))
    assert cfg["image_token_index"] == ids["<|patch|>"]
    proc = json.loads((MM / "processor_config.json").read_text())
    assert proc["image_processor"]["max_patches"] == multimodal.MAX_TILES
    for name in multimodal.HEADS.values():
        check_head_fits_target(load_head_spec(MODELS / name), text)  # raises on a mismatch
    with pytest.raises(Exception, match="vocab_size"):
        check_head_fits_target(load_head_spec(MODELS / "eagle3-llama4-tiny"), text)


def test_rebuild_is_identical(tmp_path):
    pytest.importorskip("torchvision", reason="transformers' Llama 4 processor needs torchvision (make installs it)")
    models = tmp_path / "models"
    (models / "llama4-tiny").mkdir(parents=True)
    for f in (MODELS / "llama4-tiny").iterdir():
        (models / "llama4-tiny" / f.name).write_bytes(f.read_bytes())
    for src in multimodal.HEADS:
        (models / src).mkdir()
        for f in (MODELS / src).iterdir():
            (models / src / f.name).write_bytes(f.read_bytes())
    out = multimodal.build(models / "llama4-tiny", models, seed=0)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "processor_config.json"):
        assert _sha(out / name) == _sha(MM / name), name
    for name in multimodal.HEADS.values():
        assert (models / name / "config.json").read_text() == (MODELS / name / "config.json").read_text()
        assert _sha(models / name / "model.safetensors") == _sha(MODELS / name / "model.safetensors")


def test_torchvision_shim_imports_next_to_cpu_torch():
    pytest.importorskip("torchvision", reason="torchvision not installed (make installs it)")
    code = ("import actors.torchvision_cpu as t; t.install(); import torch, torchvision; "
            "from transformers.models.llama4 import Llama4ImageProcessor; "
            "from transformers import Llama4ForConditionalGeneration; "
            "print(t.compiled_ops(), hasattr(torch.ops.torchvision, 'nms'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    compiled, has_nms = out.stdout.split()
    assert has_nms == "True"
    assert compiled in ("True", "False")
