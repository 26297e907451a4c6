"""A running request that vLLM did not schedule in a step is not finished (hardening): vLLM's runner takes it out
of ``input_batch`` for that step (``_update_states``: every cached request not scheduled, under a tight token
budget or a preemption) and puts it back later. The proposer frees draft state only for what the scheduler
finished (``SchedulerOutput.finished_req_ids``, handed over by the worker), so the request comes back drafting
with its context, and its acceptance is still counted.

No engine: the proposer is built without vLLM's config (what ``propose`` reads), with a fake client."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from actors.messages import DraftStatus, DraftStep
from actors.verifier.client import DraftReply, ProposeTiming
from actors.verifier.proposer import ProposerState, RemoteEagleProposer

K = 2


class Client:
    """Records the steps and frees it gets; drafts 7s."""

    vocab_size = 100

    def __init__(self) -> None:
        self.steps: list[DraftStep] = []
        self.freed: list[str] = []

    def propose(self, step: DraftStep, hidden: torch.Tensor) -> tuple[DraftReply, ProposeTiming]:
        self.steps.append(step)
        drafts = np.full((len(step.seqs), step.num_speculative_tokens), 7, np.int32)
        return DraftReply(DraftStatus.OK, drafts), ProposeTiming(0.0, 0.0, 0.0, False)

    def free(self, req_ids: list[str]) -> None:
        self.freed += req_ids


def proposer() -> RemoteEagleProposer:
    p = object.__new__(RemoteEagleProposer)
    p.is_driver, p.client, p.state, p._finished, p.device = True, Client(), ProposerState(), set(), torch.device("cpu")
    p.runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=[]))
    return p


def run_step(p: RemoteEagleProposer, seqs: list[tuple[str, int, int]]) -> DraftStep:
    """One step of the batch ``seqs``: (req_id, first position, rows), every row accepted; the step the client got."""
    p.runner.input_batch.req_ids = [rid for rid, _, _ in seqs]
    counts = [n for _, _, n in seqs]
    qsl = torch.tensor([0, *np.cumsum(counts).tolist()])
    positions = torch.cat([torch.arange(pos, pos + n) for _, pos, n in seqs])
    num_tokens = int(qsl[-1])
    meta = SimpleNamespace(batch_size=lambda: len(seqs), query_start_loc_cpu=qsl)
    p.propose(K, torch.arange(num_tokens), positions, torch.zeros(num_tokens, 4), torch.full((len(seqs),), 9), None,
              meta, None)
    return p.client.steps[-1]


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
