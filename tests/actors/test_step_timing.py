"""Step timings mean "until the work is done" on CUDA as on a CPU (``actors.timing``): the drafter's timed calls
wait for the device before reading the clock when it is a CUDA device, and never on a CPU; the verifier's worker
records CUDA events instead and never waits (its steps must not stall), on tensor-parallel rank 0 only. Checked with
``torch.cuda.synchronize`` and ``torch.cuda.Event`` replaced by recorders (no GPU needed); no durations are
asserted."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from actors import timing


@pytest.fixture
def syncs(monkeypatch) -> list:
    """The devices ``torch.cuda.synchronize`` was called with."""
    calls: list = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    return calls


def test_synchronize_on_cuda_only(syncs):
    timing.synchronize("cpu")
    timing.synchronize(torch.device("cpu"))
    timing.synchronize(None)
    assert syncs == []
    timing.synchronize(torch.device("cuda", 1))
    timing.synchronize("cuda")
    assert syncs == [torch.device("cuda", 1), "cuda"]
    timing.ms_since(0.0, "cuda:0")
    assert syncs[-1] == "cuda:0"  # a duration on CUDA is read after the device finished


class FakeEvent:
    """``torch.cuda.Event`` as the worker uses it: ``record`` logged, ``elapsed_time`` 2.5 ms (and logged)."""

    log: list[str] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing

    def record(self) -> None:
        FakeEvent.log.append("record")

    def elapsed_time(self, end: FakeEvent) -> float:
        FakeEvent.log.append("read")
        return 2.5


def _worker(monkeypatch, log: list[str], rank: int = 0):
    from actors.verifier import worker

    monkeypatch.setattr(worker._PlatformWorker, "__init__", lambda self, *a, **k: None)
    monkeypatch.setattr(worker._PlatformWorker, "execute_model", lambda self, out, *a, **k: log.append("forward"))
    monkeypatch.setattr(worker._PlatformWorker, "sample_tokens", lambda self, *a, **k: log.append("sample"))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.log = log
    w = worker.RemoteDraftWorker()
    w.device, w.rank = torch.device("cuda", 2), rank
    w.model_runner = SimpleNamespace(drafter=None)
    return w


def test_worker_times_its_steps_on_the_device_without_waiting(monkeypatch, syncs):
    """forward_ms and sample_ms are device spans between two events around each call; nothing waits for the device
    while the step runs, and the spans are resolved when the statistics are read."""
    log: list[str] = []
    w = _worker(monkeypatch, log)
    w.execute_model(SimpleNamespace(total_num_scheduled_tokens=4, finished_req_ids=set()))
    w.sample_tokens(None)
    assert log == ["record", "forward", "record", "record", "sample", "record"] and syncs == []
    assert (len(w.split.forward_ms), len(w.split.sample_ms)) == (1, 1)
    split = w.split.to_dict()
    assert split["forward_ms"] == split["sample_ms"] == [2.5] and log[-2:] == ["read", "read"]


def test_only_rank_0_times_its_steps(monkeypatch, syncs):
    log: list[str] = []
    w = _worker(monkeypatch, log, rank=1)
    w.execute_model(SimpleNamespace(total_num_scheduled_tokens=4, finished_req_ids=set()))
    w.sample_tokens(None)
    assert log == ["forward", "sample"] and len(w.split.forward_ms) == 0 and syncs == []


def test_drafter_times_until_the_device_is_done(toy_heads, monkeypatch):
    """The drafter engine's compute_ms (and the actor's branch pass) wait for the engine's device."""
    from actors.drafter.config import DrafterEngineConfig
    from actors.drafter.engine import DrafterEngine
    from actors.eagle.checkpoint import load_head
    from actors.messages import DraftStep, SeqSlice

    target_dir, heads = toy_heads
    engine = DrafterEngine(load_head(heads["eagle1"], target_dir), DrafterEngineConfig(max_model_len=64))
    waited: list = []
    monkeypatch.setattr(timing, "synchronize", waited.append)
    step = DraftStep(0, 3, [SeqSlice("a", 0, 5, 0)], np.arange(5, dtype=np.int32))
    result = engine.draft(step, np.zeros((5, engine.spec.fused_hidden_size), np.float32))
    assert waited == [engine.device] and result.step_id == 0

    from actors.drafter.actor import DrafterActor

    actor = object.__new__(DrafterActor)  # the branch pass only: an engine, no checkpoint loading
    actor.engine = engine
    actor.branches(["a"])
    assert waited == [engine.device] * 2


def test_worker_without_a_device_yet_times_on_the_host(syncs):
    """Before ``init_device`` a worker has no ``device``: its timings are host time, and kept bounded."""
    from actors.verifier import worker

    w = object.__new__(worker.RemoteDraftWorker)
    spans = timing.DeviceSpans(maxlen=2)
    for _ in range(3):
        w._timed(spans, lambda: None)
    assert len(spans) == 2 and syncs == [] and all(ms >= 0 for ms in spans.values())


def test_remote_step_is_timed_when_its_drafts_are_read(monkeypatch):
    """A step's ``propose_ms`` (sending it, then reading its drafts back) is recorded when its drafts are collected
    (``Speculation.collect``), never at propose. The drafts come back as host arrays that vLLM's scheduler takes as
    lists (``RemoteEagleProposer.take``), never copied to the verifier's device: nothing there to wait for."""
    from actors.verifier.speculator import Drafts, DraftTiming
    from tests.actors.fake_speculator import FakeSpeculator, propose, speculation

    class Timed(FakeSpeculator):
        def draft(self, step):
            drafts = super().draft(step)
            drafts.timing = DraftTiming(ship_ms=0.2, wait_ms=0.0, compute_ms=0.1, all_hits=False)
            return drafts

    waited: list = []
    monkeypatch.setattr(timing, "synchronize", waited.append)
    s = speculation(Timed())
    propose(s, [("a", 0, 3), ("b", 0, 2)])
    assert not s.stats.timings
    drafts = s.collect()
    assert isinstance(drafts, Drafts) and isinstance(drafts.ids, np.ndarray) and drafts.ids.tolist() == [[7, 7]] * 2
    t = s.stats.timings[-1]
    assert len(s.stats.timings) == 1 and (t.batch_size, t.num_tokens, t.ship_ms, t.compute_ms) == (2, 5, 0.2, 0.1)
    assert t.propose_ms >= 0 and waited == []
