"""One verifier's drafting step by step (``actors.verifier.speculation``) over a fake speculator, no vLLM: with no
ready drafter a step ships nothing, waits for nothing and proposes no draft tokens for any sequence
(``Drafts.lengths``: vLLM's scheduler then gets empty lists, ``test_vllm_adapter``); a sequence whose drafter failed
gets none while the others keep theirs; a speculator that raises never fails a step; the counters ``/metrics`` shows
say so; drafting resumes once a drafter is ready again; finished sequences are freed on one path (``finish``)."""

from __future__ import annotations

import numpy as np
import pytest

from actors.messages import DraftStep
from actors.metrics import COUNTER_KEYS
from actors.verifier.acceptance import Proposed
from actors.verifier.speculator import Drafts, Short
from tests.actors.fake_speculator import DRAFT, NEXT, FakeSpeculator, K, propose, run_step, speculation


def steps_sent(s) -> int:
    return len(s.speculator.steps)


def test_no_ready_drafter_proposes_no_draft_tokens_and_ships_nothing():
    s = speculation()
    drafts = run_step(s, [("a", 0, 4), ("b", 0, 3)])  # drafted
    assert drafts.lengths() == [K, K] and drafts.ids.tolist() == [[DRAFT] * K] * 2
    assert set(s.acceptance.pending) == {"a", "b"}
    s.speculator.drafters = 0  # the only drafter is gone (quarantined, deleted, never deployed)
    s.finish(["b"])  # the scheduler finished b: freed at once, on the drafters still known
    assert s.speculator.freed == ["b"] and "b" not in s.acceptance.pending
    propose(s, [("a", 4, 2)])
    assert s.nothing_to_take()  # known at propose: the engine core need not ask for the drafts
    drafts = s.collect()
    assert steps_sent(s) == 1  # nothing shipped to any drafter
    assert drafts.lengths() == [0] and drafts.short == {0: Short.NO_DRAFTER} and not drafts.errors
    assert s.acceptance.pending == {}  # no drafts proposed: no acceptance to count next step
    assert s.stats.steps_without_drafts == 1 and s.stats.short == {Short.NO_DRAFTER: 1}
    assert s.stats.steps == 1 and s.stats.failures == 0  # draft steps sent: only the first; no drafter failed
    # a's drafts of the first step were accepted (2 rows follow k = 2 drafts: 1 accepted), counted as usual
    assert s.acceptance.per_request["a"].num_drafts == 1 and s.acceptance.per_request["a"].num_accepted_tokens == 1

    run_step(s, [("a", 6, 1)])  # one row: vLLM verified no draft for it; nothing counted as a draft
    assert s.acceptance.per_request["a"].num_drafts == 1 and s.stats.steps_without_drafts == 2

    s.speculator.drafters = 1  # a drafter is attached again: the next step drafts
    propose(s, [("a", 7, 1)])
    assert not s.nothing_to_take()
    drafts = s.collect()
    step = s.speculator.steps[-1]
    assert steps_sent(s) == 2 and step.seqs[0].start_position == 7  # the drafter masks what it never saw
    assert step.finished == []  # finished sequences travel through ``free``, never with a step
    assert drafts.lengths() == [K] and drafts.short == {}
    assert s.acceptance.pending["a"] == Proposed(K, 7, "on_demand")


def test_without_drafter_skips_the_step_before_anything_is_prepared():
    """``without_drafter`` (asked before vLLM prepares a proposal): with a drafter ready, nothing happens; with none,
    the step is short for every sequence at once (``NO_DRAFTER``, K wide), costing what a target-only step does: the
    drafts awaited are forgotten (their outcome is not looked at), the period is no sample of any k."""
    s = speculation()
    run_step(s, [("a", 0, 4), ("b", 0, 3)])
    assert not s.without_drafter(2) and not s.nothing_to_take() and set(s.acceptance.pending) == {"a", "b"}
    s.speculator.drafters = 0
    idles: list[int] = []
    s.lengths.idle = lambda: idles.append(1)
    assert s.without_drafter(2) and s.nothing_to_take()
    assert s.acceptance.pending == {} and idles == [1] and s.lengths.chosen == [0, 0, 1]
    assert s.stats.short == {Short.NO_DRAFTER: 2} and s.stats.steps_without_drafts == 1 and s.stats.failures == 0
    drafts = s.collect()
    assert drafts.lengths() == [0, 0] and drafts.k == K and s.collect() is None
    assert steps_sent(s) == 1 and s.acceptance.per_request == {}  # a's and b's drafts were never looked at


class PartlyFailing(FakeSpeculator):
    """``b``'s drafter failed this step (while ``failing``): ``b`` short, one error; the others drafted."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = True

    def draft(self, step: DraftStep) -> Drafts:
        drafts = super().draft(step)
        if self.failing:
            drafts.short = {i: Short.FAILED for i, s in enumerate(step.seqs) if s.req_id == "b"}
            drafts.ids[list(drafts.short)] = 0
            drafts.errors = ["b's drafter timed out"]
        return drafts


def test_a_failed_drafter_costs_its_sequences_their_drafts_only():
    s = speculation(PartlyFailing())
    drafts = run_step(s, [("a", 0, 3), ("b", 0, 3)])
    assert drafts.lengths() == [K, 0] and drafts.ids.tolist() == [[DRAFT] * K, [0] * K]
    assert set(s.acceptance.pending) == {"a"}  # pending as vLLM verifies them: b has none
    assert s.stats.failures == 1 and s.stats.short == {Short.FAILED: 1}
    assert s.stats.steps_without_drafts == 0  # a drafted
    s.speculator.failing = False  # short for that step only: the next step drafts b again
    drafts = run_step(s, [("a", 3, 2), ("b", 3, 1)])
    assert drafts.lengths() == [K, K] and set(s.acceptance.pending) == {"a", "b"}
    assert s.stats.failures == 1 and s.stats.short == {Short.FAILED: 1}
    assert "b" not in s.acceptance.per_request and s.acceptance.per_request["a"].num_accepted_tokens == 1


def test_every_sequence_failed_is_a_step_without_drafts():
    class AllFailing(FakeSpeculator):
        def draft(self, step: DraftStep) -> Drafts:
            return Drafts.none(len(step.seqs), step.num_speculative_tokens, Short.FAILED, "gone")

    s = speculation(AllFailing())
    assert run_step(s, [("a", 0, 3), ("b", 0, 3)]).lengths() == [0, 0]
    assert s.stats.steps_without_drafts == 1 and s.stats.failures == 1 and s.stats.short == {Short.FAILED: 2}
    assert s.acceptance.pending == {}


class Raising(FakeSpeculator):
    """Raises from ``send`` or ``collect`` (``where``)."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where

    def send(self, step, hidden):
        if self.where == "send":
            raise ConnectionError("drafter gone")
        return super().send(step, hidden)

    def collect(self, ticket):
        if self.where == "collect":
            raise TimeoutError("no answer in time")
        return super().collect(ticket)


@pytest.mark.parametrize("where", ["send", "collect"])
def test_a_raising_speculator_never_fails_the_step(where):
    s = speculation(Raising(where))
    propose(s, [("a", 0, 3), ("b", 0, 3)])
    assert s.nothing_to_take() == (where == "send")  # known at once when the send failed
    drafts = s.collect()
    assert drafts.lengths() == [0, 0] and drafts.short == {0: Short.FAILED, 1: Short.FAILED}
    assert drafts.errors and ("drafter gone" if where == "send" else "no answer in time") in drafts.errors[0]
    assert s.stats.failures == 1 and s.stats.short == {Short.FAILED: 2} and s.stats.steps_without_drafts == 1
    assert s.stats.steps == 1 and s.acceptance.pending == {}
    assert len(s.stats.timings) == (1 if where == "collect" else 0)  # timed when an answer was read back


def test_a_step_with_fewer_drafts_asks_the_drafter_for_that_many():
    """A draft length below K for a step (``num_speculative_tokens_per_batch_size``, or ``auto``): the step the
    drafter gets carries it, so the drafter runs that many passes, not K; vLLM is scheduled that many; acceptance is
    counted over that many."""
    from actors.verifier.draft_length import build_draft_length

    s = speculation(policy=build_draft_length([[1, 1, K], [2, 8, 1]], max_k=K, max_num_seqs=8))
    drafts = run_step(s, [("a", 0, 3), ("b", 0, 3)])  # a batch of 2: k = 1
    assert s.speculator.steps[-1].num_speculative_tokens == 1
    assert drafts.ids.shape == (2, 1) and drafts.lengths() == [1, 1]
    assert s.acceptance.pending["a"].num_drafts == 1
    drafts = run_step(s, [("a", 3, 2)])  # a batch of 1: k = K
    assert s.speculator.steps[-1].num_speculative_tokens == K and drafts.lengths() == [K]
    assert s.lengths.chosen == [0, 1, 1]


def test_a_target_only_step_ships_nothing():
    """k = 0 (the policy's choice): nothing shipped, no sequence short (nothing went wrong), nothing to take."""
    s = speculation(policy=type("Zero", (), {"max_k": K, "choose": lambda self, b: 0,
                                             "observe_period": lambda self, *a, **k: None,
                                             "observe_acceptance": lambda self, n, a: None,
                                             "goodput": lambda self, b, k: None})())
    propose(s, [("a", 0, 3)])
    assert s.nothing_to_take()
    drafts = s.collect()
    assert drafts.ids.shape == (1, 0) and drafts.lengths() == [0] and drafts.short == {}
    assert steps_sent(s) == 0 and s.stats.steps == 0 and s.stats.steps_without_drafts == 0 and s.stats.short == {}
    assert s.lengths.chosen == [1, 0, 0] and s.acceptance.pending == {}


def test_the_step_carries_the_rows_vllm_verified():
    """What ``build`` ships: each sequence's rows, input ids paired with the token after each row (the sampled
    token after its last), and the hidden rows of the shipped rows."""
    s = speculation()
    run_step(s, [("a", 7, 2), ("b", 3, 1)])
    step, hidden = s.speculator.steps[-1], s.speculator.hidden[-1]
    assert step.input_ids.tolist() == [1, NEXT, NEXT]  # target tokens 0, 1 (a), 2 (b)
    assert [(x.req_id, x.start_position, x.num_tokens) for x in step.seqs] == [("a", 7, 2), ("b", 3, 1)]
    assert hidden[:, 0].tolist() == [0, 1, 2] and step.step_id == 0 and step.num_speculative_tokens == K


def test_prompt_steps():
    """A partial prefill's drafts are discarded by vLLM (not awaited for acceptance); the prompt's last chunk drafts
    as usual; they travel as ``PREFILL`` and ``CONTEXT`` rows."""
    from actors.messages import SeqRole

    s = speculation()
    drafts = run_step(s, [("a", 0, 4), ("b", 0, 4)], prompt_lens=[8, 4])
    assert [x.role for x in s.speculator.steps[-1].seqs] == [SeqRole.PREFILL, SeqRole.CONTEXT]
    assert drafts.lengths() == [K, K] and set(s.acceptance.pending) == {"b"}


def test_drafts_never_taken_are_read_and_dropped():
    """``settle`` (the next step, or the worker's ``begin_step``): a step's drafts vLLM did not take are read back
    (the speculator's state stays whole) and not awaited for acceptance."""
    s = speculation()
    propose(s, [("a", 0, 3)])
    propose(s, [("a", 3, 1)])  # the first step's drafts were never taken
    assert len(s.stats.timings) == 1 and s.acceptance.pending == {}
    assert s.collect().lengths() == [K] and len(s.stats.timings) == 2 and "a" in s.acceptance.pending
    assert s.collect() is None  # nothing proposed since
    s.settle()
    assert len(s.stats.timings) == 2


def test_finish_is_the_one_free_path():
    s = speculation()
    run_step(s, [("a", 0, 3), ("b", 0, 3)])
    s.finish([])
    assert s.speculator.freed == []  # nothing to free: no call
    s.finish(iter(["a"]))
    assert s.speculator.freed == ["a"] and set(s.acceptance.pending) == {"b"}

    class FreeRaises(FakeSpeculator):
        def free(self, req_ids):
            raise ConnectionError("drafter gone")

    s = speculation(FreeRaises())
    run_step(s, [("a", 0, 3)])
    s.finish(["a"])  # the drafter is gone, and its state with it: not an error
    assert s.acceptance.pending == {}


def test_report_counters_only():
    """``report``: the speculator's counters (only ``COUNTER_KEYS`` when ``counters_only``, as ``/metrics`` reads)
    with this verifier's steps, acceptance and draft lengths."""
    class WithEvents(FakeSpeculator):
        def stats(self):
            return {"drafters": 2, "rehomed": 1, "events": ["d0 joined"]}

    s = speculation(WithEvents())
    run_step(s, [("a", 0, 3)])
    run_step(s, [("a", 3, 2)])
    full, counters = s.report(), s.report(counters_only=True)
    assert full.client == {"drafters": 2, "rehomed": 1, "events": ["d0 joined"]}
    assert counters.client == {"drafters": 2, "rehomed": 1} and set(counters.client) <= set(COUNTER_KEYS)
    assert full.steps == counters.steps == 2 and full.speculative_tokens == [0, 0, 2]
    assert full.per_request["a"].num_accepted_tokens == 1 and counters.per_request == {}
    assert counters.acceptance_by_source["on_demand"].num_drafts == 1


def test_drafts_lengths():
    drafts = Drafts(np.zeros((3, 2), np.int64), {1: Short.FULL})
    assert drafts.k == 2 and drafts.lengths() == [2, 0, 2]
    none = Drafts.none(2, 3, Short.CONTEXT)
    assert none.lengths() == [0, 0] and none.ids.shape == (2, 3) and none.errors == []
    assert Drafts.none(1, 0, Short.FAILED, "boom").errors == ["boom"]


def test_reset_measurements_clears_the_tables_and_keeps_the_counters():
    from actors.verifier.draft_length import AutoDraftLength

    s = speculation(policy=AutoDraftLength(K))
    for pos in range(0, 12, 3):  # decode steps: acceptance counted, periods timed by auto
        run_step(s, [("a", pos, 3)])
    s.lengths.policy.history.append((1, K, 5.0))
    assert s.stats.timings and s.acceptance.per_request and s.acceptance.pending
    steps = s.stats.steps
    s.reset_measurements()
    assert not s.stats.timings and not s.acceptance.per_request and not s.lengths.policy.history
    assert s.stats.steps == steps and s.acceptance.pending  # counters and the drafts awaited stay
