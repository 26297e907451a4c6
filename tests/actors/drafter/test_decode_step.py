"""``actors.drafter.decode_step`` on the CPU: fixed-shape decode steps (the passes a CUDA graph replays, run eagerly
here) draft what the engine's eager passes draft, through every case of ``scenarios.STEPS``, with either attention
backend (the Triton kernel through Triton's interpreter), and so do pipelined drafting's branch passes; padding never
touches a real cache entry."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.drafter.branches import BranchConfig
from actors.drafter.decode_step import batch_sizes
from actors.messages import DraftStep, SeqSlice
from tests.actors.drafter import scenarios


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_fixed_shape_steps_draft_what_the_eager_passes_draft(method, backend, monkeypatch):
    want, eager = scenarios.run("cpu", method)
    assert eager.decode is None  # a CPU's default: the eager passes
    monkeypatch.setenv("EAGLE_CLUSTER_SLOT_ATTENTION", backend)
    got, fixed = scenarios.run("cpu", method, fixed_shape_steps=True)
    assert fixed.attention_backend == backend
    assert got == want
    # Every step but the prefill ran fixed-shape; the cases happened: a prefix hit, a re-homed sequence, no room.
    assert fixed.decode.steps == len(scenarios.STEPS) - 1 and fixed.decode.graphs is None
    assert fixed.prefix_hit_tokens == eager.prefix_hit_tokens == 8
    assert got[-1][0] == [0, 0, 0]  # "e": placeholders
    # The caches agree wherever a real row can read (the last position is where padding writes).
    for layer in range(fixed.spec.num_layers):
        torch.testing.assert_close(fixed.cache.k[layer][:, :-1], eager.cache.k[layer][:, :-1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_fixed_shape_branch_passes_draft_the_eager_branch_tables(method, backend, monkeypatch):
    """Pipelined drafting: the branches (``actors.drafter.branch_passes``, each in a scratch slot) draft what
    ``BranchAttention``'s eager passes draft, so the steps' hits and drafts agree too."""
    branches = BranchConfig(bonus_fanout=2, recovered_fanout=1)
    want, _ = scenarios.run("cpu", method, branches)
    monkeypatch.setenv("EAGLE_CLUSTER_SLOT_ATTENTION", backend)
    got, fixed = scenarios.run("cpu", method, branches, fixed_shape_steps=True)
    assert got == want
    assert fixed.branch_passes.calls == len(scenarios.STEPS) and fixed.cache.scratch_slots == 32
    assert any(table for table in got[1::2])  # branches were drafted


def test_padding_writes_only_the_unused_last_position():
    """A batch of 3 sequences of 1 and 3 rows runs as 4 x 3: the padding rows and sequence write position max_len - 1
    (never a real row's: positions stop at max_model_len - 1) and nothing else."""
    engine = scenarios.make_engine("cpu", "eagle3", fixed_shape_steps=True)
    width = engine.spec.fused_hidden_size
    prefill = DraftStep(0, 3, [SeqSlice(r, 8 * i, 8, 0) for i, r in enumerate("abc")],
                        np.arange(24, dtype=np.int32))
    engine.draft_tensors(prefill, torch.randn(24, width))
    before = [t.clone() for t in engine.cache.k]
    step = DraftStep(1, 3, [SeqSlice("b", 0, 1, 8), SeqSlice("a", 1, 3, 8), SeqSlice("c", 4, 1, 8)],
                     np.arange(5, dtype=np.int32))
    engine.draft_tensors(step, torch.randn(5, width))
    assert engine.decode.steps == 1 and engine.decode.shape_of(step).batch == 4
    changed = (engine.cache.k[0] != before[0]).any(-1).any(-1).nonzero().tolist()  # [slot, position] pairs
    last = engine.cache.max_len - 1
    rows = {engine.cache.slot_of[r]: p for r, p in (("a", [8, 9, 10, 11, 12]), ("b", [8, 9, 10]), ("c", [8, 9, 10]))}
    assert {(s, p) for s, p in changed if p != last} == {(s, p) for s, ps in rows.items() for p in ps}


def test_batch_sizes_follow_vllms_ladder():
    assert batch_sizes(128) == [1, 2, 4, *range(8, 129, 8)]
    assert batch_sizes(20) == [1, 2, 4, 8, 16, 20] and batch_sizes(3) == [1, 2, 3]


def test_which_steps_are_fixed_shape():
    engine = scenarios.make_engine("cpu", "eagle", fixed_shape_steps=True, max_k=3, cuda_graph_max_batch=2)
    decode = engine.decode

    def step(k: int, rows: list[int]) -> DraftStep:
        starts = np.cumsum([0, *rows])
        return DraftStep(0, k, [SeqSlice(f"s{i}", int(starts[i]), n, 10) for i, n in enumerate(rows)],
                         np.zeros(sum(rows), dtype=np.int32))

    assert decode.accepts(step(3, [4, 1]))
    assert not decode.accepts(step(0, [1]))  # k = 0 drafts nothing
    assert not decode.accepts(step(3, [5]))  # more rows than k + 1: a prefill
    assert not decode.accepts(step(3, [1, 1, 1]))  # past the largest batch
    with_image = step(3, [2])
    with_image.mm_rows = np.array([0], dtype=np.int32)
    assert not decode.accepts(with_image)
