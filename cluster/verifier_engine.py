"""``VerifierEngine``: vLLM's ``AsyncLLM`` for the target, with drafting delegated to the drafter pool, and vLLM's
own OpenAI serving objects (completions, chat, models, tokenization) on top of it, in the verifier replica's
process (``cluster.verifier_server`` serves it over HTTP, gRPC and the handle).

vLLM's engine core and its worker run in their own process (``AsyncLLM``'s default); the worker's proposer
(``actors.verifier.vllm_adapter``) drafts through the speculator that talks to the drafter actors. Everything here
is what vLLM's own API server does between its routes and the engine, called in-process: a request goes from parsing to
``AsyncLLM`` without a hop, and a stream's events come back as vLLM's serving code yields them.

``warm_up`` runs before the replica reports ready: a few short generations, until the speculator has attached
to a drafter and drafted a step (or a deadline passes: no drafter application, the verifier then serves without
drafts), so the first user request costs what the tenth does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from actors.metrics import ProposerStats
from cluster.config import DRAFTER_DEPLOYMENT, SpeculativeConfig, VerifierConfig
from cluster.drafter_pool.finder import SERVE_FINDER
from cluster.verifier_reply import VerifierReply

logger = logging.getLogger(__name__)
WARM_UP_DEADLINE_S = 60.0  # how long the replica waits for a drafter before it reports ready without one
WARM_UP_PROMPT = "def main():\n    "


def vllm_cli_args(model: str, served_model_name: str) -> Any:
    """The ``vllm serve`` argument namespace vLLM's serving objects read (defaults, plus the model names)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    return parser.parse_args(["--model", model, "--served-model-name", served_model_name])


class VerifierEngine:
    def __init__(self, verifier: VerifierConfig, speculative_config: SpeculativeConfig, drafter_app: str) -> None:
        """Starts the engine (its processes start here; ``start`` finishes the set-up). ``drafter_app``: the
        drafter application's name; the speculator in vLLM's engine process opens a handle to its drafter
        deployment there (the draft-call timeout comes from the drafters, through ``attach``)."""
        import ray
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from actors.verifier.engine import verifier_kwargs
        from actors.vllm_engine import keep_async_scheduling, set_engine_env, worker_in_engine_core

        v = verifier
        # Before the engine exists: the model runner (actors.vllm_engine.choose_model_runner), vLLM-CPU's settings.
        set_engine_env(v.tensor_parallel_size, in_process=False)
        client = {"finder": SERVE_FINDER, "app_name": drafter_app, "deployment_name": DRAFTER_DEPLOYMENT,
                  "hidden_transport": v.hidden_transport}
        kwargs = verifier_kwargs(
            v.model,
            speculative_config.for_vllm(),
            client,
            tensor_parallel_size=v.tensor_parallel_size,
            max_model_len=v.max_model_len,
            max_num_seqs=v.max_num_seqs,
            served_model_name=v.name,
            owner_pid=os.getpid(),  # the engine processes end with this replica
            ray_address=ray.get_runtime_context().gcs_address,  # the engine's driver joins this cluster
            **v.vllm_engine_kwargs(),
        )
        self.model, self.name = v.model, v.name
        with keep_async_scheduling(kwargs):
            self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**worker_in_engine_core(kwargs)))
        self.state: Any = None

    async def start(self) -> None:
        """vLLM's serving objects, as its API server builds them (``init_app_state``)."""
        from starlette.datastructures import State
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state

        self.state = State()
        tasks = await self.engine.get_supported_tasks()
        await init_app_state(self.engine, self.state, vllm_cli_args(self.model, self.name), tasks)

    # --- OpenAI ---------------------------------------------------------------------------------------------------
    @staticmethod
    async def _reply(coro) -> VerifierReply:
        """vLLM's answer (a response, an ``ErrorResponse``, or an async generator of SSE events) as a reply."""
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.exceptions import VLLMClientError

        try:
            result = await coro
        except (VLLMClientError, ValueError) as e:  # the request's fault (vLLM's validation): a 4xx
            status = 404 if type(e).__name__ == "VLLMNotFoundError" else 400
            return VerifierReply.json(status, {"error": {"message": str(e), "type": "BadRequestError",
                                                         "param": getattr(e, "parameter", None), "code": status}})
        if isinstance(result, ErrorResponse):
            return VerifierReply.json(result.error.code, result.model_dump())
        if hasattr(result, "model_dump"):
            return VerifierReply.json(200, result.model_dump(exclude_none=True))
        return VerifierReply.stream(result)

    async def completions(self, request: Any) -> VerifierReply:
        return await self._reply(self.state.openai_serving_completion.create_completion(request))

    async def chat(self, request: Any) -> VerifierReply:
        return await self._reply(self.state.openai_serving_chat.create_chat_completion(request))

    async def tokenize(self, request: Any) -> VerifierReply:
        return await self._reply(self.state.serving_tokenization.create_tokenize(request, None))

    async def detokenize(self, request: Any) -> VerifierReply:
        return await self._reply(self.state.serving_tokenization.create_detokenize(request, None))

    async def models(self) -> dict[str, Any]:
        return (await self.state.openai_serving_models.show_available_models()).model_dump()

    # --- health, metrics, stats -----------------------------------------------------------------------------------
    async def check_health(self) -> None:
        await self.engine.check_health()
        if self.engine.errored:
            raise RuntimeError("vLLM engine errored")

    async def counters(self) -> ProposerStats:
        """The proposer's counters only (what ``/metrics`` reads: its cost does not grow with the run)."""
        return ProposerStats.of_driver(await self.engine.collective_rpc("eagle_cluster_counters"))

    async def metrics(self) -> str:
        """Prometheus text: vLLM's metrics (``vllm:spec_decode_*`` among them), then the drafter pool's as this
        verifier sees it (``eagle_cluster_*``)."""
        from prometheus_client import REGISTRY, generate_latest

        return generate_latest(REGISTRY).decode() + (await self.counters()).prometheus()

    async def stats_rpc(self) -> dict[str, Any]:
        """The driver rank's ``eagle_cluster_stats`` (counters, per-request tables, per-step timings)."""
        return next(r for r in await self.engine.collective_rpc("eagle_cluster_stats") if r["is_driver"])

    async def reset_stats(self) -> None:
        await self.engine.collective_rpc("eagle_cluster_reset_stats")

    # --- warm-up --------------------------------------------------------------------------------------------------
    async def warm_up(self, deadline_s: float = WARM_UP_DEADLINE_S,
                      drafters_expected: Callable[[], bool] = lambda: True) -> bool:
        """Short greedy generations until a step was drafted by a drafter (True), or ``deadline_s`` passed, or
        ``drafters_expected()`` says no drafter is coming (the drafter application is not deployed): False. Then
        the per-step tables are cleared, so that benchmarks and stats start from the first user request."""
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest

        start = time.monotonic()
        drafted = False
        while not drafted:
            req = CompletionRequest(model=self.name, prompt=WARM_UP_PROMPT, max_tokens=8, temperature=0.0)
            reply = await self.completions(req)
            if reply.status != 200:
                raise RuntimeError(f"warm-up request failed: {reply.body}")
            counters = await self.counters()
            drafted = counters.steps > 0 and counters.client.get("drafters", 0) > 0
            if not drafted and (time.monotonic() - start > deadline_s or not drafters_expected()):
                logger.warning("no drafter attached after %.0f s: serving without drafts until one attaches",
                               time.monotonic() - start)
                break
            if not drafted:
                await asyncio.sleep(0.5)
        await self.reset_stats()
        logger.info("warm-up done in %.1f s (drafting: %s)", time.monotonic() - start, drafted)
        return drafted
