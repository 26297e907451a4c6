"""The verifier never depends on its drafters, served for real (``serve run``, HTTP through the ``openai`` client,
one cluster for the whole module, in this order):

1. started with no drafter application at all: it serves (``/health`` 200), outputs exact, ``/metrics`` shows
   ``eagle_cluster_drafters 0``, steps verified without drafts, and no draft token verified by vLLM;
2. the drafter application deployed afterwards (as ``serve deploy`` does): attached in the background, drafting;
3. the sole drafter (its replica process and its drafter actor) SIGSTOPped under load, then SIGCONTed: 0 failed,
   exact, ``eagle_cluster_drafters 0`` while it hangs, drafting again after;
4. the drafter application deleted under load and deployed again: drafting before the delete, requests in flight
   as it went and as it came back (the load keeps going until it is RUNNING), 0 failed, exact, drafting again.

Figures (seconds until drafting, longest gap between chunks is the benchmark's: ``benchmarks.faults``)
are printed; ``-s`` shows them. Greedy outputs are compared token for token with vLLM target-only.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from actors.metrics import from_prometheus_text
from cluster import deploy_yaml
from cluster.config import DRAFTER_APP_NAME
from cluster.harness import (
    EVERY_STEP_DRAFTS,
    app_status,
    cpu_yaml,
    deploy_apps,
    drafter_pids,
    get,
    join_ray,
    serve_run,
    without_drafter_app,
)
from tests.cluster.traffic import check_exact, send, spanning

pytestmark = [pytest.mark.slow, pytest.mark.isolated]
MAX_TOKENS = 48
NUM_PROMPTS = 16
CONCURRENCY = 16


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    from tests.actors import vllm_helpers as vh

    return vh.reference(NUM_PROMPTS, MAX_TOKENS)


@pytest.fixture(scope="module")
def full_doc(tmp_path_factory) -> dict:
    # Drafts at every step, never ``auto``, whatever the shipped YAML says: a hung drafter must be met under load.
    path = cpu_yaml(tmp_path_factory.mktemp("outage") / "full.yaml", speculative_config=EVERY_STEP_DRAFTS)
    return deploy_yaml.load(path)


@pytest.fixture(scope="module")
def server(reference, full_doc, tmp_path_factory):
    import ray

    path = deploy_yaml.write(without_drafter_app(full_doc), tmp_path_factory.mktemp("outage") / "alone.yaml")
    with serve_run(path) as proc:
        join_ray(proc, "outage-test")
        yield proc
        ray.shutdown()


def metrics() -> dict[str, float]:
    """``/metrics``' ``eagle_cluster_*`` samples (labels kept in the name) and vLLM's draft tokens verified."""
    status, body = get("/metrics", timeout=60)
    assert status == 200
    text = body.decode()
    out = {"draft_tokens": float(from_prometheus_text(text).num_draft_tokens)}
    for line in text.splitlines():
        if line.startswith("eagle_cluster_"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def wait_drafting(timeout_s: float = 60) -> float:
    """Short requests until the verifier uses a drafter and vLLM verifies draft tokens again; the seconds it took."""
    from cluster.harness import MODEL, post

    start, first = time.time(), metrics()["draft_tokens"]
    body = f'{{"model": "{MODEL}", "prompt": "def f(x):", "max_tokens": 16, "ignore_eos": true}}'.encode()
    while time.time() - start < timeout_s:
        post("/v1/completions", body, timeout=120)
        m = metrics()
        if m["eagle_cluster_drafters"] >= 1 and m["draft_tokens"] > first:
            return time.time() - start
        time.sleep(0.2)
    raise TimeoutError(f"not drafting {timeout_s} s later: {metrics()}")


def wait_running(name: str, timeout_s: float = 300) -> float:
    start = time.time()
    while (status := app_status(name)) != "RUNNING":
        assert status != "DEPLOY_FAILED" and time.time() - start < timeout_s, status
        time.sleep(0.5)
    return time.time() - start


def test_serves_with_no_drafter_application(server, reference):
    assert get("/health")[0] == 200
    results = asyncio.run(send(list(reference), CONCURRENCY, MAX_TOKENS))
    check_exact(results, reference)
    m = metrics()
    assert m["eagle_cluster_drafters"] == 0
    assert m["eagle_cluster_steps_without_drafts_total"] > 0
    assert m['eagle_cluster_undrafted_sequences_total{reason="no_drafter"}'] > 0
    assert m["draft_tokens"] == 0  # vLLM verified no draft token: the steps scheduled none
    assert get("/health")[0] == 200


def test_drafter_application_deployed_later_is_attached(server, reference, full_doc):
    deploy_apps(full_doc)
    took = wait_running(DRAFTER_APP_NAME)
    drafting = wait_drafting()
    print(f"\ndrafter application deployed after the verifier: RUNNING in {took:.1f} s, drafting {drafting:.1f} s "
          "after that")
    results = asyncio.run(send(list(reference), CONCURRENCY, MAX_TOKENS))
    check_exact(results, reference)


def test_sole_drafter_sigstopped_under_load(server, reference):
    before = metrics()
    (pids,) = drafter_pids()  # (replica process, drafter actor process): the CPU default's one drafter
    marks: dict[str, float] = {}
    seen_drafters: list[float] = []

    def fault(elapsed: float) -> None:
        if "stop" not in marks and elapsed > 2:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            marks["stop"] = time.time()
        elif "stop" in marks and "cont" not in marks:
            if time.time() - marks["stop"] > 1.5:
                seen_drafters.append(metrics()["eagle_cluster_drafters"])
            if time.time() - marks["stop"] > 5:
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)
                marks["cont"] = time.time()

    try:
        # Long enough to outlast the fault: without drafts the verifier runs at target-only speed meanwhile.
        results = asyncio.run(send(list(reference) * 8, CONCURRENCY, MAX_TOKENS, during=fault))
    finally:
        if "stop" in marks and "cont" not in marks:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
    check_exact(results, reference)
    assert "cont" in marks, "the load ended before the drafter was resumed"
    during = metrics()
    assert 0 in seen_drafters, seen_drafters  # /metrics said so while the drafter hung
    assert during["eagle_cluster_steps_without_drafts_total"] > before["eagle_cluster_steps_without_drafts_total"]
    drafting = wait_drafting()
    print(f"\nsole drafter SIGSTOPped {marks['cont'] - marks['stop']:.1f} s under {CONCURRENCY} streams: 0 failed, "
          f"exact; drafting again {time.time() - marks['cont']:.1f} s after SIGCONT (probe {drafting:.1f} s)")


def test_drafter_application_deleted_and_redeployed_under_load(server, reference, full_doc):
    from ray import serve

    marks: dict[str, float] = {}
    errors: list[BaseException] = []
    done = threading.Event()
    drafts_at_start = metrics()["draft_tokens"]

    def redeploy() -> None:  # in a thread of its own, under the load; what it raises is raised below
        try:
            marks["drafted_before"] = metrics()["draft_tokens"] - drafts_at_start  # drafting under this load
            serve.delete(DRAFTER_APP_NAME)  # blocks until the application is gone
            marks["deleted"] = time.time()
            while metrics()["eagle_cluster_drafters"] and time.time() - marks["deleted"] < 10:
                time.sleep(0.2)  # the verifier drops the drafter at the first step that fails on it
            marks["drafters_after_delete"] = metrics()["eagle_cluster_drafters"]
            deploy_apps(full_doc)
            wait_running(DRAFTER_APP_NAME)
            marks["running"] = time.time()
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    thread = threading.Thread(target=redeploy)

    def fault(elapsed: float) -> None:
        if not thread.is_alive() and "started" not in marks and elapsed > 2:
            marks["started"] = time.time()
            thread.start()

    spans: list[tuple[float, float]] = []  # the load goes on until the application is back
    results = asyncio.run(send(list(reference), CONCURRENCY, MAX_TOKENS, during=fault, spans=spans,
                               until=done.is_set))
    thread.join()
    if errors:
        raise errors[0]
    check_exact(results, reference)
    assert marks["drafted_before"] > 0, "no draft token verified before the delete: drafting was off"
    assert marks["drafters_after_delete"] == 0
    # requests in flight the moment the application was gone, and the moment it was back
    going = spanning(spans, marks["deleted"], marks["deleted"])
    back = spanning(spans, marks["running"], marks["running"])
    assert going > 0 and back > 0, (going, back, len(spans))
    drafting = wait_drafting()
    print(f"\ndrafter application deleted under load ({marks['deleted'] - marks['started']:.1f} s), deployed again "
          f"(RUNNING {marks['running'] - marks['deleted']:.1f} s later): {len(results)} requests, 0 failed, exact, "
          f"{going} in flight when it was gone, {back} when it was back; drafting "
          f"{time.time() - marks['running']:.1f} s after RUNNING (probe {drafting:.1f} s)")
