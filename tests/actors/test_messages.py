"""The step messages (``actors.messages``): each written once over its dataclass fields, read back equal, and
refused with the field named when the bytes do not hold up; the docstrings' worked examples."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from actors.messages import (
    BadMessage,
    BadStep,
    BranchEntry,
    BranchTable,
    DraftResult,
    DraftStatus,
    DraftStep,
    SeqRole,
    SeqSlice,
)


def _step() -> DraftStep:
    seqs = [SeqSlice("a", 0, 2, 7), SeqSlice("b", 2, 1, 0, SeqRole.CONTEXT)]
    return DraftStep(3, 2, seqs, np.array([5, 6, 7], np.int32), ["z"], "bfloat16")


def test_step_round_trip_and_wire_keys():
    step = _step()
    back = DraftStep.unpack(step.pack())
    assert (back.step_id, back.num_speculative_tokens, back.seqs, back.finished, back.hidden_dtype) == (
        3, 2, step.seqs, ["z"], "bfloat16")
    assert back.input_ids.dtype == np.int32 and back.input_ids.tolist() == [5, 6, 7]
    d = msgpack.unpackb(step.pack(), raw=False)
    assert sorted(d) == ["finished", "hidden_dtype", "input_ids", "k", "seqs", "step_id"]
    assert d["seqs"][1] == ["b", 2, 1, 0, "context"]  # a sequence travels as a row of its fields


def test_result_round_trip():
    r = DraftResult(4, DraftStatus.OK, np.arange(6, dtype=np.int32).reshape(2, 3), 1.5, "", "d1", 3, 1, 2, [0], [1])
    back = DraftResult.unpack(r.pack())
    assert back.draft_token_ids.tolist() == r.draft_token_ids.tolist()
    assert (back.step_id, back.status, back.compute_ms, back.drafter_id, back.active_sequences, back.cold_sequences,
            back.branch_lookups, back.hit_seqs, back.full_seqs) == (4, DraftStatus.OK, 1.5, "d1", 3, 1, 2, [0], [1])
    empty = DraftResult.unpack(DraftResult(0, DraftStatus.FAILED, np.zeros((0, 0), np.int32), error="x").pack())
    assert empty.draft_token_ids.shape == (0, 0) and empty.error == "x"


def test_branch_table_round_trip():
    table = BranchTable({"a": BranchEntry(9, [11, 12], {(1, 40): [1, 2], (2, 41): [3, 4]}), "b": BranchEntry(0, [])},
                        active_sequences=2, compute_ms=0.5)
    assert BranchTable.unpack(table.pack()) == table


@pytest.mark.parametrize(
    ("cls", "change", "reason"),
    [
        (DraftStep, lambda d: d.update(k="2"), "draft step: k must be an integer, got str"),
        (DraftStep, lambda d: d["seqs"][0].__setitem__(1, None), "draft step: start must be an integer"),
        (DraftStep, lambda d: d["seqs"].__setitem__(0, ["a", 0]),
         r"draft step: each of seqs must be \[req_id, start, num_tokens, start_position, role\]"),
        (DraftStep, lambda d: d.pop("finished"), r"draft step: missing fields \['finished'\]"),
        (DraftResult, lambda d: d.update(drafts=[[2, 3], b"\x00" * 4]), "draft result: drafts: 4 bytes"),
        (DraftResult, lambda d: d.update(status="maybe"), "draft result: status: 'maybe' is not a valid"),
        (DraftResult, lambda d: d.update(compute_ms="fast"), "draft result: compute_ms must be a number"),
        (BranchTable, lambda d: d["entries"]["a"].__setitem__(2, [[1]]), r"branch table: each of drafts must be"),
        (BranchTable, lambda d: d.update(entries=[]), "branch table: entries must be a map"),
    ],
)
def test_bad_fields_are_named(cls, change, reason):
    good = {DraftStep: _step(), DraftResult: DraftResult(1, DraftStatus.OK, np.zeros((2, 3), np.int32)),
            BranchTable: BranchTable({"a": BranchEntry(9, [1], {(0, 2): [3]})})}[cls]
    d = msgpack.unpackb(good.pack(), raw=False)
    change(d)
    with pytest.raises(BadMessage, match=reason) as e:
        cls.unpack(msgpack.packb(d, use_bin_type=True))
    assert isinstance(e.value, BadStep) == (cls is DraftStep)  # a drafter answers a BadStep as FAILED


def test_lookup_worked_example():
    """``BranchEntry.lookup``: L = 9, served [t1, t2]; positions 10, 11 with inputs [t1, y] -> ``drafts[(1, y)]``;
    inputs [t2, y] match no branch."""
    t1, t2, y = 11, 12, 40
    entry = BranchEntry(9, [t1, t2], {(1, y): [1, 2], (2, y): [3, 4], (0, y): [5, 6]})
    assert entry.lookup(10, [t1, y]) == [1, 2]
    assert entry.lookup(10, [t2, y]) is None
    assert entry.lookup(10, [t1, t2, y]) == [3, 4] and entry.lookup(10, [y]) == [5, 6]
    assert entry.lookup(11, [t1, y]) is None  # not the step these branches follow


def test_table_lookup_worked_example():
    """``BranchTable.lookup``: k = 2; a (CONTEXT), b (positions 10, 11, inputs [t1, y]), c (position 5, input [z]);
    b: L = 9, served [t1, t2], {(1, y): [1, 2]}; c: L = 4, served [], {} -> hits [1], misses [2], context [0],
    lookups 2."""
    t1, t2, y, z = 11, 12, 40, 50
    seqs = [SeqSlice("a", 0, 1, 0, SeqRole.CONTEXT), SeqSlice("b", 1, 2, 10), SeqSlice("c", 3, 1, 5)]
    step = DraftStep(0, 2, seqs, np.array([7, t1, y, z], np.int32))
    table = BranchTable({"b": BranchEntry(9, [t1, t2], {(1, y): [1, 2]}), "c": BranchEntry(4, [])})
    assert table.lookup(step) == ([1], [[1, 2]], [2], [0], 2)
    short = BranchTable({"b": BranchEntry(9, [t1, t2], {(1, y): [1]})})  # a branch of fewer than k drafts: a miss
    assert short.lookup(step) == ([], [], [1, 2], [0], 1)


def test_hidden_codec_worked_example():
    """``actors.wire``: bf16 travels as its int16 bits and comes back bit for bit; float16 travels as float32."""
    import torch

    from actors.wire import HIDDEN_WIRE_DTYPES, decode_hidden, encode_hidden

    h = torch.randn(2, 4).to(torch.bfloat16)
    array, dtype = encode_hidden(h)
    assert (dtype, array.dtype, array.shape) == ("bfloat16", HIDDEN_WIRE_DTYPES["bfloat16"], (2, 4))
    assert torch.equal(decode_hidden(array, dtype), h) and torch.equal(decode_hidden(array, dtype, copy=True), h)
    array, dtype = encode_hidden(h.to(torch.float16))
    assert (dtype, array.dtype) == ("float32", np.float32) and decode_hidden(array, dtype).dtype == torch.float32
