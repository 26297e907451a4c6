"""The drafter pool's autoscaling on draft latency (``cluster.drafter_pool.autoscaling``): ``wanted_replicas``'s
``by_latency`` term, the policy reading it from Serve's aggregated ``draft_ms``, and ``target_draft_ms`` reaching the
policy through the pool's config. No cluster: Serve's context is a stand-in with its two fields."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cluster.drafter_pool.autoscaling import DrafterLoadPolicy, wanted_replicas

FEW = {"r1": 1.0, "r2": 1.0}  # two replicas, two sequences: by sequences, one replica (at 16 each) is enough


def latency_only(draft_ms: dict[str, float], current: int, target: float | None) -> int:
    return wanted_replicas(FEW, draft_ms, current, 16, target)


def test_slow_drafting_grows_the_pool_in_proportion():
    """current * mean(draft_ms) / target, rounded up: the pool needed for the mean step to draft within target."""
    assert latency_only({"r1": 40.0, "r2": 40.0}, 2, 20.0) == 4  # twice too slow: twice the replicas
    assert latency_only({"r1": 30.0, "r2": 50.0}, 2, 20.0) == 4  # the mean, not the slowest
    assert latency_only({"r1": 21.0, "r2": 21.0}, 2, 20.0) == 3  # a little slow: one more
    assert latency_only({"r1": 100.0}, 1, 20.0) == 5


def test_on_target_holds_and_fast_drafting_gives_sequences_the_say():
    assert latency_only({"r1": 20.0, "r2": 20.0}, 2, 20.0) == 2  # exactly on target: no growth
    assert latency_only({"r1": 19.0, "r2": 21.0}, 2, 20.0) == 2
    # fast drafting asks for fewer replicas: the larger of the two terms wins, here the sequences'
    assert wanted_replicas({"r1": 40.0, "r2": 40.0}, {"r1": 5.0, "r2": 5.0}, 2, 16, 20.0) == 5


def test_idle_replicas_do_not_dilute_the_mean():
    """A replica that drafted nothing in the window reports 0 ms (``DrafterActor.load_window``): it is left out, or
    an idle new replica would halve the mean and stop the growth it was added for."""
    assert latency_only({"r1": 40.0, "r2": 0.0}, 2, 20.0) == 4
    assert latency_only({"r1": 0.0, "r2": 0.0}, 2, 20.0) == 1  # nobody drafted: sequences only
    assert latency_only({"r1": -1.0, "r2": 40.0}, 2, 20.0) == 4


def test_latency_is_ignored_without_a_target_or_replicas():
    assert latency_only({"r1": 500.0}, 1, None) == 1  # target_draft_ms unset: sequences only
    assert latency_only({"r1": 500.0}, 0, 20.0) == 1  # no replica running: nothing to scale from
    assert latency_only({}, 2, 20.0) == 1  # no reports yet


def test_policy_reads_draft_ms_from_serves_aggregated_metrics():
    policy = DrafterLoadPolicy(target_sequences_per_replica=16, target_draft_ms=10.0)
    ctx = SimpleNamespace(current_num_replicas=2, aggregated_metrics={
        "active_sequences": {"r1": 4.0, "r2": 4.0}, "draft_ms": {"r1": 25.0, "r2": 35.0}})
    assert policy(ctx) == (6, {"wanted_replicas": 6})  # 2 * 30 / 10; by sequences 1
    assert DrafterLoadPolicy(target_sequences_per_replica=16)(ctx)[0] == 1  # no latency target: by sequences
    ctx.aggregated_metrics = {"active_sequences": {"r1": 4.0}}  # no draft_ms reported (yet)
    assert policy(ctx)[0] == 1
    ctx.aggregated_metrics = None
    assert policy(ctx)[0] == 0  # nothing reported: Serve's min_replicas bounds it


@pytest.mark.parametrize(("target", "wanted"), [(None, 1), (10.0, 6)])
def test_target_draft_ms_reaches_the_policy_through_the_config(target, wanted):
    from ray.serve.config import AutoscalingConfig

    from cluster.config import AutoscalingConfig as Ours

    ours = Ours(min_replicas=1, max_replicas=8, target_draft_ms=target)
    serve_cfg = AutoscalingConfig(**ours.for_serve())
    policy = serve_cfg.policy.get_policy()(**serve_cfg.policy.policy_kwargs)
    ctx = SimpleNamespace(current_num_replicas=2, aggregated_metrics={
        "active_sequences": {"r1": 4.0, "r2": 4.0}, "draft_ms": {"r1": 30.0, "r2": 30.0}})
    assert policy(ctx)[0] == wanted
