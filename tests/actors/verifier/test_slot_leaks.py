"""Draft KV slots are not leaked (hardening): a drafter the speculator drops for a timeout or a bad answer is told to
free the sequences it held (it may be alive, and its slots count as load for the router and the autoscaler);
finished sequences are freed on their home at once; a drafter evicts slots left idle; its health probe takes none.
And a sequence's draft state stays right when steps skip it: one back from a step vLLM did not schedule finds its
branches, and one whose rows never reached the drafter is drafted from what the drafter really has.

No Ray runs here: the drafter is a fake actor whose calls return fake object refs, and ``ray.get`` / ``ray.wait``
are replaced to read them (``tests.actors.fake_drafters``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from actors.messages import BranchEntry, BranchTable, DraftStep, SeqSlice
from actors.verifier.speculator import Short
from tests.actors.fake_drafters import (
    FakeDrafter,
    K,
    Method,
    Pool,
    Ref,
    fake_ray,
    good,
    out_of_vocab,
    step_of,
    timed_out,
)
from tests.actors.steps import random_step


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch):
    fake_ray(monkeypatch)


@pytest.mark.parametrize("answer", [out_of_vocab, timed_out], ids=["bad-answer", "timeout"])
def test_dropped_drafter_is_told_to_free_what_it_held(answer):
    sick, healthy = FakeDrafter(answer), FakeDrafter(good)
    pool = Pool({"sick": (sick, 0), "healthy": (healthy, 100)})  # new sequences go to the least loaded: sick
    pool.homes.new_group_size = 8
    drafts = pool.draft(*step_of(0, ["a", "b"]))
    assert len(drafts.errors) == 1 and drafts.short == {0: Short.FAILED, 1: Short.FAILED}
    assert sorted(sick.freed) == ["a", "b"]  # freed on the home they lost, not only forgotten here
    assert "sick" not in pool.drafters.links and set(pool.homes.lost) == {"a", "b"}

    # Next step: re-homed on the healthy drafter; nothing else is sent to the dropped one.
    pool.fakes.pop("sick")
    drafts = pool.draft(*step_of(1, ["a", "b"]))
    assert not drafts.errors and not drafts.short and pool.homes.home == {"a": "healthy", "b": "healthy"}
    assert sorted(sick.freed) == ["a", "b"] and len(sick.steps) == 1


def test_finished_and_lost_sequences_are_all_freed_on_the_dropped_drafter():
    sick = FakeDrafter(good)
    pool = Pool({"sick": (sick, 0)})
    pool.draft(*step_of(0, ["a", "b"]))
    sick.answer = out_of_vocab
    pool.free(["a"])  # "a" finished: freed on its home at once, not carried by the next step
    assert sick.freed == ["a"] and pool.homes.home == {"b": "sick"}
    pool.draft(*step_of(1, ["b"]))  # which fails: "b" is freed there by the drop
    assert sorted(sick.freed) == ["a", "b"]
    assert all(s.finished == [] for s in sick.steps)


def test_finished_sequences_are_freed_on_each_home_at_once():
    """``free`` sends each home the finished sequences it held, one call each, and forgets them everywhere: none is
    sent again, with a step or a later ``free``."""
    d1, d2 = FakeDrafter(good), FakeDrafter(good)
    pool = Pool({"d1": (d1, 0), "d2": (d2, 0)})
    pool.homes.new_group_size = 1
    pool.draft(*step_of(0, ["a", "b", "c"]))
    assert set(pool.homes.home.values()) == {"d1", "d2"}
    on = {d: sorted(r for r, h in pool.homes.home.items() if h == d) for d in ("d1", "d2")}
    pool.free(["a", "b", "c", "never-seen"])
    assert sorted(d1.freed) == on["d1"] and sorted(d2.freed) == on["d2"]
    assert pool.homes.home == {} and pool.homes.lost == {}
    pool.free(["a"])  # already freed: nothing sent again
    pool.draft(*step_of(1, ["x"]))
    assert sorted(d1.freed + d2.freed) == ["a", "b", "c"]
    assert all(s.finished == [] for d in (d1, d2) for s in d.steps)


def test_freeing_on_a_dead_drafter_never_raises():
    dead = FakeDrafter(timed_out, free_raises=True)
    pool = Pool({"dead": (dead, 0)})
    drafts = pool.draft(*step_of(0, ["a"]))  # must not raise
    assert drafts.errors and drafts.short == {0: Short.FAILED} and dead.freed == [] and "a" in pool.homes.lost


class BranchingDrafter(FakeDrafter):
    """A pipelined drafter: ``branches(req_ids)`` answers the ``entries`` it holds of ``req_ids``, and records what
    it was asked for."""

    def __init__(self, entries: dict[str, BranchEntry]) -> None:
        super().__init__(good)
        self.entries, self.asked = entries, []
        self.branches = Method(self._branches)

    def _branches(self, req_ids: list[str]) -> Ref:
        self.asked.append(sorted(req_ids))
        return Ref(BranchTable({r: self.entries[r] for r in req_ids if r in self.entries}).pack())


def test_a_sequence_back_from_an_unscheduled_step_finds_its_branches():
    """The speculator asks its drafter for the branches of every sequence homed there, not only the step's: "b",
    not scheduled in step 1, is answered from its branches in step 2 without waiting."""
    drafter = BranchingDrafter({"b": BranchEntry(10, [5, 6], {(0, 1): [3, 4]})})
    pool = Pool({"d": (drafter, 0)}, drafts_branches=True)
    pool.homes.new_group_size = 8

    def step_at(step_id: int, seqs: list[tuple[str, int]]) -> tuple[DraftStep, torch.Tensor]:
        slices = [SeqSlice(rid, i, 1, pos) for i, (rid, pos) in enumerate(seqs)]
        return DraftStep(step_id, K, slices, np.ones(len(seqs), np.int32)), torch.zeros(len(seqs), 4)

    pool.draft(*step_at(0, [("a", 10), ("b", 10)]))
    pool.draft(*step_at(1, [("a", 11)]))  # "b" not scheduled: still homed, not finished
    assert drafter.asked[-1] == ["a", "b"] and drafter.freed == []
    drafts = pool.draft(*step_at(2, [("a", 12), ("b", 11)]))
    assert drafts.hits == [1] and drafts.ids[1].tolist() == [3, 4]


# --- the drafter: idle slots are evicted, the health probe takes no slot, a step past a gap is not drafted from
# entries the drafter never got -----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def engine_of(toy_heads, clock: Callable[[], float] = time.monotonic, **config: Any):
    """An engine over the toy EAGLE-3 head, with ``config``'s ``DrafterEngineConfig`` fields (and ``clock``)."""
    from actors.drafter.config import DrafterEngineConfig
    from actors.drafter.engine import DrafterEngine
    from actors.eagle.checkpoint import load_head

    target_dir, heads = toy_heads
    head = load_head(heads["eagle3"], target_dir)
    return DrafterEngine(head, DrafterEngineConfig(max_model_len=64, **config), clock=clock)


@pytest.mark.parametrize("branches", [None, {"bonus_fanout": 2, "recovered_fanout": 1}], ids=["sync", "async"])
def test_idle_slots_are_evicted(toy_heads, branches):
    from actors.drafter.branches import BranchConfig

    clock = Clock()
    engine = engine_of(toy_heads, idle_slot_ttl_s=300.0, clock=clock,
                       branches=BranchConfig(**branches) if branches else None)
    width = engine.spec.fused_hidden_size
    engine.draft_tensors(*random_step(0, K, [("a", 0, 4), ("b", 0, 3)], width))
    engine.after_step()
    assert engine.num_active_sequences == 2
    clock.now = 200.0  # "b" steps on; "a" was abandoned (its verifier died, its free was lost)
    engine.draft_tensors(*random_step(1, K, [("b", 3, 1)], width, seed=1))
    engine.after_step()
    clock.now = 400.0
    engine.draft_tensors(*random_step(2, K, [("b", 4, 1)], width, seed=2))
    assert engine.num_active_sequences == 1 and set(engine.cache.slot_of) == {"b"} and engine.evicted == 1
    assert "a" not in engine.branch_table

    # A sequence of the step at hand is never evicted, however long it was away; it continues where it was.
    clock.now = 10_000.0
    p = engine.draft_tensors(*random_step(3, K, [("b", 5, 1)], width, seed=3))
    assert set(engine.cache.slot_of) == {"b"} and engine.evicted == 1 and p.cold == 0


def test_no_ttl_never_evicts(toy_heads):
    clock = Clock()
    engine = engine_of(toy_heads, idle_slot_ttl_s=None, clock=clock)
    width = engine.spec.fused_hidden_size
    engine.draft_tensors(*random_step(0, K, [("a", 0, 4)], width))
    clock.now = 1e9
    engine.draft_tensors(*random_step(1, K, [("b", 0, 2)], width))
    assert engine.num_active_sequences == 2 and engine.evicted == 0


def test_probe_takes_no_slot_even_when_the_cache_is_full(toy_heads):
    engine = engine_of(toy_heads, max_num_seqs=1)
    width = engine.spec.fused_hidden_size
    assert engine.probe() == (1, 1)
    assert engine.num_active_sequences == 0 and engine.cache.num_slots == 1
    engine.draft_tensors(*random_step(0, K, [("a", 0, 4)], width))
    slots = dict(engine.cache.slot_of)
    assert engine.probe() == (1, 1)  # full: it still drafts, and evicts nobody
    assert engine.cache.slot_of == slots and engine.num_active_sequences == 1
    p = engine.draft_tensors(*random_step(1, K, [("a", 4, 1)], width, seed=1))
    assert p.full_seqs == [] and p.cold == 0


def test_actor_probe_never_shows_as_a_sequence(toy_heads):
    from actors.drafter.actor import DrafterActor
    from actors.drafter.config import DrafterEngineConfig, DrafterSettings

    target_dir, heads = toy_heads
    actor = DrafterActor(DrafterSettings(str(heads["eagle1"]), str(target_dir),
                                         engine=DrafterEngineConfig(max_model_len=64, max_num_seqs=1)))
    assert actor.probe() == (1, 1)
    assert actor.stats()["active_sequences"] == 0 and actor.engine.cache.slot_of == {}
    assert actor.stats()["evicted_sequences"] == 0


@pytest.mark.parametrize("branches", [None, {"bonus_fanout": 2, "recovered_fanout": 1}], ids=["sync", "async"])
def test_rows_that_never_arrived_are_masked_as_a_gap(toy_heads, branches):
    """Rows 5-7 never reached the drafter (the verifier's target-only steps ship nothing, or their call failed): the
    step from position 8 attends to rows 0-4 and its own, never to the entries at 5-7 (missing, or drafts'). Two
    engines given the same rows, one with noise written at 5-7, draft the same; the kv_cache docstring's worked
    example, gap by gap."""
    from actors.drafter.branches import BranchConfig

    cfg = BranchConfig(**branches) if branches else None
    engine, noisy = engine_of(toy_heads, branches=cfg), engine_of(toy_heads, branches=cfg)
    width = engine.spec.fused_hidden_size

    def both(step_id: int, pos: int, rows: int):
        step, hidden = random_step(step_id, K, [("s", pos, rows)], width, seed=step_id)
        got, want = engine.draft_tensors(step, hidden), noisy.draft_tensors(step, hidden)
        engine.after_step()
        noisy.after_step()
        return got, want

    both(0, 0, 5)
    slot, other = engine.cache.slot_of["s"], noisy.cache.slot_of["s"]
    assert int(engine.cache.next_pos[slot]) == 5
    g = torch.Generator().manual_seed(7)
    for t in noisy.cache.k + noisy.cache.v:
        t[other, 5:12] = 100 * torch.randn(t[other, 5:12].shape, generator=g)

    def gap() -> tuple[int, int, int]:
        c = engine.cache
        return int(c.known_from[slot]), int(c.gap_lo[slot]), int(c.gap_hi[slot])

    got, want = both(1, 8, 2)
    assert got.cold == 0 and gap() == (0, 5, 8)
    assert got.drafts.tolist() == want.drafts.tolist()
    assert int(engine.cache.next_pos[slot]) == 10
    got, want = both(2, 12, 1)  # a second gap widens the first: [5, 12)
    assert got.cold == 0 and gap() == (0, 5, 12)
    assert got.drafts.tolist() == want.drafts.tolist()
    # Contiguous steps keep the gap; a restart from an earlier position (preemption) rewrites it away.
    assert both(3, 13, 1)[0].cold == 0 and gap() == (0, 5, 12)
    assert both(4, 0, 6)[0].cold == 0 and gap()[0] == 0 and engine.cache.full_context(slot)
