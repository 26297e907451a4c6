"""The hidden-row transport seam (``actors.verifier.transport``) without Ray: fake actors and refs whose readiness
the test controls, and a real ``DrafterActor`` called in this process.

- ordering: a slot is rewritten only once the call that read it answered; all slots unanswered: the host path;
- fallbacks, counted: rows too big for a slot, the region not mapped yet, or refused;
- a stale or mismatched generation is a ``FAILED`` answer that the speculator treats as a failed drafter (its
  sequences short this step, no drafts from other rows);
- the same drafts by either path; the config checked, naming the field; regions unlinked when a drafter is dropped.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from actors.drafter.actor import DrafterActor
from actors.drafter.config import DrafterEngineConfig, DrafterSettings
from actors.messages import DraftResult, DraftStatus, DraftStep, SeqRole, SeqSlice, ShmRows
from actors.shm_rows import REGION_PREFIX, SHM_DIR, RowsReader, ShmRegion
from actors.verifier.remote_speculator import RemoteSpeculator, build_speculator
from actors.verifier.speculator import Short
from actors.verifier.transport import HostRows, ShmTransport, StepRows, TransportConfig, Transports
from tests.actors import fake_drafters
from tests.actors.fake_drafters import Method, Ref

WIDTH = 16


def ours() -> set[str]:
    return {n for n in os.listdir(SHM_DIR) if n.startswith(REGION_PREFIX)}


@pytest.fixture(autouse=True)
def no_leak():
    before = ours()
    yield
    assert ours() == before, "a shared-memory region was left in /dev/shm"


@pytest.fixture
def fake_ray(monkeypatch):
    fake_drafters.fake_ray(monkeypatch)


class FakeDrafter:
    """Maps the region for real (``RowsReader``) and records each call's rows; its answers stay unready until the
    test says (``answer``)."""

    def __init__(self, open_answer: Any = True) -> None:
        self.reader = RowsReader()
        self.open_answer = open_answer
        self.open_ref = Ref(ready=False)
        self.got: list[tuple[str, np.ndarray, ShmRows | None, Ref]] = []  # (path, rows, metadata, answer)
        self.closed: list[str] = []
        self.open_rows = Method(self._open)
        self.draft_step = Method(lambda b, rows: self._record("host", np.array(rows), None))
        self.draft_step_shm = Method(self._shm)
        self.close_rows = Method(lambda name: self.closed.append(name))

    def _open(self, name: str, nonce: str) -> Ref:
        if self.open_answer is True:
            self.reader.open(name, nonce)
        self.open_ref.value = self.open_answer
        return self.open_ref

    def _shm(self, step_bytes: bytes, meta_bytes: bytes) -> Ref:
        meta = ShmRows.unpack(meta_bytes)
        return self._record("shm", np.array(self.reader.view(meta, "float32")), meta)

    def _record(self, path: str, rows: np.ndarray, meta: ShmRows | None) -> Ref:
        ref = Ref(b"answer", ready=False)
        self.got.append((path, rows, meta, ref))
        return ref


def transport(drafter: FakeDrafter, slots: int = 2, slot_bytes: int = 4 * WIDTH * 4) -> ShmTransport:
    t = ShmTransport(drafter, TransportConfig("shm", slots, slot_bytes / 2**20), Transports().stats)
    drafter.open_ref.ready = True
    return t


def hidden(n: int, seed: int = 0) -> StepRows:
    return StepRows(torch.randn(n, WIDTH, generator=torch.Generator().manual_seed(seed)))  # [n, WIDTH]


def test_a_slot_is_reused_only_once_its_reader_answered(fake_ray):
    d = FakeDrafter()
    t = transport(d, slots=2)
    rows = [hidden(4, seed) for seed in range(5)]
    for r in rows[:2]:
        t.send(d, b"s", r, np.array([1, 2]))
    assert [(p, m.slot, m.generation) for p, _, m, _ in d.got] == [("shm", 0, 1), ("shm", 1, 2)]
    t.send(d, b"s", rows[2], np.array([1, 2]))  # both unanswered: not overwritten, the host path
    assert d.got[-1][0] == "host" and t.stats.fallbacks == {"busy": 1}
    d.got[1][3].ready = True  # the drafter answered the call that read slot 1 (slot 0's still pending)
    t.send(d, b"s", rows[3], np.array([0, 3]))
    path, got, meta, _ = d.got[-1]
    assert (path, meta.slot, meta.generation) == ("shm", 1, 3)  # slot 1 reused, a new generation
    assert np.array_equal(got, rows[3].array()[[0, 3]])
    assert np.array_equal(d.got[0][1], rows[0].array()[[1, 2]])  # what slot 0's reader got was never touched
    assert t.stats.sent == {"shm": 3, "host": 1}
    t.close()
    assert d.closed == [t.region.name]


def test_rows_too_big_for_a_slot_go_by_the_host_path(fake_ray):
    d = FakeDrafter()
    t = transport(d, slot_bytes=4 * WIDTH * 4)  # 4 rows a slot
    big = hidden(6)
    t.send(d, b"s", big, np.arange(5))
    assert d.got[-1][0] == "host" and np.array_equal(d.got[-1][1], big.array()[:5])
    t.send(d, b"s", big, np.arange(4))  # the next step that fits: shared memory again
    assert d.got[-1][0] == "shm" and t.stats.fallbacks == {"too_big": 1}
    t.close()


def test_the_host_path_until_the_drafter_mapped_the_region(fake_ray):
    d = FakeDrafter()
    t = ShmTransport(d, TransportConfig("shm", 2, 1.0), Transports().stats)
    t.send(d, b"s", hidden(2), np.arange(2))  # the open call not answered yet
    d.open_ref.ready = True
    t.send(d, b"s", hidden(2), np.arange(2))
    assert [p for p, *_ in d.got] == ["host", "shm"] and t.stats.fallbacks == {"opening": 1}
    t.close()


@pytest.mark.parametrize("answer", [False, Ref(error=RuntimeError("no such method"))], ids=["refused", "raised"])
def test_a_drafter_that_cannot_map_it_gets_the_host_path_for_good(fake_ray, answer):
    d = FakeDrafter(open_answer=answer if answer is False else None)
    if answer is not False:
        d.open_ref = answer
    d.open_ref.ready = True
    t = ShmTransport(d, TransportConfig("shm", 2, 1.0), Transports().stats)
    assert t.region.name in ours()
    for _ in range(2):
        t.send(d, b"s", hidden(2), np.arange(2))
    assert [p for p, *_ in d.got] == ["host", "host"] and t.stats.fallbacks == {"open_failed": 2}
    assert t.region.name not in ours()  # unlinked at once
    t.close()


def test_attach_chooses_by_node_and_config(fake_ray, monkeypatch):
    import actors.verifier.transport as tr

    monkeypatch.setattr(tr, "this_node_id", lambda: "node-a")
    made = []
    for mode, node, want in [("auto", "node-a", ShmTransport), ("auto", "node-b", HostRows), ("auto", None, HostRows),
                             ("host", "node-a", HostRows), ("shm", "node-b", ShmTransport)]:
        t = Transports(TransportConfig(mode)).attach(FakeDrafter(), {"node_id": node} if node else {})
        assert type(t) is want, (mode, node)
        made.append(t)
    for t in made:
        t.close()


def test_no_room_for_a_region_means_the_host_path(fake_ray, monkeypatch):
    def full(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ShmRegion, "create", full)
    transports = Transports(TransportConfig("shm"))
    assert isinstance(transports.attach(FakeDrafter(), {}), HostRows)
    assert transports.stats.fallbacks == {"create_failed": 1}


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"hidden_transport": "nvlink"}, "draft_client.hidden_transport"),
    ({"shm_slots": 1}, "draft_client.shm_slots"),
    ({"shm_slot_mib": 0}, "draft_client.shm_slot_mib"),
])
def test_the_config_is_checked_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        build_speculator({"actor": "unused", "start_wait_s": 0.0, **kwargs})


# --- a real drafter, in this process ------------------------------------------------------------------------------
class InProcess:
    """A ``DrafterActor`` behind fake refs: each call runs at once, its answer ready."""

    def __init__(self, actor: DrafterActor) -> None:
        self.actor = actor

    def __getattr__(self, name: str) -> Method:
        fn = getattr(self.actor, name)
        return Method(lambda *a: Ref(fn(*a)))


def one_drafter(actor: DrafterActor, mode: str) -> RemoteSpeculator:
    speculator = RemoteSpeculator(None, vocab_size=300, hidden_transport=mode)
    speculator.drafters.add("d", InProcess(actor), actor.info())
    return speculator


def step(step_id: int, seqs: list[tuple[str, int, list[int]]], width: int) -> tuple[DraftStep, torch.Tensor]:
    slices, ids, off = [], [], 0
    for rid, pos, tokens in seqs:
        slices.append(SeqSlice(rid, off, len(tokens), pos, SeqRole.DRAFT))
        ids += tokens
        off += len(tokens)
    return (DraftStep(step_id, 3, slices, np.array(ids, np.int32)),
            torch.randn(off, width, generator=torch.Generator().manual_seed(step_id)))


def actors_regions(actor: DrafterActor) -> list[str]:
    return list(actor.rows.regions)


STEPS = [[("a", 0, [1, 2, 3]), ("b", 0, [4, 5])], [("a", 3, [6]), ("b", 2, [7, 8])], [("b", 4, [9]), ("a", 4, [10])]]


@pytest.fixture
def drafters(toy_heads):
    target, heads = toy_heads
    settings = DrafterSettings(str(heads["eagle3"]), str(target), engine=DrafterEngineConfig(max_model_len=64))
    return DrafterActor(settings), DrafterActor(settings)


def test_the_same_drafts_by_either_path(fake_ray, drafters):
    via_host, via_shm = one_drafter(drafters[0], "host"), one_drafter(drafters[1], "shm")
    assert via_shm.drafters.links["d"].rows.wait_open(0)
    for i, seqs in enumerate(STEPS):
        sent = step(i, seqs, 3 * 64)
        a, b = via_host.collect(via_host.send(*sent)), via_shm.collect(via_shm.send(*sent))
        assert not a.errors and not b.errors and not a.short and not b.short
        assert np.array_equal(a.ids, b.ids)
    assert via_shm.stats()["transport"]["sent"] == {"shm": 3} and via_host.stats()["transport"]["sent"] == {"host": 3}
    assert drafters[1].stats()["shm_regions"] == 1
    via_shm.close()


def test_a_stale_generation_fails_that_drafter_not_the_output(fake_ray, drafters, monkeypatch):
    """The metadata names a generation the slot does not hold (a breach of the ordering): the drafter answers
    FAILED, drafts nothing from those rows, and the verifier drops it: its sequences short this step."""
    speculator = one_drafter(drafters[1], "shm")
    assert not speculator.collect(speculator.send(*step(0, STEPS[0], 3 * 64))).errors
    link = speculator.drafters.links["d"]
    real = ShmRegion.write

    def stale(self, slot, generation, src, rows):
        return replace(real(self, slot, generation, src, rows), generation=generation - 1)

    monkeypatch.setattr(ShmRegion, "write", stale)
    drafts = speculator.collect(speculator.send(*step(1, STEPS[1], 3 * 64)))
    assert drafts.short == {0: Short.FAILED, 1: Short.FAILED} and not drafts.ids.any()
    assert len(drafts.errors) == 1 and "generation" in drafts.errors[0]
    assert speculator.drafters.links == {} and "d" in speculator.drafters.quarantine  # dropped
    assert link.rows.state == "closed" and actors_regions(drafters[1]) == []  # the pair's region closed at both ends


def test_rows_rewritten_while_drafting_are_a_failed_step(fake_ray, drafters, monkeypatch):
    """The slot is rewritten while the engine drafts from it: FAILED, and the engine keeps nothing of the step."""
    actor = drafters[1]
    region = ShmRegion.create(2, 2**16)
    assert actor.open_rows(region.name, region.nonce.hex())
    sent, hidden_rows = step(0, STEPS[0], 3 * 64)
    meta = region.write(0, 1, hidden_rows, np.arange(hidden_rows.shape[0]))
    real = actor.engine.draft

    def rewriting(step_, rows, *a):
        out = real(step_, rows, *a)
        region.write(0, 2, hidden_rows, np.arange(hidden_rows.shape[0]))  # the verifier broke the ordering
        return out

    monkeypatch.setattr(actor.engine, "draft", rewriting)
    result = DraftResult.unpack(actor.draft_step_shm(sent.pack(), meta.pack()))
    assert result.status is DraftStatus.FAILED and "rewritten" in result.error
    assert actor.engine.num_active_sequences == 0 and actor.stats()["stale_rows"] == 1
    actor.close_rows(region.name)
    region.close()
