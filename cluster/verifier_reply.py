"""``VerifierReply``: what the verifier deployment streams back to the ingress for one OpenAI request.

``completions`` / ``chat`` (``cluster.verifier_server``) are async generators of replies: one ``JSON`` reply for a
whole response or an error (its HTTP status and body), or one ``SSE`` reply per server-sent event when streaming.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class ReplyKind(enum.Enum):
    JSON = "json"  # a whole response, or an error: ``status`` and ``body``
    SSE = "sse"  # one server-sent event of a stream (``data: ...\n\n``): ``event``


@dataclass(frozen=True)
class VerifierReply:
    kind: ReplyKind
    status: int = 200
    body: dict[str, Any] = field(default_factory=dict)
    event: str = ""

    @classmethod
    def json(cls, status: int, body: dict[str, Any]) -> VerifierReply:
        return cls(ReplyKind.JSON, status=status, body=body)

    @classmethod
    def sse(cls, event: str) -> VerifierReply:
        return cls(ReplyKind.SSE, event=event)
