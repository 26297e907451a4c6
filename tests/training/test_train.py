"""The training commands: toy-scale runs are deterministic for a seed, and bad input fails clearly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from actors.eagle.spec import head_spec_from_dict
from tests.conftest import ROOT, toy_target_spec
from training import corpus, heads, target


def _rows(n: int = 6, seq: int = 32) -> torch.Tensor:
    return torch.randint(0, 300, (n, seq), generator=torch.Generator().manual_seed(1))


def test_target_training_is_deterministic_and_learns():
    spec = toy_target_spec()
    train = target.TrainSpec(steps=4, batch_size=2, seq_len=32, warmup=1, seed=3)
    losses_a, losses_b = [], []
    a = target.train_target(_rows(), spec, train, lambda s, loss: losses_a.append(loss))
    b = target.train_target(_rows(), spec, train, lambda s, loss: losses_b.append(loss))
    assert losses_a == losses_b
    for (na, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), na
    assert losses_a[-1] < losses_a[0]
    c = target.train_target(_rows(), spec, target.TrainSpec(steps=1, batch_size=2, seq_len=32, seed=4))
    assert not torch.equal(c.lm_head.weight, a.lm_head.weight)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_head_training_is_deterministic(toy_target, method):
    rows = _rows()
    tcfg = toy_target.config.to_dict()
    cfg = heads.eagle1_config(tcfg, 1) if method == "eagle" else heads.eagle3_config(tcfg, [1, 2, 3], 128)
    feats = heads.collect_features(toy_target, rows, [1, 2, 3] if method == "eagle3" else None)
    spec = head_spec_from_dict(cfg)
    d2t = heads.draft_vocab_from_counts(rows, 300, 128) if method == "eagle3" else None
    runs = []
    for _ in range(2):
        head = heads.init_head(spec, toy_target, seed=0, d2t=d2t)
        losses: list[float] = []
        hs = heads.HeadTrainSpec(steps=3, batch_size=2, unroll=3 if method == "eagle3" else 1)
        heads.train_head(
            head, toy_target.lm_head.weight.detach(), rows, feats, hs,
            lambda step, loss, top1, out=losses: out.append(loss),
        )
        runs.append((losses, head.fc.weight.detach().clone()))
    assert runs[0][0] == runs[1][0]
    assert torch.equal(runs[0][1], runs[1][1])


def test_draft_vocab_map_worked_example():
    rows = torch.tensor([[4, 4, 4, 0, 0, 2, 2, 1, 5, 3]])
    d2t = heads.draft_vocab_from_counts(rows, 6, 3)
    assert d2t.tolist() == [0, 1, 2]  # draft ids 0,1,2 -> target ids 0,2,4
    assert (torch.arange(3) + d2t).tolist() == [0, 2, 4]


def test_eagle3_layer_ids_outside_target_are_refused(toy_target):
    with pytest.raises(ValueError, match=r"eagle_aux_hidden_state_layer_ids: \[7\] outside"):
        heads.eagle3_config(toy_target.config.to_dict(), [1, 2, 7], 128)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        heads.eagle3_config(toy_target.config.to_dict(), [1, 2, 3], 10_000)
    with pytest.raises(ValueError, match="num_layers"):
        heads.eagle1_config(toy_target.config.to_dict(), 0)


def test_inconsistent_target_sizes_are_refused():
    with pytest.raises(ValueError, match="num_key_value_heads"):
        target.TargetSpec(num_attention_heads=8, num_key_value_heads=3).validate()
    with pytest.raises(ValueError, match="hidden_size"):
        target.TargetSpec(hidden_size=250, num_attention_heads=8).validate()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "training.cli", *args, "--quiet"], cwd=ROOT, capture_output=True, text=True,
        timeout=300,
    )


def test_cli_missing_corpus(tmp_path):
    r = _cli("target", "--corpus", str(tmp_path / "nope"), "--out", str(tmp_path / "out"))
    assert r.returncode == 2
    assert "corpus" in r.stderr and "is not a folder" in r.stderr


def test_cli_empty_corpus(tmp_path):
    (tmp_path / "empty").mkdir()
    r = _cli("target", "--corpus", str(tmp_path / "empty"), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "no .py files" in r.stderr


def test_cli_bad_output_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    r = _cli("target", "--out", str(tmp_path / "file"))
    assert r.returncode != 0 and "--out" in r.stderr and "not a folder" in r.stderr


def test_cli_heads_without_target(tmp_path):
    r = _cli("heads", "--out", str(tmp_path))
    assert r.returncode == 2 and "run the 'target' stage first" in r.stderr


def test_cli_toy_end_to_end(tmp_path):
    """A whole (tiny) run of the CLI on a small corpus: target + heads, loadable afterwards."""
    src = tmp_path / "src"
    src.mkdir()
    for p in corpus.stdlib_files(corpus.default_corpus_dir())[:40]:
        (src / p.name).write_text(corpus.read_text(p))
    out = tmp_path / "models"
    r = _cli("all", "--corpus", str(src), "--out", str(out), "--target-steps", "2", "--batch-size", "2",
             "--head-steps", "2", "--head-rows", "8", "--vocab-size", "400")
    assert r.returncode == 0, r.stderr[-2000:]
    from actors.eagle.checkpoint import load_head

    for name in ("eagle-llama4-tiny-1l", "eagle-llama4-tiny-3l", "eagle3-llama4-tiny"):
        head = load_head(out / name, out / "llama4-tiny")
        assert head.spec.vocab_size == 400
    assert json.loads((out / "eagle3-llama4-tiny" / "config.json").read_text())["draft_vocab_size"] == 200


def test_unrolled_attention_worked_example():
    """``UnrolledAttention``: T = 3, step 1: anchor 0 sees {s0: pos 0, s1: pos 1}; anchor 2 sees {s0: 0..2, s1: pos 3}.
    Zero queries attend uniformly over what they see; one-hot values say which keys those are."""
    from types import SimpleNamespace

    head = SimpleNamespace(layers=[SimpleNamespace(self_attn=SimpleNamespace(chunk_size=0))])
    attend = heads.UnrolledAttention(head, seq_len=3)
    eye = torch.eye(6)
    zeros = torch.zeros(1, 3, 1, 6)
    attend(0, zeros, zeros, eye[None, :3, None, :], None)  # step 0: keys of positions 0..2
    out = attend(0, zeros, zeros, eye[None, 3:, None, :], None)[0]  # step 1: one key per anchor
    assert out[0].tolist() == [0.5, 0, 0, 0.5, 0, 0]  # s0 at position 0, s1 of anchor 0
    assert out[2].tolist() == [0.25, 0.25, 0.25, 0, 0, 0.25]  # s0 at 0..2, s1 of anchor 2
