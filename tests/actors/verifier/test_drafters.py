"""A hung drafter (alive, not answering) costs the verifier one short stall, not one per step: the step's deadline
comes from the step period (``StepDeadline``), the calls it gave up on are cancelled, and the drafter stays out of
use, whatever discovery says, until it answers a health probe (``Quarantine``).

No Ray runs here: fake actors and refs (``tests.actors.fake_drafters``); ``ray.get`` records the timeouts it
is given."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import ray

from actors.verifier.drafters import ActorFinder, Drafters, Quarantine, StepDeadline, build_finder
from actors.verifier.speculator import Short
from tests.actors.fake_drafters import FakeDrafter, Method, Pool, Ref, good, step_of


def test_step_deadline_worked_example():
    d = StepDeadline(max_s=10.0, floor_s=1.0, factor=10.0, min_samples=8)
    assert d.seconds() == 10.0  # nothing seen yet: the pool's timeout
    t = 0.0
    for _ in range(9):
        d.step_started(t)
        t += 0.03
    assert d.seconds() == 1.0  # 10 x 30 ms is under the floor
    for _ in range(64):
        d.step_started(t)
        t += 0.4
    assert d.seconds() == pytest.approx(4.0)
    d.step_started(t + 60)  # an idle minute is not a step period
    assert d.seconds() == pytest.approx(4.0)


class Probed(FakeDrafter):
    """A fake drafter with a health probe whose ref is ready only once ``healthy`` is set."""

    def __init__(self, answer) -> None:
        super().__init__(answer)
        self.healthy: bool | None = None  # None: not answering; False: answers badly


@pytest.fixture
def fake_ray(monkeypatch):
    """``ray.get`` / ``ray.wait`` over ``Ref``s; the probe ref of drafter ``d`` is ready when ``d.healthy`` is not
    None. Records ``ray.get`` timeouts and ``ray.cancel`` calls."""
    seen: dict[str, list] = {"timeouts": [], "cancelled": []}
    drafters: list[Probed] = []

    def probe_of(ref: Ref) -> Probed | None:
        return next((d for d in drafters if ref.value == ("probe", id(d))), None)

    def get(ref: Ref, timeout: float | None = None) -> Any:
        seen["timeouts"].append(timeout)
        d = probe_of(ref)
        if d is not None:
            if not d.healthy:
                raise RuntimeError("probe failed")
            return (1, 1)
        if ref.error is not None:
            raise ref.error
        return ref.value

    def wait(refs, timeout=None):
        ready = [r for r in refs if (d := probe_of(r)) is None or d.healthy is not None]
        return ready, [r for r in refs if r not in ready]

    def register(d: Probed) -> Probed:
        drafters.append(d)
        d.probe = Method(lambda: Ref(value=("probe", id(d))))
        return d

    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray, "wait", wait)
    monkeypatch.setattr(ray, "cancel", lambda ref, **kw: seen["cancelled"].append(ref))
    seen["register"] = register
    return seen


def hangs(step):
    return ray.exceptions.GetTimeoutError("no answer")


def test_a_hung_drafter_is_left_out_until_its_probe_answers(fake_ray):
    hung, other = fake_ray["register"](Probed(hangs)), fake_ray["register"](Probed(good))
    pool = Pool({"hung": (hung, 0), "other": (other, 100)})  # new sequences go to "hung" first
    pool.homes.new_group_size = 8
    pool.drafters.quarantine.min_hold_s = 0.0
    drafts = pool.draft(*step_of(0, ["a"]))
    assert drafts.errors and drafts.short == {0: Short.FAILED} and "hung" in pool.drafters.quarantine
    assert fake_ray["cancelled"], "the call given up on was not cancelled"

    # Discovery still names "hung" (its Serve replica answers): it stays out; the sequence re-homes on "other",
    # and so do new ones, though "hung" reports less load.
    drafts = pool.draft(*step_of(1, ["a", "b"]))
    assert not drafts.errors and not drafts.short and set(pool.homes.home.values()) == {"other"}
    assert "hung" not in pool.drafters.links

    hung.healthy, hung.answer = False, good  # answering, but its probe fails: still out
    pool.draft(*step_of(2, ["a", "b"]))
    assert "hung" not in pool.drafters.links


def test_a_recovered_drafter_is_used_again(fake_ray):
    hung, other = fake_ray["register"](Probed(hangs)), fake_ray["register"](Probed(good))
    pool = Pool({"hung": (hung, 0), "other": (other, 100)})
    pool.drafters.quarantine.min_hold_s = 0.0
    pool.draft(*step_of(0, ["a"]))
    assert "hung" in pool.drafters.quarantine
    hung.healthy, hung.answer = True, good  # SIGCONT: it works through its queue and answers the probe
    drafts = pool.draft(*step_of(1, ["a", "c"]))
    assert not drafts.errors and not drafts.short
    assert "hung" in pool.drafters.links and "hung" not in pool.drafters.quarantine
    assert any(kind == "readmitted" for _, kind, _ in pool.drafters.events)
    assert pool.homes.home["c"] == "hung"  # the least loaded again


def test_quarantine_holds_at_least_min_hold_and_forgets_the_silent(fake_ray, monkeypatch):
    import actors.verifier.drafters as health

    now = [100.0]
    monkeypatch.setattr(health.time, "monotonic", lambda: now[0])
    d = fake_ray["register"](Probed(good))
    q = Quarantine(min_hold_s=5.0, forget_after_s=60.0)
    q.hold("d", d, True)
    d.healthy = True
    assert q.recovered() == [] and "d" in q  # answered at once (a bad answer, not a hang): held 5 s anyway
    now[0] += 5.0
    (released,) = q.recovered()
    assert released[0] == "d" and released[1].drafts_branches and "d" not in q

    silent = fake_ray["register"](Probed(good))
    q.hold("s", silent, True)
    now[0] += 30.0
    assert q.recovered() == [] and "s" in q
    now[0] += 31.0
    assert q.recovered() == [] and "s" not in q  # forgotten: if discovery names it again, it is tried afresh


def test_the_step_waits_the_deadline_not_the_pool_timeout(fake_ray):
    """After steps 20 ms apart, a hung drafter's answer is waited for ~1 s (the floor), not the pool's 10 s."""
    hung = fake_ray["register"](Probed(good))
    pool = Pool({"hung": (hung, 0)}, timeout_s=10.0)
    assert pool.drafters.deadline.max_s == 10.0
    for i in range(10):  # healthy steps, 20 ms apart (the clock is real: the deadline is from measured periods)
        pool.drafters.deadline.step_started(i * 0.02)
    hung.answer = hangs
    fake_ray["timeouts"].clear()
    pool.draft(*step_of(0, ["a"]))
    waited = [t for t in fake_ray["timeouts"] if t is not None]
    assert waited and max(waited) <= 1.0 + 1e-6, waited


class Listed:
    """A ``Finder`` naming ``found`` (those not ``known``), or raising it."""

    def __init__(self, found) -> None:
        self.found, self.asked = found, 0

    def find(self, known):
        self.asked += 1
        if isinstance(self.found, Exception):
            raise self.found
        return [f for f in self.found if not known(f[0])]


def test_discovery_runs_in_the_background_and_learns_the_pools_settings():
    info = {"drafts_branches": True, "active_sequences": 3, "timeout_s": 3.0, "target_sequences": 16}
    drafters = Drafters(Listed([("r1", object(), info), ("r2", object(), {})]), timeout_s=10.0,
                        discover_period_s=3600.0)
    assert not drafters.links and drafters.prefix_max_load == float("inf")
    drafters.start(10.0)  # the first round, waited for (the engine's start)
    assert set(drafters.links) == {"r1", "r2"} and drafters.usable()
    r1 = drafters.links["r1"]
    assert r1.drafts_branches and r1.load == 3 and not drafters.links["r2"].drafts_branches
    assert drafters.deadline.max_s == 3.0 and drafters.prefix_max_load == 16.0
    assert [kind for _, kind, _ in drafters.events] == ["attached", "attached"]


def test_a_finder_that_raises_finds_none():
    finder = Listed(RuntimeError("no pool"))
    drafters = Drafters(finder, discover_period_s=3600.0)
    drafters.start(10.0)
    assert finder.asked == 1 and not drafters.usable() and not drafters.links and not drafters.events


def test_actor_finder_makes_no_call_for_a_known_drafter(fake_ray):
    calls = []
    actor = SimpleNamespace(info=Method(lambda: calls.append(1) or Ref({"drafter_id": "d1", "drafts_branches": True})))
    finder = ActorFinder(actor)
    (found,) = finder.find(lambda drafter_id: False)
    assert found == ("d1", actor, {"drafter_id": "d1", "drafts_branches": True}) and len(calls) == 1
    assert finder.find(lambda drafter_id: drafter_id == "d1") == [] and len(calls) == 1  # in use or held out
    assert type(build_finder({"actor": "drafter", "namespace": "ns"})) is ActorFinder
