"""Sequences without drafts for a step (``RemoteEagleProposer.limit_drafts`` / ``trim_drafts``, the worker's
``take_draft_token_ids``): with no usable drafter the proposer ships nothing, waits for nothing and proposes no draft
tokens for any sequence, so vLLM's scheduler schedules none (its lists are empty, not placeholders to reject); a
sequence whose drafter failed gets none while the others keep theirs; the counters ``/metrics`` shows say so; and
drafting resumes once a drafter is usable again. Fake client, no vLLM engine."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from vllm.v1.outputs import DraftTokenIds

from actors.messages import DraftStatus, DraftStep
from actors.metrics import ProposerStats
from actors.verifier.client import BatchTiming, DraftReply, Undrafted
from actors.verifier.draft_length import build_draft_length
from actors.verifier.proposer import RemoteEagleProposer, SentDrafts
from actors.verifier.worker import RemoteDraftWorker
from tests.actors.fake_proposer import InstantClient, K, proposer, run_step, send_step


def scheduled(p: RemoteEagleProposer, req_ids: list[str]) -> list[list[int]]:
    """What vLLM's scheduler gets through the worker: the runner's [B, k] drafts, cut by the proposer."""
    runner_out = DraftTokenIds(list(req_ids), [[7] * K for _ in req_ids])
    worker = object.__new__(RemoteDraftWorker)
    worker.model_runner = SimpleNamespace(drafter=p, take_draft_token_ids=lambda: runner_out)
    return worker.take_draft_token_ids().draft_token_ids


def steps_sent(p: RemoteEagleProposer) -> int:
    return len(p.client.steps)


def test_no_usable_drafter_schedules_no_draft_tokens_and_ships_nothing():
    p = proposer()
    run_step(p, [("a", 0, 4), ("b", 0, 3)])  # prompt steps, drafted
    assert scheduled(p, ["a", "b"]) == [[7, 7], [7, 7]] and set(p.state.pending) == {"a", "b"}
    p.client.drafters = 0  # the only drafter is gone (quarantined, deleted, never deployed)
    p.scheduler_finished(["b"])
    run_step(p, [("a", 4, 2)])
    assert steps_sent(p) == 1  # nothing shipped to any drafter
    assert p.draft_lengths == {"a": 0} and scheduled(p, ["a"]) == [[]]
    assert p.client.freed == ["b"]  # finished sequences are still freed (on the drafters still known)
    assert p.state.pending == {}  # no drafts proposed: no acceptance to count next step
    assert p.state.steps_without_drafts == 1 and p.state.undrafted == {Undrafted.NO_DRAFTER: 1}
    assert p.state.steps == 1  # draft steps sent: only the first
    # a's drafts of the first step were accepted (2 rows follow k = 2 drafts: 1 accepted), counted as usual
    assert p.state.per_request["a"].num_drafts == 1 and p.state.per_request["a"].num_accepted_tokens == 1

    run_step(p, [("a", 6, 1)])  # one row: vLLM verified no draft for it; nothing counted as a draft
    assert p.state.per_request["a"].num_drafts == 1 and p.state.steps_without_drafts == 2

    p.client.drafters = 1  # a drafter is attached again: the next step drafts
    step = run_step(p, [("a", 7, 1)])
    assert steps_sent(p) == 2 and step.seqs[0].start_position == 7  # the drafter masks what it never saw
    assert p.draft_lengths == {} and scheduled(p, ["a"]) == [[7, 7]]
    assert p.state.pending["a"] == SentDrafts(K, 7, "on_demand")


class PartlyFailing(InstantClient):
    """A client whose drafter for ``b`` failed this step (status PARTIAL, ``b`` undrafted)."""

    vocab_size = 100

    def __init__(self) -> None:
        self.steps: list[DraftStep] = []

    def usable(self) -> bool:
        return True

    def draft_batch(self, step: DraftStep, hidden: torch.Tensor) -> tuple[DraftReply, BatchTiming]:
        self.steps.append(step)
        drafts = np.full((len(step.seqs), K), 7, np.int32)
        undrafted = {i: Undrafted.FAILED for i, s in enumerate(step.seqs) if s.req_id == "b"}
        for i in undrafted:
            drafts[i] = 0
        return (DraftReply(DraftStatus.PARTIAL, drafts, "b's drafter timed out", undrafted=undrafted),
                BatchTiming(0.0, 0.0, 0.0, False))


def test_a_failed_drafter_costs_its_sequences_their_drafts_only():
    p = proposer()
    p.client = PartlyFailing()
    run_step(p, [("a", 0, 3), ("b", 0, 3)])
    assert p.draft_lengths == {"b": 0} and scheduled(p, ["a", "b"]) == [[7, 7], []]
    assert set(p.state.pending) == {"a"}
    assert p.state.failures == 1 and p.state.undrafted == {Undrafted.FAILED: 1}
    assert p.state.steps_without_drafts == 0  # a drafted


def test_limit_drafts_cuts_to_any_length():
    p = proposer()
    run_step(p, [("a", 0, 3), ("b", 0, 3)])
    p.limit_drafts("a", 1)
    assert scheduled(p, ["a", "b"]) == [[7], [7, 7]] and p.state.pending["a"].num_drafts == 1
    p.draft_lengths = {}  # the worker's next execute_model: a new step
    assert scheduled(p, ["a", "b"]) == [[7, 7], [7, 7]]


def test_a_step_with_fewer_drafts_asks_the_drafter_for_that_many():
    """A draft length below K for a step (``num_speculative_tokens_per_batch_size``, or ``auto``): the step the
    drafter gets carries it, so the drafter runs that many passes, not K; vLLM is scheduled that many; acceptance is
    counted over that many."""
    p = proposer()
    p.state.speculative_tokens = [0] * (K + 1)
    p.draft_length = build_draft_length([[1, 1, K], [2, 8, 1]], max_k=K, max_num_seqs=8)
    send_step(p, [("a", 0, 3), ("b", 0, 3)])  # a batch of 2: k = 1
    assert p.client.steps[-1].num_speculative_tokens == 1
    assert scheduled(p, ["a", "b"]) == [[7], [7]]  # the drafter's [2, 1] answer, read by the worker
    assert p.state.pending["a"].num_drafts == 1
    send_step(p, [("a", 3, 2)])  # a batch of 1: k = K
    assert p.client.steps[-1].num_speculative_tokens == K and scheduled(p, ["a"]) == [[7] * K]
    assert p.state.speculative_tokens == [0, 1, 1]


def test_counters_on_metrics():
    text = ProposerStats(steps=3, steps_without_drafts=5, undrafted={"no_drafter": 9, "failed": 2},
                         client={"drafters": 0}).prometheus()
    lines = set(text.splitlines())
    assert {"eagle_cluster_steps_without_drafts_total 5", 'eagle_cluster_undrafted_sequences_total{reason="failed"} 2',
            'eagle_cluster_undrafted_sequences_total{reason="no_drafter"} 9', "eagle_cluster_drafters 0"} <= lines
    back = ProposerStats.from_dict(ProposerStats(steps_without_drafts=5, undrafted={"failed": 2}).to_dict())
    assert back.steps_without_drafts == 5 and back.undrafted == {"failed": 2}
