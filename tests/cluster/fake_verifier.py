"""A stand-in for the verifier deployment (``cluster.verifier_server.VerifierServer``) with its call surface and
no engine: every completion is ``"ok"``. For tests of the ingress inside a real Serve app."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from cluster.verifier_reply import VerifierReply


class FakeVerifierServer:
    async def completions(self, req: Any) -> AsyncGenerator[VerifierReply, None]:
        body = {"object": "text_completion", "model": "llama4-tiny",
                "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        yield VerifierReply.json(200, body)

    async def chat(self, req: Any) -> AsyncGenerator[VerifierReply, None]:
        async for item in self.completions(req):
            yield item

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "llama4-tiny", "object": "model"}]}

    async def check_health(self) -> None:
        return None

    async def metrics(self) -> str:
        return "vllm:spec_decode_num_drafts_total 0.0\n"
