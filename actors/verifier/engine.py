"""Engine arguments for a verifier: the target, vLLM's EAGLE ``speculative_config``, and our worker class.

The speculative config is vLLM's own (``method``, ``model``, ``num_speculative_tokens``, ...): vLLM reads the
head's ``config.json`` from ``model`` (for EAGLE-3: which aux layers to capture) but never its weights, which
the drafter loads instead.
"""

from __future__ import annotations

from typing import Any

from actors.verifier.options import refuse_unsupported
from actors.verifier.worker import CONFIG_KEY

WORKER_CLS = "actors.verifier.worker.RemoteDraftWorker"
DRAFT_LENGTH_KEY = "num_speculative_tokens_per_batch_size"


def verifier_kwargs(
    target: str,
    speculative_config: dict[str, Any] | None,
    draft_client: dict[str, Any] | None,
    owner_pid: int | None = None,
    ray_address: str | None = None,
    **engine: Any,
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` / ``AsyncEngineArgs`` (on top of ``actors.vllm_engine.engine_kwargs``).

    ``draft_client=None`` keeps vLLM's own drafter (or none), with the worker's step timing: the baselines.
    ``owner_pid``: the engine's processes end when that process dies (``actors.verifier.owner_watch``).
    ``ray_address``: the GCS address the engine's driver rank joins (default: the cluster this process is connected
    to, else ``RAY_ADDRESS``, else ``"auto"``; ``"auto"`` alone may pick another Ray running on the host).
    Asynchronous scheduling: on model runner V1 off for every engine, baselines too (the remote drafter cannot feed
    it: ``actors.verifier.options``), so that all are compared alike; on runner V2 as vLLM decides (on by default on
    CUDA, off on vLLM-CPU unless ``async_scheduling=True`` is asked for: ``actors.vllm_engine.keep_async_scheduling``).
    Pipeline parallelism is refused with a remote drafter.
    """
    from actors.vllm_engine import V1, engine_kwargs, model_runner

    runner = model_runner()

    additional = dict(engine.pop("additional_config", None) or {})
    ours = dict(additional.get(CONFIG_KEY) or {})  # e.g. {"mm_embeds": False}: draft from image placeholder ids
    speculative_config, draft_length = _split_draft_length(speculative_config)
    if draft_length is not None and draft_client is not None:
        ours["draft_length"] = draft_length
    if draft_client is None:
        additional[CONFIG_KEY] = {**ours, "remote_drafter": False}
    else:
        refuse_unsupported(engine, runner)
        additional[CONFIG_KEY] = {**ours, "draft_client": dict(draft_client)}
    if owner_pid is not None:
        additional[CONFIG_KEY]["owner_pid"] = owner_pid
    if ray_address is None and draft_client is not None:
        ray_address = _connected_ray_address()
    if ray_address is not None:
        additional[CONFIG_KEY]["ray_address"] = ray_address
    kwargs = engine_kwargs(target, speculative_config=speculative_config, **engine)
    kwargs.update(worker_cls=WORKER_CLS, additional_config=additional)
    if runner == V1:
        kwargs["async_scheduling"] = False
    return kwargs


def _connected_ray_address() -> str | None:
    """The GCS address of the Ray cluster this process is connected to, else None."""
    try:
        import ray
    except ImportError:  # pragma: no cover - Ray is a dependency
        return None
    return ray.get_runtime_context().gcs_address if ray.is_initialized() else None


def _split_draft_length(spec: dict[str, Any] | None) -> tuple[dict[str, Any] | None, Any]:
    """(vLLM's speculative config without ``num_speculative_tokens_per_batch_size``, that key's value).

    The key is vLLM's, but vLLM's model runner V1 only hands its drafter the scheduler's k per step
    (``SchedulerOutput.num_spec_tokens_to_schedule``), and its type cannot hold ``"auto"``; so the remote proposer
    applies it, on either runner, (``actors.verifier.draft_length``) from
    ``additional_config["eagle_cluster"]["draft_length"]``, and vLLM runs with a fixed K. The baselines
    (vLLM's own drafter or none) drop it: they run at K."""
    if not spec or DRAFT_LENGTH_KEY not in spec:
        return spec, None
    spec = dict(spec)
    return spec, spec.pop(DRAFT_LENGTH_KEY)


def make_verifier_llm(
    target: str, speculative_config: dict[str, Any] | None, draft_client: dict[str, Any] | None, **engine: Any
):
    """An offline ``vllm.LLM`` verifier (tests, benchmarks); the Serve deployment uses the async engine."""
    from actors.vllm_engine import keep_async_scheduling, set_engine_env

    set_engine_env(engine.get("tensor_parallel_size", 1))
    from vllm import LLM

    kwargs = verifier_kwargs(target, speculative_config, draft_client, **engine)
    with keep_async_scheduling(kwargs):
        return LLM(**kwargs)
