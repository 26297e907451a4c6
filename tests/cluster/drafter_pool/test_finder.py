"""``ServeFinder`` behind a ``RemoteSpeculator``, over a fake drafter deployment handle (no Ray, no Serve): the
speculator learns drafters through ``attach`` in its background discovery only (and the pool's draft-call timeout and
target sequences per replica with them), drops one that fails and frees what it held there, re-homes the lost
sequences on the drafter the pool answers next, and frees finished sequences on their home; it starts without a
drafter application (steps draft nothing) and finds one deployed later; an ``attach`` hung on a stopped replica
never blocks a step."""

from __future__ import annotations

import threading
from concurrent.futures import wait as wait_futures
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from actors.messages import DraftStep, SeqSlice
from actors.verifier.remote_speculator import RemoteSpeculator, build_speculator
from actors.verifier.speculator import Drafts, Short
from cluster.drafter_pool import finder as finder_module
from cluster.drafter_pool.finder import SERVE_FINDER, ServeFinder
from cluster.drafter_pool.router import route_key
from tests.actors.fake_drafters import VOCAB, FakeDrafter, K, fake_ray, good, timed_out


class FakeHandle:
    """The drafter deployment's handle: ``attach`` answers the replica the pool's router would choose now
    (``replicas[0]``); ``replicas`` empty: no replica to route to (``attach`` times out). ``hang``: an event the
    attach call waits for (a replica process that is stopped)."""

    def __init__(self, replicas: list[tuple[str, FakeDrafter]]) -> None:
        self.replicas = replicas
        self.session_ids: list[str] = []
        self.hang: threading.Event | None = None
        self.cancelled = 0

    def options(self, session_id: str | None = None, **_):
        self.session_ids.append(session_id)
        return self

    @property
    def attach(self):
        return SimpleNamespace(remote=lambda: SimpleNamespace(result=self._result, cancel=self._cancel))

    def _cancel(self) -> None:
        self.cancelled += 1

    def _result(self, timeout_s: float | None = None):
        if self.hang is not None and not self.hang.wait(timeout_s):
            raise TimeoutError("the replica did not answer")
        if not self.replicas:
            raise TimeoutError("no drafter replica")
        replica_id, actor = self.replicas[0]
        return replica_id, actor, {"drafts_branches": False, "active_sequences": 0, "timeout_s": 3.0,
                                   "target_sequences": 16}


class Serve:
    """``serve.get_deployment_handle``: the handle, or Serve's KeyError while the application does not exist."""

    def __init__(self, handle: FakeHandle, deployed: bool = True) -> None:
        self.handle, self.deployed, self.opened = handle, deployed, 0

    def get_deployment_handle(self, name: str, app_name: str) -> FakeHandle:
        if not self.deployed:
            raise KeyError(f"Deployment(name='{name}', app='{app_name}') does not exist.")
        self.opened += 1
        return self.handle


def discovered(speculator: RemoteSpeculator) -> None:
    """Run one background discovery round now and wait for it (what the period would do), then take its
    results in, as the next step does."""
    drafters = speculator.drafters
    drafters._next_discovery = 0.0
    drafters._discover()
    wait_futures([drafters._finding], timeout=10)
    drafters._discover()


@pytest.fixture
def pool(monkeypatch):
    from ray import serve

    fake_ray(monkeypatch)
    handle = FakeHandle([])
    fake = Serve(handle)
    monkeypatch.setattr(serve, "get_deployment_handle", fake.get_deployment_handle)
    monkeypatch.setattr(finder_module, "ATTACH_TIMEOUT_S", 0.05)

    def make(replicas=(), deployed: bool = True) -> RemoteSpeculator:
        """As the verifier's worker builds it from ``additional_config`` (the constructor waits for the first
        discovery)."""
        handle.replicas, fake.deployed = list(replicas), deployed
        return build_speculator({"finder": SERVE_FINDER, "app_name": "eagle-drafters", "deployment_name": "Drafter",
                                 "vocab_size": VOCAB, "discover_period_s": 3600})

    return make, handle, fake


def _step(step_id: int, req_ids: list[str]) -> tuple[DraftStep, torch.Tensor]:
    seqs = [SeqSlice(rid, i, 1, 10 + step_id) for i, rid in enumerate(req_ids)]
    return DraftStep(step_id, K, seqs, np.ones(len(seqs), np.int32)), torch.zeros(len(seqs), 4)


def draft(speculator: RemoteSpeculator, sent: tuple[DraftStep, torch.Tensor]) -> Drafts:
    """One step: ``ready`` (which takes in what discovery found: never blocks), then the step sent and collected
    (with no drafter, every sequence is short: ``Short.NO_DRAFTER``)."""
    speculator.ready()
    return speculator.collect(speculator.send(*sent))


def test_failure_rehome_and_free(pool):
    make, handle, _ = pool
    r1, r2 = FakeDrafter(good), FakeDrafter(good)
    speculator = make([("r1", r1)])  # found at start (the constructor waits for the first discovery)
    assert isinstance(speculator.drafters.finder, ServeFinder) and speculator.ready()
    homes, drafters = speculator.homes, speculator.drafters
    drafts = draft(speculator, _step(0, ["a", "b"]))
    assert not drafts.errors and homes.home == {"a": "r1", "b": "r1"} and not drafts.short
    # the pool's settings, learnt with the drafter: its draft-call timeout, its target sequences per replica
    assert drafters.deadline.max_s == 3.0 and drafters.prefix_max_load == 16
    assert handle.session_ids[0] == route_key(None, 1)  # routed as new: to the least-loaded replica

    r1.answer = timed_out  # r1 fails: dropped, told to free what it held, its sequences lose their home
    drafts = draft(speculator, _step(1, ["a", "b"]))
    assert drafts.errors and drafts.short == {0: Short.FAILED, 1: Short.FAILED}
    assert "r1" not in drafters.links and sorted(r1.freed) == ["a", "b"] and set(homes.lost) == {"a", "b"}
    assert not speculator.ready()  # the only drafter is out: steps draft nothing until one is found

    handle.replicas = [("r2", r2)]  # Serve replaced the replica: discovery finds it, the next step re-homes there
    discovered(speculator)
    drafts = draft(speculator, _step(2, ["a", "b"]))
    assert not drafts.errors and not drafts.short and homes.home == {"a": "r2", "b": "r2"}
    assert homes.rehomed == 2 and not homes.lost
    assert [e[1] for e in drafters.events] == ["attached", "failed", "attached", "rehomed"]

    speculator.free(["a"])  # the scheduler finished it: freed on its home at once
    assert r2.freed == ["a"] and homes.home == {"b": "r2"}
    assert sorted(r1.freed) == ["a", "b"]  # nothing more sent to the dropped drafter
    assert all(s.finished == [] for s in r2.steps)  # never carried by a step


def test_no_drafter_application_at_start_then_deployed(pool):
    """The verifier starts before the drafter application exists: the speculator is built (no KeyError), steps
    draft nothing and never ask Serve; once the application is deployed, discovery finds its replica."""
    make, handle, fake = pool
    speculator = make(deployed=False)
    finder = speculator.drafters.finder
    assert finder.handle is None and not speculator.drafters.links and fake.opened == 0
    assert not speculator.ready()
    drafts = draft(speculator, _step(0, ["a"]))
    assert not drafts.errors and drafts.short == {0: Short.NO_DRAFTER} and not speculator.homes.home
    fake.deployed = True  # the pool is deployed, but has no replica running yet: attach times out
    discovered(speculator)
    assert fake.opened == 1 and handle.cancelled == 1 and finder.handle is None and not speculator.drafters.links
    r1 = FakeDrafter(good)
    handle.replicas = [("r1", r1)]
    discovered(speculator)  # the handle is opened again and the replica attached
    assert fake.opened == 2 and set(speculator.drafters.links) == {"r1"}
    drafts = draft(speculator, _step(1, ["a"]))
    assert not drafts.errors and speculator.homes.home == {"a": "r1"} and not drafts.short


def test_a_hung_replica_never_blocks_a_step(pool):
    """``attach`` to a stopped replica process hangs in the discovery thread; steps go on meanwhile."""
    make, handle, _ = pool
    speculator = make()
    drafters = speculator.drafters
    handle.hang = threading.Event()
    handle.replicas = [("r1", FakeDrafter(good))]
    drafters._next_discovery = 0.0
    for i in range(3):
        assert not speculator.ready()  # starts the round in the background, and returns at once
        drafts = speculator.collect(speculator.send(*_step(i, ["a"])))
        assert drafts.short == {0: Short.NO_DRAFTER}
    assert drafters._finding is not None and not drafters._finding.done()  # still waiting for the hung replica
    handle.hang.set()  # SIGCONT: the replica answers
    wait_futures([drafters._finding], timeout=10)
    drafts = draft(speculator, _step(3, ["a"]))
    assert set(drafters.links) == {"r1"} and speculator.homes.home == {"a": "r1"} and not drafts.short


def test_discovery_learns_every_replica_in_one_round(pool):
    """The router answers the least-loaded replica, so asking again names the next: a round asks until it names
    one the verifier knows."""
    make, handle, _ = pool
    r1, r2 = FakeDrafter(good), FakeDrafter(good)
    answers = iter([("r1", r1), ("r2", r2), ("r1", r1)])
    handle._result = lambda timeout_s=None: (*next(answers), {"drafts_branches": False})
    speculator = make()
    assert set(speculator.drafters.links) == {"r1", "r2"}
    assert speculator.drafters.prefix_max_load == float("inf")  # no target sequences in the info: unbounded


def test_find_stops_at_a_known_replica():
    """``ServeFinder.find`` on its own: it asks ``known`` (the verifier's drafters in use or held out), and an
    attach that fails ends the round with what it found."""
    handle = FakeHandle([("r1", FakeDrafter(good))])
    finder = ServeFinder("eagle-drafters", "Drafter")
    finder.handle = handle
    assert finder.find(lambda drafter_id: drafter_id == "r1") == []
    (found,) = finder.find(lambda drafter_id: False)  # r1 again at the next attach: seen this round, stop
    assert found[0] == "r1" and len(handle.session_ids) == 3
    handle.replicas = []
    assert finder.find(lambda drafter_id: False) == [] and finder.handle is None and handle.cancelled == 1
