"""How many draft tokens each verification step gets: the policy ``actors.verifier.speculation`` asks once per step.

Terms: *k* is the number of draft tokens proposed (and so scheduled and verified) for each sequence of a step,
0..K with K = ``num_speculative_tokens``; k = 0 is a target-only step (nothing shipped to the drafters, nothing
verified). *B* is the step's batch size.

Three policies, named by ``speculative_config.num_speculative_tokens_per_batch_size`` (which the verifier's engine
arguments move to ``additional_config["eagle_cluster"]["draft_length"]``, ``actors.verifier.engine``):

- absent: ``FixedDraftLength``, k = K always (vLLM's behaviour).
- a list of ``[start, end, k]`` (vLLM's format and validation, ``vllm.v1.spec_decode.dynamic.utils``; k clamped to
  K): ``ScheduledDraftLength``, k = schedule(B).
- ``"auto"``: ``AutoDraftLength``, the k of the highest expected output tokens per second, from what the verifier
  measures itself:

  * acceptance by draft position ``p[i]`` (decayed counts over recent draft runs): a sequence drafting k tokens
    yields ``E(k) = 1 + p[0] + ... + p[k-1]`` tokens per step.
  * step cost per batch-size bucket (1, 2, 3-4, 5-8, ...; ``bucket``). A step's *period* runs from one ``propose``
    to the next: the drafting of the step and the target forward that verifies it. Each bucket drafts one k
    (``current``) and measures the others *against it*: a *probe* drafts k for ``hold`` steps, and k's ratio
    ``rel[k]`` is the median of its periods over the median of the current k's ``between`` periods just before it.
    Ratios measured side by side, because this machine's speed drifts by 25% within minutes. A k's ratio is the
    mean of its last ``max_probes`` probes, replaced when a probe differs by over ``changed``. Only steady periods
    count: not the first ``settle`` at a new k, nor steps with prompt rows, idle gaps or bucket changes.
  * the k >= 1 ratios are fitted to a line (``_Bucket.fitted``): drafting at all costs much (the ship, the wait,
    the drafter's context pass), each further draft little, so one noisy probe does not move one k alone.
  * goodput(k) = E(k) / rel(k); the chosen k is the argmax, kept unless a rival beats it by ``hysteresis`` on
    ``confirm`` fresh probes; the k switched from is probed first after a switch, so a misread is undone soon.
  * a new bucket starts from the nearest measured bucket's ratios; every ``explore_every`` steps a bucket probes a k
    not in use (the runner-up every other time), so the ratios stay fresh. Exploration is deterministic.

  ``python -m benchmarks.offline draft-length-sim`` replays the rule against per-k costs measured on this machine, with
  noise, pauses and drift, beside the best fixed k.

``StepDraftLength`` applies a policy to the steps: it hands it each step's period and counts the k chosen.

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
from typing import Any, NamedTuple, Protocol

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
    """What ``auto`` knows of one batch-size bucket: the k it drafts (``current``), that k's recent cost, and every
    k's cost *relative to it* (``rel``), measured by probes."""

    current: int
    rel: list[float | None]  # [K + 1] cost(k) / cost(current) per step of this bucket; rel[current] == 1
    probes: list[int]  # [K + 1] probes behind rel[k] (capped at ``max_probes``: a moving average)
    probed_at: list[int]  # [K + 1] ``steps`` at k's last probe
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=4))  # current k's last steady periods / B
    since: int = 0  # of them, taken since the last probe or switch
    probe_k: int = -1  # the k being probed (-1: none)
    probe_left: int = 0  # steps of the probe still to choose
    probe_samples: list[float] = field(default_factory=list)  # the probe's steady periods / B
    steps: int = 0
    run: int = 0  # consecutive periods at the k of the last one observed (1: the first after a change or a break)
    probe_next: int = 0  # the periodic probes go through the k values in turn: the next one to try
    next_explore: int = 0  # ``steps`` from which the next periodic probe may start
    # a k whose ratio is not this bucket's own evidence, probed before any switch (-1: none): the k switched away
    # from (its ratio derived from the probes that moved away), or k = 0 in a bucket started from a smaller batch's
    recheck: int = -1

    @classmethod
    def start(cls, max_k: int, current: int, explore_every: int, rel: list[float | None] | None = None) -> _Bucket:
        k1 = max_k + 1
        rel = list(rel) if rel is not None else [None] * k1
        rel[current] = 1.0
        probes = [0] * k1  # a neighbour's ratios (``rel``) are no probes of this bucket: each is probed in turn
        probes[current] = 1
        return cls(current, rel, probes, [-(10**9)] * k1, next_explore=explore_every)

    def cost(self) -> float | None:
        """The current k's cost, ms per sequence per step: the median of its recent steady periods."""
        return statistics.median(self.recent) if self.recent else None

    def fitted(self) -> list[float | None]:
        """``rel`` with k >= 1 on a line (a fixed cost to draft at all plus a cost per draft, slope >= 0), fitted by
        least squares weighted by each ratio's probes (a neighbour's ratio, not probed here, by 1; the current k's
        ratio, exact, by 16). Worked example:
        current k = 3, rel [0.5, 0.8, 1.05, 1.0] from [2, 2, 2, -] probes: the k >= 1 points (1, 0.8) w 2, (2, 1.05)
        w 2, (3, 1.0) w 16 fit 0.79 + 0.07 k, so [0.5, 0.86, 0.93, 1.01]: k = 2's one high ratio is mostly noise.
        A falling line is flattened (slope 0): drafting more never costs less."""
        pts = [(k, r, 16 if k == self.current else max(self.probes[k], 1)) for k, r in enumerate(self.rel)
               if k >= 1 and r is not None]
        if len(pts) < 2:
            return list(self.rel)
        w = sum(p[2] for p in pts)
        mk, mr = sum(k * n for k, _, n in pts) / w, sum(r * n for _, r, n in pts) / w
        var = sum(n * (k - mk) ** 2 for k, _, n in pts)
        slope = max(0.0, sum(n * (k - mk) * (r - mr) for k, r, n in pts) / var)
        return [r if k == 0 or r is None else mr + slope * (k - mk) for k, r in enumerate(self.rel)]


@dataclass
class AutoDraftLength:
    """k per step maximising the estimated output tokens per second (module docstring)."""

    max_k: int
    hysteresis: float = 0.05
    between: int = 4  # steady periods of the current k before a probe (its cost, the ratio's denominator)
    hold: int = 5  # steps of a probe (the first `settle` are not samples: 3 samples, a median robust to one pause)
    settle: int = 2  # periods at a new k that are not samples (the change's own, and one with the drafter warming)
    changed: float = 1.5  # a probe's ratio this far (either way) from the mean replaces it: the cost changed
    max_probes: int = 4  # a k's ratio is the mean of its last this many probes (a moving average beyond)
    confirm: int = 2  # probes behind a rival's ratio before switching to it
    fresh_steps: int = 32  # ... the last of them within this many bucket steps, else it is probed again first
    close: float = 0.8  # a new bucket probes the k its neighbour's ratios put within this of the best (the rest later)
    explore_every: int = 64  # steps between the periodic probes of the k not in use (each in turn, K down to 0)
    acceptance_decay: float = 0.995  # per verified draft run
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
            known = [o for o in self.buckets if None not in self.buckets[o].rel]
            if known:  # start from the nearest measured bucket (the smaller one on a tie: the load is rising)
                nearest = min(known, key=lambda o: (abs(o - b), o))
                near = self.buckets[nearest]
                rel = near.fitted()
                k = best_k(rel, expected_tokens(self.acceptance(), self.max_k), near.current, self.hysteresis)
                self.buckets[b] = _Bucket.start(self.max_k, k, self.explore_every,
                                                [r / rel[k] for r in rel])  # type: ignore[operator]
                if nearest < b and k != 0:
                    # a larger batch than the neighbour's: verifying drafts costs more, so k = 0 gains on every k
                    # (served, held: a k = 0 step at batch 1 took 0.55x a k = 3 one; at batch 32 a k = 3 step took
                    # 103 ms while vLLM target-only's took ~34 ms, from its 951 tok/s at 32 streams), and a
                    # neighbour's ratio would keep it below ``close``, never probed in a short run
                    self.buckets[b].recheck = 0
            else:
                self.buckets[b] = _Bucket.start(self.max_k, self.max_k, self.explore_every)
        return self.buckets[b]

    def choose(self, batch_size: int) -> int:
        s = self._bucket(batch_size)
        s.steps += 1
        if s.probe_left > 0:
            s.probe_left -= 1
            return s.probe_k
        if s.probe_k >= 0:
            self._end_probe(s)
        if self.max_k == 0:
            return s.current
        # the current k's cost is what a probe's ratio is measured against: measured afresh before each probe
        ready = s.since >= self.between
        unknown = [k for k in range(self.max_k, -1, -1) if s.rel[k] is None]
        if unknown:  # a bucket with nothing to start from measures every k first, K down to 0
            return self._probe(s, unknown[0]) if ready else s.current
        rel, expected = s.fitted(), expected_tokens(self.acceptance(), self.max_k)
        gp = [e / r for e, r in zip(expected, rel, strict=True)]  # type: ignore[operator]
        close = [k for k in range(self.max_k + 1) if not s.probes[k] and gp[k] >= self.close * max(gp)]
        if close:  # a bucket started from a neighbour's ratios measures the k they put close to the best, best first
            return self._probe(s, max(close, key=lambda k: gp[k])) if ready else s.current
        if s.recheck >= 0:  # a ratio this bucket has not measured itself (``_Bucket.recheck``)
            return self._probe(s, s.recheck) if ready else s.current
        best = best_k(rel, expected, s.current, self.hysteresis)
        if best != s.current:
            if s.steps - s.probed_at[best] > self.fresh_steps:
                s.probes[best] = 0  # measured long ago: measured afresh (``confirm`` probes) before a switch
            if s.probes[best] < self.confirm:
                return self._probe(s, best) if ready else s.current
            self._switch(s, best)
            return s.current
        if ready and s.steps >= s.next_explore:
            # every other periodic probe measures the runner-up (the k that a noisy ratio would switch to, or from),
            # the rest go through the other k values in turn
            s.next_explore = s.steps + self.explore_every
            others = [k for k in range(self.max_k, -1, -1) if k != s.current]
            s.probe_next += 1
            if s.probe_next % 2:
                return self._probe(s, max(others, key=lambda k: gp[k]))
            return self._probe(s, others[(s.probe_next // 2 - 1) % len(others)])
        return s.current

    def _probe(self, s: _Bucket, k: int) -> int:
        s.probe_k, s.probe_left, s.probe_samples, s.since = k, self.hold - 1, [], 0
        if k == s.recheck:
            s.recheck = -1
        return k

    def _end_probe(self, s: _Bucket) -> None:
        """The probe's ratio: the median of its steady periods over the current k's recent median, just before it."""
        k, s.probe_k = s.probe_k, -1
        cost = s.cost()
        if not s.probe_samples or not cost:
            return
        ratio = statistics.median(s.probe_samples) / cost
        n = min(s.probes[k], self.max_probes - 1)
        if n == 0 or not 1 / self.changed < ratio / s.rel[k] < self.changed:  # type: ignore[operator]
            s.rel[k], s.probes[k] = ratio, 0  # nothing, a neighbour's or a stale figure, or the cost changed: replaced
        else:
            s.rel[k] = (s.rel[k] * n + ratio) / (n + 1)  # type: ignore[operator]
        s.probes[k] += 1
        s.probed_at[k] = s.steps

    def _switch(self, s: _Bucket, k: int) -> None:
        """Make k the current k: every ratio is now relative to it; its cost is measured afresh. The k left is
        probed next (``recheck``), its derived ratio replaced by that probe's: a switch made on a misread (the
        batch ramping up, a slow spell while the rival was probed) is undone within a few probes, not left until
        the k left is next the runner-up."""
        r = s.rel[k]
        s.rel = [None if x is None else x / r for x in s.rel]  # type: ignore[operator]
        s.probes[s.current], s.probed_at[s.current] = 0, s.steps
        s.recheck = s.current
        s.current = k
        s.recent.clear()
        s.since = 0

    def observe_period(self, batch_size: int, k: int, ms: float, previous_k: int | None = None) -> None:
        """One step's period (``ms``, from its ``propose`` to the next) at this batch size, drafting k, after a step
        that drafted ``previous_k`` (None: not known, taken as k). Only a steady period (``previous_k == k``, past
        the first ``settle``) is a sample: of the current k's cost, or of the probed k's; all go to ``history``."""
        s = self._bucket(batch_size)
        self.history.append((batch_size, k, ms))
        if previous_k is None:  # not known: taken as steady
            s.run = self.settle + 1
        else:
            s.run = s.run + 1 if previous_k == k else 1
        if s.run <= self.settle:
            return
        per_seq = ms / max(batch_size, 1)
        if s.probe_k >= 0 and k == s.probe_k:
            s.probe_samples.append(per_seq)
        elif s.probe_k < 0 and k == s.current:
            s.recent.append(per_seq)
            s.since += 1

    def observe_acceptance(self, num_drafts: int, accepted: int) -> None:
        """One verified draft run: ``num_drafts`` proposed, the first ``accepted`` of them accepted."""
        d = self.acceptance_decay  # a position's counts decay only as it is observed again: k values not in use
        for i in range(min(num_drafts, self.max_k)):  # keep their last estimate
            self.proposed[i] = self.proposed[i] * d + 1.0
            self.accepted[i] = self.accepted[i] * d + (1.0 if i < accepted else 0.0)

    def _goodputs(self, s: _Bucket) -> list[float | None]:
        """Estimated output tokens per second of a bucket's steps drafting k = 0..K, all sequences together
        (``E(k) / (rel(k) * cost)``: tokens per step over the step period; None: not measured)."""
        expected, cost = expected_tokens(self.acceptance(), self.max_k), s.cost()
        return [1000.0 * e / (r * cost) if r and cost else None for e, r in zip(expected, s.fitted(), strict=True)]

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


class _TimedStep(NamedTuple):
    """A decode step whose period (from its ``choose`` to the next) the policy may be handed."""

    start: float  # when it chose its k (perf_counter seconds)
    batch_size: int
    k: int
    previous_k: int | None  # the k of the decode step just before it; None: it followed a prompt step or a gap


class StepDraftLength:
    """A policy asked once per step: it is handed the last step's period (``observe_period``) when that step, the one
    before it and this one were decode-only, in one batch-size bucket, with no idle gap (``idle``); the k chosen
    per step is counted (``chosen``, for ``/metrics``)."""

    def __init__(self, policy: DraftLength) -> None:
        self.policy = policy
        self.chosen = [0] * (policy.max_k + 1)  # steps per k
        self.estimated_goodput = 0.0  # the policy's estimate for the last step (0: none)
        self._last: _TimedStep | None = None

    def choose(self, start: float, batch_size: int, clean: bool) -> int:
        """This step's k; ``clean``: a decode-only step (no prompt rows)."""
        policy = self.policy
        if type(policy) is FixedDraftLength:
            k = policy.max_k
        else:
            last, self._last = self._last, None
            follows = last is not None and clean and bucket(last.batch_size) == bucket(batch_size)
            if follows and last.previous_k is not None:  # steady periods only: the policy compares the two k
                policy.observe_period(last.batch_size, last.k, (start - last.start) * 1e3, previous_k=last.previous_k)
            k = max(0, min(policy.max_k, policy.choose(batch_size)))
            if clean:
                self._last = _TimedStep(start, batch_size, k, last.k if follows else None)
            self.estimated_goodput = policy.goodput(batch_size, k) or 0.0
        self.chosen[k] += 1
        return k

    def idle(self) -> None:
        """The engine went idle: the next step's period would include the gap, so it is not measured."""
        self._last = None
