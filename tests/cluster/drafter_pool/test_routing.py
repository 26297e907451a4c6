"""The drafter pool's logic, without a cluster: batch splitting, routing keys, the router's choices, the
autoscaling policy, and the Serve options the config turns into (validated by Serve's own models)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from actors.messages import DraftResult, DraftStatus, DraftStep, SeqSlice
from cluster.drafter_pool.autoscaling import DrafterLoadPolicy, wanted_replicas
from cluster.drafter_pool.router import SequenceAffinityRouter, route_key


def test_select_worked_example():
    step = DraftStep(7, 3, [SeqSlice("a", 0, 2, 10), SeqSlice("b", 2, 1, 4), SeqSlice("c", 3, 3, 0)],
                     np.arange(6, dtype=np.int32) + 100, ["z"])
    sub, rows = step.select([2, 0])
    assert rows.tolist() == [3, 4, 5, 0, 1]
    assert [(s.req_id, s.start, s.num_tokens, s.start_position) for s in sub.seqs] == [("c", 0, 3, 0), ("a", 3, 2, 10)]
    assert sub.input_ids.tolist() == [103, 104, 105, 100, 101] and sub.finished == []
    sub.validate(5, 8, 8)
    assert DraftStep.unpack(sub.pack()).seqs == sub.seqs


def test_result_carries_drafter_fields():
    r = DraftResult(1, DraftStatus.PARTIAL, np.ones((2, 3), np.int32), 1.5, "x", "replica-1", 12, 2, 2, [1])
    back = DraftResult.unpack(r.pack())
    assert (back.status, back.drafter_id, back.active_sequences, back.cold_sequences) == (
        DraftStatus.PARTIAL, "replica-1", 12, 2)
    assert (back.branch_lookups, back.hit_seqs, back.branch_hits) == (2, [1], 1)


def replica(uid: str, active: int, reported_at: float = 1.0):
    from ray.serve._private.common import DeploymentID
    from ray.serve.request_router import ReplicaID

    rid = ReplicaID(unique_id=uid, deployment_id=DeploymentID(name="Drafter", app_name="app"))
    return SimpleNamespace(replica_id=rid, routing_stats={"active_sequences": active, "reported_at": reported_at})


def choose(router, replicas, key):
    pending = SimpleNamespace(metadata=SimpleNamespace(session_id=key))
    return asyncio.run(router.choose_replicas(replicas, pending))


def make_router() -> SequenceAffinityRouter:
    router = SequenceAffinityRouter.__new__(SequenceAffinityRouter)  # the logic only: no Serve router around it
    router.initialize_state()
    return router


def test_router_keeps_sequences_home_and_rehomes_when_home_is_gone():
    router = make_router()
    r1, r2 = replica("r1", 30), replica("r2", 2)
    assert choose(router, [r1, r2], route_key("r1", 5)) == [[r1]]  # busy home: still home
    ranks = choose(router, [r2], route_key("r1", 5))  # r1 is gone: re-home to what is left
    assert ranks == [[r2]]


def test_router_spreads_new_sequences_by_load_between_reports():
    router = make_router()
    r1, r2 = replica("r1", 3), replica("r2", 0)
    picks = [choose(router, [r1, r2], route_key(None, 4))[0][0].replica_id.unique_id for _ in range(3)]
    assert picks == ["r2", "r1", "r2"]  # r2: 0 -> 4; r1: 3 -> 7; r2: 4 -> 8
    r2.routing_stats = {"active_sequences": 1, "reported_at": 2.0}  # a fresh report replaces the guesses
    assert choose(router, [r1, r2], route_key(None, 1))[0][0] is r2


def test_wanted_replicas_worked_example():
    assert wanted_replicas({"a": 20, "b": 20}, {}, 2, 16, None) == 3
    assert wanted_replicas({"a": 20, "b": 20}, {"a": 30, "b": 50}, 2, 16, 20) == 4
    assert wanted_replicas({}, {}, 1, 16, 20) == 0  # idle: Serve's min_replicas bounds it


def test_policy_reads_serve_context():
    ctx = SimpleNamespace(aggregated_metrics={"active_sequences": {"x": 40.0}, "draft_ms": {"x": 5.0}},
                          current_num_replicas=1)
    assert DrafterLoadPolicy(target_sequences_per_replica=16)(ctx)[0] == 3
    with pytest.raises(ValueError, match="target_sequences_per_replica"):
        DrafterLoadPolicy(target_sequences_per_replica=0)


def test_autoscaling_config_is_valid_for_serve():
    from ray.serve.config import AutoscalingConfig

    from cluster.config import AutoscalingConfig as Ours

    ours = Ours(min_replicas=1, max_replicas=3, target_sequences_per_replica=8, upscale_delay_s=1)
    serve_cfg = AutoscalingConfig(**ours.for_serve())
    assert serve_cfg.max_replicas == 3 and serve_cfg.upscale_delay_s == 1
    policy = serve_cfg.policy.get_policy()
    assert policy is DrafterLoadPolicy
    assert policy(**serve_cfg.policy.policy_kwargs).target_sequences_per_replica == 8


def test_serve_gets_the_classes_and_vllm_the_finder_path():
    from actors.verifier.drafters import build_finder
    from cluster import deploy_yaml
    from cluster.app import build_drafter_app
    from cluster.config import DRAFTER_APP_NAME
    from cluster.drafter_pool.finder import SERVE_FINDER, ServeFinder
    from tests.cluster.configs import drafter_deployment

    finder = build_finder({"finder": SERVE_FINDER, "app_name": "a", "deployment_name": "d"})  # as vLLM's worker does
    assert type(finder) is ServeFinder and (finder.app_name, finder.deployment_name) == ("a", "d")
    doc = deploy_yaml.with_changes(deploy_yaml.load(), absolute=True)
    drafter = drafter_deployment(build_drafter_app(deploy_yaml.app_args(doc, DRAFTER_APP_NAME)))
    router = drafter._deployment_config.request_router_config
    assert router.get_request_router_class() is SequenceAffinityRouter
