"""Where a GPU verifier's engine runs (``VerifierConfig.replica_gpus`` / ``executor_backend``, bound by
``cluster.app.build_app``): at TP 1 the engine core runs the model inside the Serve replica's process tree, so the
replica holds bundle 0's GPU (Ray then sets its ``CUDA_VISIBLE_DEVICES``, which vLLM's engine-core process inherits;
with no GPU Ray leaves it unset and the engine would take the node's GPU 0); at TP > 1 vLLM's Ray executor puts one
worker on each bundle's GPU, so the replica holds none. Built from the GPU YAMLs in deploy/ (hub ids: the config
checks that need checkpoints are skipped); nothing is deployed."""

from __future__ import annotations

import copy

import pytest

from cluster.app import build_app
from cluster.config import EagleClusterConfig
from tests.cluster.configs import CPU, app_args, config_error
from tests.conftest import ROOT

SCOUT_TP4 = ROOT / "deploy" / "llama4-scout-eagle-tp4.yaml"
SCOUT_TP1 = ROOT / "deploy" / "llama4-scout-w4a16-eagle3.yaml"


def _verifier(args: dict):
    """The Verifier deployment as ``build_app`` binds it (Serve keeps it, and its bundles, privately)."""
    return build_app(args)._bound_deployment


def test_tp1_replica_holds_its_bundles_gpu():
    args = app_args(SCOUT_TP1)
    assert args["verifier"]["tensor_parallel_size"] == 1
    v = _verifier(args)
    assert v.ray_actor_options["num_gpus"] == 1
    (bundle,) = v._replica_config.placement_group_bundles
    assert bundle["GPU"] == 1 and bundle["CPU"] >= v.ray_actor_options["num_cpus"]  # the replica fits in bundle 0
    assert EagleClusterConfig.model_validate(args).verifier.executor_backend is None  # vLLM's "uni"


def test_tp4_workers_hold_the_gpus():
    args = app_args(SCOUT_TP4)
    v = _verifier(args)
    assert v.ray_actor_options.get("num_gpus", 0) == 0  # else vLLM's worker 0 waits for bundle 0's GPU forever
    assert [b["GPU"] for b in v._replica_config.placement_group_bundles] == [1, 1, 1, 1]
    assert EagleClusterConfig.model_validate(args).verifier.executor_backend == "ray"


def test_tp1_with_the_ray_executor_leaves_the_gpu_to_its_worker():
    args = copy.deepcopy(app_args(SCOUT_TP1))
    args["verifier"]["engine_kwargs"]["distributed_executor_backend"] = "ray"
    assert _verifier(args).ray_actor_options.get("num_gpus", 0) == 0


def test_cpu_replica_holds_no_gpu():
    assert _verifier(copy.deepcopy(CPU)).ray_actor_options.get("num_gpus", 0) == 0


@pytest.mark.parametrize("backend", ["mp", "uni"])
def test_tp_on_gpus_needs_the_ray_executor(backend):
    args = copy.deepcopy(app_args(SCOUT_TP4))
    args["verifier"]["engine_kwargs"]["distributed_executor_backend"] = backend
    msg = config_error(args)
    assert "distributed_executor_backend" in msg and "placement group bundles" in msg
