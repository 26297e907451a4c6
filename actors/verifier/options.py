"""Engine options the remote drafter cannot work with, refused before an engine is built.

Checked where engine arguments are made (``actors.verifier.engine.verifier_kwargs``), by the YAML config
(``cluster.config.VerifierConfig``: ``verifier.engine_kwargs``), and in the worker itself
(``actors.verifier.worker.RemoteDraftWorker.init_device``) for engines built some other way. No vLLM import here:
the Serve config validates without it.
"""

from __future__ import annotations

import os
from typing import Any

V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
V1, V2 = "v1", "v2"

ASYNC_SCHEDULING = (
    "the remote drafter needs it off with model runner V1: with async scheduling V1 feeds each rank's own drafter "
    "buffer into the next step, which remote drafts never reach; model runner V2 (VLLM_USE_V2_MODEL_RUNNER=1, "
    "vLLM's default on CUDA) supports it")
RAY_V2_EXECUTOR_ENV = "VLLM_USE_RAY_V2_EXECUTOR_BACKEND"
LEGACY_RAY_EXECUTOR = (
    "vLLM's legacy Ray executor calls the model runner directly, past the verifier worker's hooks (finished "
    "sequences would never be freed on the drafters); unset it or set 1 for RayExecutorV2, vLLM's default")
PIPELINE_PARALLEL = (
    "the remote drafter supports 1 only: vLLM builds the drafter hook on the last pipeline stage only, and vLLM's "
    "scheduler takes draft tokens from that stage; use tensor_parallel_size")


def refuse_unsupported(engine: dict[str, Any], runner: str | None = None) -> None:
    """A ``ValueError`` starting with the option's name when ``engine`` (vLLM engine keyword arguments) asks for
    something the remote drafter cannot do: ``async_scheduling`` on model runner V1 (``runner``: ``"v1"`` or
    ``"v2"``; None where the runner is chosen later, in the engine's process, whose worker then checks),
    ``pipeline_parallel_size`` > 1; and ``distributed_executor_backend: ray`` with vLLM's legacy Ray executor asked
    for in this process's environment (``legacy_ray_executor``: the error then names the variable)."""
    if engine.get("distributed_executor_backend") == "ray" and legacy_ray_executor():
        raise ValueError(f"{RAY_V2_EXECUTOR_ENV}={os.environ[RAY_V2_EXECUTOR_ENV]!r} with "
                         f"distributed_executor_backend 'ray': {LEGACY_RAY_EXECUTOR}")
    if engine.get("async_scheduling") and runner == "v1":
        raise ValueError(f"async_scheduling: {engine['async_scheduling']!r}; {ASYNC_SCHEDULING}")
    pp = engine.get("pipeline_parallel_size") or 1
    if pp != 1:
        raise ValueError(f"pipeline_parallel_size: {pp}; {PIPELINE_PARALLEL}")


def legacy_ray_executor() -> bool:
    """Whether the environment asks vLLM for its legacy Ray executor (``VLLM_USE_RAY_V2_EXECUTOR_BACKEND`` set to
    0; vLLM reads it as ``bool(int(...))``, default 1: ``RayExecutorV2``)."""
    value = os.environ.get(RAY_V2_EXECUTOR_ENV, "").strip()
    return value.lstrip("-").isdigit() and int(value) == 0


def requested_runner() -> str | None:
    """The model runner the environment names (``VLLM_USE_V2_MODEL_RUNNER``, parsed as vLLM does: ``1`` / ``true``
    or ``0`` / ``false``), else None: then V2 on CUDA, V1 on a CPU (``actors.vllm_engine.choose_model_runner``)."""
    value = os.environ.get(V2_RUNNER_ENV, "").strip().lower()
    if not value:
        return None
    if value in ("1", "true"):
        return V2
    if value in ("0", "false"):
        return V1
    raise ValueError(f"{V2_RUNNER_ENV}={os.environ[V2_RUNNER_ENV]!r}: use 1 (model runner V2) or 0 (model runner V1)")


def expected_runner(accelerator: str) -> str:
    """The runner an engine on ``accelerator`` (``"cpu"`` or ``"gpu"``) will use, by this process's environment."""
    return requested_runner() or (V1 if accelerator == "cpu" else V2)
