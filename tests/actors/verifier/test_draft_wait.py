"""Where the verifier waits for its drafts: ``propose`` (inside vLLM's ``sample_tokens``) only sends the step, and the
worker's ``take_draft_token_ids`` (vLLM's engine core, ``post_step``: after the step's tokens went to the clients)
reads the answer. Fake client, no vLLM engine."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from vllm.v1.outputs import DraftTokenIds

from actors.messages import DraftStatus, DraftStep
from actors.verifier.client import BatchTiming, DraftReply, Undrafted
from actors.verifier.worker import RemoteDraftWorker
from tests.actors.fake_proposer import K, proposer, send_step


class Deferred:
    """Answers a step only when it is collected, with 5s; ``fail`` makes the collection raise."""

    vocab_size = 100

    def __init__(self, fail: bool = False) -> None:
        self.events: list[str] = []
        self.fail = fail

    def usable(self) -> bool:
        return True

    def send_batch(self, step: DraftStep, hidden: torch.Tensor) -> DraftStep:
        self.events.append(f"send {step.step_id}")
        return step

    def collect_batch(self, step: DraftStep) -> tuple[DraftReply, BatchTiming]:
        self.events.append(f"collect {step.step_id}")
        if self.fail:
            raise TimeoutError("the drafter did not answer in time")
        drafts = np.full((len(step.seqs), step.num_speculative_tokens), 5, np.int32)
        return DraftReply(DraftStatus.OK, drafts), BatchTiming(0.0, 0.0, 0.0, False)

    def free(self, req_ids: list[str]) -> None:
        pass


def take(p, req_ids: list[str]) -> list[list[int]]:
    """The worker's ``take_draft_token_ids`` over a runner that holds propose's placeholders (zeros)."""
    runner_out = DraftTokenIds(list(req_ids), [[0] * K for _ in req_ids])
    worker = object.__new__(RemoteDraftWorker)
    worker.model_runner = SimpleNamespace(drafter=p, take_draft_token_ids=lambda: runner_out)
    return worker.take_draft_token_ids().draft_token_ids


def test_propose_sends_and_the_engine_core_reads_the_drafts_later():
    p = proposer()
    p.client = Deferred()
    placeholders = send_step(p, [("a", 0, 3), ("b", 0, 2)])
    assert placeholders.tolist() == [[0] * K, [0] * K] and p.client.events == ["send 0"]
    assert take(p, ["a", "b"]) == [[5] * K, [5] * K]  # the drafter's, not the placeholders
    assert p.client.events == ["send 0", "collect 0"] and len(p.state.timings) == 1
    assert take(p, ["a", "b"]) == [[0] * K, [0] * K]  # nothing in flight: the runner's own answer, read once


def test_a_step_nobody_collected_is_settled_before_the_next_is_sent():
    p = proposer()
    p.client = Deferred()
    send_step(p, [("a", 0, 3)])
    send_step(p, [("a", 3, 1)])
    assert p.client.events == ["send 0", "collect 0", "send 1"]


def test_a_drafter_that_fails_when_read_costs_that_step_its_drafts_only():
    p = proposer()
    p.client = Deferred(fail=True)
    send_step(p, [("a", 0, 3), ("b", 0, 2)])
    assert take(p, ["a", "b"]) == [[], []]  # none scheduled, so none verified
    assert p.state.failures == 1 and p.state.undrafted == {Undrafted.FAILED: 2}
    p.client.fail = False
    send_step(p, [("a", 3, 1), ("b", 2, 1)])
    assert take(p, ["a", "b"]) == [[5] * K, [5] * K]
