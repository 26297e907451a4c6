"""How many branch rows the drafter's next ``after_step`` may draft: pipelined drafting's fan-out, following the
drafter's spare time.

Where it sits: ``DrafterEngine.draft`` tells it when a step arrives, ``DrafterEngine.after_step`` when the branches
(the next step's precomputed drafts, ``actors.drafter.branches``) are done and how many rows they took, and
``DrafterEngine._branches`` asks it for the row budget (``BranchConfig.branches_per_sequence``). The configured
``max_branch_rows`` stays the cap; this budget moves below it.

The verifier calls the actor's ``branches`` right after each ``draft_step`` without waiting, and the actor runs one
call at a time. So the gap between the end of one step's branches and the start of the next step says whether the
branches fit the drafter's spare time:

- *late*: the next step started less than ``late_ms`` after the branches ended: it was queued behind them, and
  the verifier's step may have waited for the drafter. The budget halves.
- *room*: the gap holds at least one more branch row per sequence (the measured cost of a row times the batch
  size), and more than ``late_ms``: the budget grows by one row per sequence, up to the cap.
- otherwise it stays. A gap over ``idle_s`` (no traffic) says nothing about the step's time and is not used.

Worked example (also a test, ``tests/actors/drafter/test_branch_budget.py``): cap 32, batch 4, a row costs 0.5 ms.
Branches end at t = 0 and the next step arrives at 0.2 ms: late, 32 -> 16. Then a gap of 1.5 ms: not late, but
4 more rows need 2.0 ms: 16 stays. Then a gap of 5 ms: 16 -> 20.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BranchBudget:
    cap: int | None  # ``max_branch_rows``: the budget never exceeds it (None: no cap)
    rows: int | None = None  # the current budget; None: the cap
    late_ms: float = 1.0
    idle_s: float = 1.0
    row_ms: float = 0.0  # the measured cost of one branch row (exponentially smoothed)
    _branches_end: float | None = None

    def __post_init__(self) -> None:
        if self.rows is None:
            self.rows = self.cap

    def step_arrived(self, now: float, batch_size: int) -> None:
        """A step started at ``now`` (seconds, ``time.perf_counter``) with ``batch_size`` sequences."""
        end, self._branches_end = self._branches_end, None
        if end is None or self.rows is None or now - end > self.idle_s:
            return
        gap_ms = (now - end) * 1e3
        if gap_ms < self.late_ms:
            self.rows //= 2
        elif gap_ms >= self.row_ms * batch_size:
            self.rows += batch_size
            if self.cap is not None:
                self.rows = min(self.rows, self.cap)

    def branches_done(self, now: float, ms: float, rows: int) -> None:
        """The step's branches ended at ``now`` after ``ms`` milliseconds over ``rows`` branch rows."""
        self._branches_end = now
        if rows > 0:
            per_row = ms / rows
            self.row_ms = per_row if self.row_ms == 0.0 else 0.7 * self.row_ms + 0.3 * per_row
