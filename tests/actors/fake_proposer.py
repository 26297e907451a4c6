"""A ``RemoteEagleProposer`` without vLLM: built without vLLM's config (what ``propose`` reads), with a fake draft
client, and driven one step at a time, for the proposer's own tests."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from actors.messages import DraftStatus, DraftStep
from actors.verifier.client import BatchTiming, DraftReply
from actors.verifier.proposer import ProposerState, RemoteEagleProposer

K = 2


class InstantClient:
    """A fake client's ``send_batch`` / ``collect_batch`` (what the proposer calls) from its ``draft_batch``: the
    answer is made when the step is sent, and read back as it is."""

    def send_batch(self, step: DraftStep, hidden: torch.Tensor) -> tuple[DraftReply, BatchTiming]:
        return self.draft_batch(step, hidden)

    def collect_batch(self, run: tuple[DraftReply, BatchTiming]) -> tuple[DraftReply, BatchTiming]:
        return run


class Client(InstantClient):
    """Records the steps and frees it gets; drafts 7s."""

    vocab_size = 100

    def __init__(self) -> None:
        self.steps: list[DraftStep] = []
        self.freed: list[str] = []
        self.drafters = 1  # usable drafters (0: the proposer drafts nothing and ships nothing)

    def usable(self) -> bool:
        return self.drafters > 0

    def draft_batch(self, step: DraftStep, hidden: torch.Tensor) -> tuple[DraftReply, BatchTiming]:
        self.steps.append(step)
        drafts = np.full((len(step.seqs), step.num_speculative_tokens), 7, np.int32)
        return DraftReply(DraftStatus.OK, drafts), BatchTiming(0.0, 0.0, 0.0, False)

    def free(self, req_ids: list[str]) -> None:
        self.freed += req_ids


def proposer() -> RemoteEagleProposer:
    p = object.__new__(RemoteEagleProposer)
    p.is_driver, p.client, p.state, p._finished, p.device = True, Client(), ProposerState(), set(), torch.device("cpu")
    p.runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=[]))
    p.draft_lengths = {}
    p._in_flight = None
    return p


def send_step(p: RemoteEagleProposer, seqs: list[tuple[str, int, int]]) -> torch.Tensor:
    """``propose`` for the batch ``seqs``: (req_id, first position, rows), every row accepted; the step is sent to
    the client and nothing is read back yet; returns propose's placeholders."""
    p.runner.input_batch.req_ids = [rid for rid, _, _ in seqs]
    counts = [n for _, _, n in seqs]
    qsl = torch.tensor([0, *np.cumsum(counts).tolist()])
    positions = torch.cat([torch.arange(pos, pos + n) for _, pos, n in seqs])
    num_tokens = int(qsl[-1])
    meta = SimpleNamespace(batch_size=lambda: len(seqs), query_start_loc_cpu=qsl)
    return p.propose(K, torch.arange(num_tokens), positions, torch.zeros(num_tokens, 4), torch.full((len(seqs),), 9),
                     None, meta, None)


def run_step(p: RemoteEagleProposer, seqs: list[tuple[str, int, int]]) -> DraftStep:
    """One step of the batch ``seqs`` (``send_step``), its drafts then read by ``collect_drafts``, as vLLM's runner
    and engine core do; the step the client got."""
    send_step(p, seqs)
    p.collect_drafts()
    return p.client.steps[-1]
