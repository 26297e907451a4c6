"""The CPU default served for real: `serve run deploy/cpu.yaml` (plus gRPC; k fixed, ``EVERY_STEP_DRAFTS``, so that
every test's traffic drafts: ``auto`` may draft nothing at the loads they send), then the `openai` client, a grpcio
stub built from the proto, and Python handle calls against it; bad input gets a 4xx with a reason and the server
stays up."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cluster.harness import EVERY_STEP_DRAFTS, GRPC, HTTP, MODEL, cpu_yaml, metric, ray_env, serve_run
from cluster.harness import get as _get
from cluster.harness import post as _post
from tests.conftest import ROOT
from tests.waits import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.isolated]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = cpu_yaml(tmp_path_factory.mktemp("app") / "app.yaml", grpc=True, speculative_config=EVERY_STEP_DRAFTS)
    with serve_run(path) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=HTTP + "/v1", api_key="unused")


def test_models_and_health(client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert _get("/health")[0] == 200


def test_completion_greedy_matches_vllm_target_only(client):
    """Served through the cluster (EAGLE-3 drafter pool) == vLLM target-only, token for token (greedy)."""
    prompt = "def fibonacci(n):\n"
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0)
    assert out.usage.completion_tokens == 32 or out.choices[0].finish_reason == "stop"
    from vllm import SamplingParams

    from tests.actors import vllm_helpers as vh

    ref, _ = vh.target_only([prompt], SamplingParams(max_tokens=32, temperature=0))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ROOT / "models/llama4-tiny")
    assert out.choices[0].text == tok.decode(ref[0])


def test_streaming_completion(client):
    pieces = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="class Stack:\n", max_tokens=24, temperature=0, stream=True) if c.choices]
    whole = client.completions.create(model=MODEL, prompt="class Stack:\n", max_tokens=24, temperature=0)
    assert len(pieces) > 1 and "".join(pieces) == whole.choices[0].text


def test_chat_completion_and_stream(client):
    msgs = [{"role": "user", "content": "import os"}]
    out = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0)
    assert out.choices[0].message.role == "assistant" and out.usage.completion_tokens > 0
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0,
                                                 stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == out.choices[0].message.content


def test_metrics_have_spec_decode_counters(client):
    client.completions.create(model=MODEL, prompt="def f(x):\n", max_tokens=16, temperature=0)
    status, body = _get("/metrics")
    text = body.decode()
    assert status == 200
    for name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos"):
        assert name in text
    drafts = [ln for ln in text.splitlines() if ln.startswith("vllm:spec_decode_num_drafts_total")]
    assert drafts and float(drafts[0].split()[-1]) > 0
    pool = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln.startswith("eagle_cluster_")}
    assert pool["eagle_cluster_draft_steps_total"] > 0
    assert pool["eagle_cluster_draft_failures_total"] == 0 and pool["eagle_cluster_rehomed_sequences_total"] == 0
    assert pool["eagle_cluster_drafters"] == 1 and pool["eagle_cluster_quarantined_drafters"] == 0


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "malformed JSON"),
        (b"[1, 2]", "JSON object"),
        (json.dumps({"prompt": "x", "max_tokens": 0}).encode(), "max_tokens"),
        (json.dumps({"prompt": "x", "max_tokens": -5}).encode(), "max_tokens"),
        (json.dumps({"prompt": "x", "max_tokens": "ten"}).encode(), "max_tokens"),
        (json.dumps({"prompt": "x", "bogus_field": 1}).encode(), "unknown field 'bogus_field'"),
        (json.dumps({"prompt": "x", "temperature": "hot"}).encode(), "temperature"),
        (json.dumps({"prompt": "x", "max_tokens": 5000}).encode(), "max_model_len"),
        (json.dumps({"prompt": "def f():\n" * 400, "max_tokens": 4}).encode(), "context"),
        (json.dumps({"prompt": [99999999], "max_tokens": 4}).encode(), "token"),
        (json.dumps({"prompt": "x", "suffix": "y"}).encode(), "suffix"),
        (json.dumps({"model": "gpt-5", "prompt": "x"}).encode(), "not served"),
    ],
)
def test_bad_http_input_gets_4xx_with_reason(server, body, reason):
    status, out = _post("/v1/completions", body)
    assert 400 <= status < 500, out
    assert reason.lower() in json.dumps(out).lower(), out


def test_server_stays_up_after_bad_input(client):
    for _ in range(3):
        _post("/v1/completions", b"{broken")
    out = client.completions.create(model=MODEL, prompt="x = ", max_tokens=4, temperature=0)
    assert out.usage.completion_tokens == 4


def test_grpc_generate_and_stream(server):
    import grpc

    from cluster.proto import eagle_cluster_pb2 as pb
    from cluster.proto import eagle_cluster_pb2_grpc as pb_grpc

    with grpc.insecure_channel(GRPC) as channel:
        stub = pb_grpc.EagleClusterStub(channel)
        meta = (("application", "eagle-cluster"),)
        reply = stub.Generate(pb.GenerateRequest(prompt="def add(a, b):\n", max_tokens=12), metadata=meta)
        assert reply.completion_tokens == 12 and reply.text
        pieces = list(stub.GenerateStream(pb.GenerateRequest(prompt="def add(a, b):\n", max_tokens=12),
                                          metadata=meta))
        assert "".join(p.text for p in pieces) == reply.text
        assert pieces[-1].finish_reason == "length"
        with pytest.raises(grpc.RpcError) as e:
            stub.Generate(pb.GenerateRequest(prompt="", max_tokens=4), metadata=meta)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "prompt" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=100000), metadata=meta)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_grpc_stream_errors_end_with_their_status(server):
    """A streaming call with bad input ends INVALID_ARGUMENT with the reason, as the unary call does (was: a normal,
    empty stream with status OK: the code set on the context never reached the client through Serve's proxy)."""
    import grpc

    from cluster.proto import eagle_cluster_pb2 as pb
    from cluster.proto import eagle_cluster_pb2_grpc as pb_grpc

    with grpc.insecure_channel(GRPC) as channel:
        stub = pb_grpc.EagleClusterStub(channel)
        meta = (("application", "eagle-cluster"),)
        for request, reason in [(pb.GenerateRequest(prompt="", max_tokens=4000000000), "prompt"),
                                (pb.GenerateRequest(prompt="x", max_tokens=100000), "")]:
            with pytest.raises(grpc.RpcError) as e:
                list(stub.GenerateStream(request, metadata=meta))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and reason in e.value.details()
            assert "Traceback" not in e.value.details()
        pieces = list(stub.GenerateStream(pb.GenerateRequest(prompt="x = ", max_tokens=4), metadata=meta))
        assert pieces and pieces[-1].finish_reason == "length"


def test_client_disconnect_aborts_and_frees(server):
    """A client that goes away mid-stream (HTTP and gRPC): the request is aborted in vLLM (no more tokens made for
    it) and its sequence freed on the drafter: 0 draft sequences held afterwards."""
    import time
    import urllib.request

    import grpc
    import ray

    from cluster.harness import drafter_stats, join_ray, replica_actors
    from cluster.proto import eagle_cluster_pb2 as pb
    from cluster.proto import eagle_cluster_pb2_grpc as pb_grpc

    body = {"model": MODEL, "prompt": "def main():\n", "max_tokens": 900, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(HTTP + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    resp = urllib.request.urlopen(req, timeout=60)
    for _ in range(3):
        assert resp.readline()
    with grpc.insecure_channel(GRPC) as channel:
        stub = pb_grpc.EagleClusterStub(channel)
        call = stub.GenerateStream(pb.GenerateRequest(prompt="class A:\n", max_tokens=900),
                                   metadata=(("application", "eagle-cluster"),))
        assert next(call).finish_reason == ""  # the gRPC stream is generating
        # vLLM's gauge follows its steps: wait for it, do not sample it once
        assert wait_for(lambda: metric("vllm:num_requests_running") == 2, 60), \
            "vLLM never reported the HTTP and the gRPC request running together"
        call.cancel()
    resp.close()  # the HTTP client goes away
    gone = time.time()
    join_ray(server, "disconnect-test")
    try:
        (drafter,) = replica_actors("Drafter")
        while time.time() - gone < 10:
            running = metric("vllm:num_requests_running")
            held = drafter_stats(drafter["replica_id"])["active_sequences"]
            if running == 0 and held == 0:
                break
            time.sleep(0.25)
        tokens = metric("vllm:generation_tokens_total")
        time.sleep(2)
        assert (running, held) == (0, 0), f"{running} requests running, {held} draft sequences held 10 s after"
        assert metric("vllm:generation_tokens_total") == tokens  # nothing is generated for the gone clients
        print(f"\ndisconnect: aborted and freed within {time.time() - 2 - gone:.2f} s")
    finally:
        ray.shutdown()


def test_python_handle_snippet_from_readme(server):
    """Runs the README's handle snippet in a fresh interpreter connected to the running cluster."""
    readme = (ROOT / "README.md").read_text()
    snippet = readme.split("<!-- handle-snippet -->")[1].split("```python")[1].split("```")[0]
    env = {**os.environ, **ray_env(server)}  # its ray.init(address="auto") reads RAY_ADDRESS first
    r = subprocess.run([sys.executable, "-c", snippet], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "completion:" in r.stdout and "streamed:" in r.stdout


def _fuzz_cases(n: int, seed: int = 0):
    """Requests built from vLLM's CompletionRequest JSON schema: a prompt plus 1-3 fields with values of random
    (often wrong) types. Integers stay small so that a valid case is a short generation."""
    import random

    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    rng = random.Random(seed)
    fields = sorted(CompletionRequest.model_json_schema()["properties"])
    values = [None, True, False, -1, 0, 1, 2, 0.5, -0.5, 1e9, "", "x", "\u0000", [], [1, 2], ["a"], {}, {"a": 1}]
    for _ in range(n):
        body = {"prompt": rng.choice(["def f(", "", [1, 2, 3], ["a", "b"], 7]), "max_tokens": rng.choice([1, 2, 3])}
        for key in rng.sample(fields, rng.randint(1, 3)):
            body[key] = rng.choice(values)
        if body.get("n") not in (None, 1, 2) or body.get("best_of") not in (None, 1, 2):
            body.pop("n", None)
            body.pop("best_of", None)
        yield body


def test_fuzz_completions_schema_no_5xx(server):
    """150 schema-driven requests on loopback: every answer is 2xx or 4xx, and the server stays up."""
    statuses = []
    for body in _fuzz_cases(150):
        if isinstance(body.get("max_tokens"), int) and not isinstance(body["max_tokens"], bool):
            body["max_tokens"] = max(-1, min(body["max_tokens"], 3))
        status, out = _post("/v1/completions", json.dumps(body).encode())
        assert status < 500, (body, out)
        statuses.append(status)
    assert 200 in statuses and any(400 <= s < 500 for s in statuses)
    assert _get("/health")[0] == 200


def test_vllm_bench_serve_client_works_against_the_cluster(server, tmp_path):
    """A user's existing tooling: vLLM's own serving benchmark client on the shipped prompts (its ``custom``
    dataset), next to ours on the same prompts: the same requests succeed with the same token counts, and vLLM's
    client reads the cluster's speculative counters as the server counted its run, a run that drafted (k fixed: the
    module's server; timings: ``python -m benchmarks.served --workload agreement``)."""
    import asyncio

    from benchmarks.load import ours_flat, run, scrape, vllm_run
    from cluster.harness import load_prompts

    prompts = load_prompts(None, 8)
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    before, _ = scrape(HTTP)
    theirs = vllm_run(HTTP, tmp_path / "prompts.jsonl", 8, 4, 16, tmp_path)
    spec = scrape(HTTP)[0] - before
    ours = ours_flat(asyncio.run(run(HTTP, prompts, 16, 4, None, "ours", quiet=True)), 0.0)
    assert theirs["completed"] == ours["successful requests"] == 8 and theirs["failed"] == 0
    assert theirs["total_output_tokens"] == ours["output tokens"] == 8 * 16
    assert theirs["total_input_tokens"] > 0
    assert spec.num_drafts > 0, "the server drafted nothing in vLLM's client's run"
    assert theirs.get("spec_decode_num_drafts", 0) == spec.num_drafts
    assert theirs["spec_decode_acceptance_length"] == pytest.approx(spec.mean_acceptance_length, abs=0.01)
    assert theirs["spec_decode_acceptance_length"] > 1.0
