"""A running request that vLLM did not schedule in a step is not finished (hardening): vLLM's runner takes it out
of ``input_batch`` for that step (``_update_states``: every cached request not scheduled, under a tight token
budget or a preemption) and puts it back later. The proposer frees draft state only for what the scheduler
finished (``SchedulerOutput.finished_req_ids``, handed over by the worker), so the request comes back drafting
with its context, and its acceptance is still counted.

No engine: the proposer is built without vLLM's config (what ``propose`` reads), with a fake client."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tests.actors.fake_proposer import proposer, run_step


def test_unscheduled_request_keeps_its_draft_state_and_acceptance():
    p = proposer()
    run_step(p, [("a", 0, 4), ("b", 0, 4)])
    step = run_step(p, [("a", 4, 2)])  # "b" was not scheduled: still running
    assert step.finished == [] and "b" in p.state.pending
    step = run_step(p, [("a", 6, 1), ("b", 4, 3)])  # "b" is back where it stopped, 2 of its drafts accepted
    assert step.finished == [] and [s.start_position for s in step.seqs] == [6, 4]
    assert p.state.per_request["b"].num_accepted_tokens == 2 and p.state.per_request["b"].num_drafts == 1


def test_only_scheduler_finished_requests_are_freed():
    p = proposer()
    run_step(p, [("a", 0, 4), ("b", 0, 4)])
    p.scheduler_finished({"a"})
    assert run_step(p, [("b", 4, 1)]).finished == ["a"]
    assert run_step(p, [("b", 5, 1)]).finished == []  # sent once
    assert "a" not in p.state.pending

    # The engine goes idle: what finished since the last step is freed with the idle step's own finished.
    p.scheduler_finished({"b"})
    p.free_now(["c"])
    assert sorted(p.client.freed) == ["b", "c"]
    assert run_step(p, [("d", 0, 2)]).finished == []


def test_non_driver_ranks_keep_nothing():
    p = proposer()
    p.is_driver = False
    p.scheduler_finished({"a"})
    assert p._finished == set()


def test_worker_hands_the_scheduler_finished_requests_to_the_proposer(monkeypatch):
    from actors.verifier import worker

    monkeypatch.setattr(worker._PlatformWorker, "__init__", lambda self, *a, **k: None)
    monkeypatch.setattr(worker._PlatformWorker, "execute_model", lambda self, out, *a, **k: None)
    w = worker.RemoteDraftWorker()
    w.device = torch.device("cpu")
    p = proposer()
    w.model_runner = SimpleNamespace(drafter=p)
    w.execute_model(SimpleNamespace(total_num_scheduled_tokens=4, finished_req_ids={"a"}))
    assert p._finished == {"a"} and p.client.freed == []
    w.execute_model(SimpleNamespace(total_num_scheduled_tokens=0, finished_req_ids={"b"}))  # going idle
    assert p._finished == set() and sorted(p.client.freed) == ["a", "b"]
