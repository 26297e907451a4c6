"""``eagle-cluster serve`` for real: the issue's command line serves the CPU default on 127.0.0.1:8000 with greedy
outputs identical to vLLM target-only; its ``--write-config`` YAML, served by ``serve run``, answers the same, and
every metric the Grafana dashboard's panels query is on that cluster's ``/metrics``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from cluster import dashboard
from cluster.harness import (
    HTTP,
    SERVE_PORTS,
    end_session,
    get,
    kill_orphaned_haproxy,
    load_prompts,
    serve_run,
    session_processes,
    start,
    stop,
    stop_ray,
    wait_healthy,
)
from cluster.serve_cli import GRACE_S
from tests.conftest import ROOT
from tests.waits import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.isolated]

SPEC = '{"method": "eagle3", "model": "models/eagle3-llama4-tiny", "num_speculative_tokens": 3}'
COMMAND = [sys.executable, "-m", "cluster.cli", "serve", "models/llama4-tiny", "--speculative-config", SPEC,
           "--max-model-len", "1024"]
MAX_TOKENS = 24
NUM_PROMPTS = 3


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    """vLLM target-only greedy text for each prompt (``ignore_eos``: every answer is MAX_TOKENS long)."""
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from tests.actors import vllm_helpers as vh

    prompts = load_prompts(None, NUM_PROMPTS)
    ids, _ = vh.target_only(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))
    tok = AutoTokenizer.from_pretrained(ROOT / "models/llama4-tiny")
    return {p: tok.decode(i) for p, i in zip(prompts, ids, strict=True)}


def served_texts(model: str, prompts: list[str]) -> dict[str, str]:
    from openai import OpenAI

    client = OpenAI(base_url=HTTP + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == [model]
    out = {}
    for p in prompts:
        r = client.completions.create(model=model, prompt=p, max_tokens=MAX_TOKENS, temperature=0,
                                      extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == MAX_TOKENS
        out[p] = r.choices[0].text
    return out


def test_cli_serves_greedy_identical_to_target_only(reference, tmp_path):
    log = tmp_path / "cli.log"
    proc = start(COMMAND, log=log, ports=SERVE_PORTS)
    try:
        wait_healthy(proc, HTTP, 600, log)
        # vLLM's default served name: the model as given on the command line
        assert served_texts("models/llama4-tiny", list(reference)) == reference
        status, body = get("/metrics")
        assert status == 200 and b"vllm:spec_decode_num_drafts_total" in body
        before = session_processes(proc.pid)
    finally:
        took = stop(proc, end_left=False)  # what the server leaves is looked at below, then ended
    # Ctrl-C (SIGINT to the process group, as a terminal sends it) stops the server itself, within its bound, and
    # every process it started with it (Ray's, vLLM's engine processes, HAProxy).
    try:
        assert proc.returncode != -signal.SIGKILL, "the harness had to SIGKILL it"
        assert took < GRACE_S + 20, f"stopped {took:.1f} s after Ctrl-C"
        assert len(before) > 3  # Ray's GCS, raylet, workers: the check below would find a live one
        assert wait_for(lambda: not session_processes(proc.pid), timeout_s=30), session_processes(proc.pid)
    finally:
        end_session(proc.pid)
        stop_ray()
        kill_orphaned_haproxy()


def test_written_config_serve_run_same_outputs_and_dashboard_metrics(reference, tmp_path):
    path = tmp_path / "app.yaml"
    done = subprocess.run([*COMMAND, "--write-config", str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with serve_run(path):
        assert served_texts("models/llama4-tiny", list(reference)) == reference
        status, body = get("/metrics")
        assert status == 200
        missing = dashboard.missing(dashboard.load(), body.decode())
    # Every panel's metrics, the admission counter included: the verifier replica admits requests, and its
    # registry is what /metrics renders.
    assert not missing, json.dumps({k: sorted(v) for k, v in missing.items()}, indent=1)
