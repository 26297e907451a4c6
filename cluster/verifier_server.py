"""The verifier deployment: vLLM's ``AsyncLLM`` for the target, with drafting delegated to the drafter pool, and
vLLM's own OpenAI serving objects (completions, chat, models) on top of it.

Undecorated; ``cluster.app`` binds it with a placement group of ``tensor_parallel_size`` bundles (the replica
runs in bundle 0). On GPUs at TP 1 the replica holds bundle 0's GPU and vLLM's engine-core process inherits it; at
TP > 1 vLLM's Ray executor puts a worker on each bundle's GPU (``VerifierConfig.replica_gpus``, ``executor_backend``).
The ingress calls ``completions`` / ``chat`` with a request already validated into vLLM's
protocol models; both are async generators of ``cluster.verifier_reply.VerifierReply``: one ``JSON`` reply for a
whole response or an error (with its HTTP status), or one ``SSE`` reply for each server-sent event when streaming.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncGenerator
from typing import Any

from actors.metrics import ProposerStats
from cluster.config import DRAFTER_DEPLOYMENT, SpeculativeConfig, VerifierConfig
from cluster.drafter_pool.client import SERVE_DRAFT_CLIENT
from cluster.verifier_reply import VerifierReply

logger = logging.getLogger(__name__)


def vllm_cli_args(model: str, served_model_name: str) -> Any:
    """The ``vllm serve`` argument namespace vLLM's serving objects read (defaults, plus the model names)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    return parser.parse_args(["--model", model, "--served-model-name", served_model_name])


class VerifierServer:
    async def __init__(self, verifier: dict[str, Any], speculative_config: dict[str, Any], drafter_app: str) -> None:
        """``verifier``, ``speculative_config``: those sections of the app's config. ``drafter_app``: the drafter
        application's name; vLLM's engine runs in its own process, and its draft client opens a handle to that
        application's drafter deployment there (the draft-call timeout comes from the drafters, through
        ``attach``)."""
        import ray
        from starlette.datastructures import State
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.v1.engine.async_llm import AsyncLLM

        from actors.verifier.engine import verifier_kwargs
        from actors.vllm_engine import set_engine_env

        v = VerifierConfig.model_validate(verifier)
        # Before the engine exists: model runner V1 (the remote proposer hooks V1 only), vLLM-CPU's settings.
        set_engine_env(v.tensor_parallel_size, in_process=False)
        client = {
            "client": SERVE_DRAFT_CLIENT,
            "app_name": drafter_app,
            "deployment_name": DRAFTER_DEPLOYMENT,
        }
        engine = v.vllm_engine_kwargs()
        kwargs = verifier_kwargs(
            v.model,
            SpeculativeConfig.model_validate(speculative_config).for_vllm(),
            client,
            tensor_parallel_size=v.tensor_parallel_size,
            max_model_len=v.max_model_len,
            max_num_seqs=v.max_num_seqs,
            served_model_name=v.name,
            owner_pid=os.getpid(),  # the engine processes end with this replica
            ray_address=ray.get_runtime_context().gcs_address,  # the engine's driver joins this cluster
            **engine,
        )
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        self.state = State()
        tasks = await self.engine.get_supported_tasks()
        await init_app_state(self.engine, self.state, vllm_cli_args(v.model, v.name), tasks)

    async def _run(self, coro) -> AsyncGenerator[VerifierReply, None]:
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.exceptions import VLLMClientError

        try:
            result = await coro
        except (VLLMClientError, ValueError) as e:  # the request's fault (vLLM's validation): a 4xx
            status = 404 if type(e).__name__ == "VLLMNotFoundError" else 400
            yield VerifierReply.json(status, {"error": {"message": str(e), "type": "BadRequestError",
                                                        "param": getattr(e, "parameter", None), "code": status}})
            return
        if isinstance(result, ErrorResponse):
            yield VerifierReply.json(result.error.code, result.model_dump())
        elif hasattr(result, "model_dump"):
            yield VerifierReply.json(200, result.model_dump(exclude_none=True))
        else:
            async for chunk in result:
                yield VerifierReply.sse(chunk)

    async def completions(self, request) -> AsyncGenerator[VerifierReply, None]:
        async for item in self._run(self.state.openai_serving_completion.create_completion(request)):
            yield item

    async def chat(self, request) -> AsyncGenerator[VerifierReply, None]:
        async for item in self._run(self.state.openai_serving_chat.create_chat_completion(request)):
            yield item

    async def models(self) -> dict[str, Any]:
        return (await self.state.openai_serving_models.show_available_models()).model_dump()

    async def metrics(self) -> str:
        """Prometheus text of this replica: vLLM's metrics (``vllm:spec_decode_*`` among them), then the drafter
        pool's as this verifier sees it (``eagle_cluster_*``)."""
        from prometheus_client import REGISTRY, generate_latest

        counters = ProposerStats.of_driver(await self.engine.collective_rpc("eagle_cluster_counters"))
        return generate_latest(REGISTRY).decode() + counters.prometheus()

    async def spec_stats(self) -> ProposerStats:
        """The proposer's counters: drafter failures, steps, per-request acceptance (vLLM's names), and the draft
        client's (re-homed sequences, sequences per drafter replica, failure / re-home events)."""
        from ray import serve

        stats = ProposerStats.of_driver(await self.engine.collective_rpc("eagle_cluster_stats"))
        stats.replica = serve.get_replica_context().replica_id.unique_id
        return stats

    async def step_timings(self, reset: bool = False) -> dict[str, list]:
        """Per-step timings since the last reset, for benchmarks: the proposer's (``timings``: how long each
        propose took and waited on drafters, and whether it was all hits) and the worker's (``forward_ms``: the
        target forward, ``sample_ms``: rejection sampling and propose, ``period_ms``: step start to step start). On CUDA
        they run until the device finished the call's work (``actors.timing``), as on a CPU."""
        rpc = await self.engine.collective_rpc("eagle_cluster_stats")
        driver = next(r for r in rpc if r["is_driver"])
        if reset:
            await self.engine.collective_rpc("eagle_cluster_reset_stats")
        return {k: driver[k] for k in ("timings", "forward_ms", "sample_ms", "period_ms")}

    async def check_health(self) -> None:
        await self.engine.check_health()
        if self.engine.errored:
            raise RuntimeError("vLLM engine errored")
