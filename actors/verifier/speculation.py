"""One verifier's drafting, step by step, with no vLLM in it: the three calls of a step over the ``Speculator`` seam.

Where it sits: ``actors.verifier.vllm_adapter`` turns vLLM's rows into sequences and, when asked, one ``DraftStep``;
this decides what happens to them, and hands back the ``Drafts`` that the adapter gives vLLM's scheduler:

    speculation.propose(seqs, in_prefill, build)  # vLLM's propose: acceptance of the last drafts, this step's k,
                                                  #   the step sent (nothing waited for)
    drafts = speculation.collect()                # vLLM's take_draft_token_ids: the drafts, waited for now
    speculation.finish(req_ids)                   # the scheduler finished these: freed everywhere, one path

A step drafts nothing, and ships nothing, when the policy chooses k = 0 or no drafter is ready: then every sequence
gets no draft token (``Drafts.lengths``), and vLLM runs the next step as a target-only one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np
import torch

from actors.messages import DraftStep, SeqRole, SeqSlice
from actors.metrics import COUNTER_KEYS, ProposerStats
from actors.verifier.acceptance import Acceptance
from actors.verifier.draft_length import StepDraftLength
from actors.verifier.speculator import Drafts, Short, Speculator
from actors.verifier.step_stats import StepStats

logger = logging.getLogger(__name__)


class _Sent(NamedTuple):
    ticket: Any  # the speculator's
    seqs: list[SeqSlice]
    in_prefill: list[bool]
    num_tokens: int
    send_ms: float  # the verifier's time making and sending the step


class Speculation:
    def __init__(self, speculator: Speculator, lengths: StepDraftLength) -> None:
        self.speculator = speculator
        self.lengths = lengths
        self.acceptance = Acceptance(lengths.policy.observe_acceptance)
        self.stats = StepStats()
        self._sent: _Sent | None = None  # a step sent, until collect reads it
        self._now: Drafts | None = None  # or a step's drafts known at once: none for any sequence

    def propose(self, seqs: list[SeqSlice], in_prefill: list[bool],
                build: Callable[[int], tuple[DraftStep, torch.Tensor]]) -> None:
        """A step's sequences (one ``SeqSlice`` each, in the batch's order; ``in_prefill``: a partial prefill, whose
        drafts vLLM discards); ``build(k)``: the step's ``DraftStep`` and hidden rows ``[num_tokens, width]``, made
        only when it is sent."""
        start = time.perf_counter()
        self.settle()
        self.acceptance.verified(seqs)
        clean = not any(in_prefill) and all(s.role is SeqRole.DRAFT for s in seqs)
        k = self.lengths.choose(start, len(seqs), clean)
        if k == 0:  # a target-only step: nothing shipped, drafted or verified
            self._now = Drafts(np.zeros((len(seqs), 0), np.int64))
            return
        if not self.speculator.ready():  # none found yet, all dropped, the pool gone: nothing shipped or waited for
            self._short_now(Drafts.none(len(seqs), k, Short.NO_DRAFTER))
            return
        step, hidden = build(k)
        self.stats.steps += 1
        try:
            ticket = self.speculator.send(step, hidden)
        except Exception as e:  # a drafter that errors never fails a request
            self._short_now(Drafts.none(len(seqs), k, Short.FAILED, f"{type(e).__name__}: {e}"))
            return
        self._sent = _Sent(ticket, seqs, in_prefill, step.num_tokens, (time.perf_counter() - start) * 1e3)

    def without_drafter(self, batch_size: int) -> bool:
        """Whether no drafter is ready for this step, asked before vLLM prepares its inputs for a proposal: then every
        sequence is short, and the step costs what a target-only one does (no rows, no policy, no acceptance)."""
        if self.speculator.ready():
            return False
        self.settle()
        self.acceptance.forget(list(self.acceptance.pending))  # their outcome is not looked at
        self.lengths.idle()  # a period without drafting is no sample of any k
        self._short_now(Drafts.none(batch_size, self.lengths.policy.max_k, Short.NO_DRAFTER))
        return True

    def _short_now(self, drafts: Drafts) -> None:
        self.stats.failures += bool(drafts.errors)
        self.stats.count_short(drafts)
        if drafts.errors:
            logger.warning("drafting failed (%s); this step proposes no drafts", drafts.errors[0])
        self._now = drafts

    def collect(self, taken: bool = True) -> Drafts | None:
        """The drafts of the step ``propose`` saw, waited for now; None when it saw none. ``taken``: vLLM takes
        them (so they are awaited at the next step)."""
        if self._now is not None:  # none for any sequence: nothing to await
            drafts, self._now = self._now, None
            return drafts
        if self._sent is not None:
            sent, self._sent = self._sent, None
            start = time.perf_counter()
            try:
                drafts = self.speculator.collect(sent.ticket)
            except Exception as e:
                drafts = Drafts.none(len(sent.seqs), 0, Short.FAILED, f"{type(e).__name__}: {e}")
            if drafts.errors:
                logger.warning("drafter failed for %d of %d sequences (%s)", len(drafts.short), len(sent.seqs),
                               "; ".join(drafts.errors))
            self.stats.drafted(drafts, sent.num_tokens, sent.send_ms + (time.perf_counter() - start) * 1e3)
            if taken:
                self.acceptance.proposed(sent.seqs, drafts, sent.in_prefill)
            return drafts
        return None

    def nothing_to_take(self) -> bool:
        """Whether this step's drafts are known to be none at all (k = 0, or no drafter ready)."""
        return self._sent is None and self._now is not None

    def settle(self) -> None:
        """A step's drafts that vLLM never took (it takes them after every step that ran the model, so this is a
        guard): read and dropped before the next step, so the speculator's state stays whole."""
        self.collect(taken=False)

    def finish(self, req_ids: Iterable[str]) -> None:
        """Finished sequences: forgotten here, freed on their drafters. The one path that frees a sequence."""
        req_ids = list(req_ids)
        if not req_ids:
            return
        self.acceptance.forget(req_ids)
        try:
            self.speculator.free(req_ids)
        except Exception as e:  # the drafter is gone, and its state with it
            logger.info("freeing %d finished sequences failed (%s)", len(req_ids), e)

    def idle(self) -> None:
        self.lengths.idle()

    def report(self, counters_only: bool = False) -> ProposerStats:
        """This verifier's steps, acceptance, draft lengths and speculator counters (``counters_only``: what
        ``/metrics`` reads on every scrape)."""
        stats = self.speculator.stats()
        if counters_only:
            stats = {k: stats[k] for k in COUNTER_KEYS if k in stats}
        return self.stats.report(self.acceptance, self.lengths, stats, counters_only)

    def reset_measurements(self) -> None:
        """Between a benchmark's runs: per-step timings, per-request tables, the policy's timed periods; the
        counters and the drafts awaiting their step stay."""
        self.stats.timings.clear()
        self.acceptance.reset_measurements()
        history = getattr(self.lengths.policy, "history", None)  # ``auto`` only
        if history is not None:
            history.clear()
