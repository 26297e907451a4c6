"""Errors as the verifier replica answers them: one mapping from what went wrong to an HTTP status, a gRPC code
and an OpenAI error body, shared by the HTTP routes, the gRPC methods and the Python handle API
(``cluster.verifier_server``).

    the request's fault              ``BadRequest`` (4xx, naming the field) or an error vLLM answered (its status)
    the engine is gone               vLLM's ``EngineDeadError``, or a Ray actor / Serve error: 503 "verifier
                                     unavailable: <type>"
    anything else                    a bug: 500 with a generic message, logged here with its traceback

On gRPC the HTTP status maps through ``grpc_code`` (400/401/404/429/503 -> INVALID_ARGUMENT / UNAUTHENTICATED /
NOT_FOUND / RESOURCE_EXHAUSTED / UNAVAILABLE), an error event inside a stream included. A unary call ends with
the code set on its context and an empty reply; a streaming call sets it and raises ``GrpcAbort``: Serve's gRPC
proxy carries a streaming context's code only with a yielded message, so a stream that yields nothing would end
OK; a raised exception with a code on the context becomes Serve's ``gRPCStatusError`` and the call ends with that
code and details.
"""

from __future__ import annotations

import json
import logging
from typing import Any

logger = logging.getLogger(__name__)

# HTTP status -> gRPC status code name; other 4xx are INVALID_ARGUMENT, other 5xx INTERNAL.
GRPC_CODES: dict[int, str] = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    413: "RESOURCE_EXHAUSTED", 429: "RESOURCE_EXHAUSTED", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE",
}
INTERNAL_MESSAGE = "internal error (logged at the verifier)"
ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 413: "RequestTooLarge",
               500: "InternalServerError", 503: "ServiceUnavailable"}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "Error"), "param": param, "code": status}}


class BadRequest(Exception):
    """A request refused before it reaches the engine: its HTTP status, the reason, the field it names."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def __reduce__(self) -> tuple[type, tuple[int, str, str | None]]:
        # a handle call's error travels pickled from the replica to the caller (Exception's own reduce would call
        # BadRequest(message) there and fail, so the caller would not get the reason)
        return BadRequest, (self.status, self.message, self.param)


class VerifierError(ValueError):
    """The engine answered an error (a whole JSON answer, or an error event inside a stream): its HTTP status and
    message. A ``ValueError`` for the Python handle API, which raised one before."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message

    def __reduce__(self) -> tuple[type, tuple[int, str]]:
        return VerifierError, (self.status, self.message)  # pickled to a handle's caller (see ``BadRequest``)


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


def unavailable_errors() -> tuple[type[BaseException], ...]:
    """What a call raises when the engine cannot answer: vLLM's engine core died, or (a call through Ray) its
    actor died or is unavailable, Serve has no replica for it or refuses more requests. Anything else is a bug."""
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
    from vllm.v1.engine.exceptions import EngineDeadError

    return (EngineDeadError, RayActorError, BackPressureError, DeploymentUnavailableError)


def error_status(e: BaseException) -> tuple[int, str]:
    """(HTTP status, message for the client) for an exception; a bug is logged with its traceback and answered
    500 with a generic message."""
    if isinstance(e, BadRequest | VerifierError):
        return e.status, e.message
    from cluster.admission import Overloaded

    if isinstance(e, Overloaded):
        return 503, str(e)
    if isinstance(e, unavailable_errors()):
        logger.warning("verifier unavailable: %s", e)
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


def error_message(body: Any) -> str:
    """The message of an OpenAI error body (``{"error": {"message": ...}}``), or a generic one."""
    err = body.get("error") if isinstance(body, dict) else None
    return str(err.get("message")) if isinstance(err, dict) and err.get("message") else INTERNAL_MESSAGE
