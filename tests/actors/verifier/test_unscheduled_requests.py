"""A running request that vLLM did not schedule in a step is not finished (hardening): vLLM's runner takes it out
of ``input_batch`` for that step (``_update_states``: every cached request not scheduled, under a tight token
budget or a preemption) and puts it back later. Draft state is freed only for what the scheduler finished
(``SchedulerOutput.finished_req_ids``, which the worker's ``execute_model`` hands to the adapter's ``begin_step``,
freed at once through ``Speculation.finish``), so the request comes back drafting with its context, and its
acceptance is still counted.

No engine: a fake speculator; the adapter built from the tiny checkpoints' vLLM config (``conftest``)."""

from __future__ import annotations

from types import SimpleNamespace

from tests.actors.fake_speculator import fake_worker, run_step, speculation


def test_unscheduled_request_keeps_its_draft_state_and_acceptance():
    s = speculation()
    run_step(s, [("a", 0, 4), ("b", 0, 4)])
    run_step(s, [("a", 4, 2)])  # "b" was not scheduled: still running
    assert s.speculator.freed == [] and "b" in s.acceptance.pending
    run_step(s, [("a", 6, 1), ("b", 4, 3)])  # "b" is back where it stopped, 2 of its drafts accepted
    step = s.speculator.steps[-1]
    assert step.finished == [] and [x.start_position for x in step.seqs] == [6, 4]
    assert s.acceptance.per_request["b"].num_accepted_tokens == 2 and s.acceptance.per_request["b"].num_drafts == 1
    assert s.speculator.freed == []


def _out(tokens: int, finished: set[str]) -> SimpleNamespace:
    return SimpleNamespace(total_num_scheduled_tokens=tokens, finished_req_ids=finished)


def test_only_scheduler_finished_requests_are_freed(make_adapter):
    s = speculation()
    adapter = make_adapter(s)
    run_step(s, [("a", 0, 4), ("b", 0, 4)])
    adapter.begin_step(_out(1, {"a"}))
    assert s.speculator.freed == ["a"] and "a" not in s.acceptance.pending  # at once: not with the next step
    run_step(s, [("b", 4, 1)])
    adapter.begin_step(_out(1, set()))
    run_step(s, [("b", 5, 1)])
    assert s.speculator.freed == ["a"]  # freed once; "b", out of the batches, never
    assert all(step.finished == [] for step in s.speculator.steps)

    # The engine goes idle: what finished is freed with the idle step, before it.
    adapter.begin_step(_out(0, {"b"}))
    assert s.speculator.freed == ["a", "b"] and s.acceptance.pending == {}
    run_step(s, [("d", 0, 2)])
    assert s.speculator.freed == ["a", "b"]


def test_non_driver_ranks_keep_nothing(make_adapter):
    adapter = make_adapter(None)
    adapter.prompts.announced.add("a")
    adapter.begin_step(_out(1, {"a"}))  # nothing to free: no draft state on this rank
    assert adapter.prompts.announced == {"a"} and not adapter.nothing_to_take()


def test_the_worker_frees_what_the_scheduler_finished_at_once(monkeypatch, make_adapter):
    """``execute_model`` hands the scheduler's ``finished_req_ids`` to the adapter before the step: freed on the
    drafters at once (one call, sorted), forgotten by the acceptance and the prompt announcer; a step with no tokens
    scheduled (the engine going idle) frees its own finished and tells the draft-length policy."""
    s = speculation()
    adapter = make_adapter(s)
    w = fake_worker(monkeypatch, adapter)
    idles: list[int] = []
    s.idle = lambda: idles.append(1)
    run_step(s, [("a", 0, 4), ("b", 0, 4), ("c", 0, 4)])
    adapter.prompts.announced |= {"a", "b", "c"}
    w.execute_model(_out(4, {"c", "a"}))
    assert s.speculator.freed == ["a", "c"] and set(s.acceptance.pending) == {"b"}
    assert adapter.prompts.announced == {"b"} and idles == []
    w.execute_model(_out(4, set()))
    assert s.speculator.freed == ["a", "c"]  # nothing finished: no call
    w.execute_model(_out(0, {"b"}))  # going idle
    assert s.speculator.freed == ["a", "c", "b"] and idles == [1] and s.acceptance.pending == {}
    run_step(s, [("d", 0, 2)])
    assert s.speculator.steps[-1].finished == []  # finished sequences never travel with a step
