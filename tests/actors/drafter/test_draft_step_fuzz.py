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
from actors.drafter.branches import BranchConfig
from actors.drafter.config import DrafterEngineConfig, DrafterSettings
from actors.messages import (
    BadStep,
    BranchTable,
    DraftResult,
    DraftStatus,
    DraftStep,
    SeqSlice,
)
from tests.actors.malformed_steps import K, check_answer, good_step, mutations
from tests.conftest import EAGLE1, TARGET

MAX_LEN = 64
ASYNC = BranchConfig(bonus_fanout=2, recovered_fanout=1)


def _actor(branches: BranchConfig | None = None, max_k: int = 4) -> DrafterActor:
    engine = DrafterEngineConfig(max_model_len=MAX_LEN, branches=branches, max_k=max_k)
    return DrafterActor(DrafterSettings(str(EAGLE1), str(TARGET), engine=engine))


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
        result = check_answer(actor.draft_step(bad_bytes, bad_hidden), spec.vocab_size)
        failed += result.status is DraftStatus.FAILED
        table = BranchTable.unpack(actor.branches(rng.choice([["a", "b"], ["a", 3, None], "ab", None, [["a"]]])))
        assert set(table.entries) <= {"a", "b"}
    assert failed >= 250 and actor.stats()["failures"] == failed

    # A good step afterwards drafts what a fresh drafter drafts (new sequences: no state of the fuzzing).
    fresh = _actor(branches)
    step, hidden = good_step(spec.fused_hidden_size, ids=("c", "d"), seed=1)
    got = DraftResult.unpack(actor.draft_step(step.pack(), hidden))
    want = DraftResult.unpack(fresh.draft_step(step.pack(), hidden))
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
    result = DraftResult.unpack(actor.draft_step(msgpack.packb(d, use_bin_type=True), hidden))
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
    result = DraftResult.unpack(actor.draft_step(step.pack(), np.zeros((5, width), np.float32)))
    assert result.status is DraftStatus.OK and result.full_seqs == [1]
