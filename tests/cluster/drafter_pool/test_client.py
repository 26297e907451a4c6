"""``ServeDraftClient`` over a fake drafter deployment handle (no Ray, no Serve): it learns drafters through
``attach`` in its background discovery only (and the pool's draft-call timeout with them), drops one that fails and
frees what it held there, re-homes the lost sequences on the drafter the pool answers next, and frees finished
sequences on their home; it starts without a drafter application (steps draft nothing) and finds one deployed
later; an ``attach`` hung on a stopped replica never blocks a step."""

from __future__ import annotations

import threading
from concurrent.futures import wait as wait_futures
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from actors.messages import DraftStatus, DraftStep, SeqSlice
from cluster.drafter_pool import client as client_module
from cluster.drafter_pool.client import ServeDraftClient
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
        return replica_id, actor, {"drafts_branches": False, "active_sequences": 0, "timeout_s": 3.0}


class Serve:
    """``serve.get_deployment_handle``: the handle, or Serve's KeyError while the application does not exist."""

    def __init__(self, handle: FakeHandle, deployed: bool = True) -> None:
        self.handle, self.deployed, self.opened = handle, deployed, 0

    def get_deployment_handle(self, name: str, app_name: str) -> FakeHandle:
        if not self.deployed:
            raise KeyError(f"Deployment(name='{name}', app='{app_name}') does not exist.")
        self.opened += 1
        return self.handle


def discovered(client: ServeDraftClient) -> None:
    """Run one background discovery round now and wait for it (what the period would do), then take its
    results in, as the next step does."""
    client._next_discovery = 0.0
    client._discover()
    wait_futures([client._finding], timeout=10)
    client._discover()


@pytest.fixture
def pool(monkeypatch):
    from ray import serve

    fake_ray(monkeypatch)
    handle = FakeHandle([])
    fake = Serve(handle)
    monkeypatch.setattr(serve, "get_deployment_handle", fake.get_deployment_handle)
    monkeypatch.setattr(client_module, "ATTACH_TIMEOUT_S", 0.05)

    def make(replicas=(), deployed: bool = True) -> ServeDraftClient:
        handle.replicas, fake.deployed = list(replicas), deployed
        return ServeDraftClient("eagle-drafters", "Drafter", vocab_size=VOCAB, discover_period_s=3600)

    return make, handle, fake


def _step(step_id: int, req_ids: list[str]) -> tuple[DraftStep, torch.Tensor]:
    seqs = [SeqSlice(rid, i, 1, 10 + step_id) for i, rid in enumerate(req_ids)]
    return DraftStep(step_id, K, seqs, np.ones(len(seqs), np.int32)), torch.zeros(len(seqs), 4)


def test_failure_rehome_and_free(pool):
    make, handle, _ = pool
    r1, r2 = FakeDrafter(good), FakeDrafter(good)
    client = make([("r1", r1)])  # found at start (the constructor waits for the first discovery)
    reply, _ = client.draft_batch(*_step(0, ["a", "b"]))
    assert reply.status is DraftStatus.OK and client.home == {"a": "r1", "b": "r1"} and not reply.undrafted
    assert client.timeout_s == 3.0  # the pool's setting, learnt with the drafter
    assert handle.session_ids[0] == route_key(None, 1)  # routed as new: to the least-loaded replica

    r1.answer = timed_out  # r1 fails: dropped, told to free what it held, its sequences lose their home
    reply, _ = client.draft_batch(*_step(1, ["a", "b"]))
    assert reply.status is DraftStatus.FAILED and reply.undrafted == {0: "failed", 1: "failed"}
    assert "r1" not in client.links and sorted(r1.freed) == ["a", "b"] and set(client.lost) == {"a", "b"}
    assert not client.usable()  # the only drafter is out: steps draft nothing until one is found

    handle.replicas = [("r2", r2)]  # Serve replaced the replica: discovery finds it, the next step re-homes there
    discovered(client)
    reply, _ = client.draft_batch(*_step(2, ["a", "b"]))
    assert reply.status is DraftStatus.OK and client.home == {"a": "r2", "b": "r2"}
    assert client.rehomed == 2 and not client.lost
    assert [e[1] for e in client.events] == ["attached", "failed", "attached", "rehomed"]

    client.free(["a"])  # the engine went idle: freed on its home at once
    assert r2.freed == ["a"] and client.home == {"b": "r2"}
    assert sorted(r1.freed) == ["a", "b"]  # nothing more sent to the dropped drafter


def test_no_drafter_application_at_start_then_deployed(pool):
    """The verifier starts before the drafter application exists: the client is built (no KeyError), steps
    draft nothing and never ask Serve; once the application is deployed, discovery finds its replica."""
    make, handle, fake = pool
    client = make(deployed=False)
    assert client.handle is None and not client.links and fake.opened == 0
    reply, _ = client.draft_batch(*_step(0, ["a"]))
    assert reply.status is DraftStatus.OK and reply.undrafted == {0: "no_drafter"} and not client.home
    fake.deployed = True  # the pool is deployed, but has no replica running yet: attach times out
    discovered(client)
    assert fake.opened == 1 and handle.cancelled == 1 and client.handle is None and not client.links
    r1 = FakeDrafter(good)
    handle.replicas = [("r1", r1)]
    discovered(client)  # the handle is opened again and the replica attached
    assert fake.opened == 2 and set(client.links) == {"r1"}
    reply, _ = client.draft_batch(*_step(1, ["a"]))
    assert reply.status is DraftStatus.OK and client.home == {"a": "r1"} and not reply.undrafted


def test_a_hung_replica_never_blocks_a_step(pool):
    """``attach`` to a stopped replica process hangs in the discovery thread; steps go on meanwhile."""
    make, handle, _ = pool
    client = make()
    handle.hang = threading.Event()
    handle.replicas = [("r1", FakeDrafter(good))]
    client._next_discovery = 0.0
    for i in range(3):
        reply, _ = client.draft_batch(*_step(i, ["a"]))
        assert reply.undrafted == {0: "no_drafter"}
    assert client._finding is not None and not client._finding.done()  # still waiting for the hung replica
    handle.hang.set()  # SIGCONT: the replica answers
    wait_futures([client._finding], timeout=10)
    reply, _ = client.draft_batch(*_step(3, ["a"]))
    assert set(client.links) == {"r1"} and client.home == {"a": "r1"} and not reply.undrafted


def test_discovery_learns_every_replica_in_one_round(pool):
    """The router answers the least-loaded replica, so asking again names the next: a round asks until it names
    one the client knows."""
    make, handle, _ = pool
    r1, r2 = FakeDrafter(good), FakeDrafter(good)
    answers = iter([("r1", r1), ("r2", r2), ("r1", r1)])
    handle._result = lambda timeout_s=None: (*next(answers), {"drafts_branches": False})
    client = make()
    assert set(client.links) == {"r1", "r2"}
