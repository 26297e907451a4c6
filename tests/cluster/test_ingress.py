"""The verifier replica's surfaces without Serve or vLLM: request parsing (4xx with reasons) and the API key, on
HTTP and gRPC. HTTP goes through the app Serve would build (``VerifierServer.__serve_build_asgi_app__``) with
starlette's ``TestClient``, in front of a fake engine (``tests.cluster.fake_verifier.FakeEngine``)."""

from __future__ import annotations

import asyncio
import json

import pytest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest

from cluster.errors import INTERNAL_MESSAGE, BadRequest, GrpcAbort, grpc_code
from cluster.openai_requests import parse_request
from cluster.verifier_reply import VerifierReply
from tests.cluster.fake_verifier import FakeEngine, http_client, make_server


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


class _GrpcContext:
    def __init__(self, metadata) -> None:
        self.metadata, self.code, self.details = metadata, None, None

    def invocation_metadata(self):
        return self.metadata

    def set_code(self, code) -> None:
        self.code = code

    def set_details(self, details) -> None:
        self.details = details


COMPLETION = {"prompt": "x", "max_tokens": 2}
KEY = {"authorization": "Bearer s3cret"}


def test_api_key_on_http_and_grpc():
    import grpc

    from cluster.proto import eagle_cluster_pb2 as pb

    http, verifier = http_client(api_key="s3cret", grpc={"enabled": True})
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "s3cret"}):
        r = http.post("/v1/completions", json=COMPLETION, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
        assert http.post("/v1/chat/completions", json={}, headers=headers).status_code == 401
        assert http.get("/v1/models", headers=headers).status_code == 401
    assert verifier.calls == 0
    r = http.post("/v1/completions", json=COMPLETION, headers=KEY)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ok" and verifier.calls == 1
    assert http.get("/v1/models", headers=KEY).json()["data"][0]["id"] == "llama4-tiny"
    ingress = make_server(api_key="s3cret", grpc={"enabled": True})
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

    ingress = make_server(api_key="s3cret")
    ctx = _GrpcContext([("authorization", "Bearer s3cret")])
    reply = asyncio.run(ingress.Generate(pb.GenerateRequest(prompt="x"), ctx))
    assert ctx.code == grpc.StatusCode.UNIMPLEMENTED and "ingress.grpc.enabled" in ctx.details and reply.text == ""
    ctx = _GrpcContext([])
    with pytest.raises(GrpcAbort):
        asyncio.run(_drain(ingress.GenerateStream(pb.GenerateRequest(prompt="x"), ctx)))
    assert ctx.code == grpc.StatusCode.UNIMPLEMENTED


async def _drain(agen) -> list:
    return [x async for x in agen]


def test_grpc_without_key_only_when_opted_in():
    from cluster.proto import eagle_cluster_pb2 as pb

    ingress = make_server(grpc={"enabled": True, "allow_unauthenticated": True})
    ctx = _GrpcContext([])
    assert ingress._grpc_request(pb.GenerateRequest(prompt="x"), ctx) and ctx.code is None


def test_no_api_key_means_open():
    http, verifier = http_client()
    assert http.post("/v1/completions", json=COMPLETION).status_code == 200 and verifier.calls == 1
    assert http.get("/v1/models").status_code == 200
    assert http.get("/openapi.json").status_code == 200 and http.get("/docs").status_code == 200
    assert http.get("/redoc").status_code == 200


def test_docs_behind_the_key():
    """/openapi.json lists every route: it needs the key; /docs and /redoc (browser pages, which cannot send the
    key) are off when there is one."""
    http, _ = http_client(api_key="s3cret")
    assert http.get("/openapi.json").status_code == 401
    assert "/v1/completions" in http.get("/openapi.json", headers=KEY).json()["paths"]
    for path in ("/docs", "/redoc"):
        assert http.get(path).status_code == 401
        assert http.get(path, headers=KEY).status_code == 404
    assert http.get("/no-such-path").status_code == 401  # unknown paths say nothing without the key


def test_health_open_metrics_behind_the_key_when_configured():
    http, _ = http_client(api_key="s3cret")
    assert http.get("/health").status_code == 200 and http.get("/metrics").status_code == 200
    http, _ = http_client(api_key="s3cret", metrics_require_api_key=True)
    assert http.get("/health").status_code == 200
    assert http.get("/metrics").status_code == 401
    r = http.get("/metrics", headers=KEY)
    assert r.status_code == 200 and "vllm:spec_decode_num_drafts_total" in r.text


def test_body_over_the_limit_is_413_before_the_verifier():
    http, verifier = http_client(max_body_bytes=1024)
    big = json.dumps({"prompt": "x" * 2000, "max_tokens": 2}).encode()
    r = http.post("/v1/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "ingress.max_body_bytes" in r.json()["error"]["message"]
    r = http.post("/v1/completions", content=iter([big[:600], big[600:]]))  # chunked: no Content-Length
    assert r.status_code == 413 and "content-length" not in r.request.headers
    assert verifier.calls == 0
    small = json.dumps({"prompt": "x" * 900, "max_tokens": 2}).encode()
    assert http.post("/v1/completions", content=iter([small[:500], small[500:]])).status_code == 200
    assert http.post("/v1/completions", content=small).status_code == 200 and verifier.calls == 2


def test_n_over_the_limit_is_400_naming_n():
    http, verifier = http_client(max_n=2)
    r = http.post("/v1/completions", json={**COMPLETION, "n": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n" and "at most 2" in r.json()["error"]["message"]
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "n": 9})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    assert verifier.calls == 0
    assert http.post("/v1/completions", json={**COMPLETION, "n": 2}).status_code == 200


class GatedVerifier(FakeEngine):
    """Completions wait for ``open()``: requests stay in flight for as long as the test wants."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def completions(self, req):
        self.calls += 1
        await self.gate.wait()
        self.calls -= 1  # counted below again
        return await super().completions(req)


def test_overload_is_503_with_retry_after_not_a_queue():
    import httpx

    async def scenario() -> None:
        verifier = GatedVerifier()
        ingress = make_server(verifier, max_inflight_requests=2, retry_after_s=3)
        transport = httpx.ASGITransport(app=ingress.__serve_build_asgi_app__())
        async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
            held = [asyncio.create_task(client.post("/v1/completions", json=COMPLETION)) for _ in range(2)]
            while verifier.calls < 2:
                await asyncio.sleep(0)
            third = asyncio.create_task(client.post("/v1/completions", json=COMPLETION))
            while not third.done() and verifier.calls < 3:  # answered at once, or queued behind the gate
                await asyncio.sleep(0)
            assert third.done() and verifier.calls == 2
            r = third.result()
            assert r.status_code == 503 and r.headers["retry-after"] == "3"
            assert "in flight" in r.json()["error"]["message"]
            assert (await client.get("/health")).status_code == 200  # only generation requests are counted
            verifier.gate.set()
            assert [t.status_code for t in await asyncio.gather(*held)] == [200, 200]
            assert ingress.inflight.inflight == 0
            assert (await client.post("/v1/completions", json=COMPLETION)).status_code == 200

    asyncio.run(scenario())


def test_grpc_shares_the_inflight_limit():
    import grpc

    from cluster.proto import eagle_cluster_pb2 as pb

    ingress = make_server(FakeEngine(), grpc={"enabled": True, "allow_unauthenticated": True}, max_inflight_requests=1)
    with ingress.inflight.admit():  # one HTTP request in flight
        ctx = _GrpcContext([])
        asyncio.run(ingress.Generate(pb.GenerateRequest(prompt="x"), ctx))
        assert ctx.code == grpc.StatusCode.UNAVAILABLE and "in flight" in ctx.details
        ctx = _GrpcContext([])
        with pytest.raises(GrpcAbort):
            asyncio.run(_drain(ingress.GenerateStream(pb.GenerateRequest(prompt="x"), ctx)))
        assert ctx.code == grpc.StatusCode.UNAVAILABLE
    assert ingress.inflight.inflight == 0


def test_a_failing_request_gives_its_slot_back():
    from cluster.admission import InflightLimit, Overloaded

    limit = InflightLimit(1)
    with pytest.raises(RuntimeError), limit.admit():
        raise RuntimeError("verifier died")
    with limit.admit(), pytest.raises(Overloaded), limit.admit():
        pass
    assert limit.inflight == 0


# --- errors that say what happened ----------------------------------------------------------------------------
OPEN_GRPC = {"grpc": {"enabled": True, "allow_unauthenticated": True}}


class ScriptedVerifier(FakeEngine):
    """Completions answer ``items``: one ``VerifierReply`` (a whole answer), or SSE events streamed; then raise
    ``error`` if given (before answering when there are no items, else mid-stream)."""

    def __init__(self, items=(), error: BaseException | None = None) -> None:
        super().__init__()
        self.items, self.error = list(items), error

    async def completions(self, req):
        self.calls += 1
        if self.items and isinstance(self.items[0], VerifierReply):
            return self.items[0]
        if not self.items and self.error is not None:
            raise self.error
        return VerifierReply.stream(self._events())

    async def _events(self):
        for item in self.items:
            yield item
        if self.error is not None:
            raise self.error


def _error_json(status: int, message: str):
    return VerifierReply.json(status, {"error": {"message": message, "type": "X", "code": status}})


def _sse(text: str) -> str:
    chunk = {"choices": [{"index": 0, "text": text, "finish_reason": None}]}
    return f"data: {json.dumps(chunk)}\n\n"


def _run_grpc(ingress, request, stream: bool):
    """(replies, context, the GrpcAbort raised or None)."""
    ctx = _GrpcContext([])
    if not stream:
        return [asyncio.run(ingress.Generate(request, ctx))], ctx, None
    replies: list = []

    async def drain() -> None:
        async for reply in ingress.GenerateStream(request, ctx):
            replies.append(reply)

    try:
        asyncio.run(drain())
    except GrpcAbort as e:
        return replies, ctx, e
    return replies, ctx, None


CODES = [(400, "INVALID_ARGUMENT"), (401, "UNAUTHENTICATED"), (404, "NOT_FOUND"), (429, "RESOURCE_EXHAUSTED"),
         (503, "UNAVAILABLE"), (413, "RESOURCE_EXHAUSTED"), (422, "INVALID_ARGUMENT"), (500, "INTERNAL"),
         (502, "INTERNAL")]


@pytest.mark.parametrize(("status", "name"), CODES)
def test_grpc_code_for_each_http_status(status, name):
    import grpc

    assert grpc_code(status) == getattr(grpc.StatusCode, name)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("status", "name"), CODES[:5])
def test_grpc_relays_the_verifiers_status(stream, status, name):
    """Was: every non-200 an INVALID_ARGUMENT (unary), a normal empty stream (streaming)."""
    import grpc

    from cluster.proto import eagle_cluster_pb2 as pb

    ingress = make_server(ScriptedVerifier([_error_json(status, "max_tokens: too many for this model")]), **OPEN_GRPC)
    replies, ctx, abort = _run_grpc(ingress, pb.GenerateRequest(prompt="x", max_tokens=5), stream)
    assert ctx.code == getattr(grpc.StatusCode, name) and ctx.details == "max_tokens: too many for this model"
    assert (abort is not None) == stream and replies in ([], [pb.GenerateReply()])


def test_grpc_stream_with_bad_input_ends_invalid_argument():
    """An empty prompt and max_tokens 4000000000: was a normal empty stream with status OK."""
    import grpc

    from cluster.proto import eagle_cluster_pb2 as pb

    verifier = FakeEngine()
    ingress = make_server(verifier, **OPEN_GRPC)
    replies, ctx, abort = _run_grpc(ingress, pb.GenerateRequest(prompt="", max_tokens=4000000000), stream=True)
    assert replies == [] and abort is not None and verifier.calls == 0
    assert ctx.code == grpc.StatusCode.INVALID_ARGUMENT and "prompt" in ctx.details
    assert abort.code == ctx.code and abort.details == ctx.details


def test_grpc_stream_status_reaches_the_client_through_serves_replica_path():
    """What Serve 2.60 does with a streaming method's exception (``Replica._maybe_wrap_grpc_exception`` on the
    ``RayServegRPCContext`` the method was given, then the proxy's ``get_grpc_response_status``), run on the
    servicer without Ray: the call ends with the code and reason the method set."""
    import grpc
    from ray.serve._private.grpc_util import get_grpc_response_status
    from ray.serve._private.replica import Replica
    from ray.serve.grpc_util import RayServegRPCContext

    from cluster.proto import eagle_cluster_pb2 as pb

    class RawContext:  # the grpc.aio context Serve's proxy copies into a RayServegRPCContext
        def invocation_metadata(self):
            return ()

        def auth_context(self):
            return {}

        def code(self):
            return None

        def details(self):
            return None

        def peer(self):
            return "ipv4:127.0.0.1:1"

        def peer_identities(self):
            return None

        def peer_identity_key(self):
            return None

        def trailing_metadata(self):
            return ()

    class Metadata:
        is_grpc_request = True

        def __init__(self, ctx) -> None:
            self.grpc_context = ctx

    ingress = make_server(FakeEngine(), **OPEN_GRPC)
    serve_ctx = RayServegRPCContext(RawContext())

    async def drain() -> None:
        async for _ in ingress.GenerateStream(pb.GenerateRequest(prompt="", max_tokens=4000000000), serve_ctx):
            pass

    with pytest.raises(GrpcAbort) as e:
        asyncio.run(drain())
    wrapped = Replica._maybe_wrap_grpc_exception(None, e.value, Metadata(serve_ctx))
    status = get_grpc_response_status(wrapped, 30.0, "req-1")
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT and status.is_error and "prompt" in status.message


def test_grpc_error_event_inside_a_stream():
    """vLLM's streaming error (``data: {"error": ...}``) after a first piece: was a KeyError (INTERNAL, with a
    remote traceback); now the piece, then the event's status and message."""
    import grpc

    from cluster.proto import eagle_cluster_pb2 as pb

    event = json.dumps({"error": {"message": "prompt too long", "type": "BadRequestError", "code": 400}})
    verifier = ScriptedVerifier([_sse("def"), f"data: {event}\n\n", _sse("never")])
    replies, ctx, abort = _run_grpc(make_server(verifier, **OPEN_GRPC), pb.GenerateRequest(prompt="x"), stream=True)
    assert [r.text for r in replies] == ["def"] and abort is not None
    assert ctx.code == grpc.StatusCode.INVALID_ARGUMENT and ctx.details == "prompt too long"
    event = json.dumps({"error": {"message": "Internal server error", "type": "InternalServerError", "code": 500}})
    verifier = ScriptedVerifier([f"data: {event}\n\n"])
    _, ctx, abort = _run_grpc(make_server(verifier, **OPEN_GRPC), pb.GenerateRequest(prompt="x"), stream=True)
    assert ctx.code == grpc.StatusCode.INTERNAL and abort is not None


def _dead() -> list[BaseException]:
    """What the engine raises once its core process is gone (vLLM's ``EngineDeadError``), and what a call through
    Ray raises when an actor it needs died."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError
    from vllm.v1.engine.exceptions import EngineDeadError

    return [EngineDeadError(), ActorDiedError(), ActorUnavailableError("restarting", None)]


@pytest.mark.parametrize("stream", [False, True])
def test_grpc_dead_verifier_is_unavailable_a_bug_is_internal_without_internals(stream):
    import grpc

    from cluster.proto import eagle_cluster_pb2 as pb

    for error in _dead():
        ingress = make_server(ScriptedVerifier(error=error), **OPEN_GRPC)
        _, ctx, _ = _run_grpc(ingress, pb.GenerateRequest(prompt="x"), stream)
        assert ctx.code == grpc.StatusCode.UNAVAILABLE and "verifier unavailable" in ctx.details
    ingress = make_server(ScriptedVerifier(error=KeyError("secret_internal_name")), **OPEN_GRPC)
    _, ctx, _ = _run_grpc(ingress, pb.GenerateRequest(prompt="x"), stream)
    assert ctx.code == grpc.StatusCode.INTERNAL and ctx.details == INTERNAL_MESSAGE


def test_http_dead_verifier_is_503_a_bug_is_500(caplog):
    """Was: any exception a 503 'verifier unavailable'."""
    from starlette.testclient import TestClient

    for error in _dead():
        http = TestClient(make_server(ScriptedVerifier(error=error)).__serve_build_asgi_app__())
        r = http.post("/v1/completions", json=COMPLETION)
        assert r.status_code == 503 and "verifier unavailable" in r.json()["error"]["message"]
    http = TestClient(make_server(ScriptedVerifier(error=KeyError("secret_internal_name"))).__serve_build_asgi_app__())
    with caplog.at_level("ERROR", logger="cluster.errors"):
        r = http.post("/v1/completions", json=COMPLETION)
    assert r.status_code == 500 and r.json()["error"]["message"] == INTERNAL_MESSAGE
    assert "secret_internal_name" not in r.text
    assert any(rec.exc_info and "secret_internal_name" in str(rec.exc_info[1]) for rec in caplog.records)


def test_http_stream_failure_mid_stream_says_which():
    from starlette.testclient import TestClient

    for error, status in [(_dead()[0], 503), (RuntimeError("secret_internal_name"), 500)]:
        http = TestClient(make_server(ScriptedVerifier([_sse("a")], error=error)).__serve_build_asgi_app__())
        r = http.post("/v1/completions", json={**COMPLETION, "stream": True})
        events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
        assert r.status_code == 200 and events[-1] == "[DONE]" and "secret_internal_name" not in r.text
        assert json.loads(events[0])["choices"][0]["text"] == "a"
        assert json.loads(events[-2])["error"]["code"] == status


class BrokenVerifier(FakeEngine):
    """Every call raises ``error`` (as the engine does when its core process is gone, or when it failed)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    async def _raise(self, *_):
        raise self.error

    completions = chat = models = check_health = metrics = _raise


def test_models_metrics_health_say_which_without_internals():
    from starlette.testclient import TestClient

    for error, status in [(_dead()[0], 503), (RuntimeError("secret_internal_name"), 500)]:
        http = TestClient(make_server(BrokenVerifier(error)).__serve_build_asgi_app__())
        for path in ("/v1/models", "/metrics"):
            r = http.get(path)
            assert r.status_code == status and "secret_internal_name" not in r.text
            assert r.json()["error"]["code"] == status
        r = http.get("/health")
        assert r.status_code == 503 and "secret_internal_name" not in r.text
        reason = "verifier unavailable: EngineDeadError" if status == 503 else "verifier unhealthy"
        assert r.json()["reason"] == reason
        assert http.post("/v1/completions", json=COMPLETION).status_code == status


def test_grpc_abort_survives_the_trip_to_the_proxy():
    """Serve pickles the exception a streaming method raises (in its ``gRPCStatusError``) from the replica to the
    proxy, which ends the call with its code; one that does not unpickle ends it INTERNAL instead."""
    import pickle

    import grpc
    from ray.serve.exceptions import gRPCStatusError


    code = grpc.StatusCode.INVALID_ARGUMENT
    abort = pickle.loads(pickle.dumps(GrpcAbort(code, "prompt: empty")))
    assert (abort.code, abort.details, str(abort)) == (code, "prompt: empty", "prompt: empty")
    wrapped = pickle.loads(pickle.dumps(gRPCStatusError(abort, code, "prompt: empty")))
    assert (wrapped._grpc_code, wrapped._grpc_details) == (code, "prompt: empty")


def test_handle_errors_survive_the_trip_to_the_caller():
    """A handle call's ``BadRequest`` / ``VerifierError`` travels pickled from the replica to its caller, with its
    status, reason and field."""
    import pickle

    from cluster.errors import VerifierError

    bad = pickle.loads(pickle.dumps(BadRequest(400, "top_p must be in (0, 1], got 1.5.", "top_p")))
    assert (bad.status, bad.message, bad.param, str(bad)) == (400, "top_p must be in (0, 1], got 1.5.", "top_p",
                                                              "top_p must be in (0, 1], got 1.5.")
    err = pickle.loads(pickle.dumps(VerifierError(503, "verifier unavailable: EngineDeadError")))
    assert (type(err), err.status, err.message) == (VerifierError, 503, "verifier unavailable: EngineDeadError")


# --- vLLM's other routes ---------------------------------------------------------------------------------------
def test_tokenize_detokenize_version_routes_and_their_bad_input():
    from cluster.openai_requests import parse_tokenize

    http, _ = http_client(api_key="s3cret")
    assert http.post("/tokenize", json={"prompt": "x"}).status_code == 401  # behind the key, like the rest
    r = http.post("/tokenize", json={"prompt": "x"}, headers=KEY)
    assert r.status_code == 200 and r.json()["tokens"] == [1]
    assert http.post("/detokenize", json={"tokens": [1]}, headers=KEY).json() == {"prompt": "x"}
    assert http.get("/version", headers=KEY).json()["version"]
    for body, reason in ((b"{", "malformed JSON"), (b"[1]", "JSON object"), (b'{"tokens": "x"}', "tokens")):
        r = http.post("/detokenize", content=body, headers=KEY)
        assert r.status_code == 400 and reason in r.json()["error"]["message"], r.text
    # both of vLLM's tokenize bodies: a completion prompt and chat messages
    assert parse_tokenize(b'{"prompt": "x"}').prompt == "x"
    assert parse_tokenize(b'{"messages": [{"role": "user", "content": "x"}]}').messages
    with pytest.raises(BadRequest):
        parse_tokenize(b'{"nothing": 1}')


# --- bad sampling input, on every surface ----------------------------------------------------------------------
NAN = float("nan")
BAD_SAMPLING = [  # (sampling arguments, the field the error names, the reason)
    ({"temperature": -1.0}, "temperature", "non-negative"),
    ({"temperature": NAN}, "temperature", "finite"),
    ({"temperature": 3.0}, "temperature", "[0, 2]"),
    ({"top_p": 1.5}, "top_p", "(0, 1]"),
    ({"top_p": NAN}, "top_p", "(0, 1]"),
    ({"top_k": -5}, "top_k", "top_k"),
    ({"stop": 5}, "stop", "valid string"),
    ({"stop": [1, 2]}, "stop", "valid string"),
]
CHAT = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(("sampling", "field", "reason"), BAD_SAMPLING,
                         ids=[f"{k}={v}" for s, _, _ in BAD_SAMPLING for k, v in s.items()])
def test_bad_sampling_is_400_naming_the_field_before_the_engine(sampling, field, reason):
    """HTTP (completions, chat) and the Python handle calls (``generate``, ``chat``, ``generate_stream``) refuse it
    with the field and vLLM's reason, and the engine never sees it; the next good request is served."""
    from starlette.testclient import TestClient

    verifier = FakeEngine()
    server = make_server(verifier)
    http = TestClient(server.__serve_build_asgi_app__())
    json_body = {"content-type": "application/json"}
    for path, body in (("/v1/completions", COMPLETION), ("/v1/chat/completions", {"messages": CHAT})):
        r = http.post(path, content=json.dumps({**body, **sampling}), headers=json_body)  # NaN as JSON's NaN
        err = r.json()["error"]
        assert r.status_code == 400 and field in err["message"] and reason in err["message"], (path, err)
        assert err["param"] is None or err["param"].startswith(field)
    for call in (lambda: server.generate("x", **sampling), lambda: server.chat(CHAT, **sampling),
                 lambda: _drain(server.generate_stream("x", **sampling))):
        with pytest.raises(BadRequest) as e:
            asyncio.run(call())
        assert e.value.status == 400 and field in e.value.message and reason in e.value.message
    assert verifier.calls == 0
    assert http.post("/v1/completions", json=COMPLETION).status_code == 200
    assert asyncio.run(server.generate("x", max_tokens=2, temperature=0.5, top_p=0.9, stop=["\n"]))["choices"]
    assert verifier.calls == 2


GRPC_BAD_SAMPLING = [({"temperature": -1.0}, "temperature"), ({"temperature": NAN}, "temperature"),
                     ({"top_p": 1.5}, "top_p"), ({"top_p": -0.5}, "top_p")]


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize(("sampling", "field"), GRPC_BAD_SAMPLING,
                         ids=[f"{k}={v}" for s, _ in GRPC_BAD_SAMPLING for k, v in s.items()])
def test_grpc_bad_sampling_is_invalid_argument_naming_the_field(sampling, field, stream):
    """The proto's floats carry any value (its ``stop`` is ``repeated string``: a wrong type cannot be sent)."""
    import grpc

    from cluster.proto import eagle_cluster_pb2 as pb

    verifier = ScriptedVerifier([_sse("ok")]) if stream else FakeEngine()  # the fake streams only when scripted to
    ingress = make_server(verifier, **OPEN_GRPC)
    replies, ctx, abort = _run_grpc(ingress, pb.GenerateRequest(prompt="x", max_tokens=2, **sampling), stream)
    assert ctx.code == grpc.StatusCode.INVALID_ARGUMENT and field in ctx.details, ctx.details
    assert (abort is not None) == stream and verifier.calls == 0
    replies, ctx, abort = _run_grpc(ingress, pb.GenerateRequest(prompt="x", max_tokens=2, temperature=0.5), stream)
    assert ctx.code is None and abort is None and verifier.calls == 1 and replies[0].text == "ok"
