"""The ingress's HTTP gate: an ASGI middleware in front of every route (``VerifierServer.__serve_build_asgi_app__``).

It answers, before any route runs, a request that must not get through, in this order:

    401  no or a wrong ``Authorization: Bearer <api_key>`` (``cluster.api_key``), on every path but the open ones
         (``/health``; ``/metrics`` unless ``ingress.metrics_require_api_key``)
    503  a generation request (``limited_paths``) while ``ingress.max_inflight_requests`` are in flight at this
         replica (``cluster.admission``), with ``Retry-After``; a request holds its slot until its response,
         streamed or not, has been sent
    413  a body over ``ingress.max_body_bytes``: refused on its ``Content-Length`` before reading it, or, without
         one (chunked), as soon as what was read passes the limit; the route gets the body already read

Pure ASGI (as vLLM's ``AuthenticationMiddleware``), so streamed responses pass through untouched.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from cluster.admission import InflightLimit, Overloaded
from cluster.api_key import ApiKey
from cluster.errors import error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


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


class BodyTooLarge(Exception):
    pass


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body, or ``BodyTooLarge`` as soon as more than ``limit`` bytes have come."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the route the body already read, then whatever comes next (a disconnect)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


class HttpGuard:
    def __init__(self, app: ASGIApp, api_key: ApiKey, open_paths: frozenset[str] = frozenset({"/health"}),
                 max_body_bytes: int | None = None, inflight: InflightLimit | None = None,
                 limited_paths: frozenset[str] = frozenset()) -> None:
        self.app, self.api_key, self.open_paths = app, api_key, open_paths
        self.max_body_bytes, self.inflight, self.limited_paths = max_body_bytes, inflight, limited_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan events
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
        if path not in self.open_paths and not self.api_key.accepts(header(scope, b"authorization")):
            await send_error(send, 401, "missing or wrong API key", {"www-authenticate": "Bearer"})
            return
        if self.inflight is None or path not in self.limited_paths:
            await self._sized(scope, receive, send)
            return
        try:
            with self.inflight.admit():
                await self._sized(scope, receive, send)
        except Overloaded as e:
            await send_error(send, 503, str(e), {"retry-after": str(e.retry_after_s)})

    async def _sized(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.max_body_bytes
        if limit is None:
            await self.app(scope, receive, send)
            return
        too_large = f"request body over {limit} bytes (ingress.max_body_bytes)"
        length = header(scope, b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await send_error(send, 413 if length.isdigit() else 400,
                             too_large if length.isdigit() else "malformed Content-Length")
            return
        try:
            body = await read_body(receive, limit)
        except BodyTooLarge:
            await send_error(send, 413, too_large)
            return
        await self.app(scope, replay(body, receive), send)
