"""Where the verifier waits for its drafts: ``propose`` (inside vLLM's ``sample_tokens``) only sends the step
(``Speculator.send``), and the worker's ``take_draft_token_ids`` (vLLM's engine core, ``post_step``: after the step's
tokens went to the clients) reads the answer (``Speculator.collect``). A fake speculator behind the real adapter
(``actors.verifier.vllm_adapter``) and ``actors.verifier.speculation``; no vLLM engine."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from vllm.v1.outputs import DraftTokenIds

from actors.messages import DraftStep
from actors.verifier.draft_length import FixedDraftLength, StepDraftLength
from actors.verifier.prefix import PromptAnnouncer
from actors.verifier.speculation import Speculation
from actors.verifier.speculator import Drafts, DraftTiming, Short
from actors.verifier.vllm_adapter import RemoteEagleProposer
from actors.verifier.worker import RemoteDraftWorker

K = 2


class Deferred:
    """A ``Speculator`` that answers a step only when it is collected, with 5s; ``fail`` makes the collection
    raise."""

    def __init__(self, fail: bool = False) -> None:
        self.events: list[str] = []
        self.fail = fail

    def ready(self) -> bool:
        return True

    def send(self, step: DraftStep, hidden: torch.Tensor) -> DraftStep:
        self.events.append(f"send {step.step_id}")
        return step

    def collect(self, step: DraftStep) -> Drafts:
        self.events.append(f"collect {step.step_id}")
        if self.fail:
            raise TimeoutError("the drafter did not answer in time")
        ids = np.full((len(step.seqs), step.num_speculative_tokens), 5, np.int64)
        return Drafts(ids, timing=DraftTiming(all_hits=False))

    def free(self, req_ids) -> None:
        pass

    def stats(self) -> dict:
        return {}


def adapter(speculator: Deferred) -> RemoteEagleProposer:
    """The driver's adapter without vLLM's config: what ``propose`` and ``take`` read."""
    p = object.__new__(RemoteEagleProposer)
    p.speculation = Speculation(speculator, StepDraftLength(FixedDraftLength(K)))
    p.runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=[], num_prompt_tokens=None), requests={})
    p.prompts = PromptAnnouncer(0, False)
    return p


def send_step(p: RemoteEagleProposer, seqs: list[tuple[str, int, int]]) -> torch.Tensor:
    """``propose`` for the batch ``seqs``: (req_id, first position, rows), every row accepted; the step is sent and
    nothing is read back yet; returns propose's placeholders."""
    p.runner.input_batch.req_ids = [rid for rid, _, _ in seqs]
    counts = [n for _, _, n in seqs]
    qsl = torch.tensor([0, *np.cumsum(counts).tolist()])
    positions = torch.cat([torch.arange(pos, pos + n) for _, pos, n in seqs])
    num_tokens = int(qsl[-1])
    meta = SimpleNamespace(batch_size=lambda: len(seqs), query_start_loc_cpu=qsl, query_start_loc=qsl.clone())
    return p.propose(K, torch.arange(num_tokens), positions, torch.zeros(num_tokens, 4), torch.full((len(seqs),), 9),
                     None, meta, None)


def take(p: RemoteEagleProposer, req_ids: list[str]) -> list[list[int]]:
    """The worker's ``take_draft_token_ids`` over a runner that holds propose's placeholders (zeros)."""
    runner_out = DraftTokenIds(list(req_ids), [[0] * K for _ in req_ids])
    worker = object.__new__(RemoteDraftWorker)
    worker._take_calls = 0  # what __init__ sets (the worker counts the engine core's asks)
    worker.model_runner = SimpleNamespace(drafter=p, take_draft_token_ids=lambda: runner_out)
    return worker.take_draft_token_ids().draft_token_ids


def test_propose_sends_and_the_engine_core_reads_the_drafts_later():
    speculator = Deferred()
    p = adapter(speculator)
    placeholders = send_step(p, [("a", 0, 3), ("b", 0, 2)])
    assert placeholders.tolist() == [[0] * K, [0] * K] and speculator.events == ["send 0"]
    assert take(p, ["a", "b"]) == [[5] * K, [5] * K]  # the drafter's, not the placeholders
    assert speculator.events == ["send 0", "collect 0"] and len(p.speculation.stats.timings) == 1
    assert take(p, ["a", "b"]) == [[0] * K, [0] * K]  # nothing in flight: the runner's own answer, read once


def test_a_step_nobody_collected_is_settled_before_the_next_is_sent():
    speculator = Deferred()
    p = adapter(speculator)
    send_step(p, [("a", 0, 3)])
    send_step(p, [("a", 3, 1)])
    assert speculator.events == ["send 0", "collect 0", "send 1"]


def test_a_drafter_that_fails_when_read_costs_that_step_its_drafts_only():
    speculator = Deferred(fail=True)
    p = adapter(speculator)
    send_step(p, [("a", 0, 3), ("b", 0, 2)])
    assert take(p, ["a", "b"]) == [[], []]  # none scheduled, so none verified
    assert p.speculation.stats.failures == 1 and p.speculation.stats.short == {Short.FAILED: 2}
    speculator.fail = False
    send_step(p, [("a", 3, 1), ("b", 2, 1)])
    assert take(p, ["a", "b"]) == [[5] * K, [5] * K]
