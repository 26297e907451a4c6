"""The ingress's API key check, one for HTTP and gRPC (``cluster.verifier_server``, ``cluster.http_guard``).

The key is kept only as its SHA-256 digest, and a presented key is hashed and compared with
``secrets.compare_digest``, as vLLM's own server does (``vllm/entrypoints/serve/middleware/authenticate.py``):
equal-length digests compared in constant time, so the time to refuse says nothing about how much of a guess
was right, nor about the key's length.
"""

from __future__ import annotations

import hashlib
import secrets


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class ApiKey:
    """``ApiKey(None)`` lets everything through; ``ApiKey("k")`` accepts ``Authorization: Bearer k`` only."""

    def __init__(self, key: str | None) -> None:
        self._digest = None if key is None else _digest(key)

    @property
    def required(self) -> bool:
        return self._digest is not None

    def accepts(self, authorization: str | None) -> bool:
        """``authorization``: the HTTP ``Authorization`` header or the gRPC ``authorization`` metadata value."""
        if self._digest is None:
            return True
        if not authorization:
            return False
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return secrets.compare_digest(_digest(token), self._digest)
