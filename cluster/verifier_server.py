"""The verifier deployment, which is also the application's ingress: OpenAI-compatible HTTP, gRPC
(``deploy/eagle_cluster.proto``) and Python handle calls, answered in the process that holds vLLM's engine, as
vLLM's own API server answers them (and as Ray Serve LLM's direct streaming makes its ``LLMServer`` the ingress).

    client ──HTTP──► Serve's proxy ──► VerifierServer (this replica) ──in-process──► VerifierEngine (AsyncLLM)
           ──gRPC──► Serve's gRPC proxy ──┘        ▲ handle: serve.get_app_handle("eagle-cluster").generate...

    GET  /health               200 when the engine is alive, 503 otherwise (drafters are an optimisation: their
                               absence is not a failure)
    GET  /v1/models, /version
    POST /v1/completions       (stream: true -> SSE)
    POST /v1/chat/completions  (chat template from the tokenizer; image_url parts checked by ``cluster.images``)
    POST /tokenize, /detokenize   vLLM's own answers
    GET  /metrics              Prometheus text: vLLM's metrics (vllm:spec_decode_* included), then eagle_cluster_*
    GET  /openapi.json, /docs, /redoc   FastAPI's; with an API key, /docs and /redoc are off (a browser page
                               cannot send the key) and /openapi.json needs the key

A request is parsed into vLLM's own protocol models (``cluster.openai_requests``: a bad one is a 4xx with the
reason and never reaches the engine) and handed to the engine without a hop; a stream's events go out as vLLM
yields them. Serve builds the HTTP app per replica, after ``__init__`` (``serve.ingress()`` with no app, then
``__serve_build_asgi_app__``), so that it follows the config: ``cluster.http_guard.HttpGuard`` in front of every
route checks the API key (``/health`` is open, ``/metrics`` too unless ``ingress.metrics_require_api_key``), the
body size (413) and the generation requests in flight (503 with ``Retry-After``; gRPC shares the count and answers
``UNAVAILABLE``). Errors map to statuses and gRPC codes in one place, ``cluster.errors``.

The replica reports ready (``/v1/models`` answers, ``serve status`` RUNNING) only after ``VerifierEngine.warm_up``:
the first user request costs what the tenth does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from actors.metrics import ProposerStats
from cluster.admission import InflightLimit
from cluster.api_key import ApiKey
from cluster.config import EagleClusterConfig, IngressConfig
from cluster.errors import (
    BadRequest,
    GrpcAbort,
    VerifierError,
    error_body,
    error_message,
    error_status,
    grpc_code,
    stream_error,
)
from cluster.openai_requests import (
    DEFAULT_MAX_TOKENS,
    check_images,
    completion_request,
    parse_request,
    parse_tokenize,
)
from cluster.verifier_reply import ReplyKind, VerifierReply

logger = logging.getLogger(__name__)
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status)


class VerifierServer:
    async def __init__(self, config: EagleClusterConfig) -> None:
        """``config``: the application's validated ``args``. Starts the engine and warms it up."""
        from cluster.verifier_engine import VerifierEngine

        engine = VerifierEngine(config.verifier, config.speculative_config, config.drafter_app)
        await engine.start()
        await engine.warm_up(drafters_expected=lambda: _app_deployed(config.drafter_app))
        self._serve(engine, config.ingress_for_verifier(), config.verifier.name)

    @classmethod
    def with_engine(cls, engine: Any, ingress: IngressConfig, model_name: str) -> VerifierServer:
        """A server in front of ``engine`` (anything with ``VerifierEngine``'s methods): tests, fakes."""
        server = cls.__new__(cls)
        server._serve(engine, ingress, model_name)
        return server

    def _serve(self, engine: Any, ingress: IngressConfig, model_name: str) -> None:
        self.engine = engine
        self.config = ingress
        self.model_name = model_name
        self.api_key = ApiKey(ingress.api_key)
        self.inflight = InflightLimit(ingress.max_inflight_requests, ingress.retry_after_s)

    # --- requests, as every surface builds them -------------------------------------------------------------------
    def _openai_request(self, raw: bytes, chat: bool) -> Any:
        """A generation request, or ``BadRequest``: parsed, ``n`` and images checked, the model name ours."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest

        req = parse_request(raw, ChatCompletionRequest if chat else CompletionRequest, self.config.max_n)
        if chat:
            check_images(req, self.config.max_images_per_request, self.config.allow_remote_images)
        if req.model not in (None, self.model_name):
            raise BadRequest(404, f"model {req.model!r} is not served here (served: {self.model_name!r})", "model")
        return req

    async def _generate(self, req: Any, chat: bool) -> VerifierReply:
        return await (self.engine.chat(req) if chat else self.engine.completions(req))

    # --- HTTP -----------------------------------------------------------------------------------------------------
    def __serve_build_asgi_app__(self) -> FastAPI:
        """The HTTP app for this replica's config; Serve calls it once, after ``__init__``."""
        from cluster.http_guard import HttpGuard

        keyed = self.api_key.required
        app = FastAPI(title="Eagle Cluster", description="Llama 4 with disaggregated EAGLE speculative decoding",
                      docs_url=None if keyed else "/docs", redoc_url=None if keyed else "/redoc")
        app.add_api_route("/v1/completions", self.http_completions, methods=["POST"])
        app.add_api_route("/v1/chat/completions", self.http_chat, methods=["POST"])
        app.add_api_route("/tokenize", self.http_tokenize, methods=["POST"])
        app.add_api_route("/detokenize", self.http_detokenize, methods=["POST"])
        app.add_api_route("/v1/models", self.http_models, methods=["GET"])
        app.add_api_route("/version", self.http_version, methods=["GET"])
        app.add_api_route("/health", self.http_health, methods=["GET"])
        app.add_api_route("/metrics", self.http_metrics, methods=["GET"])
        open_paths = {"/health"} if self.config.metrics_require_api_key else {"/health", "/metrics"}
        app.add_middleware(HttpGuard, api_key=self.api_key, open_paths=frozenset(open_paths),
                           max_body_bytes=self.config.max_body_bytes, inflight=self.inflight,
                           limited_paths=GENERATION_PATHS)
        return app

    @staticmethod
    def _response(reply: VerifierReply) -> Response:
        if reply.kind is ReplyKind.JSON:
            return JSONResponse(reply.body, status_code=reply.status)
        return StreamingResponse(_events_or_error(reply.events), media_type="text/event-stream")

    async def _http(self, request: Request, chat: bool) -> Response:
        try:
            req = self._openai_request(await request.body(), chat)
            return self._response(await self._generate(req, chat))
        except Exception as e:  # BadRequest (4xx), the engine gone (503), or a bug (500)
            return _error(*error_status(e), getattr(e, "param", None))

    async def http_completions(self, request: Request) -> Response:
        return await self._http(request, chat=False)

    async def http_chat(self, request: Request) -> Response:
        return await self._http(request, chat=True)

    async def _http_tokenization(self, request: Request, detokenize: bool) -> Response:
        try:
            req = parse_tokenize(await request.body(), detokenize)
            call = self.engine.detokenize if detokenize else self.engine.tokenize
            return self._response(await call(req))
        except Exception as e:
            return _error(*error_status(e), getattr(e, "param", None))

    async def http_tokenize(self, request: Request) -> Response:
        return await self._http_tokenization(request, detokenize=False)

    async def http_detokenize(self, request: Request) -> Response:
        return await self._http_tokenization(request, detokenize=True)

    async def http_models(self) -> Response:
        try:
            return JSONResponse(await self.engine.models())
        except Exception as e:
            return _error(*error_status(e))

    async def http_version(self) -> Response:
        from vllm import __version__

        return JSONResponse({"version": __version__})

    async def http_health(self) -> Response:
        """200, or 503 with a reason that names no internals (``/health`` is open)."""
        try:
            await self.engine.check_health()
        except Exception as e:
            status, message = error_status(e)
            logger.warning("health check failed: %s", e)
            reason = message if status == 503 else "verifier unhealthy"
            return JSONResponse({"status": "unhealthy", "reason": reason}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def http_metrics(self) -> Response:
        try:
            text = await self.engine.metrics()
        except Exception as e:
            return _error(*error_status(e))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    # --- Python handle calls --------------------------------------------------------------------------------------
    async def generate(self, prompt: str, **sampling: Any) -> dict[str, Any]:
        """``serve.get_app_handle(app).generate.remote("def f(", max_tokens=16)`` -> an OpenAI completion dict."""
        return _whole(await self.engine.completions(completion_request(prompt, sampling, stream=False)))

    async def chat(self, messages: list[dict[str, Any]], **sampling: Any) -> dict[str, Any]:
        """``handle.chat.remote([{"role": "user", "content": [{"type": "image_url", "image_url": {"url":
        cluster.images.data_url(img)}}, {"type": "text", "text": "..."}]}], max_tokens=16)`` -> an OpenAI chat
        completion dict. Validated as an HTTP body would be (``BadRequest`` with the reason)."""
        raw = json.dumps({"messages": messages, **sampling, "stream": False}).encode()
        return _whole(await self.engine.chat(self._openai_request(raw, chat=True)))

    async def _stream(self, prompt: str, sampling: dict[str, Any]) -> AsyncGenerator[tuple[str, str], None]:
        """(new text, finish reason or "") for each streamed chunk."""
        reply = await self.engine.completions(completion_request(prompt, sampling, stream=True))
        if reply.kind is ReplyKind.JSON:
            raise VerifierError(reply.status, error_message(reply.body))
        async for event in reply.events:
            for line in event.splitlines():
                if (err := stream_error(line)) is not None:
                    raise err
                if line.startswith("data: ") and line != "data: [DONE]":
                    choices = json.loads(line[len("data: ") :]).get("choices")
                    if choices:
                        yield choices[0].get("text") or "", choices[0].get("finish_reason") or ""

    async def generate_stream(self, prompt: str, **sampling: Any) -> AsyncGenerator[str, None]:
        """``handle.options(stream=True).generate_stream.remote(prompt, ...)``: yields the new text pieces."""
        async for text, _ in self._stream(prompt, sampling):
            if text:
                yield text

    async def models(self) -> dict[str, Any]:
        return await self.engine.models()

    async def metrics(self) -> str:
        return await self.engine.metrics()

    async def spec_stats(self) -> ProposerStats:
        """The proposer's counters: drafter failures, steps, per-request acceptance (vLLM's names), and the draft
        client's (re-homed sequences, sequences per drafter replica, failure / re-home events)."""
        from ray import serve

        stats = ProposerStats.from_dict(await self.engine.stats_rpc())
        stats.replica = serve.get_replica_context().replica_id.unique_id
        return stats

    async def step_timings(self, reset: bool = False) -> dict[str, list]:
        """Per-step timings since the last reset, for benchmarks: the proposer's (``timings``: how long each
        propose took and waited on drafters, and whether it was all hits) and the worker's (``forward_ms``: the
        target forward, ``sample_ms``: rejection sampling and propose, ``period_ms``: step start to step start), and
        the periods the draft-length policy timed (``draft_length_periods``: batch size, k, ms; ``auto`` only). On
        CUDA they run until the device finished the call's work (``actors.timing``), as on a CPU."""
        driver = await self.engine.stats_rpc()
        if reset:
            await self.engine.reset_stats()
        return {k: driver[k] for k in ("timings", "forward_ms", "sample_ms", "period_ms", "draft_length_periods")}

    async def check_health(self) -> None:
        """Serve's health check of this replica: the engine's."""
        await self.engine.check_health()

    # --- gRPC (method names are the RPC names) --------------------------------------------------------------------
    def _grpc_request(self, request, grpc_context) -> dict[str, Any]:
        """The sampling arguments of a gRPC request, or ``BadRequest`` (501: gRPC off, 401: the key, 400)."""
        if not self.config.grpc.enabled:  # Serve's gRPC proxy is up for another app, or grpc_options went unnoticed
            raise BadRequest(501, "gRPC is not enabled for this application (ingress.grpc.enabled)")
        if not self.api_key.accepts(dict(grpc_context.invocation_metadata()).get("authorization")):
            raise BadRequest(401, "missing or wrong API key")
        sampling: dict[str, Any] = {"max_tokens": request.max_tokens or DEFAULT_MAX_TOKENS,
                                    "temperature": request.temperature}
        if request.top_p:
            sampling["top_p"] = request.top_p
        if request.HasField("seed"):
            sampling["seed"] = request.seed
        if request.stop:
            sampling["stop"] = list(request.stop)
        if not request.prompt:
            raise BadRequest(400, "prompt: must not be empty", "prompt")
        return sampling

    @staticmethod
    def _grpc_fail(grpc_context, e: Exception) -> GrpcAbort:
        """Sets the code and details for ``e`` on the context; the ``GrpcAbort`` a streaming call raises."""
        status, message = error_status(e)
        code = grpc_code(status)
        grpc_context.set_code(code)
        grpc_context.set_details(message)
        return GrpcAbort(code, message)

    async def Generate(self, request, grpc_context):  # noqa: N802 - the RPC's name
        from cluster.proto import eagle_cluster_pb2 as pb

        try:
            sampling = self._grpc_request(request, grpc_context)
            with self.inflight.admit():
                out = await self.generate(request.prompt, **sampling)
        except Exception as e:  # the code set on the context travels with the (empty) reply
            self._grpc_fail(grpc_context, e)
            return pb.GenerateReply()
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        return pb.GenerateReply(
            text=choice["text"], finish_reason=choice.get("finish_reason") or "",
            prompt_tokens=usage.get("prompt_tokens", 0), completion_tokens=usage.get("completion_tokens", 0),
        )

    async def GenerateStream(self, request, grpc_context):  # noqa: N802 - the RPC's name
        """Yields the new text; a failure, before the first piece or after some, sets the code on the context
        and raises ``GrpcAbort`` so that the call ends with that code (see ``cluster.errors``)."""
        from cluster.proto import eagle_cluster_pb2 as pb

        try:
            sampling = self._grpc_request(request, grpc_context)
            with self.inflight.admit():
                async for text, finish in self._stream(request.prompt, sampling):
                    if text or finish:
                        yield pb.GenerateReply(text=text, finish_reason=finish)
        except Exception as e:
            raise self._grpc_fail(grpc_context, e) from None


def _app_deployed(name: str) -> bool:
    """Whether Serve has the application ``name`` (deploying or running): drafters may still attach from it."""
    from ray import serve

    try:
        return name in serve.status().applications
    except Exception:  # the controller could not be asked: assume it may come
        return True


def _whole(reply: VerifierReply) -> dict[str, Any]:
    """The body of a non-streaming reply, or ``VerifierError``."""
    if reply.status != 200 or reply.kind is not ReplyKind.JSON:
        raise VerifierError(reply.status, error_message(reply.body))
    return reply.body


async def _events_or_error(events: AsyncIterator[str]) -> AsyncGenerator[str, None]:
    """vLLM's events as they come; if the engine fails mid-stream, an error event and ``[DONE]`` at once."""
    try:
        async for event in events:
            yield event
    except Exception as e:
        yield f"data: {json.dumps(error_body(*error_status(e)))}\n\n"
        yield "data: [DONE]\n\n"
