"""The draft-length rule (``actors.verifier.draft_length``): its worked example, the schedule as vLLM expands it,
``auto`` finding the k of the highest goodput at each load and holding it under noise (hysteresis), exploration,
and how the key travels (engine arguments, ``/metrics``)."""

from __future__ import annotations

import doctest
import random

import pytest

from actors.metrics import ProposerStats
from actors.verifier import draft_length as dl
from actors.verifier.engine import verifier_kwargs
from benchmarks.offline import drive


def test_worked_example_in_the_docstring():
    result = doctest.testmod(dl)
    assert result.attempted == 4 and result.failed == 0


def test_schedule_is_vllms_lookup_clamped_and_carried():
    s = dl.build_draft_length([[1, 2, 3], [4, 8, 5], [17, 32, 0]], max_k=3, max_num_seqs=64)
    assert isinstance(s, dl.ScheduledDraftLength)
    # 3 at 1-2; the gap 3 carries 3; 4-8 clamped to K = 3... the gap 9-16 carries the previous entry; 0 from 17 on
    assert [s.choose(b) for b in (1, 2, 3, 4, 8, 9, 16, 17, 32, 64, 500)] == [3, 3, 3, 3, 3, 3, 3, 0, 0, 0, 0]
    s = dl.build_draft_length([[1, 1, 2], [2, 64, 1]], max_k=3, max_num_seqs=64)
    assert [s.choose(b) for b in (1, 2, 64)] == [2, 1, 1]
    with pytest.raises(ValueError, match="start at 1"):
        dl.build_draft_length([[2, 4, 1]], 3, 64)
    assert isinstance(dl.build_draft_length(None, 3, 64), dl.FixedDraftLength)
    assert dl.build_draft_length(None, 3, 64).choose(100) == 3


def simulate(policy: dl.AutoDraftLength, batch: int, cost, steps: int, noise: float = 0.0, seed: int = 0,
             accept=(0.8, 0.6, 0.4), trace: list[int] | None = None) -> list[int]:
    """Drive the policy as the proposer does (``benchmarks.offline.drive``): choose, verify (acceptance),
    time the step (``cost(batch, k)`` ms per step, times 1 +- noise). ``trace``: the bucket's ``current`` after each
    step is appended to it."""
    rng = random.Random(seed)
    after = None if trace is None else lambda: trace.append(policy.buckets[dl.bucket(batch)].current)
    ks, _ = drive(policy, batch, lambda t, k: cost(batch, k) * (1 + rng.uniform(-noise, noise)), steps, rng, accept,
                  after)
    return ks


def cost(batch: int, k: int) -> float:
    """A step: 2 ms fixed, drafting (k > 0) 2 ms + 0.3 ms per sequence, 0.5 ms per token verified."""
    return 2.0 + (2.0 + 0.3 * batch if k else 0.0) + 0.5 * batch * (1 + k)


def test_auto_picks_the_best_k_at_each_load():
    p = dl.AutoDraftLength(3)
    low = simulate(p, 1, cost, 200)
    high = simulate(p, 32, cost, 200)
    # batch 1: goodput per k [1/2.5, 1.8/5.3, 2.4/5.8, 2.8/6.3]: k = 3; batch 32: [32/18, 57.6/45.6, ...]: k = 0
    assert low[-50:].count(3) >= 50 - p.hold and high[-50:].count(0) >= 50 - p.hold  # one periodic probe at most
    assert p.goodput(1, 3) and p.goodput(32, 0) and p.goodput(32, 0) > p.goodput(32, 3)
    assert abs(p.acceptance()[0] - 0.8) < 0.08 and abs(p.acceptance()[2] - 0.4) < 0.1


def choices(policy: dl.AutoDraftLength, batch: int, cost, steps: int, noise: float, seed: int) -> list[int]:
    """The bucket's choice (``current``, probes aside) after each of ``steps`` simulated steps."""
    trace: list[int] = []
    simulate(policy, batch, cost, steps, noise=noise, seed=seed, trace=trace)
    return trace


def test_auto_is_stable_under_noise():
    """Two k within a few percent of each other, 10% timing noise: the choice does not flip step to step."""
    def close(batch: int, k: int) -> float:  # E(k)/cost equal within ~2% for k = 2 and 3 at batch 8
        return {0: 30.0, 1: 40.0, 2: 50.0, 3: 57.4}[k]

    p = dl.AutoDraftLength(3)
    current = choices(p, 8, close, 1000, noise=0.1, seed=3)[100:]
    switches = sum(a != b for a, b in zip(current, current[1:], strict=False))
    assert switches <= 6, switches  # one switch per 150 steps at most, between two k whose goodputs are 2% apart
    no_hysteresis = dl.AutoDraftLength(3, hysteresis=0.0, confirm=0, max_probes=1)
    current = choices(no_hysteresis, 8, close, 1000, noise=0.1, seed=3)[100:]
    assert sum(a != b for a, b in zip(current, current[1:], strict=False)) > 2 * switches  # what they buy


def test_a_slow_run_does_not_move_auto():
    """k = 3 is best; every step turns slow for a while (another job on the core). ``auto`` compares the k values by
    ratios measured side by side (a probe against the current k's periods just before it), so a slow run of the
    current k is no news about the others: it stays at k = 3."""
    def spiky(step: list[int]):
        def cost_at(batch: int, k: int) -> float:
            step[0] += 1
            slow = 1.4 if 300 <= step[0] < 330 else 1.0  # thirty slow steps, whatever k
            return {0: 10.0, 1: 11.0, 2: 12.0, 3: 13.0}[k] * slow
        return cost_at

    p = dl.AutoDraftLength(3)
    ks = simulate(p, 1, spiky([0]), 600)
    assert ks[300:450].count(3) >= 150 - 3 * p.hold, ks[300:450]  # the periodic probes only


def test_a_rival_is_probed_again_before_a_switch():
    """A rival measured long ago (over ``fresh_steps``) or fewer than ``confirm`` times is measured again before
    ``auto`` switches to it: the cost of the k values changed since (drafting got cheap), and one old figure is not
    enough to act on."""
    p = dl.AutoDraftLength(3)
    simulate(p, 1, lambda b, k: 10.0 + 10.0 * k, 200)  # drafting is dear: k = 0 (1/10 against 2.8/40 tokens per ms)
    s = p.buckets[dl.bucket(1)]
    assert s.current == 0
    s.rel[3] = 0.5  # a figure that says k = 3 is the best by far, but measured long ago
    ks = simulate(p, 1, lambda b, k: 10.0 + 10.0 * k, 100)
    assert 3 in ks[:p.between + 2] and ks.count(3) == p.hold  # probed once, not switched to
    assert ks[-40:].count(0) >= 40 - p.hold and s.current == 0  # the probe found it dear: k = 0 stays


def test_a_switch_made_on_a_misread_is_undone():
    """A bucket at k = 3 (the best) is misled into k = 1 (two probes read k = 1 at 0.4x k = 3's cost: the batch was
    ramping up). The k it left is probed right after the switch, its ratio measured afresh: back at k = 3 within a
    few probes, not a whole run later."""
    p = dl.AutoDraftLength(3)
    costs = {0: 10.0, 1: 11.0, 2: 12.0, 3: 13.0}
    simulate(p, 1, lambda b, k: costs[k], 100)
    s = p.buckets[dl.bucket(1)]
    assert s.current == 3
    s.rel[1], s.probes[1], s.probed_at[1] = 0.4, p.confirm, s.steps  # the misread, fresh and confirmed
    ks = simulate(p, 1, lambda b, k: costs[k], 120)
    assert ks[0] == 1 and ks.index(3) <= p.between + p.settle, ks  # switched, and the k left is probed first thing
    assert s.current == 3 and ks[60:].count(3) >= 60 - 2 * p.hold, ks  # back at k = 3 for good, probes aside


def test_auto_explores_then_follows_a_changed_cost():
    p = dl.AutoDraftLength(3, explore_every=16)
    def cheap(batch: int, k: int) -> float:  # drafting is cheap: k = 3
        return 5.0 + 0.5 * k

    first = simulate(p, 1, cheap, 31)
    # K measured first (its cost is what the others are measured against), then a probe of each k, K - 1 down to 0,
    # each after K's cost measured afresh: ``between`` steady periods, after ``settle`` unsteady ones
    again = [3] * (p.settle + p.between)
    assert first == [3] * p.between + [2] * p.hold + again + [1] * p.hold + again + [0] * p.hold
    simulate(p, 1, cheap, 100)
    assert p.buckets[dl.bucket(1)].current == 3
    ks = simulate(p, 1, lambda b, k: 9.0 + 40.0 * k, 300)  # drafting became expensive: k = 0 wins
    assert ks[-20:].count(0) >= 20 - 2 * p.hold  # all but the periodic probes (one every 16 steps)


def test_auto_samples_steady_periods_only():
    """A period right after a k change also streams the previous step's output (measured at batch 32: the first
    k = 0 step after k = 3 steps took ~1.6x a steady one), and the next one after a k = 0 stretch finds the drafter
    cold (a drafter step after an idle gap costs 1.3-3.9x one run back to back: issue 20's seventh pass), so the
    first ``settle`` (2) periods at a new k are not samples of its cost; they go to ``history`` only."""
    p = dl.AutoDraftLength(3)
    p.observe_period(32, 3, 90.0, previous_k=0)
    s = p.buckets[dl.bucket(32)]
    p.observe_period(32, 3, 70.0, previous_k=3)
    assert not s.recent and s.cost() is None and p.history[-1] == (32, 3, 70.0)
    p.observe_period(32, 3, 40.0, previous_k=3)
    p.observe_period(32, 3, 42.0, previous_k=3)
    assert len(s.recent) == 2 and s.cost() == pytest.approx(41.0 / 32)
    assert p.choose(32) == 3  # ``between`` (4) steady periods before a probe
    p.observe_period(32, 3, 40.0, previous_k=3)
    p.observe_period(32, 3, 42.0, previous_k=3)
    assert p.choose(32) == 2 and s.probe_k == 2  # k = 2 not measured yet: probed
    p.observe_period(32, 2, 50.0, previous_k=3)  # a change: the count starts again
    p.observe_period(32, 2, 20.0, previous_k=2)
    assert not s.probe_samples
    p.observe_period(32, 2, 20.0, previous_k=2)
    assert s.probe_samples == [20.0 / 32] and len(p.history) == 9
    for _ in range(p.hold - 1):
        p.choose(32)
    p.choose(32)  # the probe ends: its ratio to the current k's cost
    assert s.rel[2] == pytest.approx(20.0 / 41.0) and s.probes[2] == 1


def test_the_speculation_hands_auto_the_previous_steps_k(monkeypatch):
    """Each step is timed from its ``propose`` to the next (``StepDraftLength``, asked by ``Speculation.propose``),
    and the policy handed that period with the k of the step before it, only when all three steps were decode steps
    (a prompt step breaks the chain, as does an idle engine); the k chosen per step is counted."""
    from types import SimpleNamespace

    from actors.verifier import speculation as speculation_module
    from tests.actors.fake_speculator import propose, speculation

    class Scripted:
        max_k = 3

        def __init__(self, ks: list[int]) -> None:
            self.ks, self.seen = iter(ks), []

        def choose(self, batch_size: int) -> int:
            return next(self.ks)

        def observe_period(self, batch_size, k, ms, previous_k=None):
            self.seen.append((k, previous_k, round(ms)))

        def observe_acceptance(self, num_drafts, accepted):
            return None

        def goodput(self, batch_size, k):
            return None

    now = [0.0]
    monkeypatch.setattr(speculation_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    s = speculation(policy=(policy := Scripted([3, 3, 0, 0, 0, 3, 3, 3, 3, 3, 3])))
    decode, prompt = [("a", 9, 1)], [("a", 0, 4)]
    for t, seqs in enumerate([decode, decode, decode, decode, decode, prompt, decode, decode]):
        now[0] = t * 0.01  # propose at t * 10 ms
        propose(s, seqs, prompt_lens=[4] if seqs is prompt else None)
        s.collect()
    # Step t's period (k_t, k_{t-1}) is handed over at step t + 1: steps 1, 2 and 3 (step 0 has no previous k).
    # Step 4's period ends at the prompt step, which breaks the chain: step 6 has no previous k, so step 7 hands
    # nothing over either.
    assert policy.seen == [(3, 3, 10), (0, 3, 10), (0, 0, 10)]
    assert s.lengths.chosen == [3, 0, 0, 5]
    # The engine idle before step 8: step 7's period (which step 8 would hand over) includes the gap, so it is not;
    # step 9 then has no previous k, and step 10 hands step 9's period over.
    for t, idle in ((8, True), (9, False), (10, False)):
        now[0] = t * 0.01
        if idle:
            s.idle()
        propose(s, decode)
        s.collect()
    assert policy.seen == [(3, 3, 10), (0, 3, 10), (0, 0, 10), (3, 3, 10)]


def test_engine_arguments_move_the_key_to_the_clusters_config():
    spec = {"method": "eagle", "model": "/m", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size":
            "auto"}
    kw = verifier_kwargs("/t", spec, {"actor": "a"})
    assert "num_speculative_tokens_per_batch_size" not in kw["speculative_config"]
    assert kw["additional_config"]["eagle_cluster"]["draft_length"] == "auto"
    assert spec["num_speculative_tokens_per_batch_size"] == "auto"  # the caller's dict is left alone
    base = verifier_kwargs("/t", spec, None)  # baselines run at K
    assert "draft_length" not in base["additional_config"]["eagle_cluster"]
    assert "num_speculative_tokens_per_batch_size" not in base["speculative_config"]


def test_histogram_on_metrics():
    text = ProposerStats(speculative_tokens=[5, 0, 2, 7], estimated_goodput=123.5).prometheus()
    assert 'eagle_cluster_speculative_tokens_bucket{le="0"} 5' in text
    assert 'eagle_cluster_speculative_tokens_bucket{le="2"} 7' in text
    assert 'eagle_cluster_speculative_tokens_bucket{le="+Inf"} 14' in text
    assert "eagle_cluster_speculative_tokens_sum 25" in text and "eagle_cluster_speculative_tokens_count 14" in text
    assert "eagle_cluster_estimated_goodput_tokens_per_second 123.5" in text
    assert ProposerStats.from_dict(ProposerStats(speculative_tokens=[1, 2]).to_dict()).speculative_tokens == [1, 2]


def test_goodput_table_is_what_auto_chooses_by():
    assert [dl.bucket_label(dl.bucket(b)) for b in (1, 2, 3, 4, 5, 8, 9, 16, 32)] == [
        "1", "2", "3-4", "3-4", "5-8", "5-8", "9-16", "9-16", "17-32"]
    p = dl.AutoDraftLength(3)
    assert dl.FixedDraftLength(3).goodput_table() == {} and p.goodput_table() == {}
    simulate(p, 32, cost, 200)
    row = p.goodput_table()["17-32"]
    assert len(row) == 4 and all(v is not None for v in row)
    assert max(range(4), key=lambda k: row[k]) == 0 == p.buckets[dl.bucket(32)].current  # the argmax is the choice
    assert row[0] == pytest.approx(p.goodput(32, 0))
    text = ProposerStats(goodput_by_k={"17-32": [1.5, None, 0.25, 0.125]}).prometheus()
    assert 'eagle_cluster_estimated_goodput_by_draft_length{batch="17-32",k="0"} 1.500' in text
    assert 'k="1"' not in text and 'eagle_cluster_estimated_goodput_by_draft_length{batch="17-32",k="3"} 0.125' in text


def test_a_new_bucket_starts_from_its_measured_neighbour():
    """Batch 16 measured (k = 0 wins there, as at 32): batch 32 starts at k = 0 from batch 16's ratios, which put
    every k > 0 far below it (under ``close``, 0.8x), so it probes none of them until its periodic probes. A policy
    that had not measured any bucket measures every k first."""
    p = dl.AutoDraftLength(3)
    simulate(p, 16, cost, 200)
    assert p.buckets[dl.bucket(16)].current == 0
    ks = simulate(p, 32, cost, 40)
    assert ks == [0] * 40, ks
    fresh = simulate(dl.AutoDraftLength(3), 32, cost, 60)  # every k, then k = 0, then k = 3 (the k left) once more
    assert fresh[:4] == [3] * 4 and set(fresh[:31]) == {0, 1, 2, 3} and fresh[-9:] == [0] * 9, fresh
    # near the best, a neighbour's ratio is measured at once, and k = 0 where the load rose: batch 1 (k = 3) ->
    # batch 2 probes 2, then 0
    simulate(p, 1, cost, 200)
    ks = simulate(p, 2, cost, 30)
    assert ks[:9] == [3] * p.between + [2] * p.hold and ks.count(0) >= p.hold and ks.count(1) == 0, ks


def test_a_larger_batch_probes_k0_at_once():
    """Batch 1 measured with k = 0 at under half k = 3's goodput (far below ``close``): batch 4 starts at k = 3 from
    its ratios, and probes k = 0 at once all the same, since the load rose; a smaller batch does not."""
    costs = {0: 10.0, 1: 11.0, 2: 12.0, 3: 13.0}  # goodput [0.100, 0.164, 0.200, 0.215] tokens/ms
    p = dl.AutoDraftLength(3)
    simulate(p, 4, lambda b, k: costs[k], 200)
    simulate(p, 1, lambda b, k: costs[k], 30)  # batch 1 starts from batch 4 (nearer than nothing): no k = 0 probe
    ks = simulate(p, 8, lambda b, k: costs[k], 30)
    assert ks.count(0) == p.hold and ks[:p.between] == [3] * p.between, ks
    q = dl.AutoDraftLength(3)
    simulate(q, 8, lambda b, k: costs[k], 200)
    ks = simulate(q, 4, lambda b, k: costs[k], 30)
    assert ks.count(0) == 0, ks


def test_the_fit_over_the_drafting_k():
    """The worked example of ``_Bucket.fitted``: one high ratio of k = 2 is mostly noise on the line through k >= 1."""
    s = dl._Bucket(3, [0.5, 0.8, 1.05, 1.0], [2, 2, 2, 1], [0] * 4)
    assert [round(r, 2) for r in s.fitted()] == [0.5, 0.86, 0.93, 1.01]
    assert dl._Bucket(3, [0.5, 1.2, 1.1, 1.0], [2, 2, 2, 1], [0] * 4).fitted()[1:] == pytest.approx([1.03] * 3)  # flat


def test_a_server_slow_at_start_is_not_misread():
    """Every step is slow while the server warms up (5x, fading over its first 100 steps), when ``auto`` measures
    every k for the first time. It measures each k against the current k's periods just before, which were slow too,
    so it finds k = 0 best at batch 16 all the same, and stays there."""
    calls = [0]

    def warming(batch: int, k: int) -> float:
        calls[0] += 1
        return cost(batch, k) * (1.0 + 4.0 * max(0.0, 1.0 - calls[0] / 100))

    p = dl.AutoDraftLength(3)
    ks = simulate(p, 16, warming, 300)
    assert p.buckets[dl.bucket(16)].current == 0 and ks[-100:].count(0) >= 100 - 2 * p.hold, ks[-100:]
    assert len(p.history) == 300 and p.history[-1][:2] == (16, ks[-1])
