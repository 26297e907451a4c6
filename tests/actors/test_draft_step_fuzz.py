"""A drafter answers whatever it is sent: malformed ``DraftStep`` bytes (truncated, wrong types, missing fields) and
out-of-bounds values (k past the drafter's ``max_k``, positions, token ids, the hidden array's shape and dtype
against ``hidden_dtype``) get a ``FAILED`` ``DraftResult`` naming the reason (``actors.messages.BadStep``), never an
exception or a traceback, and change nothing: a good step afterwards drafts what a fresh drafter drafts. The
drafter is the shipped tiny EAGLE head in an in-process ``DrafterActor`` (no Ray)."""

from __future__ import annotations

import random

import msgpack
import numpy as np
import pytest

from actors.drafter.actor import DrafterActor
from actors.messages import (
    MAX_POSITION,
    BadStep,
    BranchTable,
    DraftResult,
    DraftStatus,
    DraftStep,
    SeqRole,
    SeqSlice,
)
from tests.conftest import EAGLE1, TARGET

K, MAX_LEN = 3, 64
ASYNC = {"bonus_fanout": 2, "recovered_fanout": 1}


def _actor(branches=None, max_k: int = 4) -> DrafterActor:
    return DrafterActor(str(EAGLE1), str(TARGET), max_model_len=MAX_LEN, branches=branches, max_k=max_k)


def good_step(width: int, ids=("a", "b"), seed: int = 0) -> tuple[DraftStep, np.ndarray]:
    rng = np.random.default_rng(seed)
    seqs = [SeqSlice(ids[0], 0, 3, 0), SeqSlice(ids[1], 3, 2, 0, SeqRole.DRAFT)]
    return (DraftStep(7, K, seqs, rng.integers(0, 200, 5).astype(np.int32)),
            rng.standard_normal((5, width)).astype(np.float32))


JUNK = [None, True, False, -1, 0, 1, 3, 2**31, 2**63 - 1, -(2**63), 1.5, float("nan"), "", "x", "draft", b"",
        b"\x00\x01\x02", [], [1], ["a"], [[1, 2]], {}, {"a": 1}]


def mutations(rng: random.Random, packed: bytes, hidden: np.ndarray):
    """(step bytes, hidden) pairs, each with something wrong (or, rarely, harmless)."""
    d = msgpack.unpackb(packed, raw=False)
    width = hidden.shape[1]
    kind = rng.randrange(9)
    if kind == 0:  # truncated, or trailing bytes, or random bytes, or not bytes at all
        choice = rng.randrange(4)
        if choice == 0:
            return packed[: rng.randrange(len(packed))], hidden
        if choice == 1:
            return packed + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))), hidden
        if choice == 2:
            return bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))), hidden
        return rng.choice([None, "step", 3, [packed]]), hidden
    if kind == 1:  # a field replaced or missing
        key = rng.choice(sorted(d))
        if rng.random() < 0.2:
            d.pop(key)
        else:
            d[key] = rng.choice(JUNK)
    elif kind == 2:  # k out of bounds
        d["k"] = rng.choice([-5, -1, 5, 17, 1000, 2**31, 2**63 - 1])
    elif kind == 3:  # one field of a sequence
        row = d["seqs"][rng.randrange(len(d["seqs"]))]
        j = rng.randrange(5)
        row[j] = rng.choice(JUNK + [-(10**6), 10**6, MAX_POSITION, 2**40, "context", "nope"])
    elif kind == 4:  # a sequence row of the wrong length, or sequences that do not tile
        if rng.random() < 0.5:
            d["seqs"][0] = d["seqs"][0][: rng.randrange(5)] + ([0] * rng.randrange(2))
        else:
            d["seqs"].append(d["seqs"][rng.randrange(len(d["seqs"]))])
    elif kind == 5:  # input ids: wrong byte count, outside the vocabulary, another length
        d["input_ids"] = rng.choice([
            d["input_ids"][:-1], d["input_ids"] + b"\x00",
            np.array([0, 1, 2, 3, 10**8], np.int32).tobytes(), np.array([0, -1, 2, 3, 4], np.int32).tobytes(),
            np.arange(4, dtype=np.int32).tobytes(), "ids",
        ])
    elif kind == 6:  # hidden_dtype
        d["hidden_dtype"] = rng.choice(["bfloat16", "float16", "float64", "int8", "", "x" * 1000])
    elif kind == 7:  # the hidden array's dtype, shape or type
        hidden = rng.choice([
            hidden.astype(np.float64), hidden.astype(np.float16), hidden.view(np.int32), hidden.astype(np.int64),
            hidden[:, : width - 1], hidden[:-1], np.concatenate([hidden, hidden]), hidden.reshape(-1),
            hidden[None], np.zeros((0, width), np.float32), hidden.astype(bool), hidden.tolist(), None, b"hidden",
            hidden.astype(object),
        ])
    else:  # positions past what int32 holds
        d["seqs"][rng.randrange(len(d["seqs"]))][3] = rng.choice([MAX_POSITION, 2**40, 2**63 - 1])
    return msgpack.packb(d, use_bin_type=True), hidden


def check_answer(answer: bytes, vocab: int, max_k: int = 4) -> DraftResult:
    result = DraftResult.unpack(answer)
    if result.status is DraftStatus.FAILED:
        assert result.error.startswith("draft step: "), result.error  # a BadStep's reason, not a traceback
    else:  # a harmless mutation (a step id, an extra sequence field that still holds up)
        assert result.status is DraftStatus.OK
        assert result.draft_token_ids.ndim == 2 and result.draft_token_ids.shape[1] <= max_k
        assert ((result.draft_token_ids >= 0) & (result.draft_token_ids < vocab)).all()
    return result


@pytest.mark.parametrize("branches", [None, ASYNC], ids=["sync", "async"])
def test_fuzzed_steps_are_refused_and_change_nothing(branches):
    actor = _actor(branches)
    spec = actor.engine.spec
    step, hidden = good_step(spec.fused_hidden_size)
    packed = step.pack()
    rng = random.Random(0)
    failed = 0
    for _ in range(300):
        bad_bytes, bad_hidden = mutations(rng, packed, hidden)
        result = check_answer(actor.propose(bad_bytes, bad_hidden), spec.vocab_size)
        failed += result.status is DraftStatus.FAILED
        table = BranchTable.unpack(actor.branches(rng.choice([["a", "b"], ["a", 3, None], "ab", None, [["a"]]])))
        assert set(table.entries) <= {"a", "b"}
    assert failed >= 250 and actor.stats()["failures"] == failed

    # A good step afterwards drafts what a fresh drafter drafts (new sequences: no state of the fuzzing).
    fresh = _actor(branches)
    step, hidden = good_step(spec.fused_hidden_size, ids=("c", "d"), seed=1)
    got = DraftResult.unpack(actor.propose(step.pack(), hidden))
    want = DraftResult.unpack(fresh.propose(step.pack(), hidden))
    assert got.status is DraftStatus.OK and got.draft_token_ids.shape == (2, K)
    assert got.draft_token_ids.tolist() == want.draft_token_ids.tolist()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda d, h: d.update(k=5), r"num_speculative_tokens 5 outside \[0, 4\]"),
        (lambda d, h: d.update(k=-1), "num_speculative_tokens -1"),
        (lambda d, h: d.update(k=2**63 - 1), "num_speculative_tokens"),
        (lambda d, h: d.update(k=2.0), "k must be an integer"),
        (lambda d, h: d.update(k=True), "k must be an integer"),
        (lambda d, h: d.pop("seqs"), r"missing fields \['seqs'\]"),
        (lambda d, h: d["seqs"][0].__setitem__(3, 2**40), "bad slice for 'a'"),
        (lambda d, h: d["seqs"][0].__setitem__(4, "maybe"), "role"),
        (lambda d, h: d["seqs"][0].__setitem__(0, 7), "req_id must be a string"),
        (lambda d, h: d.update(input_ids=b"\x00" * 19), "int32 bytes"),
        (lambda d, h: d.update(hidden_dtype="float64"), "hidden_dtype 'float64' is none of"),
        (lambda d, h: d.update(hidden_dtype="bfloat16"), "hidden array of float32 for hidden_dtype bfloat16"),
    ],
)
def test_each_refusal_names_the_field(change, reason):
    import re

    actor = _actor()
    step, hidden = good_step(actor.engine.spec.fused_hidden_size)
    d = msgpack.unpackb(step.pack(), raw=False)
    change(d, hidden)
    result = DraftResult.unpack(actor.propose(msgpack.packb(d, use_bin_type=True), hidden))
    assert result.status is DraftStatus.FAILED and re.search(reason, result.error), result.error
    assert result.step_id in (-1, 7) and actor.engine.num_active_sequences == 0


def test_hidden_array_must_match_hidden_dtype():
    step, hidden = good_step(8)
    step.check_hidden(hidden)
    for bad in (hidden.astype(np.float64), hidden.view(np.int32), hidden.reshape(-1), hidden.tolist()):
        with pytest.raises(BadStep):
            step.check_hidden(bad)
    step.hidden_dtype = "bfloat16"
    step.check_hidden(np.zeros((5, 8), np.int16))  # bf16 travels as int16 bits
    with pytest.raises(BadStep, match="travels as int16"):
        step.check_hidden(hidden)


def test_unpack_refuses_malformed_bytes():
    step, _ = good_step(8)
    packed = step.pack()
    assert DraftStep.unpack(packed).seqs == step.seqs
    for bad in (packed[:-3], packed + b"\x01", b"", b"\xc1", msgpack.packb([1, 2]), "str"):
        with pytest.raises(BadStep, match="^draft step: "):
            DraftStep.unpack(bad)


def test_rows_past_max_model_len_get_no_drafts_not_a_failure():
    """Positions within int32 but past this drafter's ``max_model_len`` are the room rule's, not an error: that
    sequence gets no drafts and the others still draft (a pool's ``max_model_len`` may be below the verifier's)."""
    actor = _actor()
    width = actor.engine.spec.fused_hidden_size
    seqs = [SeqSlice("short", 0, 3, 0), SeqSlice("long", 3, 2, MAX_LEN + 100)]
    step = DraftStep(1, K, seqs, np.arange(5, dtype=np.int32))
    result = DraftResult.unpack(actor.propose(step.pack(), np.zeros((5, width), np.float32)))
    assert result.status is DraftStatus.OK and result.full_rows == [1]
