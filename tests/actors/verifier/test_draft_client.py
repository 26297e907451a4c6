"""The pipelined draft client (``actors.verifier.client``) against real drafter actors on a local Ray, with toy
heads: a hit is answered from the branch table without waiting for the drafter, a miss is waited for, a prompt
step is not waited for; a drafter that dies costs one step without drafts, then its sequences re-home."""

from __future__ import annotations

import numpy as np
import pytest
import ray
import torch

from actors.drafter.actor import start_drafter_actor
from actors.drafter.branches import BranchConfig
from actors.drafter.config import DrafterEngineConfig, DrafterSettings
from actors.messages import BranchTable, DraftStatus, DraftStep, SeqRole, SeqSlice
from actors.verifier.client import ActorDraftClient, DraftClient

K = 3
ASYNC = {"bonus_fanout": 2, "recovered_fanout": 1}


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="test-draft-client")
    yield
    ray.shutdown()


def step(step_id: int, seqs: list[tuple[str, int, list[int], SeqRole]], width: int) -> tuple[DraftStep, torch.Tensor]:
    """seqs: (req_id, first position, input ids, role)."""
    slices, ids, off = [], [], 0
    for rid, pos, tokens, role in seqs:
        slices.append(SeqSlice(rid, off, len(tokens), pos, role))
        ids += tokens
        off += len(tokens)
    hidden = torch.randn(off, width, generator=torch.Generator().manual_seed(step_id))
    return DraftStep(step_id, K, slices, np.array(ids, np.int32)), hidden


def table_of(client: DraftClient) -> BranchTable:
    (link,) = client.links.values()
    return BranchTable.unpack(ray.get(link.branches_ref))


def test_hits_do_not_wait_misses_do(ray_local, toy_heads):
    target, heads = toy_heads
    actor = start_drafter_actor(DrafterSettings(str(heads["eagle1"]), str(target),
                                                engine=DrafterEngineConfig(branches=BranchConfig(**ASYNC))))
    client = ActorDraftClient(actor)
    width = 64
    # A prompt step: placeholders at once, the drafter caches the rows and drafts branches for outcome a = 0.
    reply, timing = client.draft_batch(*step(0, [("s", 0, list(range(1, 12)), SeqRole.CONTEXT)], width))
    assert reply.status is DraftStatus.OK and timing.all_hits and reply.undrafted == {0: "context"}
    assert not reply.draft_token_ids.any()
    entry = table_of(client).entries["s"]
    assert entry.last_position == 10 and entry.served == [] and {a for a, _ in entry.drafts} == {0}
    assert len(entry.drafts) == ASYNC["bonus_fanout"]

    # The verifier rejected the placeholders and emitted a guessed token: a hit, answered without a call.
    (_, y), expected = next(iter(entry.drafts.items()))
    reply, timing = client.draft_batch(*step(1, [("s", 11, [y], SeqRole.DRAFT)], width))
    assert timing.all_hits and reply.hit_seqs == [0] and reply.branch_lookups == 1
    assert reply.draft_token_ids[0].tolist() == expected
    entry = table_of(client).entries["s"]  # folded, and drafted from the served drafts
    assert entry.last_position == 11 and entry.served == expected
    assert len(entry.drafts) == ASYNC["bonus_fanout"] + K * ASYNC["recovered_fanout"]

    # An outcome nobody guessed: the client waits for drafts made on demand.
    unguessed = next(t for t in range(300) if (0, t) not in entry.drafts)
    reply, timing = client.draft_batch(*step(2, [("s", 12, [unguessed], SeqRole.DRAFT)], width))
    assert not timing.all_hits and reply.hit_seqs == [] and reply.status is DraftStatus.OK
    assert reply.draft_token_ids.shape == (1, K)

    # The drafter dies: no drafts for the step, counted, never raised.
    ray.kill(actor)
    reply, _ = client.draft_batch(*step(3, [("s", 13, [5, 6], SeqRole.DRAFT)], width))
    assert reply.status is DraftStatus.FAILED and not reply.draft_token_ids.any() and reply.undrafted == {0: "failed"}
    assert [kind for _, kind, _ in client.events] == ["attached", "failed"]


class FixedPool(DraftClient):
    """A pool of given drafter actors (the Serve client finds them through Serve instead)."""

    def __init__(self, actors, **kw) -> None:
        super().__init__(**kw)
        self.actors = actors

    def _discover(self) -> None:
        for actor in self.actors:
            try:
                info = ray.get(actor.info.remote(), timeout=5)
            except ray.exceptions.RayActorError:
                continue
            self._add_link(info["drafter_id"], actor, info)


@pytest.mark.parametrize("branches", [None, ASYNC], ids=["sync", "async"])
def test_dead_home_rehomes_and_frees_go_home(ray_local, toy_heads, branches):
    target, heads = toy_heads
    engine = DrafterEngineConfig(branches=BranchConfig(**branches) if branches else None)
    actors = [start_drafter_actor(DrafterSettings(str(heads["eagle3"]), str(target), engine=engine),
                                  name=f"d{i}-{bool(branches)}") for i in range(2)]
    client = FixedPool(actors, new_group_size=1)
    width = 3 * 64
    prompt = [("a", 0, [1, 2, 3, 4], SeqRole.CONTEXT), ("b", 0, [5, 6, 7], SeqRole.CONTEXT)]
    reply, _ = client.draft_batch(*step(0, prompt, width))
    assert reply.status is DraftStatus.OK
    assert len(set(client.home.values())) == 2  # one new sequence per drafter: least-loaded first
    home_a = client.home["a"]
    victim = next(a for a in actors if ray.get(a.info.remote())["drafter_id"] == home_a)
    ray.kill(victim)
    reply, _ = client.draft_batch(*step(1, [("a", 4, [9], SeqRole.DRAFT), ("b", 3, [8], SeqRole.DRAFT)], width))
    assert reply.status is DraftStatus.PARTIAL and not reply.draft_token_ids[0].any()
    assert "a" not in client.home and client.lost["a"] == home_a
    reply, timing = client.draft_batch(*step(2, [("a", 5, [10], SeqRole.DRAFT), ("b", 4, [11], SeqRole.DRAFT)], width))
    assert reply.status is DraftStatus.OK and client.home["a"] == client.home["b"] != home_a
    assert client.rehomed == 1 and [kind for _, kind, _ in client.events] == ["failed", "rehomed"]
    survivor = next(a for a in actors if a is not victim)
    client.free(["a", "b"])
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
