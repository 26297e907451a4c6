"""``VerifierReply``: what the engine side of the verifier replica (``cluster.verifier_engine``) answers for one
OpenAI request, for its HTTP, gRPC and handle surfaces (``cluster.verifier_server``) to send on.

Either a whole answer (``JSON``: a response or an error, with its HTTP status), or a stream (``STREAM``: vLLM's
own async iterator of server-sent events, ``data: {...}\\n\\n`` then ``data: [DONE]\\n\\n``, passed on as vLLM's API
server passes it: nothing re-wrapped per chunk).
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any


class ReplyKind(enum.Enum):
    JSON = "json"  # a whole response, or an error: ``status`` and ``body``
    STREAM = "stream"  # server-sent events: ``events``


@dataclass(frozen=True)
class VerifierReply:
    kind: ReplyKind
    status: int = 200
    body: dict[str, Any] = field(default_factory=dict)
    events: AsyncIterator[str] | None = None

    @classmethod
    def json(cls, status: int, body: dict[str, Any]) -> VerifierReply:
        return cls(ReplyKind.JSON, status=status, body=body)

    @classmethod
    def stream(cls, events: AsyncIterator[str]) -> VerifierReply:
        return cls(ReplyKind.STREAM, events=events)
