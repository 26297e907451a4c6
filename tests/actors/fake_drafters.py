"""Drafter actors without Ray, for the remote speculator's tests: a fake actor whose calls return fake object refs,
``fake_ray`` to make ``ray.get`` / ``ray.wait`` read them, and ``Pool``, a ``RemoteSpeculator`` over such fakes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch

from actors.messages import DraftResult, DraftStatus, DraftStep, SeqSlice
from actors.verifier.remote_speculator import RemoteSpeculator
from actors.verifier.speculator import Drafts

K = 2
VOCAB = 100


@dataclass
class Ref:
    """A fake ``ObjectRef``: ``ray.get`` returns ``value``, or raises ``error``; ``ray.wait`` finds it ready when
    ``ready`` says so."""

    value: Any = None
    error: Exception | None = None
    ready: bool = True


class Method:
    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:
        return self.fn(*args)


class FakeDrafter:
    """A drafter actor: ``draft_step`` answers ``answer(step)`` (a ``DraftResult`` or an exception for ``ray.get``);
    ``free`` records what it was asked to free (``free`` raises with ``free_raises``); ``steps`` the steps it got."""

    def __init__(self, answer, free_raises: bool = False) -> None:
        self.answer, self.free_raises = answer, free_raises
        self.freed: list[str] = []
        self.steps: list[DraftStep] = []
        self.draft_step = Method(self._draft_step)
        self.free = Method(self._free)
        self.branches = Method(lambda req_ids: Ref(error=AssertionError("no branches asked of a sync drafter")))

    def _draft_step(self, step_bytes: bytes, hidden: np.ndarray) -> Ref:
        step = DraftStep.unpack(step_bytes)
        self.steps.append(step)
        assert step.finished == [], "finished sequences are freed by free(), never carried by a step"
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


class FakeRay:
    """``ray.get`` / ``ray.wait`` / ``ray.cancel`` over fake ``Ref``s (a test's ``monkeypatch``), recording what was
    read (``got``) and cancelled: no real Ray is started for them (a real ``ray.cancel`` would auto-start one, or join
    the last ``ray start``'s). ``ray.wait`` finds a ref ready when its ``ready`` says so and it is not in ``pending``
    (where ``ray.get`` fails the test: it would block the step) nor, before its first ``ray.wait``, in ``late``."""

    def __init__(self, monkeypatch) -> None:
        self.got: list = []
        self.cancelled: list = []
        self.pending: list = []
        self.late: list = []
        monkeypatch.setattr(ray, "get", self.get)
        monkeypatch.setattr(ray, "wait", self.wait)
        monkeypatch.setattr(ray, "cancel", lambda ref, **kw: self.cancelled.append(ref))

    @staticmethod
    def _in(ref, refs: list) -> bool:
        return any(ref is r for r in refs)

    def get(self, ref: Ref, timeout: float | None = None) -> Any:
        assert not self._in(ref, self.pending), "the step waited for a call it must not wait for"
        self.got.append(ref)
        if ref.error is not None:
            raise ref.error
        return ref.value

    def wait(self, refs: list, timeout: float | None = None) -> tuple[list, list]:
        ready = [r for r in refs if r.ready and not self._in(r, self.pending) and not self._in(r, self.late)]
        self.late = [r for r in self.late if not self._in(r, refs)]  # late once
        return ready, [r for r in refs if not self._in(r, ready)]

    def was_read(self, ref) -> bool:
        return self._in(ref, self.got)

    def read_at(self, ref) -> int:
        """Where ``ref`` is in the order of reads (by identity: two refs may hold equal values)."""
        return next(i for i, r in enumerate(self.got) if r is ref)


def fake_ray(monkeypatch) -> FakeRay:
    """Ray's ``get`` / ``wait`` / ``cancel`` faked for this test (``FakeRay``)."""
    return FakeRay(monkeypatch)


class Pool(RemoteSpeculator):
    """A ``RemoteSpeculator`` over fake drafters, ``fakes``: ``{drafter id: (FakeDrafter, its reported load)}``.

    No discovery thread: ``draft`` names every fake to ``drafters.add`` at each step, as a discovery round would (so
    a dropped one is named again, and stays out while it is held, ``Quarantine``)."""

    def __init__(self, fakes: dict[str, tuple[FakeDrafter, int]], drafts_branches: bool = False, **kw: Any) -> None:
        super().__init__(None, **({"timeout_s": 1.0, "vocab_size": VOCAB} | kw))
        self.fakes, self.drafts_branches = fakes, drafts_branches

    def found(self) -> None:
        """The fakes, added (one in use or held out is left as it is)."""
        for drafter_id, (actor, load) in self.fakes.items():
            self.drafters.add(drafter_id, actor, {"drafts_branches": self.drafts_branches, "active_sequences": load})

    def draft(self, step: DraftStep, hidden: torch.Tensor | np.ndarray) -> Drafts:
        """One step as ``actors.verifier.speculation`` drives it: ``ready`` (readmits the recovered), then ``send``
        and ``collect``."""
        self.ready()
        self.found()
        hidden = torch.from_numpy(hidden) if isinstance(hidden, np.ndarray) else hidden
        return self.collect(self.send(step, hidden))


def step_of(step_id: int, req_ids: list[str]) -> tuple[DraftStep, np.ndarray]:
    seqs = [SeqSlice(rid, i, 1, 10 + step_id) for i, rid in enumerate(req_ids)]
    return DraftStep(step_id, K, seqs, np.ones(len(seqs), np.int32)), np.zeros((len(seqs), 4))
