"""The verifier replica's surfaces inside a real Serve app, in front of a fake engine (no vLLM, so a minute, not
ten): the HTTP app Serve builds per replica (``__serve_build_asgi_app__``) checks the key, sizes and docs; Serve's
gRPC proxy reaches the replica's RPCs, which check the same key; bad sampling input over gRPC and a Serve handle is
refused naming the field, and serving goes on. Its own local Ray and ports 18000 / 19000, so it
does not meet a ``serve run`` of the CPU default (8000 / 9000)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.isolated]
HTTP, GRPC = "http://127.0.0.1:18000", "127.0.0.1:19000"
KEY = "s3cret"


@pytest.fixture(scope="module")
def app():
    import ray
    from ray import serve

    from cluster.app import VERIFIER_ENV
    from tests.cluster.fake_verifier import FakeVerifierServer

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": 18000},
                    grpc_options={"port": 19000, "grpc_servicer_functions": [
                        "cluster.proto.eagle_cluster_pb2_grpc.add_EagleClusterServicer_to_server"]})
        cfg = {"api_key": KEY, "grpc": {"enabled": True}, "max_body_bytes": 4096}
        verifier = serve.deployment(serve.ingress()(FakeVerifierServer)).options(
            name="Verifier", ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": VERIFIER_ENV}})
        serve.run(verifier.bind(cfg), name="eagle-cluster", route_prefix="/")
        yield
    finally:
        serve.shutdown()
        ray.shutdown()


def call(path: str, body: bytes | None = None, key: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    req = urllib.request.Request(HTTP + path, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_http_through_serve(app):
    body = json.dumps({"prompt": "x", "max_tokens": 2}).encode()
    assert call("/v1/completions", body)[0] == 401
    status, out = call("/v1/completions", body, KEY)
    assert status == 200 and json.loads(out)["choices"][0]["text"] == "ok"
    big = json.dumps({"prompt": "x" * 5000}).encode()
    status, out = call("/v1/completions", big, KEY)
    assert status == 413 and b"max_body_bytes" in out
    assert call("/health")[0] == 200 and call("/metrics")[0] == 200
    assert call("/openapi.json")[0] == 401 and call("/openapi.json", key=KEY)[0] == 200
    assert call("/docs", key=KEY)[0] == 404


def test_grpc_through_serve(app):
    import grpc

    from cluster.proto import eagle_cluster_pb2 as pb
    from cluster.proto import eagle_cluster_pb2_grpc as pb_grpc

    with grpc.insecure_channel(GRPC) as channel:
        stub = pb_grpc.EagleClusterStub(channel)
        meta = (("application", "eagle-cluster"),)
        with pytest.raises(grpc.RpcError) as e:
            stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2), metadata=meta)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        reply = stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2),
                              metadata=(*meta, ("authorization", f"Bearer {KEY}")))
        assert reply.text == "ok" and reply.completion_tokens == 1


def test_bad_sampling_over_grpc_and_the_handle_names_the_field_and_serving_goes_on(app):
    """Through Serve's gRPC proxy (a real stub) and a Serve handle: a negative or NaN temperature, a top_p over 1
    and (the handle only: the proto's ``stop`` is ``repeated string``) a ``stop`` that is not strings end with
    INVALID_ARGUMENT / ``BadRequest``, naming the field; the next good request is served."""
    import grpc
    from ray import serve

    from cluster.errors import BadRequest
    from cluster.proto import eagle_cluster_pb2 as pb
    from cluster.proto import eagle_cluster_pb2_grpc as pb_grpc

    bad = [({"temperature": -1.0}, "temperature"), ({"temperature": float("nan")}, "temperature"),
           ({"top_p": 1.5}, "top_p")]
    with grpc.insecure_channel(GRPC) as channel:
        stub = pb_grpc.EagleClusterStub(channel)
        meta = (("application", "eagle-cluster"), ("authorization", f"Bearer {KEY}"))
        for sampling, field in bad:
            request = pb.GenerateRequest(prompt="x", max_tokens=2, **sampling)
            for call in (stub.Generate, lambda r, **kw: list(stub.GenerateStream(r, **kw))):
                with pytest.raises(grpc.RpcError) as e:
                    call(request, metadata=meta)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in e.value.details()
        with pytest.raises(TypeError):
            pb.GenerateRequest(prompt="x", stop=[1])
        assert stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2), metadata=meta).text == "ok"

    handle = serve.get_app_handle("eagle-cluster")
    for sampling, field in [*bad, ({"stop": 5}, "stop"), ({"stop": [1, 2]}, "stop")]:
        with pytest.raises(BadRequest) as e:
            handle.generate.remote("x", **sampling).result(timeout_s=60)
        assert e.value.status == 400 and field in e.value.message, e.value
    assert handle.generate.remote("x", max_tokens=2).result(timeout_s=60)["choices"][0]["text"] == "ok"
