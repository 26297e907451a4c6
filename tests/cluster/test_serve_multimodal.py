"""The multimodal CPU config served for real (`serve run deploy/cpu-mm.yaml`): chat requests with images through
the `openai` client give, greedy, the text vLLM target-only gives for the same messages on the same checkpoint;
the Python handle takes images too; bad images get a 400 naming the problem and the server keeps serving."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

from cluster import deploy_yaml
from cluster.harness import HTTP, ray_env, serve_run
from cluster.harness import post as _post
from cluster.image_runs import image_prompts
from cluster.images import data_url
from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.isolated]
MM_YAML = ROOT / "deploy" / "cpu-mm.yaml"
MODEL = "llama4-tiny-mm"
MAX_TOKENS = 24


def _messages(prompt: dict) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": data_url(im)}} for im in prompt["multi_modal_data"]["image"]]
    text = prompt["prompt"].replace("<|image|>", "")
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    doc = deploy_yaml.with_changes(deploy_yaml.load(MM_YAML), absolute=True)
    with serve_run(deploy_yaml.write(doc, tmp_path_factory.mktemp("app") / "app.yaml")) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=HTTP + "/v1", api_key="unused")


def test_image_chats_match_vllm_target_only(client):
    from vllm import SamplingParams

    from actors.vllm_engine import make_llm

    conversations = [_messages(p) for p in image_prompts(8)]
    got = [client.chat.completions.create(model=MODEL, messages=m, max_tokens=MAX_TOKENS, temperature=0)
           for m in conversations]
    llm = make_llm(str(ROOT / "models" / MODEL), limit_mm_per_prompt={"image": 2})
    try:
        ref = llm.chat(conversations, SamplingParams(max_tokens=MAX_TOKENS, temperature=0), use_tqdm=False)
    finally:
        del llm
    assert [g.choices[0].message.content for g in got] == [r.outputs[0].text for r in ref]
    assert all(g.usage.prompt_tokens > 20 for g in got)  # the image tokens are in the prompt


def test_bad_images_are_400_and_serving_goes_on(client):
    good = data_url(image_prompts(1)[0]["multi_modal_data"]["image"][0])
    svg = "data:image/svg+xml;base64," + base64.b64encode(b"<svg/>").decode()
    cases = [
        ("data:image/png;base64,%%%", "not valid base64"),
        (svg, "unsupported image type 'image/svg+xml'"),
        ("https://example.com/cat.png", "remote image URLs are not fetched"),
    ]
    for url, reason in cases:
        body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "x"}]}]}
        status, out = _post("/v1/chat/completions", json.dumps(body).encode())
        assert status == 400 and reason in out["error"]["message"], out
    three = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
        *[{"type": "image_url", "image_url": {"url": good}}] * 3, {"type": "text", "text": "x"}]}]}
    status, out = _post("/v1/chat/completions", json.dumps(three).encode())
    assert status == 400 and "at most 2" in out["error"]["message"], out
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": good}},
                                             {"type": "text", "text": "def f("}]}]
    ok = client.chat.completions.create(model=MODEL, max_tokens=4, temperature=0, messages=messages)
    assert ok.choices[0].message.content


def test_python_handle_takes_images(server):
    code = """
import ray
from ray import serve
from cluster.image_runs import image_prompts
from cluster.images import data_url
ray.init(address="auto")
img = image_prompts(1)[0]["multi_modal_data"]["image"][0]
h = serve.get_app_handle("eagle-cluster")
msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(img)}},
                                     {"type": "text", "text": "def f("}]}]
out = h.chat.remote(msgs, max_tokens=8, temperature=0).result()
print("TOKENS", out["usage"]["completion_tokens"], out["usage"]["prompt_tokens"])
"""
    env = {**os.environ, **ray_env(server)}  # its ray.init(address="auto") reads RAY_ADDRESS first
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("TOKENS"))
    assert int(line.split()[1]) == 8 and int(line.split()[2]) > 20
