"""The pipelined remote speculator (``actors.verifier.remote_speculator``) against real drafter actors on a local
Ray, with toy heads: a hit is answered from the branch table without waiting for the drafter, a miss is waited for,
a prompt step is not waited for; a drafter that dies costs one step without drafts, then its sequences re-home.

Its rules without Ray (fake actors and refs): a step whose misses are at most ``wait_for_misses`` of it does not
wait for them; an answer nobody waited for that turns out FAILED drops its drafter at the next step."""

from __future__ import annotations

import os

import numpy as np
import pytest
import ray
import torch

from actors.drafter.actor import start_drafter_actor
from actors.drafter.branches import BranchConfig
from actors.drafter.config import DrafterEngineConfig, DrafterSettings
from actors.messages import BranchTable, DraftStep, SeqRole, SeqSlice
from actors.verifier.drafters import ActorFinder
from actors.verifier.remote_speculator import RemoteSpeculator, build_speculator
from actors.verifier.speculator import Drafts, Short
from tests.actors.fake_drafters import FakeRay, fake_ray

pytestmark = pytest.mark.isolated  # starts Ray (tests.run_isolated)
K = 3
ASYNC = {"bonus_fanout": 2, "recovered_fanout": 1}


def shm_regions() -> set[str]:
    from actors.shm_rows import REGION_PREFIX, SHM_DIR

    return {n for n in os.listdir(SHM_DIR) if n.startswith(REGION_PREFIX)}


@pytest.fixture(scope="module")
def ray_local():
    before = shm_regions()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="test-remote-speculator")
    yield
    ray.shutdown()
    assert shm_regions() == before  # every verifier-drafter region unlinked


def transport(speculator: RemoteSpeculator) -> dict:
    return speculator.stats()["transport"]


def step(step_id: int, seqs: list[tuple[str, int, list[int], SeqRole]], width: int) -> tuple[DraftStep, torch.Tensor]:
    """seqs: (req_id, first position, input ids, role)."""
    slices, ids, off = [], [], 0
    for rid, pos, tokens, role in seqs:
        slices.append(SeqSlice(rid, off, len(tokens), pos, role))
        ids += tokens
        off += len(tokens)
    hidden = torch.randn(off, width, generator=torch.Generator().manual_seed(step_id))
    return DraftStep(step_id, K, slices, np.array(ids, np.int32)), hidden


def draft(speculator: RemoteSpeculator, sent: tuple[DraftStep, torch.Tensor]) -> Drafts:
    """One step as ``actors.verifier.speculation`` drives it (a drafter is ready: the tests found it first)."""
    assert speculator.ready()
    return speculator.collect(speculator.send(*sent))


def kill(actor) -> None:
    """``ray.kill``, and wait until the actor is dead (the kill is asynchronous: a call sent at once may still run)."""
    ray.kill(actor)
    for _ in range(100):
        try:
            ray.get(actor.ping.remote(), timeout=10)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return
    raise AssertionError("the killed actor still answers")


def table_of(speculator: RemoteSpeculator) -> BranchTable:
    (link,) = speculator.drafters.links.values()
    return BranchTable.unpack(ray.get(link.branches_ref))


def test_hits_do_not_wait_misses_do(ray_local, toy_heads):
    target, heads = toy_heads
    actor = start_drafter_actor(DrafterSettings(str(heads["eagle1"]), str(target),
                                                engine=DrafterEngineConfig(branches=BranchConfig(**ASYNC))))
    # the default finder (``ActorFinder``: one actor), from vLLM's additional_config as the worker builds it
    speculator = build_speculator({"actor": actor, "start_wait_s": 30.0, "discover_period_s": 3600.0})
    assert isinstance(speculator.drafters.finder, ActorFinder) and speculator.drafters.deadline.max_s == 10.0
    width = 64
    # A prompt step: no drafts, the drafter caches the rows and drafts branches for outcome a = 0.
    drafts = draft(speculator, step(0, [("s", 0, list(range(1, 12)), SeqRole.CONTEXT)], width))
    assert not drafts.errors and drafts.timing.all_hits and drafts.short == {0: Short.CONTEXT}
    assert drafts.lengths() == [0] and not drafts.ids.any()
    entry = table_of(speculator).entries["s"]
    assert entry.last_position == 10 and entry.served == [] and {a for a, _ in entry.drafts} == {0}
    assert len(entry.drafts) == ASYNC["bonus_fanout"]

    # The verifier emitted a guessed token: a hit, answered without a call.
    (_, y), expected = next(iter(entry.drafts.items()))
    drafts = draft(speculator, step(1, [("s", 11, [y], SeqRole.DRAFT)], width))
    assert drafts.timing.all_hits and drafts.hits == [0] and drafts.lookups == 1 and not drafts.short
    assert drafts.ids[0].tolist() == expected and drafts.lengths() == [K]
    entry = table_of(speculator).entries["s"]  # folded, and drafted from the served drafts
    assert entry.last_position == 11 and entry.served == expected
    assert len(entry.drafts) == ASYNC["bonus_fanout"] + K * ASYNC["recovered_fanout"]

    # An outcome nobody guessed: the speculator waits for drafts made on demand.
    unguessed = next(t for t in range(300) if (0, t) not in entry.drafts)
    drafts = draft(speculator, step(2, [("s", 12, [unguessed], SeqRole.DRAFT)], width))
    assert not drafts.timing.all_hits and drafts.hits == [] and not drafts.errors and not drafts.short
    assert drafts.ids.shape == (1, K) and drafts.ids.dtype == np.int64

    # Both actors on this node: every step's rows went by shared memory (auto), the region mapped at start.
    assert transport(speculator)["sent"] == {"shm": 3} and transport(speculator)["fallbacks"] == {}
    (link,) = speculator.drafters.links.values()
    region = link.rows.region.name
    assert region not in shm_regions()  # mapped by the drafter, so unlinked: nothing to leak

    # The drafter dies: no drafts for the step, counted, never raised.
    kill(actor)
    drafts = draft(speculator, step(3, [("s", 13, [5, 6], SeqRole.DRAFT)], width))
    assert len(drafts.errors) == 1 and not drafts.ids.any() and drafts.short == {0: Short.FAILED}
    assert [kind for _, kind, _ in speculator.drafters.events] == ["attached", "failed"]
    assert not speculator.ready()  # the only drafter is out until its probe answers (it never will)
    assert link.rows.state == "closed"


class FixedFinder:
    """A pool of given drafter actors (``cluster.drafter_pool.finder.ServeFinder`` finds them through Serve)."""

    def __init__(self, actors) -> None:
        self.actors = actors

    def find(self, known) -> list[tuple[str, object, dict]]:
        found = []
        for actor in self.actors:
            try:
                info = ray.get(actor.info.remote(), timeout=5)
            except ray.exceptions.RayActorError:
                continue
            if not known(info["drafter_id"]):
                found.append((info["drafter_id"], actor, info))
        return found


@pytest.mark.parametrize("branches", [None, ASYNC], ids=["sync", "async"])
def test_dead_home_rehomes_and_frees_go_home(ray_local, toy_heads, branches):
    target, heads = toy_heads
    engine = DrafterEngineConfig(branches=BranchConfig(**branches) if branches else None)
    actors = [start_drafter_actor(DrafterSettings(str(heads["eagle3"]), str(target), engine=engine),
                                  name=f"d{i}-{bool(branches)}") for i in range(2)]
    speculator = RemoteSpeculator(FixedFinder(actors), new_group_size=1, discover_period_s=3600.0)
    speculator.drafters.start(30.0)
    assert len(speculator.drafters.links) == 2
    homes = speculator.homes
    width = 3 * 64
    prompt = [("a", 0, [1, 2, 3, 4], SeqRole.CONTEXT), ("b", 0, [5, 6, 7], SeqRole.CONTEXT)]
    drafts = draft(speculator, step(0, prompt, width))
    assert not drafts.errors
    assert len(set(homes.home.values())) == 2  # one new sequence per drafter: least-loaded first
    home_a = homes.home["a"]
    victim = next(a for a in actors if ray.get(a.info.remote())["drafter_id"] == home_a)
    kill(victim)
    drafts = draft(speculator, step(1, [("a", 4, [9], SeqRole.DRAFT), ("b", 3, [8], SeqRole.DRAFT)], width))
    assert len(drafts.errors) == 1 and drafts.short.get(0) is Short.FAILED and 1 not in drafts.short
    assert not drafts.ids[0].any()
    assert "a" not in homes.home and homes.lost["a"] == home_a
    drafts = draft(speculator, step(2, [("a", 5, [10], SeqRole.DRAFT), ("b", 4, [11], SeqRole.DRAFT)], width))
    assert not drafts.errors and homes.home["a"] == homes.home["b"] != home_a
    assert homes.rehomed == 1
    assert [kind for _, kind, _ in speculator.drafters.events] == ["attached", "attached", "failed", "rehomed"]
    assert speculator.stats()["rehomed"] == 1 and speculator.stats()["quarantined"] == 1
    sent = transport(speculator)["sent"]
    assert sent["shm"] >= 4 and "host" not in sent  # both drafters on this node: shared memory, a region each
    survivor = next(a for a in actors if a is not victim)
    speculator.free(["a", "b"])  # sent to their home at once
    assert homes.home == {}
    assert ray.get(survivor.stats.remote())["active_sequences"] == 0  # the free ran before this call


def test_branches_are_answered_by_sequence_when_verifiers_interleave(toy_heads):
    """Two verifiers share a drafter: B's step lands between A's ``propose`` and A's ``branches``. Each still gets
    its own sequences' branches (the actor answers by sequence, not "the last step's")."""
    from actors.drafter.actor import DrafterActor

    target, heads = toy_heads
    actor = DrafterActor(DrafterSettings(str(heads["eagle1"]), str(target),
                                         engine=DrafterEngineConfig(max_model_len=64, branches=BranchConfig(**ASYNC))))
    step_a, hidden_a = step(0, [("a", 0, [1, 2, 3], SeqRole.CONTEXT)], 64)
    step_b, hidden_b = step(1, [("b", 0, [4, 5], SeqRole.CONTEXT)], 64)
    actor.draft_step(step_a.pack(), hidden_a.numpy())
    actor.draft_step(step_b.pack(), hidden_b.numpy())  # drafts A's branches first, then leaves B's pending
    table_a = BranchTable.unpack(actor.branches(["a"]))
    table_b = BranchTable.unpack(actor.branches(["b"]))
    assert set(table_a.entries) == {"a"} and table_a.entries["a"].last_position == 2
    assert set(table_b.entries) == {"b"} and table_b.entries["b"].last_position == 1



# --- the pipelined rules without Ray: fake drafter actors and refs (``tests.actors.fake_drafters``) -------------------
FK = 2  # the fake drafters' k (``tests.actors.fake_drafters.K``)
PROMPT_END = 9  # a prompt step covers positions 0..9; the next step ships position 10
GUESS = 7  # the outcome every branch table guessed: no draft accepted, token 7 emitted


class Branching:
    """A pipelined fake drafter: ``draft_step`` answers ``answer(step)`` (its refs in ``refs``; each also put in
    ``pending`` with ``hold``); ``branches`` answers a table guessing ``GUESS`` after the prompt for each sequence
    asked, with drafts ``[10 + i, 20 + i]`` for the i-th (its refs in ``tables``)."""

    def __init__(self, fake_refs: FakeRay, answer=None, hold: bool = False) -> None:
        from actors.messages import BranchEntry
        from tests.actors.fake_drafters import FakeDrafter, Method, Ref, good

        self.fake = FakeDrafter(answer or good)
        self.refs: list = []
        self.tables: list = []
        draft_step = self.fake.draft_step.fn

        def step(*args):
            self.refs.append(draft_step(*args))
            if hold:
                fake_refs.pending.append(self.refs[-1])
            return self.refs[-1]

        def branches(req_ids):
            table = BranchTable({rid: BranchEntry(PROMPT_END, [], {(0, GUESS): [10 + i, 20 + i]})
                                 for i, rid in enumerate(req_ids)})
            self.tables.append(Ref(table.pack()))
            return self.tables[-1]

        self.fake.draft_step, self.fake.branches = Method(step), Method(branches)


def fake_step(step_id: int, outcomes: dict[str, int | None], position: int = PROMPT_END + 1):
    """(step, hidden): for each sequence, ``None``: its prompt (positions 0..PROMPT_END, a context row each);
    else one row at ``position`` whose input token is the outcome."""
    slices, ids = [], []
    for rid, token in outcomes.items():
        rows = list(range(1, PROMPT_END + 2)) if token is None else [token]
        role = SeqRole.CONTEXT if token is None else SeqRole.DRAFT
        slices.append(SeqSlice(rid, len(ids), len(rows), 0 if token is None else position, role))
        ids += rows
    return DraftStep(step_id, FK, slices, np.array(ids, np.int32)), np.zeros((len(ids), 4), np.float32)


def pipelined_pool(drafters: dict[str, tuple[Branching, int]]):
    """A ``RemoteSpeculator`` over the fakes (drafter id -> (fake, its reported load)); new sequences all go to the
    least-loaded one."""
    from tests.actors.fake_drafters import Pool

    pool = Pool({name: (b.fake, load) for name, (b, load) in drafters.items()}, drafts_branches=True)
    pool.homes.new_group_size = 8
    return pool


SEQS = ["a", "b", "c", "d"]


@pytest.mark.parametrize(("missed", "waits"), [(["d"], False), (["c", "d"], False), (["b", "c", "d"], True)],
                         ids=["1-of-4", "2-of-4", "3-of-4"])
def test_misses_are_not_waited_for_unless_over_half_the_step_missed(monkeypatch, missed, waits):
    """``wait_for_misses`` (0.5): while at most half of a step's drafted sequences missed their branch table, the
    step takes its hits and never waits for the drafter: the misses go to it as context (it drafts their next step
    from them) with no drafts this step, and the call's answer stays unread (``unchecked``) until the next step
    looks. With more missed, the step waits, and the misses get the drafter's drafts."""
    refs = fake_ray(monkeypatch)
    home = Branching(refs, hold=not waits)  # a call the step must not wait for is never ready
    pool = pipelined_pool({"home": (home, 0)})
    drafts = pool.draft(*fake_step(0, dict.fromkeys(SEQS)))  # prompts: context, nothing waited for
    assert drafts.short == dict.fromkeys(range(4), Short.CONTEXT)
    refs.pending.clear()  # the prompt step's answer came

    drafts = pool.draft(*fake_step(1, {rid: GUESS + 1 if rid in missed else GUESS for rid in SEQS}))
    link, sent = pool.drafters.links["home"], home.fake.steps[-1]
    roles = {s.req_id: s.role for s in sent.seqs}
    hit_rows = [i for i, rid in enumerate(SEQS) if rid not in missed]
    missed_rows = [i for i, rid in enumerate(SEQS) if rid in missed]
    assert drafts.hits == hit_rows and not drafts.errors and refs.was_read(home.refs[0])
    if waits:  # the whole sub-step is the drafter's answer (it answers its hits from the same table)
        assert refs.was_read(home.refs[1]) and link.unchecked is None and not drafts.timing.all_hits
        assert set(roles.values()) == {SeqRole.DRAFT}
        assert drafts.short == {} and drafts.ids.tolist() == [[1] * FK] * 4  # good(): ones
        return
    for i in hit_rows:  # a hit's drafts are its branch's
        assert drafts.ids[i].tolist() == [10 + i, 20 + i]
    assert link.unchecked is home.refs[1] and drafts.timing.all_hits
    assert {rid for rid, role in roles.items() if role is SeqRole.CONTEXT} == set(missed)
    assert drafts.short == dict.fromkeys(missed_rows, Short.CONTEXT) and not drafts.ids[missed_rows].any()
    assert drafts.lengths() == [0 if i in missed_rows else FK for i in range(4)]
    refs.pending.clear()  # the answer came: the next step reads it, before its branch table
    pool.draft(*fake_step(2, dict.fromkeys(SEQS, GUESS), PROMPT_END + 2))
    assert refs.was_read(home.refs[1]) and refs.read_at(home.refs[1]) < refs.read_at(home.tables[1])


def failed(step: DraftStep):
    from actors.messages import DraftResult, DraftStatus

    return DraftResult(step.step_id, DraftStatus.FAILED, np.zeros((0, FK), np.int32), error="CUDA error: boom")


@pytest.mark.parametrize("seen", ["before-table", "after-table"])
def test_an_unchecked_answer_that_failed_drops_its_drafter_at_the_next_step(monkeypatch, seen):
    """A step nobody waited for (prompts: context only) is answered FAILED. The next step finds out when it looks
    for that answer, before it reads its branch table or after (the answer came meanwhile): that home's sequences
    get no drafts this step, none from the table either (drafted behind a failed step); the drafter gets nothing
    more, its pending calls are cancelled, it is dropped (held out until its probe answers) and told to free the
    sequences, which re-home to another drafter that drafts them from the next step."""
    refs = fake_ray(monkeypatch)
    bad, other = Branching(refs, failed), Branching(refs)
    pool = pipelined_pool({"bad": (bad, 0), "other": (other, 100)})  # new sequences go to "bad" first
    drafts = pool.draft(*fake_step(0, dict.fromkeys(SEQS)))
    assert not drafts.errors and set(pool.homes.home.values()) == {"bad"}  # not known yet: nobody waited
    assert pool.drafters.links["bad"].unchecked is bad.refs[0] and not refs.was_read(bad.refs[0])
    if seen == "after-table":
        refs.late.append(bad.refs[0])
    drafts = pool.draft(*fake_step(1, dict.fromkeys(SEQS, GUESS)))  # every outcome guessed: all would be hits
    assert drafts.short == dict.fromkeys(range(4), Short.FAILED) and drafts.hits == [] and not drafts.ids.any()
    assert len(drafts.errors) == 1 and "boom" in drafts.errors[0]
    if seen == "after-table":
        assert refs.was_read(bad.tables[0])
    else:  # never read: cancelled
        assert not refs.was_read(bad.tables[0]) and any(r is bad.tables[0] for r in refs.cancelled)
    assert len(bad.fake.steps) == 1  # no step after the failed one
    assert "bad" not in pool.drafters.links and "bad" in pool.drafters.quarantine
    assert pool.homes.home == {} and set(pool.homes.lost) == set(SEQS) and sorted(bad.fake.freed) == SEQS
    assert [kind for _, kind, _ in pool.drafters.events] == ["failed"] and pool.stats()["quarantined"] == 1

    drafts = pool.draft(*fake_step(2, dict.fromkeys(SEQS, GUESS), PROMPT_END + 2))
    assert set(pool.homes.home.values()) == {"other"} and pool.homes.rehomed == 4
    assert not drafts.errors and not drafts.short and len(other.fake.steps) == 1


def test_a_synchronous_drafter_is_not_waited_for_on_a_partial_prefill(monkeypatch):
    """With ``wait_for_prompt_drafts`` (vLLM's colocated behaviour), a drafter without branch tables is waited for
    on every drafted sequence, the prompt's last chunk included (``CONTEXT`` becomes ``DRAFT``: its drafts are the
    first decode step's), but never on a partial prefill (``PREFILL``: vLLM discards its drafts): such a step's rows
    go to it as context, its answer is left unread (``unchecked``) and read by a later step."""
    from tests.actors.fake_drafters import FakeDrafter, Pool, good

    refs = fake_ray(monkeypatch)
    fake = FakeDrafter(good)
    step_call = fake.draft_step.fn
    sent: list = []

    def held(*args):  # a call the step must not wait for: never ready
        sent.append(step_call(*args))
        refs.pending.append(sent[-1])
        return sent[-1]

    fake.draft_step.fn = held
    pool = Pool({"sync": (fake, 0)}, wait_for_prompt_drafts=True)
    chunk = DraftStep(0, FK, [SeqSlice("a", 0, 4, 0, SeqRole.PREFILL), SeqSlice("b", 4, 4, 0, SeqRole.PREFILL)],
                      np.arange(1, 9, dtype=np.int32))
    drafts = pool.draft(chunk, np.zeros((8, 4), np.float32))
    assert drafts.short == {0: Short.CONTEXT, 1: Short.CONTEXT} and drafts.lengths() == [0, 0]
    assert [s.role for s in fake.steps[-1].seqs] == [SeqRole.PREFILL, SeqRole.PREFILL]
    assert pool.drafters.links["sync"].unchecked is sent[0] and not refs.was_read(sent[0])

    refs.pending.clear()  # the chunk's answer came; the prompts' last chunks are waited for
    fake.draft_step.fn = step_call
    last = DraftStep(1, FK, [SeqSlice("a", 0, 2, 4, SeqRole.CONTEXT), SeqSlice("b", 2, 2, 4, SeqRole.CONTEXT)],
                     np.arange(1, 5, dtype=np.int32))
    drafts = pool.draft(last, np.zeros((4, 4), np.float32))
    assert refs.was_read(sent[0])  # the unread answer, read before this step went out
    assert [s.role for s in fake.steps[-1].seqs] == [SeqRole.DRAFT, SeqRole.DRAFT]
    assert drafts.short == {} and drafts.lengths() == [FK, FK]


def test_a_synchronous_drafter_gets_a_steps_prompt_chunks_in_a_call_after_the_drafted_one(monkeypatch):
    """By default a prompt's chunks, its last included, are never waited for: a mixed step goes to a drafter
    without branch tables as two calls, the drafted sequences first (waited for), then the chunks (``PREFILL`` and
    ``CONTEXT`` kept, answer left unread). The chunks' sequences draft nothing this step (``Short.CONTEXT``)."""
    from tests.actors.fake_drafters import FakeDrafter, Pool, good

    refs = fake_ray(monkeypatch)
    fake = FakeDrafter(good)
    step_call = fake.draft_step.fn
    sent: list = []

    def recorded(*args):
        sent.append(step_call(*args))
        return sent[-1]

    fake.draft_step.fn = recorded
    pool = Pool({"sync": (fake, 0)})
    mixed = DraftStep(0, FK, [SeqSlice("d", 0, 1, 9), SeqSlice("p", 1, 4, 0, SeqRole.PREFILL),
                              SeqSlice("c", 5, 3, 0, SeqRole.CONTEXT), SeqSlice("e", 8, 2, 7)],
                      np.arange(1, 11, dtype=np.int32))
    drafts = pool.draft(mixed, np.zeros((10, 4), np.float32))
    assert [[(s.req_id, s.role) for s in step.seqs] for step in fake.steps] == [
        [("d", SeqRole.DRAFT), ("e", SeqRole.DRAFT)], [("p", SeqRole.PREFILL), ("c", SeqRole.CONTEXT)]]
    assert refs.was_read(sent[0]) and not refs.was_read(sent[1])
    assert pool.drafters.links["sync"].unchecked is sent[1]
    assert drafts.short == {1: Short.CONTEXT, 2: Short.CONTEXT} and drafts.lengths() == [FK, 0, 0, FK]
    assert not drafts.errors
