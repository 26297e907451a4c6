"""Hub ids for the drafter's head and target, resolved as vLLM resolves ``--model`` (``actors.eagle.hub``):
offline against a hub cache laid out as ``huggingface_hub`` lays it out, and, online, fetching only the
target's shards the drafter reads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from actors.eagle import hub
from actors.eagle.checkpoint import SHARED_TENSOR_NAMES
from actors.eagle.spec import HeadConfigError

ROOT = Path(__file__).resolve().parents[3]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_to_hub_cache(cache: Path, repo_id: str, folder: Path) -> Path:
    """``cache/models--org--name/{refs/main, snapshots/<commit>/...}``, as ``huggingface_hub`` stores a repo."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(folder, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


OFFLINE_SCRIPT = """
import sys
from actors.drafter.actor import DrafterActor
from actors.drafter.config import DrafterEngineConfig, DrafterSettings
from actors.eagle.hub import resolve_model_dir
from actors.eagle.spec import HeadConfigError

engine = DrafterEngineConfig(max_model_len=64)
actor = DrafterActor(DrafterSettings("test-org/eagle1-head", "test-org/llama4-target", engine=engine))
print("head", actor.head_dir)
print("probe", actor.probe())
try:
    resolve_model_dir("test-org/not-cached")
except HeadConfigError as e:
    print("missing", e)
"""


def test_offline_hub_ids_resolve_from_the_cache(toy_heads, tmp_path):
    target_dir, heads = toy_heads
    home = tmp_path / "hf"
    add_to_hub_cache(home / "hub", "test-org/llama4-target", target_dir)
    head_snapshot = add_to_hub_cache(home / "hub", "test-org/eagle1-head", heads["eagle1"])
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("HF_HUB_CACHE", None)
    out = subprocess.run([sys.executable, "-c", OFFLINE_SCRIPT], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert lines["head"] == str(head_snapshot)
    assert lines["probe"] == "(1, 1)"
    assert "test-org/not-cached" in lines["missing"] and "HF_HUB_OFFLINE=1" in lines["missing"]


def test_local_folders_are_taken_as_they_are(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda **kw: pytest.fail("no hub look-up"))
    assert hub.resolve_model_dir(tmp_path) == tmp_path
    assert hub.resolve_target_dir(tmp_path, SHARED_TENSOR_NAMES) == tmp_path
    monkeypatch.undo()  # the hub client's own check of the id (no network): a missing absolute path is no repo id
    with pytest.raises(HeadConfigError, match="neither a local folder nor a hub repo id"):
        hub.resolve_model_dir(str(tmp_path / "not" / "there"))  # not a valid repo id either


def test_sharded_target_fetches_only_the_shared_tensors_shards(tmp_path, monkeypatch):
    """Scout's target is ~200 GB in 50 shards; the drafter needs embed_tokens and lm_head only."""
    import huggingface_hub

    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    weight_map = {"language_model.model.embed_tokens.weight": "model-00001-of-00050.safetensors",
                  "language_model.model.layers.0.self_attn.q_proj.weight": "model-00002-of-00050.safetensors",
                  "language_model.lm_head.weight": "model-00050-of-00050.safetensors"}
    (snapshot / hub.SAFETENSORS_INDEX).write_text(json.dumps({"weight_map": weight_map}))
    asked: list[list[str]] = []

    def fake_snapshot_download(repo_id, allow_patterns=None, local_files_only=False):
        assert repo_id == "meta-llama/Llama-4-Scout-17B-16E-Instruct"
        asked.append(allow_patterns)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    got = hub.resolve_target_dir("meta-llama/Llama-4-Scout-17B-16E-Instruct", SHARED_TENSOR_NAMES)
    assert got == snapshot
    assert asked == [["*.json"], ["*.json", "model-00001-of-00050.safetensors", "model-00050-of-00050.safetensors"]]
