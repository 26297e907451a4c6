"""How many draft tokens each verification step gets: the rule the proposer asks once per step.

Terms: *k* is the number of draft tokens proposed (and so scheduled and verified) for each sequence of a step,
0..K with K = ``num_speculative_tokens``; k = 0 is a target-only step (nothing shipped to the drafters, nothing
verified). *B* is the step's batch size (sequences scheduled).

Three policies, named by ``speculative_config.num_speculative_tokens_per_batch_size`` (which the verifier's engine
arguments move to ``additional_config["eagle_cluster"]["draft_length"]``, see ``actors.verifier.engine``):

- absent: ``FixedDraftLength``, k = K always (vLLM's behaviour).
- a list of ``[start, end, k]`` (vLLM's format: inclusive batch-size ranges, sorted, non-overlapping, the first
  starting at 1, k >= 0; gaps and the tail carry the previous k; k is clamped to K): ``ScheduledDraftLength``,
  k = schedule(B). Validated and expanded by vLLM's own functions (``vllm.v1.spec_decode.dynamic.utils``).
- ``"auto"``: ``AutoDraftLength``, k chosen to maximise the expected output tokens per second, from what the
  verifier measures itself:

  * acceptance by draft position: ``p[i]``, the share of recent draft runs whose draft ``i`` (0-based) was
    accepted, among runs that proposed at least ``i + 1`` drafts (exponentially decayed counts, global). A
    sequence drafting k tokens then yields ``E(k) = 1 + p[0] + ... + p[k-1]`` tokens per step (the bonus or
    recovered token plus the accepted drafts).
  * step cost: per batch-size bucket (1, 2, 3-4, 5-8, 9-16, ...; ``bucket``) and per k, the median of the last
    ``window`` (3) step periods divided by B (``ms_per_seq``), measured from one ``propose`` call to the next:
    that interval holds the drafting of step t (with k_t) and the target forward that verifies its k_t drafts,
    so it depends on k_t, and also on k_{t-1}: the same interval streams the tokens of step t, which verified
    step t-1's k_{t-1} drafts (1 + accepted tokens per sequence to detokenize and send). So only *steady* periods
    are sampled: the first ``settle`` (2) periods at a new k are not (measured: at batch 32 the first k = 0 step
    after k = 3 steps took ~1.6x a steady one; and the first k > 0 steps after a k = 0 stretch find the drafter
    cold, whose step after an idle gap costs 1.3-3.9x one run back to back); steps with prompt rows, idle gaps and
    bucket changes are not sampled either. A median of a few recent samples, not a long average: one probe of a k
    not in use (``hold`` = 4 steps, 2 steady samples) replaces what was measured of it long ago (at a server's
    start everything is slow), and one slow step (a pause) does not move it.
  * goodput(k) = B * E(k) / (B * ms_per_seq(k)) per millisecond; the chosen k is the argmax.

  * a new bucket starts from the nearest bucket that measured every k: for a k it has not measured yet, its
    cost is that bucket's cost at k scaled by the ratio of the two buckets' costs at a k both measured
    (``_Bucket.estimates``). So a load seen for the first time is served at once at the k those relative costs
    pick, and it measures each other k once, one ``hold``-step probe every ``first_explore`` (6) steps, best
    estimate first (a neighbour measured while the server warmed up can be far off). Only the first bucket of a
    server's life explores every k ``min_samples`` (2) times before choosing (about 16 steps: one probe each).

  Stability: a bucket keeps its current k unless another k's estimated goodput beats it by more than
  ``hysteresis`` (5%), on top of the medians, so noise between two close k values does not make it switch step
  to step. And it switches only on fresh evidence: the current k is measured at every step, the others only when
  probed, and this machine's speed drifts by 25% within minutes, so when a slow run of the current k makes a
  rival measured long ago (over ``fresh_steps``, 32 steps) look better, the rival is probed first (its old
  samples dropped) and the two compared as they are now. Without that, one slow run of k = 3 can move a batch of
  1 to k = 2 until the next periodic probe of k = 3, hundreds of steps later (a test shows it; in service it did
  not remove the k = 2 spells of a c = 1 run: ``docs/BENCHMARKS.md``, issue 23's fifth pass). Exploration is
  deterministic: in a bucket with nothing to start from, a k with fewer than ``min_samples`` period samples is
  tried for ``hold`` consecutive steps (K first, down to 0); and every ``explore_every`` steps a bucket tries the
  next of the k values not in use (each in turn, K down to 0) for ``hold`` steps, so their estimates stay fresh
  when the load changes.

Worked example (also a test, ``tests/actors/verifier/test_draft_length.py``): K = 3, acceptance p = [0.8, 0.6, 0.4], so
E = [1, 1.8, 2.4, 2.8] for k = 0..3. At a batch of 1 the step costs [10, 11, 12, 13] ms per sequence: goodput
[0.100, 0.164, 0.200, 0.215] tokens/ms, k = 3. At a batch of 32 it costs [1.0, 2.0, 2.9, 3.8] ms per sequence:
goodput [1.00, 0.90, 0.83, 0.74], k = 0. At a batch of 8 with [3.0, 4.0, 5.0, 6.0]: [0.333, 0.450, 0.480,
0.467]: k = 2; if the bucket was at k = 3 it stays there (0.480 is not 5% above 0.467).

>>> best_k([10.0, 11.0, 12.0, 13.0], expected_tokens([0.8, 0.6, 0.4], 3), current=3)
3
>>> best_k([1.0, 2.0, 2.9, 3.8], expected_tokens([0.8, 0.6, 0.4], 3), current=3)
0
>>> best_k([3.0, 4.0, 5.0, 6.0], expected_tokens([0.8, 0.6, 0.4], 3), current=2)
2
>>> best_k([3.0, 4.0, 5.0, 6.0], expected_tokens([0.8, 0.6, 0.4], 3), current=3)
3
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

AUTO = "auto"
FIELD = "num_speculative_tokens_per_batch_size"
PRIOR_ACCEPTANCE = 0.5  # p[i] before any draft at position i was verified


def validate_schedule(value: object) -> list[tuple[int, int, int]]:
    """vLLM's validation and normalisation of ``num_speculative_tokens_per_batch_size`` (sorted ``(start, end,
    k)``); raises ``ValueError`` with vLLM's message."""
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    return validate_and_normalize_dynamic_sd_schedule(value)


def expected_tokens(acceptance: list[float], max_k: int) -> list[float]:
    """``E(k)`` for k = 0..max_k: 1 + the acceptance rates of positions 0..k-1 (``acceptance[i]``: the share of
    draft runs whose draft i was accepted, among those that proposed it)."""
    out = [1.0]
    for i in range(max_k):
        out.append(out[-1] + (acceptance[i] if i < len(acceptance) else 0.0))
    return out


def best_k(ms_per_seq: list[float | None], expected: list[float], current: int, hysteresis: float = 0.05) -> int:
    """The k of the highest ``expected[k] / ms_per_seq[k]`` (the batch's tokens per ms: tokens per sequence over the
    period per sequence), or ``current`` unless that one beats it by more than ``hysteresis``. ``None`` costs (never
    measured) are not chosen."""
    gp = [e / c if c else -1.0 for e, c in zip(expected, ms_per_seq, strict=True)]
    best = max(range(len(gp)), key=lambda k: gp[k])
    if 0 <= current < len(gp) and gp[current] > 0 and gp[best] <= gp[current] * (1 + hysteresis):
        return current
    return best


def bucket(batch_size: int) -> int:
    """Batch-size bucket: 0 for 1, 1 for 2, 2 for 3-4, 3 for 5-8, ... (``ceil(log2 B)``)."""
    return max(0, math.ceil(math.log2(max(batch_size, 1))))


def bucket_label(b: int) -> str:
    """The batch sizes of bucket ``b``: ``"1"``, ``"2"``, ``"3-4"``, ``"5-8"``, ..."""
    return str(2**b) if b <= 1 else f"{2 ** (b - 1) + 1}-{2**b}"


class DraftLength(Protocol):
    max_k: int

    def choose(self, batch_size: int) -> int: ...
    def observe_period(self, batch_size: int, k: int, ms: float, previous_k: int | None = None) -> None: ...
    def observe_acceptance(self, num_drafts: int, accepted: int) -> None: ...
    def goodput(self, batch_size: int, k: int) -> float | None: ...
    def goodput_table(self) -> dict[str, list[float | None]]: ...


@dataclass
class FixedDraftLength:
    """k = K at every step."""

    max_k: int

    def choose(self, batch_size: int) -> int:
        return self.max_k

    def observe_period(self, batch_size: int, k: int, ms: float, previous_k: int | None = None) -> None:
        return None

    def observe_acceptance(self, num_drafts: int, accepted: int) -> None:
        return None

    def goodput(self, batch_size: int, k: int) -> float | None:
        return None

    def goodput_table(self) -> dict[str, list[float | None]]:
        return {}


@dataclass
class ScheduledDraftLength(FixedDraftLength):
    """k = schedule(B), vLLM's dense lookup (``build_dynamic_sd_schedule_lookup``); past ``max_num_seqs`` the last."""

    schedule: list[tuple[int, int, int]] = field(default_factory=list)
    max_num_seqs: int = 256
    lookup: list[int] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

        self.lookup = build_dynamic_sd_schedule_lookup([list(e) for e in self.schedule], self.max_num_seqs,
                                                       self.max_k)

    def choose(self, batch_size: int) -> int:
        return self.lookup[min(max(batch_size, 1), len(self.lookup) - 1)]


@dataclass
class _Bucket:
    ms_per_seq: list[float | None]  # [K + 1] median of the recent step periods / B, per k
    samples: list[int]  # [K + 1]
    current: int
    steps: int = 0
    probe_k: int = 0
    probe_left: int = 0
    probe_next: int = 0  # the periodic probes go through the k values in turn: the next one to try
    prior: list[float | None] | None = None  # [K + 1] the nearest measured bucket's ms_per_seq when this one began
    recent: dict[int, deque[float]] = field(default_factory=dict)  # k -> its last periods / B (ms_per_seq: median)
    sampled_at: list[int] = field(default_factory=list)  # [K + 1] ``steps`` at k's last sample (-1: never)
    run: int = 0  # consecutive periods at the k of the last one observed (1: the first after a change or a break)

    def __post_init__(self) -> None:
        self.sampled_at = self.sampled_at or [-1] * len(self.ms_per_seq)

    def fresh(self, k: int, within: int) -> bool:
        """k's cost was sampled in the last ``within`` steps of this bucket."""
        return self.sampled_at[k] >= 0 and self.steps - self.sampled_at[k] <= within

    def estimates(self) -> list[float | None]:
        """ms per sequence by k: measured where this bucket has samples; else the prior's cost at k times this
        bucket's / the prior's cost at the k measured most here. Worked example: prior [2, 4, 6, 8], measured
        [None, None, None, 4.0] (k = 3 only): [1.0, 2.0, 3.0, 4.0]."""
        own = self.ms_per_seq
        if self.prior is None:
            return list(own)
        measured = [k for k in range(len(own)) if self.samples[k] and own[k] and self.prior[k]]
        scale = 1.0
        if measured:
            ref = max(measured, key=lambda k: self.samples[k])
            scale = own[ref] / self.prior[ref]
        return [own[k] if self.samples[k] else (None if self.prior[k] is None else self.prior[k] * scale)
                for k in range(len(own))]


@dataclass
class AutoDraftLength:
    """k per step maximising the estimated output tokens per second (module docstring)."""

    max_k: int
    hysteresis: float = 0.05
    window: int = 3  # period samples per (bucket, k) whose median is its cost
    acceptance_decay: float = 0.995  # per verified draft run
    min_samples: int = 2
    hold: int = 4
    settle: int = 2  # periods at a new k that are not samples (the change's own, and one with the drafter warming)
    fresh_steps: int = 32  # a k's cost measured longer ago than this (bucket steps) is probed before switching to it
    explore_every: int = 128
    first_explore: int = 6
    buckets: dict[int, _Bucket] = field(default_factory=dict)
    history: deque[tuple[int, int, float]] = field(default_factory=lambda: deque(maxlen=4096))  # (B, k, period ms)
    proposed: list[float] = field(default_factory=list)  # [K] decayed draft runs that proposed position i
    accepted: list[float] = field(default_factory=list)  # [K] ... and accepted it

    def __post_init__(self) -> None:
        self.proposed = [0.0] * self.max_k
        self.accepted = [0.0] * self.max_k

    def acceptance(self) -> list[float]:
        return [a / p if p >= 1.0 else PRIOR_ACCEPTANCE for a, p in zip(self.accepted, self.proposed, strict=True)]

    def _bucket(self, batch_size: int) -> _Bucket:
        b = bucket(batch_size)
        if b not in self.buckets:
            k1 = self.max_k + 1
            s = self.buckets[b] = _Bucket([None] * k1, [0] * k1, self.max_k)
            known = [o for o in self.buckets if o != b and min(self.buckets[o].samples) >= self.min_samples]
            if known:  # start from the nearest measured bucket (the smaller one on a tie: the load is rising)
                near = self.buckets[min(known, key=lambda o: (abs(o - b), o))]
                s.prior = near.estimates()
                s.current = best_k(s.prior, expected_tokens(self.acceptance(), self.max_k), near.current,
                                   self.hysteresis)
        return self.buckets[b]

    def choose(self, batch_size: int) -> int:
        s = self._bucket(batch_size)
        s.steps += 1
        if s.probe_left > 0:
            s.probe_left -= 1
            return s.probe_k
        if s.prior is None:
            unseen = [k for k in range(self.max_k, -1, -1) if s.samples[k] < self.min_samples]
            if unseen:
                return self._probe(s, unseen[0])
        costs, expected = s.estimates(), expected_tokens(self.acceptance(), self.max_k)
        best = best_k(costs, expected, s.current, self.hysteresis)
        if best != s.current and s.samples[best] and not s.fresh(best, self.fresh_steps):
            # the rival's cost is old (the machine's speed drifts; a slow run of the current k is no news about it):
            # measure it again before switching, its old samples dropped
            s.recent.pop(best, None)
            return self._probe(s, best)
        s.current = best
        if s.prior is not None and s.steps % self.first_explore == 0:
            # a seeded bucket measures the k it has not measured yet, one probe at a time, best estimate first
            unmeasured = [k for k in range(self.max_k + 1) if not s.samples[k]]
            if unmeasured:
                gp = [e / c if c else 0.0 for e, c in zip(expected, costs, strict=True)]
                return self._probe(s, max(unmeasured, key=lambda k: gp[k]))
        if s.steps % self.explore_every == 0 and self.max_k > 0:
            others = [k for k in range(self.max_k, -1, -1) if k != s.current]
            nxt = others[s.probe_next % len(others)]
            s.probe_next += 1
            return self._probe(s, nxt)
        return s.current

    def _probe(self, s: _Bucket, k: int) -> int:
        s.probe_k, s.probe_left = k, self.hold - 1
        return k

    def observe_period(self, batch_size: int, k: int, ms: float, previous_k: int | None = None) -> None:
        """One step's period (``ms``, from its ``propose`` to the next) at this batch size, drafting k, after a step
        that drafted ``previous_k`` (None: not known, taken as k). Only a steady period (``previous_k == k``) is a
        sample of k's cost; the others are kept in ``history`` only."""
        s = self._bucket(batch_size)
        self.history.append((batch_size, k, ms))
        if previous_k is None:  # not known: taken as steady
            s.run = self.settle + 1
        else:
            s.run = s.run + 1 if previous_k == k else 1
        if s.run <= self.settle:
            return
        recent = s.recent.setdefault(k, deque(maxlen=self.window))
        recent.append(ms / max(batch_size, 1))
        s.ms_per_seq[k] = statistics.median(recent)
        s.samples[k] += 1
        s.sampled_at[k] = s.steps

    def observe_acceptance(self, num_drafts: int, accepted: int) -> None:
        """One verified draft run: ``num_drafts`` proposed, the first ``accepted`` of them accepted."""
        d = self.acceptance_decay  # a position's counts decay only as it is observed again: k values not in use
        for i in range(min(num_drafts, self.max_k)):  # keep their last estimate
            self.proposed[i] = self.proposed[i] * d + 1.0
            self.accepted[i] = self.accepted[i] * d + (1.0 if i < accepted else 0.0)

    def _goodputs(self, s: _Bucket) -> list[float | None]:
        """Estimated output tokens per second of a bucket's steps drafting k = 0..K, all sequences together
        (``E(k) / ms_per_seq(k)``: tokens per step over the step period; None: not measured)."""
        expected = expected_tokens(self.acceptance(), self.max_k)
        return [1000.0 * e / c if c else None for e, c in zip(expected, s.estimates(), strict=True)]

    def goodput(self, batch_size: int, k: int) -> float | None:
        """``_goodputs`` of this batch size's bucket, at k."""
        return self._goodputs(self._bucket(batch_size))[k]

    def goodput_table(self) -> dict[str, list[float | None]]:
        """``_goodputs`` by batch-size bucket (``bucket_label``): what ``choose`` compares, for ``/metrics``."""
        return {bucket_label(b): self._goodputs(s) for b, s in sorted(self.buckets.items())}


def build_draft_length(spec: Any, max_k: int, max_num_seqs: int) -> DraftLength:
    """The policy for ``additional_config["eagle_cluster"]["draft_length"]``: None (k = K), ``"auto"``, a schedule
    list, or a dict ``{"auto": {AutoDraftLength's settings}}``."""
    if spec is None:
        return FixedDraftLength(max_k)
    if spec == AUTO:
        return AutoDraftLength(max_k)
    if isinstance(spec, dict) and AUTO in spec:
        return AutoDraftLength(max_k, **(spec[AUTO] or {}))
    return ScheduledDraftLength(max_k, schedule=validate_schedule(list(spec)), max_num_seqs=max_num_seqs)
