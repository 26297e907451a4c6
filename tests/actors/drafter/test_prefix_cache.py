"""The drafter's prefix cache (``actors.drafter.prefix_cache``): block hashes equal vLLM's for the same tokens; a
sequence whose first step starts past its cached prefix drafts exactly what it would have drafted from position 0;
an evicted prefix drafts from what follows (never fails) and is counted as a miss; least recently used eviction."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.drafter.branches import BranchConfig
from actors.drafter.config import DrafterEngineConfig
from actors.drafter.engine import DrafterEngine
from actors.drafter.prefix_cache import PrefixBlockStore, SeqTokens, block_hashes, hash_block_tokens, root_hash
from actors.eagle.checkpoint import load_head
from actors.messages import BadStep, DraftStep, SeqSlice
from tests.actors.drafter.test_drafter_engine import reference_drafts

BS = 4  # block size
K = 3


def test_block_hashes_equal_vllms():
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import hash_block_tokens as vllm_hash

    tokens = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    root = root_hash(BS)
    want, parent = [], root
    for b in range(len(tokens) // BS):
        parent = vllm_hash(sha256, parent, tokens[b * BS : (b + 1) * BS])
        want.append(parent)
    assert block_hashes(tokens, BS) == want and len(want) == 2  # [13, 14] is not a full block
    assert hash_block_tokens(root, tokens[:BS], ("x",)) == vllm_hash(sha256, root, tokens[:BS], ("x",))
    assert block_hashes(tokens, BS)[0] != block_hashes(tokens, 5)[0]  # each block size its own root


def test_seq_tokens_prompt_is_authoritative_and_rows_extend():
    t = SeqTokens(6, [1, 2, 3, 4, 5, 6], BS)
    t.add_rows(0, [2, 3, 99])  # a chunked prefill's stand-in next token (99) inside the prompt: ignored
    assert t.tokens == [1, 2, 3, 4, 5, 6]
    t.add_rows(3, [5, 6, 7])  # the last prompt row (position 5)'s input is the first sampled token, at position 6
    assert t.tokens == [1, 2, 3, 4, 5, 6, 7]
    t.add_rows(6, [8, 9])
    assert t.tokens == [1, 2, 3, 4, 5, 6, 7, 8, 9] and t.hashes_up_to(5) == block_hashes(t.tokens, BS)
    t.add_rows(20, [1])  # rows it never got: nothing more is hashed
    assert t.broken


def test_store_evicts_least_recently_used_tail_first():
    store = PrefixBlockStore(1, BS, 1, 2, max_blocks=3)
    k = [torch.arange(2 * 16 * 2, dtype=torch.float32).view(2, 16, 1, 2)]
    a = block_hashes(list(range(12)), BS)
    for b, h in enumerate(a):
        store.put(h, k, k, 0, b * BS)
    store.touch(a)
    other = block_hashes(list(range(100, 104)), BS)
    store.put(other[0], k, k, 1, 0)  # full: a's last block goes first
    assert store.longest(a) == [store.index[a[0]], store.index[a[1]]] and store.evicted == 1
    dst = [torch.zeros(2, 16, 1, 2)]
    store.copy_into(store.longest(a), dst, dst, 1)
    assert torch.equal(dst[0][1, : 2 * BS], k[0][0, : 2 * BS])


def _rows(tokens: list[int], next_token: int, hidden: torch.Tensor, p0: int) -> tuple[list[int], torch.Tensor]:
    """Rows from position p0 of a prompt: row p's input is the token at p + 1 (the next token for the last)."""
    return tokens[p0 + 1 :] + [next_token], hidden[p0:]


def _step(step_id: int, seqs: list[tuple[str, int, list[int], torch.Tensor, list[int] | None]]
          ) -> tuple[DraftStep, torch.Tensor]:
    """seqs: (req_id, first position, input ids, hidden rows, prompt or None)."""
    slices, ids, hid, prompts, off = [], [], [], {}, 0
    for rid, p0, row_ids, h, prompt in seqs:
        slices.append(SeqSlice(rid, off, len(row_ids), p0))
        ids += row_ids
        hid.append(h)
        off += len(row_ids)
        if prompt is not None:
            prompts[rid] = np.array(prompt, np.int32)
    return DraftStep(step_id, K, slices, np.array(ids, np.int32), prompts=prompts, block_size=BS), torch.cat(hid)


@pytest.fixture(scope="module")
def prompts_and_hidden(toy_heads):
    """A (14 tokens: 3 full blocks) and B sharing A's first 9 tokens: vLLM's hit for B is 2 blocks (P = 8)."""
    g = torch.Generator().manual_seed(1)
    ta = torch.randint(0, 300, (14,), generator=g).tolist()
    tb = ta[:9] + torch.randint(0, 300, (5,), generator=g).tolist()
    return ta, tb, g


def _a_and_b(toy_heads, prompts_and_hidden, name: str = "eagle1"):
    """(head, A, B, generator, A's hidden rows, B's): B's target states agree with A's on the 9 shared tokens."""
    target_dir, heads = toy_heads
    head = load_head(heads[name], target_dir)
    width = head.spec.fused_hidden_size
    ta, tb, g = prompts_and_hidden
    ha = torch.randn(14, width, generator=g)
    hb = torch.cat([ha[:9], torch.randn(5, width, generator=g)])
    return head, ta, tb, g, ha, hb


@pytest.mark.parametrize("name", ["eagle1", "eagle1_2l", "eagle3"])
def test_prefix_hit_drafts_as_from_position_zero(toy_heads, prompts_and_hidden, name):
    head, ta, tb, g, ha, hb = _a_and_b(toy_heads, prompts_and_hidden, name)
    width = head.spec.fused_hidden_size
    engine = DrafterEngine(head, DrafterEngineConfig(max_model_len=64))
    ids, h = _rows(ta, 7, ha, 0)
    engine.draft_tensors(*_step(0, [("a", 0, ids, h, ta)]))
    assert engine.prefix_store.num_cached == 3
    ids, h = _rows(tb, 9, hb, 8)  # vLLM computed B from position 8 only
    p = engine.draft_tensors(*_step(1, [("b", 8, ids, h, tb)]))
    assert p.cold == 0 and engine.take_prefix_counts() == (0 + 8, 0)
    full_ids, full_h = _rows(tb, 9, hb, 0)
    assert p.drafts[0].tolist() == reference_drafts(head, full_ids, full_h, K)
    # The next step (2 drafts accepted) still drafts from the whole context.
    more_ids, more_h = [int(t) for t in torch.randint(0, 300, (3,), generator=g)], torch.randn(3, width, generator=g)
    p2 = engine.draft_tensors(*_step(2, [("b", 14, more_ids, more_h, None)]))
    assert p2.drafts[0].tolist() == reference_drafts(head, full_ids + more_ids, torch.cat([full_h, more_h]), K)


def test_evicted_prefix_is_a_miss_and_drafts_from_what_follows(toy_heads, prompts_and_hidden):
    head, ta, tb, g, ha, hb = _a_and_b(toy_heads, prompts_and_hidden)
    width = head.spec.fused_hidden_size
    engine = DrafterEngine(head, DrafterEngineConfig(max_model_len=64, max_num_seqs=2, prefix_cache_fraction=0.2))
    engine.draft_tensors(*_step(0, [("a", 0, *_rows(ta, 7, ha, 0), ta)]))
    max_blocks = engine.prefix_store.max_blocks
    for i in range(max_blocks // 3 + 1):  # other prompts push A's blocks out
        other = torch.randint(0, 300, (14,), generator=g).tolist()
        engine.free([f"o{i - 1}"])
        engine.draft_tensors(*_step(1 + i, [(f"o{i}", 0, *_rows(other, 1, torch.randn(14, width), 0), other)]))
    engine.take_prefix_counts()
    ids, h = _rows(tb, 9, hb, 8)
    engine.free(["a"])
    p = engine.draft_tensors(*_step(9, [("b", 8, ids, h, tb)]))
    assert engine.take_prefix_counts() == (0, 8) and p.cold == 0
    assert int(engine.cache.known_from[engine.cache.slot_of["b"]]) == 8
    assert p.drafts[0].tolist() == reference_drafts(head, ids, h, K, p0=8)


def test_partial_prefix_masks_the_gap(toy_heads, prompts_and_hidden):
    head, ta, tb, _, ha, hb = _a_and_b(toy_heads, prompts_and_hidden)
    engine = DrafterEngine(head, DrafterEngineConfig(max_model_len=64))
    engine.draft_tensors(*_step(0, [("a", 0, *_rows(ta, 7, ha, 0), ta)]))
    store = engine.prefix_store
    store.index.pop(block_hashes(ta, BS)[1])  # block 1 gone, block 0 kept
    p = engine.draft_tensors(*_step(1, [("b", 8, *_rows(tb, 9, hb, 8), tb)]))
    slot = engine.cache.slot_of["b"]
    assert engine.take_prefix_counts() == (4, 4) and p.drafts.shape == (1, K)
    assert (int(engine.cache.known_from[slot]), int(engine.cache.gap_lo[slot]), int(engine.cache.gap_hi[slot])) == (
        0, 4, 8)
    assert not engine.cache.full_context(slot)


def test_async_drafting_counts_prompt_steps(toy_heads, prompts_and_hidden):
    """With branches, a prompt step (``SeqRole.CONTEXT``) is folded in ``after_step``: its prefix is found there."""
    from actors.messages import SeqRole

    head, ta, tb, _, ha, hb = _a_and_b(toy_heads, prompts_and_hidden, "eagle3")
    engine = DrafterEngine(head, DrafterEngineConfig(max_model_len=64,
                                                     branches=BranchConfig(bonus_fanout=2, recovered_fanout=1)))
    for i, (rid, p0, tokens, hidden) in enumerate([("a", 0, ta, ha), ("b", 8, tb, hb)]):
        step, rows = _step(i, [(rid, p0, *_rows(tokens, 7, hidden, p0), tokens)])
        step.seqs[0] = SeqSlice(rid, 0, step.seqs[0].num_tokens, p0, SeqRole.CONTEXT)
        engine.draft_tensors(step, rows)
        engine.after_step()
    assert engine.take_prefix_counts() == (8, 0) and "b" in engine.branch_table


def test_prompts_travel_and_are_checked():
    step = DraftStep(1, K, [SeqSlice("a", 0, 2, 8)], np.array([3, 4], np.int32), prompts={"a": np.arange(10,
                     dtype=np.int32)}, block_size=BS)
    back = DraftStep.unpack(step.pack())
    assert back.block_size == BS and back.prompts["a"].tolist() == list(range(10))
    assert "prefix" not in DraftStep(1, K, step.seqs, step.input_ids).pack().decode("latin-1")
    back.validate(2, 4, 4, vocab_size=20)
    sub, _ = back.select([0])
    assert sub.prompts["a"].tolist() == list(range(10)) and sub.block_size == BS
    for bad, match in [({"prompts": {"z": np.arange(3, dtype=np.int32)}}, "not in the step"),
                       ({"prompts": {"a": np.array([1, 99], np.int32)}}, "vocabulary"),
                       ({"block_size": 0}, "block_size"), ({"block_size": -1}, "block_size")]:
        s = DraftStep(1, K, step.seqs, step.input_ids, prompts=dict(step.prompts), block_size=BS)
        for key, v in bad.items():
            setattr(s, key, v)
        with pytest.raises(BadStep, match=match):
            s.validate(2, 4, 4, vocab_size=20)
