"""Draft KV slots are not leaked (hardening): a drafter the client drops for a timeout or a bad answer is told to
free the sequences it held (it may be alive, and its slots count as load for the router and the autoscaler).

No Ray runs here: the drafter is a fake actor whose calls return fake object refs, and ``ray.get`` / ``ray.wait``
are replaced to read them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import ray

from actors.messages import DraftResult, DraftStatus, DraftStep, SeqSlice
from actors.verifier.client import DraftClient

K = 2
VOCAB = 100


@dataclass
class Ref:
    """A fake ``ObjectRef``: ``ray.get`` returns ``value``, or raises ``error``."""

    value: Any = None
    error: Exception | None = None


class Method:
    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:
        return self.fn(*args)


class FakeDrafter:
    """A drafter actor: ``propose`` answers ``answer(step)`` (a ``DraftResult`` or an exception for ``ray.get``);
    ``free`` and a step's ``finished`` record what it was asked to free (``free`` raises with ``free_raises``)."""

    def __init__(self, answer, free_raises: bool = False) -> None:
        self.answer, self.free_raises = answer, free_raises
        self.freed: list[str] = []
        self.propose = Method(self._propose)
        self.free = Method(self._free)
        self.branches = Method(lambda req_ids: Ref(error=AssertionError("no branches asked of a sync drafter")))

    def _propose(self, step_bytes: bytes, hidden: np.ndarray) -> Ref:
        step = DraftStep.unpack(step_bytes)
        self.freed += step.finished  # as the engine does first thing
        out = self.answer(step)
        return Ref(error=out) if isinstance(out, Exception) else Ref(out.pack())

    def _free(self, req_ids: list[str]) -> Ref:
        if self.free_raises:
            raise RuntimeError("actor handle unusable")
        self.freed += req_ids
        return Ref(0)


def good(step: DraftStep) -> DraftResult:
    return DraftResult(step.step_id, DraftStatus.OK, np.ones((len(step.seqs), K), np.int32))


def out_of_vocab(step: DraftStep) -> DraftResult:
    return DraftResult(step.step_id, DraftStatus.OK, np.full((len(step.seqs), K), VOCAB + 5, np.int32))


def timed_out(step: DraftStep) -> Exception:
    return ray.exceptions.GetTimeoutError("drafter too slow")


class Pool(DraftClient):
    def __init__(self, drafters: dict[str, tuple[FakeDrafter, int]]) -> None:
        super().__init__(timeout_s=1.0, vocab_size=VOCAB)
        self.drafters = drafters

    def _discover(self, blocking: bool) -> None:
        for drafter_id, (actor, load) in self.drafters.items():
            self._add_link(drafter_id, actor, {"drafts_branches": False, "active_sequences": load})


@pytest.fixture(autouse=True)
def fake_ray(monkeypatch):
    def get(ref: Ref, timeout: float | None = None) -> Any:
        if ref.error is not None:
            raise ref.error
        return ref.value

    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray, "wait", lambda refs, timeout=None: (list(refs), []))


def step_of(step_id: int, req_ids: list[str], finished: list[str] | None = None) -> tuple[DraftStep, np.ndarray]:
    seqs = [SeqSlice(rid, i, 1, 10 + step_id) for i, rid in enumerate(req_ids)]
    return DraftStep(step_id, K, seqs, np.ones(len(seqs), np.int32), finished or []), np.zeros((len(seqs), 4))


@pytest.mark.parametrize("answer", [out_of_vocab, timed_out], ids=["bad-answer", "timeout"])
def test_dropped_drafter_is_told_to_free_what_it_held(answer):
    import torch

    sick, healthy = FakeDrafter(answer), FakeDrafter(good)
    client = Pool({"sick": (sick, 0), "healthy": (healthy, 100)})  # new sequences go to the least loaded: sick
    client.new_group_size = 8
    s, h = step_of(0, ["a", "b"])
    reply, _ = client.propose(s, torch.from_numpy(h))
    assert reply.status is DraftStatus.FAILED
    assert sorted(sick.freed) == ["a", "b"]  # freed on the home they lost, not only forgotten here
    assert "sick" not in client.links and set(client.lost) == {"a", "b"}

    # Next step: re-homed on the healthy drafter; nothing else is sent to the dropped one.
    client.drafters.pop("sick")
    s, h = step_of(1, ["a", "b"])
    reply, _ = client.propose(s, torch.from_numpy(h))
    assert reply.status is DraftStatus.OK and client.home == {"a": "healthy", "b": "healthy"}
    assert sorted(sick.freed) == ["a", "b"]


def test_finished_and_lost_sequences_are_all_freed_on_the_dropped_drafter():
    import torch

    sick = FakeDrafter(good)
    client = Pool({"sick": (sick, 0)})
    s, h = step_of(0, ["a", "b"])
    client.propose(s, torch.from_numpy(h))
    sick.answer = out_of_vocab
    s, h = step_of(1, ["b"], finished=["a"])  # "a" finished: freed with this step, which fails: "b" by free()
    client.propose(s, torch.from_numpy(h))
    assert sorted(sick.freed) == ["a", "b"]


def test_freeing_on_a_dead_drafter_never_raises():
    import torch

    dead = FakeDrafter(timed_out, free_raises=True)
    client = Pool({"dead": (dead, 0)})
    s, h = step_of(0, ["a"])
    reply, _ = client.propose(s, torch.from_numpy(h))  # must not raise
    assert reply.status is DraftStatus.FAILED and dead.freed == [] and "a" in client.lost
