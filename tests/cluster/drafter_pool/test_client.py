"""``ServeDraftClient`` over a fake drafter deployment handle (no Ray, no Serve): it learns drafters through
``attach`` (and the pool's draft-call timeout with them), drops one that fails and frees what it held there,
re-homes the lost sequences on the drafter the pool answers next, and frees finished sequences on their home."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from actors.messages import DraftStatus, DraftStep, SeqSlice
from cluster.drafter_pool.client import ServeDraftClient
from cluster.drafter_pool.router import route_key
from tests.actors.fake_drafters import VOCAB, FakeDrafter, K, fake_ray, good, timed_out


class FakeHandle:
    """The drafter deployment's handle: ``attach`` answers the replica the pool's router would choose now
    (``replicas[0]``); ``replicas`` empty: no drafter application is up."""

    def __init__(self, replicas: list[tuple[str, FakeDrafter]]) -> None:
        self.replicas = replicas
        self.session_ids: list[str] = []

    def options(self, session_id: str | None = None, **_):
        self.session_ids.append(session_id)
        return self

    @property
    def attach(self):
        return SimpleNamespace(remote=lambda: SimpleNamespace(result=self._result))

    def _result(self, timeout_s: float | None = None):
        if not self.replicas:
            raise TimeoutError("no drafter replica")
        replica_id, actor = self.replicas[0]
        return replica_id, actor, {"drafts_branches": False, "active_sequences": 0, "timeout_s": 3.0}


@pytest.fixture
def pool(monkeypatch):
    from ray import serve

    fake_ray(monkeypatch)
    handle = FakeHandle([])
    monkeypatch.setattr(serve, "get_deployment_handle", lambda name, app_name: handle)
    client = ServeDraftClient("eagle-drafters", "Drafter", vocab_size=VOCAB, discover_period_s=3600)
    return client, handle


def _step(step_id: int, req_ids: list[str]) -> tuple[DraftStep, torch.Tensor]:
    seqs = [SeqSlice(rid, i, 1, 10 + step_id) for i, rid in enumerate(req_ids)]
    return DraftStep(step_id, K, seqs, np.ones(len(seqs), np.int32)), torch.zeros(len(seqs), 4)


def test_failure_rehome_and_free(pool):
    client, handle = pool
    r1, r2 = FakeDrafter(good), FakeDrafter(good)
    handle.replicas = [("r1", r1)]
    reply, _ = client.propose(*_step(0, ["a", "b"]))
    assert reply.status is DraftStatus.OK and client.home == {"a": "r1", "b": "r1"}
    assert client.timeout_s == 3.0  # the pool's setting, learnt with the drafter
    assert handle.session_ids[0] == route_key(None, 1)  # routed as new: to the least-loaded replica

    r1.answer = timed_out  # r1 fails: dropped, told to free what it held, its sequences lose their home
    reply, _ = client.propose(*_step(1, ["a", "b"]))
    assert reply.status is DraftStatus.FAILED
    assert "r1" not in client.links and sorted(r1.freed) == ["a", "b"] and set(client.lost) == {"a", "b"}

    handle.replicas = [("r2", r2)]  # Serve replaced the replica: the next step finds it and re-homes there
    reply, _ = client.propose(*_step(2, ["a", "b"]))
    assert reply.status is DraftStatus.OK and client.home == {"a": "r2", "b": "r2"}
    assert client.rehomed == 2 and not client.lost
    assert [e[1] for e in client.events] == ["failed", "rehomed"]

    client.free(["a"])  # the engine went idle: freed on its home at once
    assert r2.freed == ["a"] and client.home == {"b": "r2"}
    assert sorted(r1.freed) == ["a", "b"]  # nothing more sent to the dropped drafter


def test_no_drafter_application_drafts_nothing_and_backs_off(pool):
    client, handle = pool
    reply, _ = client.propose(*_step(0, ["a"]))
    assert reply.status is not DraftStatus.OK and not client.links
    asked = len(handle.session_ids)
    handle.replicas = [("r1", FakeDrafter(good))]
    client.propose(*_step(1, ["a"]))  # within the back-off: not asked again, blocking
    assert len(handle.session_ids) == asked and not client.links
