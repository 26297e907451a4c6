"""Model runner V1 for every verifier engine (``actors.vllm_engine.use_v1_model_runner``), and a clear refusal of
model runner V2 in the worker (``actors.verifier.worker.require_v1_runner``): vLLM 0.32 picks V2 on CUDA, where
the remote proposer's hook (``runner.drafter``) does not exist. Checked on CPU, where vLLM would pick V1 anyway."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from actors import vllm_engine


@pytest.fixture
def v2_requested(monkeypatch):
    """The user's environment asks for runner V2; the variable is restored after the test."""
    monkeypatch.setenv(vllm_engine.V2_RUNNER_ENV, "1")


def test_engine_env_selects_runner_v1(v2_requested, monkeypatch):
    import vllm.envs as envs
    from vllm.ray.ray_env import get_env_vars_to_copy

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # restored too: set_engine_env sets vLLM-CPU's variables
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")
    assert envs.VLLM_USE_V2_MODEL_RUNNER is True
    vllm_engine.set_engine_env(1)
    assert envs.VLLM_USE_V2_MODEL_RUNNER is False  # what VllmConfig.use_v2_model_runner reads first
    assert vllm_engine.V2_RUNNER_ENV in get_env_vars_to_copy()  # vLLM's Ray executor hands it to its workers


def test_cached_v2_setting_is_an_error(v2_requested, monkeypatch):
    """Once an engine core has run in a process, vLLM reads cached values: setting the variable then is too late."""
    import vllm.envs as envs

    cached = envs.__getattr__
    monkeypatch.setattr(envs, "__getattr__", lambda name: True if name == vllm_engine.V2_RUNNER_ENV else cached(name))
    with pytest.raises(RuntimeError, match="VLLM_USE_V2_MODEL_RUNNER"):
        vllm_engine.use_v1_model_runner()


class _V2Runner:
    """Shaped like vLLM's ``vllm.v1.worker.gpu.model_runner.GPUModelRunner``: a ``speculator``, no ``drafter``."""

    speculator = None


@pytest.mark.parametrize("remote", [True, False], ids=["remote-drafter", "baseline"])
def test_worker_refuses_runner_v2(monkeypatch, remote):
    from actors.verifier import worker

    monkeypatch.setattr(worker._PlatformWorker, "init_device",
                        lambda self: setattr(self, "model_runner", _V2Runner()))
    w = object.__new__(worker.RemoteDraftWorker)  # no vLLM config, device or model: init_device's check only
    w.vllm_config = SimpleNamespace(additional_config={worker.CONFIG_KEY: {"remote_drafter": remote}},
                                    speculative_config=object())
    with pytest.raises(RuntimeError, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        w.init_device()


def test_runner_v1_passes():
    from actors.verifier.worker import require_v1_runner

    require_v1_runner(SimpleNamespace(drafter=None))  # V1 (GPU or CPU): a drafter attribute, no speculator
    with pytest.raises(RuntimeError, match="_V2Runner"):
        require_v1_runner(_V2Runner())


def test_vllm_runner_classes_are_told_apart():
    """vLLM's own runner classes, V1 and V2, GPU and CPU (imported only: nothing is built)."""
    from vllm.v1.worker.cpu.model_runner import CPUModelRunner as CPUv2
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner as CPUv1
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as GPUv2
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as GPUv1

    from actors.verifier.worker import require_v1_runner

    for v2 in (GPUv2, CPUv2):
        with pytest.raises(RuntimeError, match="VLLM_USE_V2_MODEL_RUNNER=0"):
            require_v1_runner(object.__new__(v2))
    for v1 in (GPUv1, CPUv1):
        require_v1_runner(object.__new__(v1))
