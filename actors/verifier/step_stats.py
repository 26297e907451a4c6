"""What the verifier's steps counted: steps sent, failures, short sequences by reason, waits and timings.

Recorded by ``actors.verifier.speculation`` once per step; read by the worker's RPCs (``eagle_cluster_stats``,
``eagle_cluster_counters``) as one ``actors.metrics.ProposerStats``, with the acceptance tables
(``actors.verifier.acceptance``), the draft-length counts (``actors.verifier.draft_length.StepDraftLength``) and the
speculator's own counters.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from actors.metrics import ProposerStats, WaitHistogram
from actors.verifier.acceptance import Acceptance
from actors.verifier.draft_length import StepDraftLength
from actors.verifier.speculator import Drafts, Short

MAX_TIMINGS = 65536  # per-step timings kept (the latest)


@dataclass
class StepTiming:
    batch_size: int
    num_tokens: int
    propose_ms: float  # the verifier's own time on the step's drafts: sending them and reading them back
    ship_ms: float
    wait_ms: float  # blocked on drafters (beyond their compute, when an answer was awaited)
    compute_ms: float
    all_hits: bool  # no drafter answer was awaited (every sequence a branch hit, or a prompt step)


@dataclass
class StepStats:
    steps: int = 0  # steps sent to the drafters
    failures: int = 0  # ... with a failed drafter
    short: dict[str, int] = field(default_factory=dict)  # sequences proposed no draft tokens, by ``Short`` reason
    steps_without_drafts: int = 0  # steps none of whose sequences drafted because no drafter could draft them
    timings: deque[StepTiming] = field(default_factory=lambda: deque(maxlen=MAX_TIMINGS))
    waits: WaitHistogram = field(default_factory=WaitHistogram)  # for /metrics: eagle_cluster_step_wait_seconds
    mm_rows_shipped: int = 0  # rows whose input embedding was the target's image embedding
    mm_steps: int = 0  # steps that were handed image embeddings (vLLM gathered them)

    def drafted(self, drafts: Drafts, num_tokens: int, propose_ms: float) -> None:
        """A step's drafts as they came back (``propose_ms``: the verifier's time sending and reading them)."""
        t = drafts.timing
        self.timings.append(StepTiming(len(drafts.ids), num_tokens, propose_ms, t.ship_ms, t.wait_ms, t.compute_ms,
                                       t.all_hits))
        self.waits.observe(t.wait_ms)
        self.failures += bool(drafts.errors)
        self.count_short(drafts)

    def count_short(self, drafts: Drafts) -> None:
        for why in drafts.short.values():
            self.short[why] = self.short.get(why, 0) + 1
        if len(drafts.short) == len(drafts.ids) and any(w in (Short.NO_DRAFTER, Short.FAILED)
                                                         for w in drafts.short.values()):
            self.steps_without_drafts += 1

    def report(self, acceptance: Acceptance, lengths: StepDraftLength, speculator: dict[str, Any],
               counters_only: bool = False) -> ProposerStats:
        """``counters_only``: without the per-request tables (what ``/metrics`` reads on every scrape)."""
        a = acceptance
        return ProposerStats(
            self.steps, self.failures, {} if counters_only else dict(a.per_request), a.branch_lookups, a.branch_hits,
            {} if counters_only else dict(a.per_request_hits), dict(a.by_source), dict(speculator),
            step_waits=replace(self.waits, counts=list(self.waits.counts)), undrafted=dict(self.short),
            steps_without_drafts=self.steps_without_drafts, speculative_tokens=list(lengths.chosen),
            estimated_goodput=lengths.estimated_goodput, goodput_by_k=lengths.policy.goodput_table())
