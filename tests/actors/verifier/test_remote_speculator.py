"""The pipelined remote speculator (``actors.verifier.remote_speculator``) against real drafter actors on a local
Ray, with toy heads: a hit is answered from the branch table without waiting for the drafter, a miss is waited for,
a prompt step is not waited for; a drafter that dies costs one step without drafts, then its sequences re-home."""

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
