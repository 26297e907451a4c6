"""Prefix-aware homing in the draft client (``actors.verifier.client``): a new sequence goes to the drafter that was
sent the longest prefix of its prompt, unless it is loaded past ``prefix_max_load``; dropped drafters are never
chosen; the drafters' prefix hit / miss counts are summed into the client's stats and ``/metrics``."""

from __future__ import annotations

import numpy as np
import torch

from actors.messages import DraftResult, DraftStatus, DraftStep, SeqSlice
from actors.metrics import ProposerStats
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
    pool.new_group_size = 1
    pool.draft_batch(*first_step(0, {"s0": system + [50]}))
    home = pool.home["s0"]
    pool.draft_batch(*first_step(1, {"s1": system + [60], "s2": system[:4] + [70, 71, 72, 73], "x": [90] * 9}))
    assert pool.home["s1"] == pool.home["s2"] == home and pool.prefix_homed == 2
    assert pool.home["x"] != home  # no prefix anywhere: the least-loaded drafter
    pool.prefix_max_load = 3
    pool.links[home].load = 3  # as the home last reported: loaded to the target, so the next goes elsewhere
    pool.draft_batch(*first_step(2, {"s3": system + [80]}))
    assert pool.home["s3"] != home
    stats = pool.stats()
    assert stats["prefix_hit_tokens"] == BS * 5 and stats["prefix_miss_tokens"] == 4  # 5 prompts, 4 answers
    text = ProposerStats(client=stats).prometheus()
    assert f"eagle_cluster_draft_prefix_hit_tokens {BS * 5}" in text
    assert "eagle_cluster_draft_prefix_miss_tokens 4" in text


def test_a_dropped_drafter_is_not_chosen_by_prefix(monkeypatch):
    fake_ray(monkeypatch)
    system = list(range(1, 9))
    pool = Pool({"A": (FakeDrafter(counting), 0), "B": (FakeDrafter(counting), 5)})
    pool.draft_batch(*first_step(0, {"s0": system}))
    assert pool.home["s0"] == "A"
    pool.drafters.pop("A")
    pool._drop(pool.links["A"], ["s0"], "gone")
    pool.draft_batch(*first_step(1, {"s1": system + [9]}))
    assert pool.home["s1"] == "B" and pool.prefix_homed == 0
