"""A drafter with no room answers "no drafts" for the sequences that do not fit, never an error or an
out-of-memory: sequences past the slot cap (``max_num_seqs``, or what ``kv_cache_gib`` holds) and sequences whose
drafting would reach past ``max_model_len``. The others draft exactly as they would alone."""

from __future__ import annotations

import pytest
import torch

from actors.drafter.branches import BranchConfig
from actors.drafter.config import DrafterEngineConfig, DrafterSettings
from actors.drafter.engine import DrafterEngine
from actors.drafter.kv_cache import DraftKVCache
from actors.eagle.checkpoint import load_head
from actors.messages import DraftResult, DraftStatus
from tests.actors.steps import random_step


@pytest.mark.parametrize("branches", [None, BranchConfig(bonus_fanout=2, recovered_fanout=1)], ids=["sync", "async"])
def test_slot_cap_refuses_new_sequences_only(toy_heads, branches):
    target_dir, heads = toy_heads
    capped = DrafterEngine(load_head(heads["eagle1"], target_dir),
                           DrafterEngineConfig(max_model_len=64, max_num_seqs=2, branches=branches))
    free = DrafterEngine(load_head(heads["eagle1"], target_dir),
                         DrafterEngineConfig(max_model_len=64, branches=branches))
    width = capped.spec.fused_hidden_size
    step, hidden = random_step(0, 3, [("a", 0, 5), ("b", 0, 7), ("c", 0, 4)], width)
    got, want = capped.draft_tensors(step, hidden), free.draft_tensors(step, hidden)
    assert got.full_seqs == [2]
    assert got.drafts[:2].tolist() == want.drafts[:2].tolist()
    assert got.drafts[2].tolist() == [0, 0, 0]
    assert capped.num_active_sequences == capped.cache.num_slots == 2  # "c" holds nothing here

    # "a" finishes: "c" (sent again from position 0) gets its slot; "b" carries on.
    step, hidden = random_step(1, 3, [("b", 7, 2), ("c", 0, 6)], width, seed=1)
    step.finished = ["a"]
    got = capped.draft_tensors(step, hidden)
    assert got.full_seqs == []
    assert capped.num_active_sequences == 2


def test_sequences_past_max_model_len_get_no_drafts(toy_heads):
    target_dir, heads = toy_heads
    engine = DrafterEngine(load_head(heads["eagle3"], target_dir), DrafterEngineConfig(max_model_len=32))
    width = engine.spec.fused_hidden_size
    # k=3 drafts at positions up to last + 2: "fits" ends at 28 (reaches 30), "long" at 30 (would reach 32).
    step, hidden = random_step(0, 3, [("fits", 0, 29), ("long", 0, 31)], width)
    got = engine.draft_tensors(step, hidden)
    assert got.full_seqs == [1] and got.drafts[1].tolist() == [0, 0, 0]
    assert engine.num_active_sequences == 1
    # A sequence drafted before that grows too long is dropped from the cache.
    step, hidden = random_step(1, 3, [("fits", 29, 2)], width)
    assert engine.draft_tensors(step, hidden).full_seqs == [0]
    assert engine.num_active_sequences == 0


def _head_and_slot_bytes(toy_heads) -> tuple:
    """The EAGLE-1 head, and the bytes of one draft KV slot of a 64-token engine (65 positions)."""
    target_dir, heads = toy_heads
    head = load_head(heads["eagle1"], target_dir)
    spec = head.spec
    return head, DraftKVCache.bytes_per_slot(spec.num_layers, spec.num_kv_heads, spec.head_dim, 65, torch.float32)


def test_kv_cache_gib_caps_the_slots(toy_heads):
    head, slot = _head_and_slot_bytes(toy_heads)
    spec = head.spec
    engine = DrafterEngine(head, DrafterEngineConfig(max_model_len=64, kv_cache_gib=3.5 * slot / 2**30,
                                                     prefix_cache_fraction=0.0))
    assert engine.cache.max_slots == 3 and engine.prefix_cache_bytes == 0
    step, hidden = random_step(0, 2, [(f"s{i}", 0, 3) for i in range(5)], spec.fused_hidden_size)
    assert engine.draft_tensors(step, hidden).full_seqs == [3, 4]
    assert sum(t.numel() * t.element_size() for t in (*engine.cache.k, *engine.cache.v)) <= 3.5 * slot
    with pytest.raises(ValueError, match="holds no sequence"):
        DrafterEngine(_head_and_slot_bytes(toy_heads)[0],
                      DrafterEngineConfig(max_model_len=64, kv_cache_gib=0.5 * slot / 2**30))


def test_prefix_cache_takes_its_share_of_kv_cache_gib(toy_heads):
    """The prefix cache's blocks and the slots share ``kv_cache_gib``: ``prefix_cache_fraction`` of it for blocks."""
    head, slot = _head_and_slot_bytes(toy_heads)
    engine = DrafterEngine(head, DrafterEngineConfig(max_model_len=64, kv_cache_gib=5 * slot / 2**30,
                                                     prefix_cache_fraction=0.2))
    assert engine.cache.max_slots == 4 and engine.prefix_cache_bytes == slot
    with pytest.raises(ValueError, match="prefix_cache_fraction"):
        DrafterEngine(_head_and_slot_bytes(toy_heads)[0], DrafterEngineConfig(prefix_cache_fraction=1.0))


def test_actor_reports_full_seqs(toy_heads):
    from actors.drafter.actor import DrafterActor

    target_dir, heads = toy_heads
    actor = DrafterActor(DrafterSettings(str(heads["eagle1"]), str(target_dir),
                                         engine=DrafterEngineConfig(max_model_len=64, max_num_seqs=1)))
    step, hidden = random_step(0, 2, [("a", 0, 3), ("b", 0, 3)], actor.engine.spec.fused_hidden_size)
    result = DraftResult.unpack(actor.draft_step(step.pack(), hidden.numpy()))
    assert result.status is DraftStatus.OK
    assert result.full_seqs == [1] and result.draft_token_ids.shape == (2, 2)
    assert actor.stats()["full_sequences"] == 1 and actor.stats()["max_sequences"] == 1


def test_cuda_budget_is_a_fraction_of_free_memory(monkeypatch):
    """Without ``kv_cache_gib``, a CUDA drafter's cache may take a fraction of the memory free after its weights
    (the GPU call is replaced here: same decision, no GPU); a CPU drafter has no memory cap."""
    from actors.drafter.kv_cache import device_budget_gib

    asked = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: asked.append(d) or (40 * 2**30, 80 * 2**30))
    assert device_budget_gib("cuda", 0.6) == pytest.approx(24.0)
    assert asked == [torch.device("cuda")]
    assert device_budget_gib("cpu", 0.6) is None
