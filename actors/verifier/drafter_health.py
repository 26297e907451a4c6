"""How the verifier's draft client tells a slow or hung drafter from a working one.

Used by ``actors.verifier.client.DraftClient`` in vLLM's driver worker, once per step:

- ``StepDeadline``: how long a step waits for a drafter before giving up on it. A drafter keeps pace with the
  verifier's steps (it drafts the next step while the verifier verifies this one), so a call still unanswered
  after many step periods is not coming soon: the deadline is ``factor`` times the median recent step period,
  never below ``floor_s`` (a noisy machine's stall is not a hang) nor above the pool's ``timeout_s``. Until it has
  seen ``min_samples`` steps, it is ``timeout_s``.
- ``Quarantine``: drafters the client dropped because they failed or timed out. A dropped drafter is not used
  again, whatever discovery says (the Serve router may still name it: its replica process answers while its
  drafter actor hangs), until it answers a health probe sent when it was dropped, and ``min_hold_s`` passed. A
  drafter actor runs one call at a time, in order, so the probe's answer also says it worked through the calls
  that hung it.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Any


class StepDeadline:
    def __init__(self, max_s: float, floor_s: float = 1.0, factor: float = 10.0, window: int = 64,
                 min_samples: int = 8) -> None:
        self.max_s, self.floor_s, self.factor, self.min_samples = max_s, floor_s, factor, min_samples
        self.periods: deque[float] = deque(maxlen=window)  # seconds between consecutive busy steps
        self._last: float | None = None

    def step_started(self, now: float) -> None:
        """Called at each step's start; an idle gap (longer than ``max_s``) is not a step period."""
        if self._last is not None and now - self._last < self.max_s:
            self.periods.append(now - self._last)
        self._last = now

    def seconds(self) -> float:
        """How long this step waits for a drafter.

        Worked example: max_s 10, floor 1, factor 10; periods of 30 ms -> max(1, 0.3) = 1 s; periods of 400 ms
        (a loaded GPU batch) -> 4 s; fewer than ``min_samples`` periods seen -> 10 s."""
        if len(self.periods) < self.min_samples:
            return self.max_s
        return min(self.max_s, max(self.floor_s, self.factor * statistics.median(self.periods)))


@dataclass
class Quarantined:
    actor: Any  # the drafter's Ray actor handle
    drafts_branches: bool
    probe: Any  # ObjectRef of the health probe sent when it was dropped
    since: float  # time.monotonic()


class Quarantine:
    """Dropped drafters, each waiting for its probe's answer (see the module docstring)."""

    def __init__(self, min_hold_s: float = 5.0, forget_after_s: float = 600.0) -> None:
        self.min_hold_s = min_hold_s  # out of use at least this long (one that answered badly probes fine at once)
        self.forget_after_s = forget_after_s  # a drafter that never answers (dead) is forgotten after this long
        self.held: dict[str, Quarantined] = {}

    def __contains__(self, drafter_id: str) -> bool:
        return drafter_id in self.held

    def hold(self, drafter_id: str, actor: Any, drafts_branches: bool) -> None:
        """Send the probe (never waited for; a dead actor's probe just fails)."""
        try:
            probe = actor.probe.remote()
        except Exception:  # the handle is unusable: the drafter is gone
            probe = None
        self.held[drafter_id] = Quarantined(actor, drafts_branches, probe, time.monotonic())

    def recovered(self) -> list[tuple[str, Quarantined]]:
        """The drafters whose probe answered well since the last call (released); forgets the long-silent ones.
        Never blocks."""
        import ray

        out: list[tuple[str, Quarantined]] = []
        now = time.monotonic()
        for drafter_id, q in list(self.held.items()):
            if now - q.since < self.min_hold_s:
                continue
            if q.probe is not None and ray.wait([q.probe], timeout=0)[0]:
                try:
                    healthy = tuple(ray.get(q.probe)) == (1, 1)
                except Exception:  # dead, or failing: keep it out
                    healthy = False
                q.probe = None
                if healthy:
                    del self.held[drafter_id]
                    out.append((drafter_id, q))
                    continue
            if now - q.since > self.forget_after_s:
                del self.held[drafter_id]
        return out
