"""What the verifier does with a drafter's answer that does not hold up (``actors.verifier.remote_speculator``,
``actors.messages.check_drafts``): draft ids that are not integers, not ``[num_seqs, k]``, or outside the target's
vocabulary make that drafter a failed one (its sequences short this step, it is dropped, they re-home next step);
the engine never sees them. Fake drafter
links (plain objects whose calls return ``ray.put`` refs) stand in for drafter actors. Also ``DraftStep.validate``,
which a drafter runs on what the verifier sends."""

from __future__ import annotations

import numpy as np
import pytest
import ray
import torch

from actors.messages import (
    BadDrafts,
    BranchEntry,
    BranchTable,
    DraftResult,
    DraftStatus,
    DraftStep,
    SeqRole,
    SeqSlice,
    check_drafts,
)
from actors.verifier.remote_speculator import RemoteSpeculator
from actors.verifier.speculator import Drafts, Short

pytestmark = pytest.mark.isolated  # starts Ray (tests.run_isolated)
K, VOCAB = 3, 100


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, namespace="test-draft-validation")
    yield
    ray.shutdown()


class _Method:
    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args):
        return ray.put(self.fn(*args))


class FakeDrafter:
    """Answers ``propose`` with ``answer(step)`` (a ``[num_seqs, k]`` array, or anything) and ``branches`` with
    ``table(req_ids)`` (a ``BranchTable``, or None: no asynchronous drafting)."""

    def __init__(self, name: str, answer, table=None) -> None:
        self.name, self.answer, self.table = name, answer, table
        self.steps: list[DraftStep] = []
        self.draft_step = _Method(self._draft_step)
        self.branches = _Method(lambda ids: self.table(ids).pack())
        self.info = _Method(lambda: {"drafter_id": name, "drafts_branches": table is not None})
        self.free = _Method(lambda ids: None)

    def _draft_step(self, packed: bytes, hidden: np.ndarray) -> bytes:
        step = DraftStep.unpack(packed)
        self.steps.append(step)
        drafts = self.answer(step)
        # DraftResult.pack writes int32 bytes and the shape as given: a wrong shape goes over the wire.
        return DraftResult(step.step_id, DraftStatus.OK, np.asarray(drafts), active_sequences=1).pack()


def pool(drafters) -> RemoteSpeculator:
    """A speculator that knows each drafter once (a dropped one is not found again)."""
    speculator = RemoteSpeculator(None, new_group_size=1, vocab_size=VOCAB)
    for d in drafters:
        speculator.drafters.add(d.name, d, {"drafts_branches": d.table is not None})
    return speculator


def draft(speculator: RemoteSpeculator, sent: tuple[DraftStep, torch.Tensor]) -> Drafts:
    assert speculator.ready()
    return speculator.collect(speculator.send(*sent))


def step(step_id: int, seqs: list[tuple[str, int, list[int]]], role=SeqRole.DRAFT) -> tuple[DraftStep, torch.Tensor]:
    slices, ids, off = [], [], 0
    for rid, pos, tokens in seqs:
        slices.append(SeqSlice(rid, off, len(tokens), pos, role))
        ids += tokens
        off += len(tokens)
    return DraftStep(step_id, K, slices, np.array(ids, np.int32)), torch.zeros(off, 8)


def good(step: DraftStep) -> np.ndarray:
    return np.full((len(step.seqs), K), 7)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (lambda s: np.full((len(s.seqs), K), VOCAB), "outside the target's vocabulary"),
        (lambda s: np.full((len(s.seqs), K), -1), "outside the target's vocabulary"),
        (lambda s: np.full((len(s.seqs), K + 1), 7), "shape"),
        (lambda s: np.full((len(s.seqs) * K,), 7), "shape"),
        (lambda s: np.full((K, len(s.seqs) + 1), 7), "shape"),
    ],
    ids=["id=vocab", "id<0", "k+1", "flat", "transposed"],
)
def test_bad_drafts_fail_that_drafter_only(ray_local, bad, reason):
    liar, honest = FakeDrafter("liar", bad), FakeDrafter("honest", good)
    speculator = pool([liar, honest])
    drafts = draft(speculator, step(0, [("a", 0, [1, 2]), ("b", 0, [3])]))  # one sequence per drafter
    (lost,) = speculator.homes.lost  # the liar's sequence
    liar_row = ["a", "b"].index(lost)
    (error,) = drafts.errors
    assert reason in error and drafts.short == {liar_row: Short.FAILED} and drafts.lengths()[1 - liar_row] == K
    assert drafts.ids.shape == (2, K) and drafts.ids.dtype == np.int64
    assert not drafts.ids[liar_row].any()  # zeros, proposed to nobody
    assert (drafts.ids[1 - liar_row] == 7).all()
    assert "liar" not in speculator.drafters.links
    assert [kind for _, kind, _ in speculator.drafters.events] == ["failed"]
    # Next step: the liar's sequence moves to the honest drafter, and everything drafts.
    drafts = draft(speculator, step(1, [("a", 2, [4]), ("b", 1, [5])]))
    assert not drafts.errors and not drafts.short and (drafts.ids == 7).all()
    assert set(speculator.homes.home.values()) == {"honest"} and speculator.homes.rehomed == 1


def test_bad_branch_table_fails_that_drafter(ray_local):
    """A pipelined drafter whose branch table holds an id outside the vocabulary: no hit is served from it."""
    table = {"t": None}
    drafter = FakeDrafter("d", good, table=lambda ids: table["t"])
    speculator = pool([drafter])
    table["t"] = BranchTable({"a": BranchEntry(1, [], {(0, 5): [1, 2, VOCAB + 3]})})
    drafts = draft(speculator, step(0, [("a", 0, [1, 2])], role=SeqRole.CONTEXT))
    assert not drafts.errors and drafts.short == {0: Short.CONTEXT}
    drafts = draft(speculator, step(1, [("a", 2, [5])]))  # the guessed outcome: would be a hit
    (error,) = drafts.errors
    assert "vocabulary" in error and drafts.short == {0: Short.FAILED}
    assert not drafts.ids.any() and drafts.hits == [] and "d" not in speculator.drafters.links


def test_check_drafts():
    ok = np.array([[0, VOCAB - 1, 5]])
    assert check_drafts(ok, 1, K, VOCAB) is ok
    assert check_drafts(np.zeros((0, K), np.int32), 0, K, VOCAB).shape == (0, K)
    assert check_drafts(np.array([[10**6] * K]), 1, K, None).shape == (1, K)  # no vocabulary known: only >= 0
    for bad, reason in [(ok.astype(np.float32), "not integer"), ([[1, 2, 3]], "not integer"),
                        (ok, "shape"), (np.array([[1, 2, VOCAB]]), "vocabulary")]:
        with pytest.raises(BadDrafts, match=reason):
            check_drafts(bad, 2 if reason == "shape" else 1, K, VOCAB)
    with pytest.raises(BadDrafts, match="branch"):
        BranchTable({"a": BranchEntry(1, [], {(0, 5): []})}).check(VOCAB)
    with pytest.raises(BadDrafts, match="branch"):
        BranchTable({"a": BranchEntry(1, [], {(-1, 5): [1]})}).check(VOCAB)
    with pytest.raises(BadDrafts, match="vocabulary"):
        BranchTable({"a": BranchEntry(1, [], {(0, 5): [1, VOCAB]})}).check(VOCAB)
    table = BranchTable({"a": BranchEntry(1, [], {(0, 5): [1, VOCAB - 1]})})
    assert table.check(VOCAB) is table and table.check(None) is table


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda s: setattr(s, "input_ids", np.array([1, 2, VOCAB], np.int32)), "vocabulary"),
        (lambda s: setattr(s, "input_ids", np.array([1, -2, 3], np.int32)), "vocabulary"),
        (lambda s: setattr(s, "input_ids", np.array([1.0, 2.0, 3.0])), "integer"),
        (lambda s: setattr(s, "input_ids", np.array([[1, 2, 3]], np.int32)), "1-D"),
        (lambda s: s.seqs.__setitem__(1, SeqSlice("a", 2, 1, 0)), "twice"),
        (lambda s: s.seqs.__setitem__(1, SeqSlice("b", 2, 1, -1)), "bad slice"),
        (lambda s: s.seqs.__setitem__(1, SeqSlice("b", 1, 2, 0)), "bad slice"),
        (lambda s: s.seqs.__setitem__(1, SeqSlice("b", 2, 2, 0)), "slices cover 4 of 3"),
    ],
)
def test_draft_step_validate_bounds(change, reason):
    s, hidden = step(0, [("a", 0, [1, 2]), ("b", 0, [3])])
    s.validate(3, 8, 8, VOCAB)
    change(s)
    with pytest.raises(ValueError, match=reason):
        s.validate(hidden.shape[0], 8, 8, VOCAB)
