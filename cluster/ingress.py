"""The ingress deployment: OpenAI-compatible HTTP, gRPC (``deploy/eagle_cluster.proto``) and Python handle calls.

It validates every request into vLLM's own protocol models (``CompletionRequest``, ``ChatCompletionRequest``),
so a bad request is answered here with a 4xx and a reason and never reaches the engine; then it forwards the
typed request to the verifier deployment (whose handle it is given) and relays the answer, as JSON or as
server-sent events. Client bytes are only ever parsed as JSON or protobuf, never unpickled.

    GET  /health               200 when the verifier's engine is alive, 503 otherwise
    GET  /v1/models
    POST /v1/completions       (stream: true -> SSE)
    POST /v1/chat/completions  (chat template from the tokenizer)
    GET  /metrics              Prometheus text: vLLM's metrics, vllm:spec_decode_* included
    GET  /openapi.json, /docs, /redoc   FastAPI's; with an API key, /docs and /redoc are off (a browser page
                               cannot send the key) and /openapi.json needs the key

Serve builds the HTTP app per replica, after ``__init__`` (``serve.ingress()`` with no app, then
``__serve_build_asgi_app__``), so that it follows the config: ``cluster.http_guard.HttpGuard`` in front of every
route checks the API key (``/health`` is open, ``/metrics`` too unless ``ingress.metrics_require_api_key``), the
body size (413) and the generation requests in flight (503 with ``Retry-After``; gRPC shares the count and answers
``UNAVAILABLE``); ``n`` over ``ingress.max_n`` is a 400.

Errors say what happened, without internals. On HTTP, a verifier that cannot be reached (its replica died, is
restarting, or Serve refuses more requests: ``UNREACHABLE``) is a 503; any other failure is a bug here or in the
verifier, a 500 with a generic message, logged with its traceback. On gRPC, the verifier's HTTP status is mapped
by ``grpc_code`` (400/401/404/429/503 -> INVALID_ARGUMENT / UNAUTHENTICATED / NOT_FOUND / RESOURCE_EXHAUSTED /
UNAVAILABLE), an error event inside a stream included. A unary call ends with the code set on its context and an
empty reply; a streaming call sets it and raises ``GrpcAbort``: Serve's gRPC proxy carries a streaming context's
code only with a yielded message, so a stream that yields nothing would end OK; a raised exception with a code on
the context becomes Serve's ``gRPCStatusError`` and the call ends with that code and details.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError

from cluster.admission import InflightLimit, Overloaded
from cluster.api_key import ApiKey
from cluster.http_guard import HttpGuard, error_body
from cluster.verifier_reply import ReplyKind

logger = logging.getLogger(__name__)

# HTTP status -> gRPC status code name; other 4xx are INVALID_ARGUMENT, other 5xx INTERNAL.
GRPC_CODES: dict[int, str] = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    413: "RESOURCE_EXHAUSTED", 429: "RESOURCE_EXHAUSTED", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE",
}
INTERNAL_MESSAGE = "internal error (logged at the ingress)"

# Fields vLLM accepts but that this deployment does not serve (they would be silently ignored or need
# features not enabled here): refused with 400 rather than dropped.
# min_p and logit_bias do not work with vLLM's speculative decoding (vLLM says so at start-up).
DEFAULT_MAX_TOKENS = 16  # a gRPC request's max_tokens 0 (the proto's default): OpenAI's and vLLM's default
UNSUPPORTED = {"suffix", "kv_transfer_params", "vllm_xargs", "cache_salt", "min_p", "logit_bias"}


class BadRequest(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


class VerifierError(ValueError):
    """The verifier answered an error (a whole JSON answer, or an error event inside a stream): its HTTP status
    and message. A ``ValueError`` for the Python handle API, which raised one before."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class GrpcAbort(Exception):
    """Raised by a streaming gRPC method after setting the code and details on its context (see the module
    docstring): ``code`` and ``details`` are the same."""

    def __init__(self, code: Any, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details

    def __reduce__(self) -> tuple[type, tuple[Any, str]]:
        # Serve pickles it (inside its gRPCStatusError) from the replica to the proxy; Exception's own reduce
        # would call GrpcAbort(details) there and fail ("Failed to deserialize", ending the call INTERNAL).
        return GrpcAbort, (self.code, self.details)


def grpc_code(status: int) -> Any:
    """The ``grpc.StatusCode`` for an HTTP status."""
    import grpc

    name = GRPC_CODES.get(status, "INVALID_ARGUMENT" if 400 <= status < 500 else "INTERNAL")
    return getattr(grpc.StatusCode, name)


def unreachable_errors() -> tuple[type[BaseException], ...]:
    """What a handle call raises when the verifier cannot answer: its actor died or is unavailable (restarting,
    a network split), Serve has no replica for it or refuses more requests. Anything else is a bug."""
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

    return (RayActorError, BackPressureError, DeploymentUnavailableError)


def error_status(e: BaseException) -> tuple[int, str]:
    """(HTTP status, message for the client) for an exception from a verifier call; a bug is logged with its
    traceback and answered 500 with a generic message."""
    if isinstance(e, VerifierError):
        return e.status, e.message
    if isinstance(e, unreachable_errors()):
        logger.warning("verifier unreachable: %s", e)
        return 503, f"verifier unavailable: {type(e).__name__}"
    logger.error("request failed", exc_info=e)
    return 500, INTERNAL_MESSAGE


def stream_error(line: str) -> VerifierError | None:
    """The error carried by one SSE line (``data: {"error": {...}}``, vLLM's streaming error), or None."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None
    try:
        event = json.loads(line[len("data: ") :])
    except json.JSONDecodeError:
        return VerifierError(500, INTERNAL_MESSAGE)
    err = event.get("error") if isinstance(event, dict) else None
    if not isinstance(err, dict):
        return None
    code = err.get("code")
    status = code if isinstance(code, int) and 400 <= code < 600 else 500
    return VerifierError(status, str(err.get("message") or "error"))


def _error_message(body: Any) -> str:
    """The message of an OpenAI error body (``{"error": {"message": ...}}``), or a generic one."""
    err = body.get("error") if isinstance(body, dict) else None
    return str(err.get("message")) if isinstance(err, dict) and err.get("message") else INTERNAL_MESSAGE


def parse_request(raw: bytes, model_cls: type, max_n: int | None = None) -> Any:
    """JSON bytes -> a vLLM protocol object, or ``BadRequest`` naming the field and the reason (``n`` over
    ``max_n`` included)."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(400, f"malformed JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "the request body must be a JSON object")
    known = set(model_cls.model_fields)
    for key in body:
        if key not in known:
            raise BadRequest(400, f"unknown field {key!r}", key)
        if key in UNSUPPORTED and body[key] not in (None, False, 0, 0.0, {}):
            raise BadRequest(400, f"field {key!r} is not supported by this deployment", key)
    n = body.get("n")
    if max_n is not None and isinstance(n, int) and not isinstance(n, bool) and n > max_n:
        raise BadRequest(400, f"n: at most {max_n} completions per request here, got {n}", "n")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise BadRequest(400, f"max_tokens must be a positive integer, got {max_tokens!r}", "max_tokens")
    try:
        return model_cls.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        raise BadRequest(400, f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")), loc or None) from None
    except Exception as e:  # vLLM's own validators raise VLLMValidationError, which pydantic does not wrap
        raise BadRequest(400, str(e), getattr(e, "parameter", None)) from None


def completion_request(prompt: str, sampling: dict[str, Any], stream: bool) -> Any:
    """A handle or gRPC call's arguments, validated exactly as an HTTP body would be."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    return parse_request(json.dumps({"prompt": prompt, **sampling, "stream": stream}).encode(), CompletionRequest)


class Ingress:
    def __init__(self, verifier, ingress: dict[str, Any], model_name: str) -> None:
        """``ingress``: the config's ``ingress`` section; ``model_name``: the served model's name."""
        from cluster.config import IngressConfig

        self.verifier = verifier
        self.config = IngressConfig.model_validate(ingress)
        self.api_key = ApiKey(self.config.api_key)
        self.grpc_enabled = self.config.grpc.enabled
        self.inflight = InflightLimit(self.config.max_inflight_requests, self.config.retry_after_s)
        self.model_name = model_name

    # --- HTTP ------------------------------------------------------------------------------------------------
    def __serve_build_asgi_app__(self) -> FastAPI:
        """The HTTP app for this replica's config; Serve calls it once, after ``__init__``."""
        keyed = self.api_key.required
        app = FastAPI(title="Eagle Cluster", description="Llama 4 with disaggregated EAGLE speculative decoding",
                      docs_url=None if keyed else "/docs", redoc_url=None if keyed else "/redoc")
        app.add_api_route("/v1/completions", self.http_completions, methods=["POST"])
        app.add_api_route("/v1/chat/completions", self.http_chat, methods=["POST"])
        app.add_api_route("/v1/models", self.http_models, methods=["GET"])
        app.add_api_route("/health", self.http_health, methods=["GET"])
        app.add_api_route("/metrics", self.http_metrics, methods=["GET"])
        open_paths = {"/health"} if self.config.metrics_require_api_key else {"/health", "/metrics"}
        app.add_middleware(HttpGuard, api_key=self.api_key, open_paths=frozenset(open_paths),
                           max_body_bytes=self.config.max_body_bytes, inflight=self.inflight,
                           limited_paths=frozenset({"/v1/completions", "/v1/chat/completions"}))
        return app

    async def _relay(self, gen) -> Response:
        first = None
        async for reply in gen:
            first = reply
            break
        if first is None:
            return JSONResponse(error_body(500, "empty response from the verifier"), status_code=500)
        if first.kind is ReplyKind.JSON:
            return JSONResponse(first.body, status_code=first.status)

        async def events() -> AsyncGenerator[str, None]:
            yield first.event
            try:
                async for reply in gen:
                    yield reply.event
            except Exception as e:  # the verifier died or failed mid-stream: an error event, at once
                status, message = error_status(e)
                yield f"data: {json.dumps(error_body(status, message))}\n\n"
                yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    def _check_images(self, req: Any) -> None:
        """Image parts of a chat request (``cluster.images``), or ``BadRequest`` (400) naming the bad one."""
        from cluster.images import ImageError, check_chat_images

        try:
            check_chat_images(getattr(req, "messages", None), self.config.max_images_per_request,
                              self.config.allow_remote_images)
        except ImageError as e:
            raise BadRequest(400, f"{e.param}: {e.message}", e.param) from None

    async def _openai(self, request: Request, model_cls: type, method: str) -> Response:
        try:
            req = parse_request(await request.body(), model_cls, self.config.max_n)
            if method == "chat":
                self._check_images(req)
        except BadRequest as e:
            return JSONResponse(error_body(e.status, e.message, e.param), status_code=e.status)
        if req.model not in (None, self.model_name):
            msg = f"model {req.model!r} is not served here (served: {self.model_name!r})"
            return JSONResponse(error_body(404, msg, "model"), status_code=404)
        gen = getattr(self.verifier.options(stream=True), method).remote(req)
        try:
            return await self._relay(gen)
        except Exception as e:  # the verifier died or is restarting (503), or a bug (500)
            status, message = error_status(e)
            return JSONResponse(error_body(status, message), status_code=status)

    async def http_completions(self, request: Request) -> Response:
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest

        return await self._openai(request, CompletionRequest, "completions")

    async def http_chat(self, request: Request) -> Response:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        return await self._openai(request, ChatCompletionRequest, "chat")

    async def http_models(self) -> Response:
        try:
            return JSONResponse(await self.verifier.models.remote())
        except Exception as e:
            status, message = error_status(e)
            return JSONResponse(error_body(status, message), status_code=status)

    async def http_health(self) -> Response:
        """200, or 503 with a reason that names no internals (``/health`` is open): the verifier is unreachable,
        or it answered that its engine is not healthy (logged here)."""
        try:
            await self.verifier.check_health.remote()
        except Exception as e:
            unreachable = isinstance(e, unreachable_errors())
            logger.warning("health check failed: %s", e)
            reason = f"verifier unavailable: {type(e).__name__}" if unreachable else "verifier unhealthy"
            return JSONResponse({"status": "unhealthy", "reason": reason}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def http_metrics(self) -> Response:
        try:
            text = await self.verifier.metrics.remote()
        except Exception as e:
            status, message = error_status(e)
            return JSONResponse(error_body(status, message), status_code=status)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    # --- Python handle calls ----------------------------------------------------------------------------------
    async def generate(self, prompt: str, **sampling: Any) -> dict[str, Any]:
        """``serve.get_app_handle(app).generate.remote("def f(", max_tokens=16)`` -> an OpenAI completion dict."""
        req = completion_request(prompt, sampling, stream=False)
        return await self._whole(self.verifier.options(stream=True).completions.remote(req))

    @staticmethod
    async def _whole(replies) -> dict[str, Any]:
        """The body of a non-streaming verifier call's one ``VerifierReply``, or ``VerifierError``."""
        async for reply in replies:
            if reply.status != 200:
                raise VerifierError(reply.status, _error_message(reply.body))
            return reply.body
        raise RuntimeError("empty response from the verifier")

    async def chat(self, messages: list[dict[str, Any]], **sampling: Any) -> dict[str, Any]:
        """``handle.chat.remote([{"role": "user", "content": [{"type": "image_url", "image_url": {"url":
        cluster.images.data_url(img)}}, {"type": "text", "text": "..."}]}], max_tokens=16)`` -> an OpenAI chat
        completion dict. Validated as an HTTP body would be (``BadRequest`` with the reason)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        req = parse_request(json.dumps({"messages": messages, **sampling, "stream": False}).encode(),
                            ChatCompletionRequest, self.config.max_n)
        self._check_images(req)
        return await self._whole(self.verifier.options(stream=True).chat.remote(req))

    async def _stream(self, prompt: str, sampling: dict[str, Any]) -> AsyncGenerator[tuple[str, str], None]:
        """(new text, finish reason or "") for each streamed chunk."""
        req = completion_request(prompt, sampling, stream=True)
        async for reply in self.verifier.options(stream=True).completions.remote(req):
            if reply.kind is ReplyKind.JSON:
                raise VerifierError(reply.status, _error_message(reply.body))
            for line in reply.event.splitlines():
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

    # --- gRPC (method names are the RPC names) ----------------------------------------------------------------
    def _grpc_request(self, request, grpc_context) -> dict[str, Any]:
        """The sampling arguments of a gRPC request, or ``BadRequest`` (501: gRPC off, 401: the key, 400)."""
        if not self.grpc_enabled:  # Serve's gRPC proxy is up for another app, or grpc_options went unnoticed
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
        if isinstance(e, BadRequest):
            status, message = e.status, e.message
        elif isinstance(e, Overloaded):
            status, message = 503, str(e)
        else:
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
        and raises ``GrpcAbort`` so that the call ends with that code (see the module docstring)."""
        from cluster.proto import eagle_cluster_pb2 as pb

        try:
            sampling = self._grpc_request(request, grpc_context)
            with self.inflight.admit():
                async for text, finish in self._stream(request.prompt, sampling):
                    if text or finish:
                        yield pb.GenerateReply(text=text, finish_reason=finish)
        except Exception as e:
            raise self._grpc_fail(grpc_context, e) from None
