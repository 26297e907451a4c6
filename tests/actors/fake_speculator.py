"""A ``Speculator`` for tests (``actors.verifier.speculator``), and a ``Speculation`` over it driven one step at a time
from (req_id, first position, rows) triples, the rows made as vLLM's model runner makes them and turned into
sequences by the adapter's own functions (``actors.verifier.step_rows``). No vLLM, no Ray."""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from actors.messages import DraftStep, SeqSlice
from actors.verifier.draft_length import DraftLength, FixedDraftLength, StepDraftLength
from actors.verifier.speculation import Speculation
from actors.verifier.speculator import Drafts
from actors.verifier.step_rows import packed_step_rows, prompt_roles

K = 2  # the engine's num_speculative_tokens
DRAFT = 7  # the token FakeSpeculator drafts
NEXT = 9  # the token the runner sampled after each sequence's last row (``batch``)
WIDTH = 4  # hidden width


class FakeSpeculator:
    """Records the steps (and their hidden rows) and frees it gets; drafts ``DRAFT`` for every sequence, answered
    when the step is collected (``draft``: what a subclass changes). ``drafters``: usable drafters (0: not
    ``ready``, so a ``Speculation`` drafts nothing and ships nothing)."""

    def __init__(self) -> None:
        self.steps: list[DraftStep] = []
        self.hidden: list[torch.Tensor] = []
        self.freed: list[str] = []
        self.drafters = 1

    def ready(self) -> bool:
        return self.drafters > 0

    def send(self, step: DraftStep, hidden: torch.Tensor) -> DraftStep:
        self.steps.append(step)
        self.hidden.append(hidden)
        return step

    def collect(self, ticket: DraftStep) -> Drafts:
        return self.draft(ticket)

    def draft(self, step: DraftStep) -> Drafts:
        return Drafts(np.full((len(step.seqs), step.num_speculative_tokens), DRAFT, np.int64))

    def free(self, req_ids: Iterable[str]) -> None:
        self.freed += list(req_ids)

    def stats(self) -> dict[str, Any]:
        return {"drafters": self.drafters}


def speculation(speculator: Any = None, policy: DraftLength | None = None) -> Speculation:
    """A ``Speculation`` over ``speculator`` (a new ``FakeSpeculator`` by default), k = ``K`` unless ``policy``."""
    return Speculation(speculator if speculator is not None else FakeSpeculator(),
                       StepDraftLength(policy if policy is not None else FixedDraftLength(K)))


def batch(seqs: list[tuple[str, int, int]]) -> dict[str, Any]:
    """vLLM's tensors for the batch ``seqs`` (req_id, first position, rows), every row accepted (no padded rejected
    rows): ``req_ids``, ``query_start_loc`` [B + 1], ``last_rows`` [B], ``positions`` [N], ``tokens`` [N] (the
    target token ids 0..N-1), ``next_ids`` [B] (``NEXT``), ``hidden`` [N, WIDTH] (row j holds j)."""
    counts = [n for _, _, n in seqs]
    qsl = torch.tensor([0, *np.cumsum(counts).tolist()])
    n = int(qsl[-1])
    return {"req_ids": [rid for rid, _, _ in seqs], "query_start_loc": qsl, "last_rows": qsl[1:] - 1,
            "positions": torch.cat([torch.arange(pos, pos + c) for _, pos, c in seqs]), "tokens": torch.arange(n),
            "next_ids": torch.full((len(seqs),), NEXT),
            "hidden": torch.arange(n, dtype=torch.float32)[:, None].expand(n, WIDTH).contiguous()}


def propose(s: Speculation, seqs: list[tuple[str, int, int]], prompt_lens: list[int] | None = None) -> list[SeqSlice]:
    """``Speculation.propose`` for the batch ``seqs``, as ``RemoteEagleProposer.propose`` makes it
    (``packed_step_rows``, ``prompt_roles``; ``prompt_lens``: each sequence's prompt length, None: all decode); nothing
    is collected yet. Returns the step's sequences."""
    b = batch(seqs)
    qsl = b["query_start_loc"]
    rows_np, counts, first, ids = packed_step_rows(qsl.numpy(), qsl, torch.zeros(len(seqs), dtype=torch.int64),
                                                   b["positions"], b["tokens"], b["next_ids"])
    offsets = np.cumsum(counts) - counts
    slices = [SeqSlice(rid, int(off), int(n), int(pos))
              for rid, off, n, pos in zip(b["req_ids"], offsets, counts, first, strict=True)]
    slices, in_prefill = prompt_roles(slices, None if prompt_lens is None else np.array(prompt_lens))
    rows = torch.from_numpy(rows_np)

    def build(k: int) -> tuple[DraftStep, torch.Tensor]:
        return DraftStep(s.stats.steps, k, slices, ids), b["hidden"][rows]

    s.propose(slices, in_prefill, build)
    return slices


def run_step(s: Speculation, seqs: list[tuple[str, int, int]], prompt_lens: list[int] | None = None) -> Drafts:
    """One step of the batch ``seqs`` (``propose``), its drafts then collected as vLLM takes them; those drafts (the
    step the speculator got, if one was sent: ``s.speculator.steps[-1]``)."""
    propose(s, seqs, prompt_lens)
    drafts = s.collect()
    assert drafts is not None
    return drafts


class _InputBatch(SimpleNamespace):
    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


def fake_runner(req_ids: list[str] | None = None, prompt_lens: np.ndarray | None = None,
                requests: dict[str, Any] | None = None) -> SimpleNamespace:
    """vLLM's model runner as ``RemoteEagleProposer`` reads it: its batch's request ids and prompt lengths (None:
    unknown), its ``CachedRequestState`` by id, its ``speculative_config``, and the two methods the adapter wraps:
    ``_prepare_inputs`` (``prepared``: the speculative config each call saw) and ``propose_draft_token_ids``
    (``proposals``: each call's arguments; returns ``"proposed"``)."""
    r = SimpleNamespace(input_batch=_InputBatch(req_ids=list(req_ids or []), num_prompt_tokens=prompt_lens),
                        requests=dict(requests or {}), speculative_config="spec", prepared=[], proposals=[])
    r._prepare_inputs = lambda scheduler_output: r.prepared.append(r.speculative_config)
    r.propose_draft_token_ids = lambda *args, **kwargs: r.proposals.append((args, kwargs)) or "proposed"
    return r


def fake_worker(monkeypatch: Any, adapter: Any, runner_out: Any = None) -> Any:
    """``actors.verifier.worker.RemoteDraftWorker`` around ``adapter`` (in its runner's drafter slot), its platform
    worker's constructor and forward stubbed out (``monkeypatch``); the runner's ``take_draft_token_ids`` answers
    ``runner_out`` (vLLM's placeholders)."""
    from actors.verifier import worker

    monkeypatch.setattr(worker._PlatformWorker, "__init__", lambda self, *a, **k: None)
    monkeypatch.setattr(worker._PlatformWorker, "execute_model", lambda self, out, *a, **k: None)
    w = worker.RemoteDraftWorker()
    w.device = torch.device("cpu")
    w.model_runner = SimpleNamespace(drafter=adapter, take_draft_token_ids=lambda: runner_out)
    assert w.adapter is adapter
    return w
