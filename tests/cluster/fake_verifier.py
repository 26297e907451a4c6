"""A stand-in for the verifier's engine side (``cluster.verifier_engine.VerifierEngine``) with its call surface and
no vLLM: every completion is ``"ok"``; and ``FakeVerifierServer``, the real ``VerifierServer`` in front of it, for
tests of the HTTP / gRPC / handle surfaces inside a real Serve app."""

from __future__ import annotations

from typing import Any

from cluster.config import IngressConfig
from cluster.verifier_reply import VerifierReply
from cluster.verifier_server import VerifierServer

COMPLETION = {"object": "text_completion", "model": "llama4-tiny",
              "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class FakeEngine:
    """Answers at once; counts completion (and chat) calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def completions(self, req: Any) -> VerifierReply:
        self.calls += 1
        return VerifierReply.json(200, COMPLETION)

    async def chat(self, req: Any) -> VerifierReply:
        return await self.completions(req)

    async def tokenize(self, req: Any) -> VerifierReply:
        return VerifierReply.json(200, {"count": 1, "max_model_len": 1024, "tokens": [1]})

    async def detokenize(self, req: Any) -> VerifierReply:
        return VerifierReply.json(200, {"prompt": "x"})

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "llama4-tiny", "object": "model"}]}

    async def check_health(self) -> None:
        return None

    async def metrics(self) -> str:
        return "vllm:spec_decode_num_drafts_total 1.0\n"


class FakeVerifierServer(VerifierServer):
    def __init__(self, ingress: dict[str, Any], model_name: str = "llama4-tiny") -> None:
        self._serve(FakeEngine(), IngressConfig.model_validate(ingress), model_name)
