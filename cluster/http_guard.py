"""The ingress's HTTP gate: an ASGI middleware in front of every route (``Ingress.__serve_build_asgi_app__``).

It answers, before any route runs, a request that must not get through:

    401  no or a wrong ``Authorization: Bearer <api_key>`` (``cluster.api_key``), on every path but the open ones
         (``/health``; ``/metrics`` unless ``ingress.metrics_require_api_key``)

Pure ASGI (as vLLM's ``AuthenticationMiddleware``), so streamed responses pass through untouched.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from cluster.api_key import ApiKey

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 413: "RequestTooLarge",
            503: "ServiceUnavailable"}
    return {"error": {"message": message, "type": kind.get(status, "Error"), "param": param, "code": status}}


async def send_error(send: Send, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps(error_body(status, message)).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class HttpGuard:
    def __init__(self, app: ASGIApp, api_key: ApiKey, open_paths: frozenset[str] = frozenset({"/health"})) -> None:
        self.app, self.api_key, self.open_paths = app, api_key, open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan events
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
        if path not in self.open_paths and not self.api_key.accepts(header(scope, b"authorization")):
            await send_error(send, 401, "missing or wrong API key", {"www-authenticate": "Bearer"})
            return
        await self.app(scope, receive, send)
