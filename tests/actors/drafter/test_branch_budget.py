"""``actors.drafter.branch_budget.BranchBudget``: pipelined drafting's fan-out follows the drafter's spare time."""

from __future__ import annotations

from actors.drafter.branch_budget import BranchBudget
from actors.drafter.branches import BranchConfig


def test_worked_example():
    b = BranchBudget(cap=32)
    b.branches_done(0.0, ms=8.0, rows=16)  # a row costs 0.5 ms
    b.step_arrived(0.0002, batch_size=4)  # 0.2 ms later: queued behind the branches
    assert b.rows == 16
    b.branches_done(1.0, ms=8.0, rows=16)
    b.step_arrived(1.0015, batch_size=4)  # 1.5 ms of spare time: 4 more rows need 2 ms
    assert b.rows == 16
    b.branches_done(2.0, ms=8.0, rows=16)
    b.step_arrived(2.005, batch_size=4)  # 5 ms: room for one more row per sequence
    assert b.rows == 20


def test_grows_to_the_cap_and_ignores_idle_gaps_and_steps_without_branches():
    b = BranchBudget(cap=8, rows=6)
    b.branches_done(0.0, ms=1.0, rows=6)
    b.step_arrived(0.1, batch_size=4)
    assert b.rows == 8  # capped
    b.branches_done(1.0, ms=1.0, rows=8)
    b.step_arrived(5.0, batch_size=4)  # 4 s without traffic: not a step's spare time
    assert b.rows == 8
    b.step_arrived(5.0001, batch_size=4)  # no branches drafted since the last step: nothing to judge
    assert b.rows == 8
    assert BranchBudget(cap=None).rows is None  # no cap: no budget either


def test_budget_and_cap_both_bound_the_fan_out():
    cfg = BranchConfig(bonus_fanout=3, recovered_fanout=2, max_branch_rows=16)
    assert cfg.branches_per_sequence(3, batch_size=2) == 8  # 3 + 3 * 2 = 9 guesses, 16 rows // 2
    assert cfg.branches_per_sequence(3, batch_size=2, budget=6) == 3
    assert cfg.branches_per_sequence(3, batch_size=8, budget=4) == 0  # drafted on demand
    assert BranchConfig(max_branch_rows=None).branches_per_sequence(2, 4, budget=None) == 4
