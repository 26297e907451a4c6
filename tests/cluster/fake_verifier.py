"""A stand-in for the verifier's engine side (``cluster.verifier_engine.VerifierEngine``) with its call surface and
no vLLM: every completion is ``"ok"``; and ``FakeVerifierServer``, the real ``VerifierServer`` in front of it, for
tests of the HTTP / gRPC / handle surfaces inside a real Serve app."""

from __future__ import annotations

from typing import Any

from cluster.config import IngressConfig
from cluster.verifier_reply import VerifierReply
from cluster.verifier_server import VerifierServer
from tests.conftest import EAGLE3, TARGET

CFG = {
    "verifier": {"model": str(TARGET), "served_model_name": "llama4-tiny"},
    "speculative_config": {"method": "eagle3", "model": str(EAGLE3), "num_speculative_tokens": 3},
}

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


def make_server(verifier=None, **ingress_cfg) -> VerifierServer:
    """The verifier replica (its HTTP / gRPC surfaces) in front of ``verifier``, a fake engine by default."""
    return VerifierServer.with_engine(verifier or FakeEngine(), IngressConfig.model_validate(ingress_cfg),
                                      "llama4-tiny")


def http_client(**ingress_cfg):
    """A starlette ``TestClient`` on the ASGI app Serve would build for the replica, and its fake engine."""
    from starlette.testclient import TestClient

    verifier = FakeEngine()
    return TestClient(make_server(verifier, **ingress_cfg).__serve_build_asgi_app__()), verifier
