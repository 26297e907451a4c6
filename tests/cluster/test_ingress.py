"""Ingress logic without Serve: request parsing (4xx with reasons) and the API key, on HTTP and gRPC."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest

from cluster.ingress import BadRequest, Ingress, parse_request
from tests.conftest import EAGLE3, TARGET

CFG = {
    "verifier": {"model": str(TARGET), "served_model_name": "llama4-tiny"},
    "speculative_config": {"method": "eagle3", "model": str(EAGLE3), "num_speculative_tokens": 3},
}


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{", "malformed JSON"),
        (b"\xff\xfe", "malformed JSON"),
        (b'"a string"', "JSON object"),
        (b'{"prompt": "x", "max_tokens": 0}', "max_tokens must be a positive integer"),
        (b'{"prompt": "x", "max_tokens": true}', "max_tokens must be a positive integer"),
        (b'{"prompt": "x", "nope": 1}', "unknown field 'nope'"),
        (b'{"prompt": "x", "min_p": 0.5}', "'min_p' is not supported"),
        (b'{"prompt": "x", "temperature": "hot"}', "temperature"),
        (b'{"prompt": "", "max_tokens": 2}', "prompt"),  # found by the fuzz test: was a 500
    ],
)
def test_parse_request_refuses_with_reason(raw, reason):
    with pytest.raises(BadRequest) as e:
        parse_request(raw, CompletionRequest)
    assert e.value.status == 400 and reason in e.value.message


def test_parse_request_accepts_openai_body():
    req = parse_request(json.dumps({"prompt": "x", "max_tokens": 3, "min_p": 0.0}).encode(), CompletionRequest)
    assert req.max_tokens == 3


class _Req:
    def __init__(self, headers: dict[str, str], body: bytes = b"{}") -> None:
        self.headers = headers
        self._body = body

    async def body(self) -> bytes:
        return self._body


class _GrpcContext:
    def __init__(self, metadata) -> None:
        self.metadata, self.code, self.details = metadata, None, None

    def invocation_metadata(self):
        return self.metadata

    def set_code(self, code) -> None:
        self.code = code

    def set_details(self, details) -> None:
        self.details = details


def _ingress(**ingress_cfg) -> Ingress:
    cfg = copy.deepcopy(CFG)
    cfg["ingress"] = ingress_cfg
    ingress = Ingress.__new__(Ingress)
    Ingress.__init__(ingress, verifier=None, config=cfg)
    return ingress


def test_api_key_on_http_and_grpc():
    import grpc

    from cluster.proto import eagle_cluster_pb2 as pb

    ingress = _ingress(api_key="s3cret", grpc={"enabled": True})
    resp = asyncio.run(ingress._openai(_Req({}), CompletionRequest, "completions"))
    assert resp.status_code == 401
    resp = asyncio.run(ingress._openai(_Req({"authorization": "Bearer wrong"}), CompletionRequest, "completions"))
    assert resp.status_code == 401
    assert ingress._authorized(_Req({"authorization": "Bearer s3cret"}))
    ctx = _GrpcContext([("authorization", "Bearer wrong")])
    reply = asyncio.run(ingress.Generate(pb.GenerateRequest(prompt="x"), ctx))
    assert ctx.code == grpc.StatusCode.UNAUTHENTICATED and reply.text == ""
    ctx = _GrpcContext([("authorization", "Bearer s3cret")])
    assert ingress._grpc_request(pb.GenerateRequest(prompt="x", max_tokens=3), ctx)["max_tokens"] == 3
    assert ctx.code is None


def test_grpc_off_unless_the_config_turns_it_on():
    """Serve's gRPC proxy may be up (another app's YAML, a stray ``grpc_options``): this app answers nothing."""
    import grpc

    from cluster.proto import eagle_cluster_pb2 as pb

    ingress = _ingress(api_key="s3cret")
    ctx = _GrpcContext([("authorization", "Bearer s3cret")])
    reply = asyncio.run(ingress.Generate(pb.GenerateRequest(prompt="x"), ctx))
    assert ctx.code == grpc.StatusCode.UNIMPLEMENTED and "ingress.grpc.enabled" in ctx.details and reply.text == ""
    ctx = _GrpcContext([])
    assert asyncio.run(_drain(ingress.GenerateStream(pb.GenerateRequest(prompt="x"), ctx))) == []
    assert ctx.code == grpc.StatusCode.UNIMPLEMENTED


async def _drain(agen) -> list:
    return [x async for x in agen]


def test_grpc_without_key_only_when_opted_in():
    from cluster.proto import eagle_cluster_pb2 as pb

    ingress = _ingress(grpc={"enabled": True, "allow_unauthenticated": True})
    ctx = _GrpcContext([])
    assert ingress._grpc_request(pb.GenerateRequest(prompt="x"), ctx) and ctx.code is None


def test_no_api_key_means_open():
    ingress = _ingress()
    assert ingress._authorized(_Req({}))
