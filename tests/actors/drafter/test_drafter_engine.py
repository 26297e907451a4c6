"""The drafter engine's batched, cached drafting equals a from-scratch recompute of the head, per sequence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.drafter.branches import BranchConfig
from actors.drafter.config import DrafterEngineConfig
from actors.drafter.engine import DrafterEngine
from actors.eagle.checkpoint import load_head
from actors.eagle.layers import sdpa_attend
from actors.messages import DraftStep, SeqSlice


def causal_attend(head, pos):
    """Plain causal (and chunked) attention over all rows, at positions ``pos``."""
    n = len(pos)

    def attend(layer, q, kk, v, positions):
        m = torch.tril(torch.ones(n, n, dtype=torch.bool))
        c = head.layers[layer].self_attn.chunk_size
        if c:
            m &= (pos[:, None] // c) == (pos[None, :] // c)
        return sdpa_attend(q[None], kk[None], v[None], m[None])[0]

    return attend


def reference_drafts(head, ids, hidden, k, p0=0):
    """Full recompute: rows (ids[t], hidden[t]) at positions p0..p0+n-1, then k greedy drafts, each step
    re-running the head over every row so far with a plain causal (and chunked) mask."""
    ids, hid = list(ids), [h for h in head.combine(hidden)]
    drafts = []
    for _ in range(k):
        pos = p0 + torch.arange(len(ids))
        out, fed = head(torch.tensor(ids), torch.stack(hid), pos, causal_attend(head, pos))
        d = int(head.greedy(out[-1]))
        drafts.append(d)
        ids.append(d)
        hid.append(fed[-1])
    return drafts


def make_step(step_id, k, seqs):
    """seqs: list of (req_id, start_position, ids, hidden) -> (DraftStep, hidden [N, width])."""
    slices, all_ids, all_hidden, off = [], [], [], 0
    for rid, p0, ids, hidden in seqs:
        slices.append(SeqSlice(rid, off, len(ids), p0))
        all_ids += list(ids)
        all_hidden.append(hidden)
        off += len(ids)
    return DraftStep(step_id, k, slices, np.array(all_ids, dtype=np.int32)), torch.cat(all_hidden)


@pytest.mark.parametrize("name", ["eagle1", "eagle1_2l", "eagle3"])
def test_batched_cached_drafts_match_recompute(toy_heads, name):
    target_dir, heads = toy_heads
    head = load_head(heads[name], target_dir)
    engine = DrafterEngine(head, DrafterEngineConfig(max_model_len=128))
    width = head.spec.fused_hidden_size
    g = torch.Generator().manual_seed(0)
    k = 3
    lengths = {"a": 5, "b": 11, "c": 1}  # "b" crosses an attention chunk (8)
    full_ids = {r: torch.randint(0, 300, (40,), generator=g) for r in lengths}
    full_hidden = {r: torch.randn(40, width, generator=g) for r in lengths}

    # Step 1: prefill of three sequences at once.
    step, hidden = make_step(0, k, [(r, 0, full_ids[r][:n], full_hidden[r][:n]) for r, n in lengths.items()])
    got = engine.draft_tensors(step, hidden).drafts
    for i, (r, n) in enumerate(lengths.items()):
        assert got[i].tolist() == reference_drafts(head, full_ids[r][:n], full_hidden[r][:n], k), r

    # Step 2: each sequence had 0..2 drafts accepted (new real rows), in another order, "c" finished.
    accepted = {"b": 3, "a": 1}
    seqs = [(r, lengths[r], full_ids[r][lengths[r] : lengths[r] + a], full_hidden[r][lengths[r] : lengths[r] + a])
            for r, a in accepted.items()]
    step, hidden = make_step(1, k, seqs)
    step.finished = ["c"]
    got = engine.draft_tensors(step, hidden).drafts
    assert engine.num_active_sequences == 2
    for i, (r, a) in enumerate(accepted.items()):
        n = lengths[r] + a
        assert got[i].tolist() == reference_drafts(head, full_ids[r][:n], full_hidden[r][:n], k), r

    # Preemption: "a" comes back from position 0 with a longer prefix; the cache is overwritten by position.
    step, hidden = make_step(2, k, [("a", 0, full_ids["a"][:9], full_hidden["a"][:9])])
    got = engine.draft_tensors(step, hidden).drafts
    assert got[0].tolist() == reference_drafts(head, full_ids["a"][:9], full_hidden["a"][:9], k)


def test_free_releases_slots(toy_heads):
    target_dir, heads = toy_heads
    engine = DrafterEngine(load_head(heads["eagle1"], target_dir), DrafterEngineConfig(max_model_len=64))
    width = engine.spec.fused_hidden_size
    seqs = [(f"r{i}", 0, torch.arange(3), torch.randn(3, width)) for i in range(20)]
    step, hidden = make_step(0, 2, seqs)
    assert engine.draft_tensors(step, hidden).drafts.shape == (20, 2)
    assert engine.num_active_sequences == 20
    assert engine.cache.num_slots == 32  # grew from 8
    engine.free([f"r{i}" for i in range(20)])
    assert engine.num_active_sequences == 0
    assert engine.cache.num_slots == 8  # idle: back to its starting size


def test_bad_step_is_refused(toy_heads):
    target_dir, heads = toy_heads
    engine = DrafterEngine(load_head(heads["eagle3"], target_dir), DrafterEngineConfig(max_model_len=64))
    step, hidden = make_step(0, 2, [("x", 0, torch.arange(3), torch.randn(3, 64))])  # EAGLE-3 needs 3 x 64
    with pytest.raises(ValueError, match="hidden width"):
        engine.draft_tensors(step, hidden)


def test_rehomed_sequence_drafts_from_the_context_it_has(toy_heads):
    """A sequence first seen mid-stream (its drafter died) drafts as if its history began there, even in a
    reused slot full of another sequence's entries."""
    target_dir, heads = toy_heads
    head = load_head(heads["eagle1"], target_dir)
    engine = DrafterEngine(head, DrafterEngineConfig(max_model_len=64, max_num_seqs=1))
    width = head.spec.fused_hidden_size
    g = torch.Generator().manual_seed(1)
    ids, hidden = torch.randint(0, 300, (12,), generator=g), torch.randn(12, width, generator=g)
    step, h = make_step(0, 2, [("old", 0, ids, hidden)])
    engine.draft_tensors(step, h)
    engine.free(["old"])
    ids2, hidden2 = torch.randint(0, 300, (3,), generator=g), torch.randn(3, width, generator=g)
    step, h = make_step(1, 2, [("moved", 9, ids2, hidden2)])  # positions 9..11, one slot: "old"'s
    got, cold, *_ = engine.draft_tensors(step, h)
    assert cold == 1
    assert got[0].tolist() == reference_drafts(head, ids2, hidden2, 2, p0=9)
    # Later steps keep to the known context, and a restart from 0 makes all of it known again.
    step, h = make_step(2, 2, [("moved", 0, ids, hidden)])
    got, cold, *_ = engine.draft_tensors(step, h)
    assert cold == 0 and got[0].tolist() == reference_drafts(head, ids, hidden, 2)


def continue_greedy(head, ids, hid, k, first=None):
    """From rows (ids, combined features) so far: optionally add row (first = (token, None -> fed of the last
    row)), then k greedy drafts by full recompute. Returns the drafts; ``ids`` / ``hid`` grow in place."""
    drafts = []
    for step in range(k + (first is not None)):
        pos = torch.arange(len(ids))
        out, fed = head(torch.tensor(ids), torch.stack(hid), pos, causal_attend(head, pos))
        tok = first if (first is not None and step == 0) else int(head.greedy(out[-1]))
        if not (first is not None and step == 0):
            drafts.append(tok)
        ids.append(tok)
        hid.append(fed[-1])
    return drafts


@pytest.mark.parametrize("name", ["eagle1", "eagle3"])
def test_branches_match_recompute_and_answer_hits(toy_heads, name):
    """Asynchronous drafting: every precomputed branch equals a full recompute of the head over the same rows
    (real rows, then the served drafts with the head's own features, then the guessed token); a step whose
    outcome was precomputed is answered from it."""

    target_dir, heads = toy_heads
    head = load_head(heads[name], target_dir)
    k = 3
    branches = BranchConfig(bonus_fanout=2, recovered_fanout=1)
    engine = DrafterEngine(head, DrafterEngineConfig(max_model_len=128, branches=branches))
    width = head.spec.fused_hidden_size
    g = torch.Generator().manual_seed(2)
    n = 11  # branches reach positions 12..17: across the chunk boundary at 16
    ids, hidden = torch.randint(0, 300, (n,), generator=g), torch.randn(n, width, generator=g)
    step, h = make_step(0, k, [("s", 0, ids, hidden)])
    first = engine.draft_tensors(step, h)
    served = first.drafts[0].tolist()
    assert served == reference_drafts(head, ids, hidden, k)  # no branches yet: drafted at once
    assert engine.branch_table == {}
    engine.after_step()
    entry = engine.branch_table["s"]
    assert entry.last_position == n - 1 and entry.served == served
    assert len(entry.drafts) == BranchConfig(2, 1).branches_per_sequence(k)
    assert sorted(a for a, _ in entry.drafts) == [0, 1, 2, 3, 3]
    for (a, y), drafts in entry.drafts.items():
        rows_ids, rows_hid = list(ids.tolist()), list(head.combine(hidden))
        for t in served[:a]:  # the accepted drafts, each with the feature the head predicted there
            continue_greedy(head, rows_ids, rows_hid, 0, first=t)
        assert continue_greedy(head, rows_ids, rows_hid, k, first=y) == drafts, (a, y)
        if a < k:
            assert y != served[a]

    # The verifier accepted one draft, then emitted a guessed recovered token: a hit.
    (a, y), expected = next(((a, y), d) for (a, y), d in entry.drafts.items() if a == 1)
    rows = torch.tensor([served[0], y])
    step, h = make_step(1, k, [("s", n, rows, torch.randn(2, width, generator=g))])
    hit = engine.draft_tensors(step, h)
    assert (hit.hit_seqs, hit.branch_lookups) == ([0], 1) and hit.drafts[0].tolist() == expected
    engine.after_step()  # folds the real rows, drafts the next branches from the served ones
    assert engine.branch_table["s"].last_position == n + 1 and engine.branch_table["s"].served == expected
    # An outcome nobody guessed: a miss, drafted on demand like the synchronous engine would.
    step, h = make_step(2, k, [("s", n + 2, torch.tensor([299]), torch.randn(1, width, generator=g))])
    miss = engine.draft_tensors(step, h)
    assert (miss.hit_seqs, miss.branch_lookups) == ([], 1) and miss.drafts.shape == (1, k)


def test_guesses_worked_example():
    """``guesses``' docstring: s = 1, fanouts 2 / 1, logits_0 top [T_1, u], logits_1 top [v, w]."""
    from actors.drafter.branches import guesses

    t1, u, v, w = 5, 7, 2, 9
    logits = torch.zeros(1, 2, 10)
    logits[0, 0, [t1, u]] = torch.tensor([3.0, 2.0])
    logits[0, 1, [v, w]] = torch.tensor([3.0, 2.0])
    cfg = BranchConfig(bonus_fanout=2, recovered_fanout=1)
    a, y = guesses(logits, torch.tensor([[t1]]), cfg, per_sequence=3)
    assert (a.tolist(), y.tolist()) == ([[1, 0, 1]], [[v, u, w]])
    a, y = guesses(logits, torch.tensor([[t1]]), cfg, per_sequence=2)
    assert (a.tolist(), y.tolist()) == ([[1, 0]], [[v, u]])


def test_fanout_shrinks_as_the_batch_grows():

    cfg = BranchConfig(bonus_fanout=2, recovered_fanout=1, max_branch_rows=8)
    assert [cfg.branches_per_sequence(3, b) for b in (1, 2, 4, 8, 9)] == [5, 4, 2, 1, 0]
    assert cfg.branches_per_sequence(0, 1) == 2  # a prompt step: bonus guesses only
    assert BranchConfig(max_branch_rows=None).branches_per_sequence(3, 1000) == 5


@pytest.mark.parametrize("name", ["eagle1", "eagle3"])
def test_context_step_caches_rows_and_drafts_outcome_zero(toy_heads, name):
    """A prompt step the verifier did not wait for (``SeqRole.CONTEXT``): no drafts, and its branches are the
    drafts a recompute gives after the prompt and the guessed next token; the next step hits one."""
    from actors.messages import SeqRole

    target_dir, heads = toy_heads
    head = load_head(heads[name], target_dir)
    k = 3
    branches = BranchConfig(bonus_fanout=3, recovered_fanout=1)
    engine = DrafterEngine(head, DrafterEngineConfig(max_model_len=128, branches=branches))
    g = torch.Generator().manual_seed(3)
    n = 13
    ids, hidden = torch.randint(0, 300, (n,), generator=g), torch.randn(n, head.spec.fused_hidden_size, generator=g)
    step, h = make_step(0, k, [("p", 0, ids, hidden)])
    step.seqs = [SeqSlice("p", 0, n, 0, SeqRole.CONTEXT)]
    first = engine.draft_tensors(step, h)
    assert not first.drafts.any() and first.hit_seqs == []
    entry = engine.after_step()["p"]
    assert entry.last_position == n - 1 and entry.served == [] and len(entry.drafts) == 3
    for (a, y), drafts in entry.drafts.items():
        assert a == 0
        assert continue_greedy(head, list(ids.tolist()), list(head.combine(hidden)), k, first=y) == drafts
    (_, y), expected = next(iter(entry.drafts.items()))
    step, h = make_step(1, k, [("p", n, torch.tensor([y]), torch.randn(1, head.spec.fused_hidden_size))])
    hit = engine.draft_tensors(step, h)
    assert hit.hit_seqs == [0] and hit.drafts[0].tolist() == expected


@pytest.mark.parametrize("name", ["eagle1", "eagle3"])
def test_bfloat16_engine_matches_bfloat16_recompute(toy_heads, name):
    """dtype plumbing (GPU drafters run heads in bfloat16; the same code runs here on the CPU): weights,
    activations and the draft KV cache in bfloat16, rotary frequencies kept in float32, drafts equal to a
    from-scratch recompute of the bfloat16 head prepared as the engine prepares it;
    asynchronous drafting runs in bfloat16 too."""
    target_dir, heads = toy_heads
    engine = DrafterEngine(load_head(heads[name], target_dir), DrafterEngineConfig(max_model_len=64),
                           dtype=torch.bfloat16)
    assert engine.head.fc.weight.dtype == torch.bfloat16
    assert engine.cache.k[0].dtype == engine.cache.v[0].dtype == torch.bfloat16
    assert engine.head.layers[0].self_attn.freqs.dtype == torch.float32
    # The recompute runs the engine's ops (vLLM's kernels where they load): in bfloat16 a kernel and the torch op it
    # replaces may round differently (measured on vLLM's AVX2 build), and test_kernels.py compares those two.
    ref_head = load_head(heads[name], target_dir, dtype=torch.bfloat16).fuse(max_positions=64)
    width = engine.spec.fused_hidden_size
    g = torch.Generator().manual_seed(2)
    seqs = [(f"s{i}", 0, torch.randint(0, 300, (n,), generator=g), torch.randn(n, width, generator=g))
            for i, n in enumerate([9, 3, 12])]
    step, hidden = make_step(0, 3, seqs)
    got = engine.draft_tensors(step, hidden).drafts  # float32 hidden from the verifier: cast on the way in
    for i, (_, _, ids, h) in enumerate(seqs):
        assert got[i].tolist() == reference_drafts(ref_head, ids, h.to(torch.bfloat16), 3)

    config = DrafterEngineConfig(max_model_len=64, branches=BranchConfig(bonus_fanout=2, recovered_fanout=1))
    branched = DrafterEngine(load_head(heads[name], target_dir), config, dtype=torch.bfloat16)
    assert branched.draft_tensors(step, hidden).drafts.tolist() == got.tolist()
    assert sorted(branched.after_step()) == ["s0", "s1", "s2"]


def test_cast_keeps_rotary_frequencies_float32(toy_heads):
    """In bfloat16, a frequency's rounding error times a position in the thousands is radians off."""
    from actors.eagle.layers import inv_freq

    target_dir, heads = toy_heads
    head = load_head(heads["eagle1"], target_dir).cast(torch.bfloat16)
    attn = head.layers[0].self_attn
    assert torch.equal(attn.freqs, inv_freq(head.spec.rope, head.spec.head_dim))


@pytest.mark.parametrize("name", ["eagle1", "eagle3"])
def test_long_prompts_attend_in_blocks(toy_heads, name, monkeypatch):
    """A context pass too big for one attention call (``MAX_SCORES``) attends one block of query rows at a time,
    with the same drafts: here blocks of a single row."""
    from actors.drafter import engine as engine_module

    monkeypatch.setattr(engine_module, "MAX_SCORES", 1)
    target_dir, heads = toy_heads
    head = load_head(heads[name], target_dir)
    engine = DrafterEngine(head, DrafterEngineConfig(max_model_len=64))
    width = head.spec.fused_hidden_size
    g = torch.Generator().manual_seed(3)
    seqs = [(r, 0, torch.randint(0, 300, (n,), generator=g), torch.randn(n, width, generator=g))
            for r, n in (("a", 13), ("b", 4))]  # "a" crosses two attention chunks (8)
    got = engine.draft_tensors(*make_step(0, 3, seqs)).drafts
    for i, (_, _, ids, h) in enumerate(seqs):
        assert got[i].tolist() == reference_drafts(head, ids, h, 3)


def test_slot_order_of_a_shuffled_batch():
    from actors.drafter.engine import CacheAttention

    assert CacheAttention._slot_order([5, 3, 4]).tolist() == [1, 2, 0]  # the docstring's example
    assert CacheAttention._slot_order([3, 4, 5]) is None  # in order: already a view
    assert CacheAttention._slot_order([6, 3, 4]) is None  # not consecutive: a copy either way
    assert CacheAttention._slot_order([2]) is None


@pytest.mark.parametrize("name", ["eagle1_2l", "eagle3"])
def test_a_shuffled_batch_drafts_what_each_sequence_drafts_alone(toy_heads, name):
    """vLLM reorders its batch as requests finish: sequences whose slots come in another order (attended in slot
    order, ``CacheAttention._slot_order``) still get the from-scratch drafts, multi-row and one-row steps alike."""
    target_dir, heads = toy_heads
    head = load_head(heads[name], target_dir)
    engine = DrafterEngine(head, DrafterEngineConfig(max_model_len=128))
    width = head.spec.fused_hidden_size
    g = torch.Generator().manual_seed(2)
    rids = ["a", "b", "c", "d", "e"]
    ids = {r: torch.randint(0, 300, (30,), generator=g) for r in rids}
    hid = {r: torch.randn(30, width, generator=g) for r in rids}
    n = dict.fromkeys(rids, 4)
    step, hidden = make_step(0, 3, [(r, 0, ids[r][:4], hid[r][:4]) for r in rids])  # slots 0..4, in order
    engine.draft_tensors(step, hidden)
    for step_id, (order, rows) in enumerate([(["c", "a", "e", "b", "d"], [2, 1, 3, 1, 2]),
                                             (["e", "d", "c", "b", "a"], [1, 1, 1, 1, 1])], start=1):
        seqs = [(r, n[r], ids[r][n[r] : n[r] + m], hid[r][n[r] : n[r] + m]) for r, m in zip(order, rows, strict=True)]
        step, hidden = make_step(step_id, 3, seqs)
        got = engine.draft_tensors(step, hidden).drafts
        for i, (r, m) in enumerate(zip(order, rows, strict=True)):
            n[r] += m
            assert got[i].tolist() == reference_drafts(head, ids[r][: n[r]], hid[r][: n[r]], 3), (step_id, r)


@pytest.mark.parametrize("name", ["eagle1", "eagle3"])
def test_a_mixed_step_attends_in_groups_not_padded_to_its_longest_chunk(toy_heads, name, monkeypatch):
    """A prompt chunk beside decode rows (``CacheAttention.groups``): each sequence still gets its from-scratch
    drafts, and no attention call holds more query rows than a group's own (here: the 40-row chunk alone, the
    three short sequences padded to 3 rows), not 4 x 40."""
    from actors.drafter import engine as engine_module

    shapes: list[tuple[int, int]] = []

    def recording_attend(q, k, v, mask):
        shapes.append((q.shape[0], q.shape[1]))  # [B, Tq]
        return sdpa_attend(q, k, v, mask)

    monkeypatch.setattr(engine_module, "sdpa_attend", recording_attend)
    target_dir, heads = toy_heads
    head = load_head(heads[name], target_dir)
    engine = DrafterEngine(head, DrafterEngineConfig(max_model_len=128))
    width = head.spec.fused_hidden_size
    g = torch.Generator().manual_seed(5)
    rids, rows = ["a", "b", "c", "d"], {"a": 3, "b": 40, "c": 2, "d": 3}
    ids = {r: torch.randint(0, 300, (60,), generator=g) for r in rids}
    hid = {r: torch.randn(60, width, generator=g) for r in rids}
    engine.draft_tensors(*make_step(0, 3, [(r, 0, ids[r][:4], hid[r][:4]) for r in rids]))  # 4 rows cached each
    shapes.clear()
    step, hidden = make_step(1, 3, [(r, 4, ids[r][4 : 4 + rows[r]], hid[r][4 : 4 + rows[r]]) for r in rids])
    got = engine.draft_tensors(step, hidden).drafts
    for i, r in enumerate(rids):
        n = 4 + rows[r]
        assert got[i].tolist() == reference_drafts(head, ids[r][:n], hid[r][:n], 3), r
    context = shapes[: len(head.layers) * 2]  # the context pass: two groups per layer, then one-row chain passes
    assert sorted(set(context)) == [(1, 40), (3, 3)], shapes
    assert max(b * t for b, t in shapes) == 40
