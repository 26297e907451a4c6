"""Where each sequence's draft state lives (``actors.verifier.homes``): the step split by home, new sequences placed
on the least-loaded drafter a group at a time, and prefix-aware homing: a new sequence goes to the drafter that was
sent the longest prefix of its prompt, unless it is loaded to ``Drafters.prefix_max_load`` (the pool's target
sequences per replica, learnt with the drafter); dropped drafters are never chosen; the drafters' prefix hit / miss
counts are summed into the speculator's stats and ``/metrics``."""

from __future__ import annotations

import numpy as np
import torch

from actors.messages import DraftResult, DraftStatus, DraftStep, SeqSlice
from actors.metrics import ProposerStats
from actors.verifier.drafters import DrafterLink
from actors.verifier.homes import Homes
from tests.actors.fake_drafters import FakeDrafter, K, Pool, fake_ray

BS = 4


def counting(step: DraftStep) -> DraftResult:
    """Drafts, and every prompt of the step counted as a prefix hit of one block."""
    return DraftResult(step.step_id, DraftStatus.OK, np.ones((len(step.seqs), K), np.int32),
                       prefix_hit_tokens=BS * len(step.prompts), prefix_miss_tokens=1)


def first_step(step_id: int, prompts: dict[str, list[int]]) -> tuple[DraftStep, torch.Tensor]:
    seqs = [SeqSlice(rid, i, 1, 0) for i, rid in enumerate(prompts)]
    step = DraftStep(step_id, K, seqs, np.ones(len(seqs), np.int32),
                     prompts={r: np.array(p, np.int32) for r, p in prompts.items()}, block_size=BS)
    return step, torch.zeros(len(seqs), 4)


def test_new_sequences_follow_their_prefix_unless_loaded(monkeypatch):
    fake_ray(monkeypatch)
    system = list(range(1, 9))  # two blocks
    pool = Pool({"A": (FakeDrafter(counting), 0), "B": (FakeDrafter(counting), 0)})
    pool.homes.new_group_size = 1
    assert pool.drafters.prefix_max_load == float("inf")  # no pool target learnt: prefix homing is unbounded
    pool.draft(*first_step(0, {"s0": system + [50]}))
    home = pool.homes.home["s0"]
    pool.draft(*first_step(1, {"s1": system + [60], "s2": system[:4] + [70, 71, 72, 73], "x": [90] * 9}))
    assert pool.homes.home["s1"] == pool.homes.home["s2"] == home and pool.homes.prefix_homed == 2
    assert pool.homes.home["x"] != home  # no prefix anywhere: the least-loaded drafter
    pool.drafters.prefix_max_load = 3
    pool.drafters.links[home].load = 3  # as the home last reported: loaded to the target, so the next goes elsewhere
    pool.draft(*first_step(2, {"s3": system + [80]}))
    assert pool.homes.home["s3"] != home
    stats = pool.stats()
    assert stats["prefix_hit_tokens"] == BS * 5 and stats["prefix_miss_tokens"] == 4  # 5 prompts, 4 answers
    assert stats["prefix_homed"] == 2
    text = ProposerStats(client=stats).prometheus()
    assert f"eagle_cluster_draft_prefix_hit_tokens {BS * 5}" in text
    assert "eagle_cluster_draft_prefix_miss_tokens 4" in text


def test_a_dropped_drafter_is_not_chosen_by_prefix(monkeypatch):
    fake_ray(monkeypatch)
    system = list(range(1, 9))
    pool = Pool({"A": (FakeDrafter(counting), 0), "B": (FakeDrafter(counting), 5)})
    pool.draft(*first_step(0, {"s0": system}))
    assert pool.homes.home["s0"] == "A"
    pool.fakes.pop("A")
    pool.drafters.drop(pool.drafters.links["A"], pool.homes.lose("A"), "gone")
    assert pool.homes.lost == {"s0": "A"}
    pool.draft(*first_step(1, {"s1": system + [9]}))
    assert pool.homes.home["s1"] == "B" and pool.homes.prefix_homed == 0


def test_groups_worked_example():
    homes = Homes()
    homes.home = {"a": "R1", "c": "R2", "d": "R1"}
    assert homes.groups(list("abcd")) == [("R1", [0, 3]), ("R2", [2])]
    assert Homes().groups(list("abcde")) == []
    assert homes.on() == {"R1": ["a", "d"], "R2": ["c"]}


def test_new_sequences_go_to_the_least_loaded_a_group_at_a_time():
    links = {"A": DrafterLink("A", None, False, load=5), "B": DrafterLink("B", None, False, load=0)}
    homes = Homes(new_group_size=2)
    step = DraftStep(0, K, [], np.zeros(0, np.int32))
    assert homes.place(list("abcdef"), links, step, float("inf")) == 0  # none had lost a home
    # B (0) takes a, b -> 2; B again c, d -> 4; B (4 < 5) e, f too: load is as reported plus placed since
    assert homes.home == dict.fromkeys("abcdef", "B") and links["B"].placed == 6
    links["B"].report(10)  # a fresh report replaces what was placed since
    assert links["B"].placed == 0
    homes.place(["g"], links, step, float("inf"))
    assert homes.home["g"] == "A"
    assert homes.place(["h"], {}, step, float("inf")) == 0 and "h" not in homes.home  # no drafter: no home


def test_lost_sequences_are_rehomed_and_released_ones_forgotten():
    links = {"A": DrafterLink("A", None, False), "B": DrafterLink("B", None, False, load=100)}
    homes = Homes()
    step = DraftStep(0, K, [], np.zeros(0, np.int32))
    homes.place(["a", "b", "c"], links, step, float("inf"))
    assert homes.lose("A") == ["a", "b", "c"] and homes.home == {} and homes.lost == dict.fromkeys("abc", "A")
    del links["A"]
    assert homes.release(["c"]) == {} and "c" not in homes.lost  # finished while lost: nothing to free anywhere
    assert homes.place(["a", "b"], links, step, float("inf")) == 2 and homes.rehomed == 2 and not homes.lost
    assert list(homes.rehomed_ids) == ["a", "b"]  # which ones: not the new sequences placed before
    assert homes.release(["a", "x"]) == {"B": ["a"]} and homes.home == {"b": "B"}

