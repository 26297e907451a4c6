"""Engine options the remote drafter cannot work with are refused with the option's name
(``actors.verifier.options``): ``async_scheduling`` on model runner V1 (V1 feeds each rank's own drafter buffer into
the next step; runner V2 takes it, as vLLM does by default on CUDA) and ``pipeline_parallel_size`` > 1 (the drafter
hook exists on the last stage only), and vLLM's legacy Ray executor (``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``: it
steps the model runner past the worker's hooks). Where engine arguments are made (``verifier_kwargs``), by the YAML
config for the runner its accelerator gets, and in the worker for engines built any other way. Nothing is
started."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import EAGLE3, TARGET

SPEC = {"method": "eagle3", "model": str(EAGLE3), "num_speculative_tokens": 3}
CLIENT = {"actor": "drafter", "namespace": "eagle_cluster"}  # one named drafter actor (the default finder)


@pytest.fixture
def runner_v1(monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")


@pytest.fixture
def runner_v2(monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")


@pytest.mark.parametrize(("option", "value"), [("async_scheduling", True), ("pipeline_parallel_size", 2)])
def test_verifier_kwargs_refuse(runner_v1, option, value):
    from actors.verifier.engine import verifier_kwargs

    with pytest.raises(ValueError, match=f"^{option}: .*remote drafter"):
        verifier_kwargs(str(TARGET), SPEC, CLIENT, **{option: value})


def test_verifier_kwargs_keep_async_scheduling_off(runner_v1):
    from actors.verifier.engine import verifier_kwargs

    assert verifier_kwargs(str(TARGET), SPEC, CLIENT)["async_scheduling"] is False
    assert verifier_kwargs(str(TARGET), SPEC, CLIENT, async_scheduling=False, pipeline_parallel_size=1)
    # baselines (vLLM's own drafter) may ask; they run with it off like every engine here, to compare alike
    assert verifier_kwargs(str(TARGET), SPEC, None, async_scheduling=True)["async_scheduling"] is False


def test_runner_v2_takes_async_scheduling_as_vllm_does(runner_v2):
    from actors.verifier.engine import verifier_kwargs

    assert "async_scheduling" not in verifier_kwargs(str(TARGET), SPEC, CLIENT)  # vLLM decides: on, on CUDA
    assert verifier_kwargs(str(TARGET), SPEC, CLIENT, async_scheduling=True)["async_scheduling"] is True
    with pytest.raises(ValueError, match="^pipeline_parallel_size: 2"):
        verifier_kwargs(str(TARGET), SPEC, CLIENT, pipeline_parallel_size=2)


def test_gpu_yamls_get_runner_v2_and_the_cpu_default_runner_v1(monkeypatch):
    from actors.verifier.options import expected_runner
    from cluster.config import EagleClusterConfig
    from tests.cluster.configs import app_args
    from tests.conftest import ROOT

    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    runners = {path.name: expected_runner(EagleClusterConfig.model_validate(app_args(path)).verifier.accelerator)
               for path in sorted((ROOT / "deploy").glob("*.yaml"))}
    assert runners["cpu.yaml"] == "v1" and runners["llama4-scout-eagle-tp4.yaml"] == "v2", runners
    assert {name for name, runner in runners.items() if runner == "v2"} == {
        name for name in runners if name.startswith("llama4-")}


@pytest.mark.parametrize("value", ["0", " 0"])
def test_the_legacy_ray_executor_is_refused_naming_the_variable(runner_v1, monkeypatch, value):
    """vLLM's legacy Ray executor calls the model runner past the worker's hooks: refused before an engine is built,
    with the variable named; RayExecutorV2 (the variable unset or 1) and other executors are left alone."""
    from actors.verifier.engine import verifier_kwargs

    monkeypatch.setenv("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", value)
    with pytest.raises(ValueError, match="^VLLM_USE_RAY_V2_EXECUTOR_BACKEND=.* distributed_executor_backend 'ray'"):
        verifier_kwargs(str(TARGET), SPEC, CLIENT, distributed_executor_backend="ray")
    assert verifier_kwargs(str(TARGET), SPEC, CLIENT, distributed_executor_backend="mp")
    monkeypatch.setenv("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", "1")
    assert verifier_kwargs(str(TARGET), SPEC, CLIENT, distributed_executor_backend="ray")
    monkeypatch.delenv("VLLM_USE_RAY_V2_EXECUTOR_BACKEND")
    assert verifier_kwargs(str(TARGET), SPEC, CLIENT, distributed_executor_backend="ray")


def _worker(monkeypatch, runner, *, async_scheduling=False, pp=1, tp=1, backend="mp"):
    from actors.verifier import worker

    monkeypatch.setattr(worker._PlatformWorker, "init_device", lambda self: setattr(self, "model_runner", runner))
    w = object.__new__(worker.RemoteDraftWorker)  # no device or model: init_device's checks only
    w.rank = 0
    w.vllm_config = SimpleNamespace(
        additional_config={worker.CONFIG_KEY: {"draft_client": CLIENT}}, speculative_config=object(),
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                        distributed_executor_backend=backend))
    return w


def test_worker_refuses_async_scheduling(monkeypatch):
    w = _worker(monkeypatch, SimpleNamespace(drafter=None), async_scheduling=True)
    with pytest.raises(RuntimeError, match="async_scheduling is on"):
        w.init_device()


def test_worker_refuses_the_legacy_ray_executor(monkeypatch):
    """An engine built some other way (not through ``verifier_kwargs``) is refused by its worker, at start."""
    monkeypatch.setenv("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", "0")
    w = _worker(monkeypatch, SimpleNamespace(drafter=None), backend="ray")
    with pytest.raises(RuntimeError, match="VLLM_USE_RAY_V2_EXECUTOR_BACKEND='0'; vLLM's legacy Ray executor"):
        w.init_device()


def test_worker_refuses_pipeline_stages(monkeypatch):
    """On a stage but the last, vLLM builds no drafter: the error must say why, not ask for a speculative config."""
    w = _worker(monkeypatch, SimpleNamespace(), pp=2)
    with pytest.raises(RuntimeError, match="pipeline_parallel_size 2; .*last pipeline stage"):
        w.init_device()


def test_uni_executor_is_honoured_at_tp1_only():
    """``distributed_executor_backend: uni`` at TP 1 becomes vLLM's ``UniProcExecutor`` class (vLLM-CPU would turn
    the string into ``mp``); any other backend, none, or TP > 1 is left as given."""
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    from actors.vllm_engine import worker_in_engine_core

    got = worker_in_engine_core({"distributed_executor_backend": "uni", "tensor_parallel_size": 1, "model": "m"})
    assert got == {"distributed_executor_backend": UniProcExecutor, "tensor_parallel_size": 1, "model": "m"}
    for kwargs in ({"model": "m"}, {"distributed_executor_backend": "mp"},
                   {"distributed_executor_backend": "uni", "tensor_parallel_size": 2}):
        assert worker_in_engine_core(kwargs) == kwargs


def test_the_driver_rank_joins_the_cluster_of_the_process_that_built_the_engine(runner_v1, monkeypatch):
    """Not ``"auto"``, which may pick another Ray running on the host (the test suite runs two side by side)."""
    import ray

    from actors.verifier.engine import verifier_kwargs
    from actors.verifier.worker import CONFIG_KEY

    def ours(kwargs):
        return kwargs["additional_config"][CONFIG_KEY].get("ray_address")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    assert ours(verifier_kwargs(str(TARGET), SPEC, CLIENT)) is None  # the worker falls back to RAY_ADDRESS / auto
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(gcs_address="10.0.0.7:6379"))
    assert ours(verifier_kwargs(str(TARGET), SPEC, CLIENT)) == "10.0.0.7:6379"
    assert ours(verifier_kwargs(str(TARGET), SPEC, CLIENT, ray_address="10.0.0.8:6379")) == "10.0.0.8:6379"
    assert ours(verifier_kwargs(str(TARGET), SPEC, None)) is None  # a baseline joins nothing
