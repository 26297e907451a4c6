"""Image rows in a draft step: the message carries them (msgpack, validated), sub-steps keep them, and the drafter
uses the target's merged embedding exactly where vLLM's EAGLE heads do (the input embedding of those rows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.drafter.branches import BranchConfig
from actors.drafter.config import DrafterEngineConfig
from actors.drafter.engine import DrafterEngine
from actors.eagle.checkpoint import load_head
from actors.messages import BadStep, DraftStep, SeqSlice
from actors.verifier.step_rows import mm_rows
from tests.actors.drafter.test_drafter_engine import causal_attend, make_step


def _mm_step(hidden_width: int, embed_width: int, rows: list[int], dtype=np.float32):
    ids = np.arange(1, 9, dtype=np.int32)
    step = DraftStep(3, 2, [SeqSlice("a", 0, 5, 0), SeqSlice("b", 5, 3, 10)], ids)
    step.mm_rows = np.array(rows, np.int32)
    step.mm_embeds = np.arange(len(rows) * embed_width, dtype=np.float32).reshape(len(rows), embed_width)
    step.mm_embeds = step.mm_embeds.astype(dtype)
    return step


def test_pack_round_trip_and_text_steps_pack_nothing_more():
    step = _mm_step(16, 4, [1, 2, 6])
    back = DraftStep.unpack(step.pack())
    assert back.mm_rows.tolist() == [1, 2, 6]
    assert np.array_equal(back.mm_embeds, step.mm_embeds)
    back.validate(8, 16, 16, vocab_size=100, embed_width=4)
    text = DraftStep(3, 2, step.seqs, step.input_ids)
    assert len(text.pack()) < len(step.pack())
    assert b"mm" not in text.pack()
    assert DraftStep.unpack(text.pack()).num_mm_rows == 0


def test_select_keeps_image_rows_of_the_chosen_sequences():
    step = _mm_step(16, 4, [1, 2, 6])
    sub, rows = step.select([1, 0])  # b (rows 5-7) then a (rows 0-4)
    assert rows.tolist() == [5, 6, 7, 0, 1, 2, 3, 4]
    assert sub.mm_rows.tolist() == [1, 4, 5]  # step rows 6, 1, 2
    assert np.array_equal(sub.mm_embeds, step.mm_embeds[[2, 0, 1]])
    only_b_text, _ = DraftStep(3, 2, step.seqs, step.input_ids, mm_rows=np.array([1], np.int32),
                               mm_embeds=step.mm_embeds[:1]).select([1])
    assert only_b_text.num_mm_rows == 0 and only_b_text.mm_embeds is None


@pytest.mark.parametrize(("rows", "embeds", "match"), [
    ([2, 1], None, "ascending"),
    ([1, 1], None, "ascending"),
    ([8], None, "ascending"),
    ([-1], None, "ascending"),
    ([1, 2], np.zeros((3, 4), np.float32), r"mm_embeds must be \[2"),
    ([1, 2], np.zeros((2, 5), np.float32), "width 5"),
    ([1, 2], np.zeros((2, 4), np.float64), "float64"),
])
def test_bad_image_rows_are_refused(rows, embeds, match):
    step = _mm_step(16, 4, [0] * len(rows))
    step.mm_rows = np.array(rows, np.int32)
    if embeds is not None:
        step.mm_embeds = embeds
    with pytest.raises(BadStep, match=match):
        step.validate(8, 16, 16, vocab_size=100, embed_width=4)


@pytest.mark.parametrize("raw", [
    {"mm": "x"}, {"mm": [b"\x00\x00\x00\x00", [1, 4], b"\x00" * 15]}, {"mm": [b"\x00\x00\x00", [1, 4], b""]},
    {"mm": [b"\x00\x00\x00\x00", [2, 4], b"\x00" * 16]}, {"mm": [b"\x00\x00\x00\x00", ["1", 4], b"\x00" * 16]},
])
def test_malformed_image_fields_are_refused_on_unpack(raw):
    import msgpack

    d = msgpack.unpackb(_mm_step(16, 4, [1]).pack(), raw=False)
    d.update(raw)
    with pytest.raises(BadStep):
        DraftStep.unpack(msgpack.packb(d, use_bin_type=True))


def _reference(head, ids, hidden, k, mm_rows, mm_embeds):
    """Recompute from scratch with vLLM's merge: embeds at ``mm_rows`` replaced, then k greedy drafts."""
    ids, hid = list(ids), list(head.combine(hidden))
    drafts, mm = [], (torch.tensor(mm_rows), mm_embeds)
    for _ in range(k):
        pos = torch.arange(len(ids))
        out, fed = head(torch.tensor(ids), torch.stack(hid), pos, causal_attend(head, pos), mm=mm)
        d = int(head.greedy(out[-1]))
        drafts.append(d)
        ids.append(d)
        hid.append(fed[-1])
    return drafts


@pytest.mark.parametrize("name", ["eagle1", "eagle3"])
@pytest.mark.parametrize("branches", [None, BranchConfig(bonus_fanout=2, recovered_fanout=1)], ids=["sync", "async"])
def test_drafter_uses_image_embeddings_where_vllm_does(toy_heads, name, branches):
    target_dir, heads = toy_heads
    head = load_head(heads[name], target_dir)
    width, h = head.spec.fused_hidden_size, head.spec.hidden_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 300, (12,), generator=g)
    hidden = torch.randn(12, width, generator=g)
    mm_rows = [6, 7, 8, 9, 10, 11]  # an "image" up to the last prompt row (its input is the image's last patch)
    image = torch.randn(len(mm_rows), h, generator=g) * 10
    k = 3

    def run(with_image: bool, embeds: torch.Tensor | None = None):
        engine = DrafterEngine(load_head(heads[name], target_dir),
                               DrafterEngineConfig(max_model_len=128, branches=branches))
        step, hid = make_step(0, k, [("a", 0, ids, hidden)])
        if with_image:
            step.mm_rows = np.array(mm_rows, np.int32)
            step.mm_embeds = (image if embeds is None else embeds).numpy()
        first = engine.draft_tensors(step, hid).drafts[0].tolist()
        # the next step (one accepted token) reads the image rows from the draft KV cache
        step2, hid2 = make_step(1, k, [("a", 12, [int(ids[0])], hidden[:1])])
        return first, engine.draft_tensors(step2, hid2).drafts[0].tolist()

    got, got_next = run(True)
    if branches is None:
        assert got == _reference(head, ids, hidden, k, mm_rows, image)
    plain, plain_next = run(False)
    assert (got, got_next) != (plain, plain_next)  # the image changed what was drafted
    # the image rows set to embed_tokens(ids) is the text-only step, exactly
    same = run(True, head.embed_tokens(ids[mm_rows]).detach())
    assert same == (plain, plain_next)


def test_image_rows_from_vllm_inputs():
    """vLLM's (mm_embeds, is_mm_embed) over the scheduled tokens -> the shipped rows and their embeddings."""
    e = torch.arange(3 * 2, dtype=torch.float32).view(3, 2)
    is_mm = torch.tensor([False, True, True, False, True])
    rows, emb = mm_rows(([e[:2], e[2:]], is_mm), torch.tensor([0, 1, 4]), 5)
    assert rows.tolist() == [1, 2]
    assert torch.equal(emb, e[[0, 2]])
    rows, emb = mm_rows(([e], is_mm), torch.tensor([0, 3]), 5)
    assert rows.tolist() == [] and emb is None
    assert mm_rows(None, torch.tensor([0]), 5)[1] is None
    # non-padded path: rows dropped (4 of 5 left) no longer line up with the scheduled tokens -> nothing shipped
    assert mm_rows(([e], is_mm), torch.tensor([0, 1]), 4, padded=False)[1] is None
    assert mm_rows(([e], is_mm), torch.tensor([0, 1]), 5, padded=False)[0].tolist() == [1]
