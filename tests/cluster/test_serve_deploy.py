"""``serve deploy`` the long-lived way, with real processes: ``ray start --head`` in another folder, ``serve
deploy`` of the CPU default (its relative model paths unchanged; k fixed, ``EVERY_STEP_DRAFTS``, so that the load
drafts), completions through the ``openai`` client, then two redeploys and what each costs:

- the drafter application (``num_replicas: 2`` in its args) while 16 requests stream (streams started again as
  each ends, until the drafter replicas changed): drafting was on before the swap, streams were in flight as it
  was seen, every stream finishes with greedy output identical to vLLM target-only, and the verifier's replica
  process is the same one;
- target model (a copy of the checkpoint in another folder): a new verifier replica (and new drafters); the seconds
  without service are printed (``-s``) and written in the README.

Then ``serve shutdown``, and this Ray's processes ended (``cluster.harness.stop_ray``: not another Ray on the host).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from actors.metrics import from_prometheus_text
from cluster import deploy_yaml
from cluster.config import APP_NAME, DRAFTER_APP_NAME, DRAFTER_DEPLOYMENT
from cluster.harness import EVERY_STEP_DRAFTS, HTTP, MODEL, get, stop_ray
from tests.cluster.traffic import spanning
from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.isolated]
MAX_TOKENS = 48
NUM_STREAMS = 16
BIN = Path(sys.executable).parent
ENV = {**os.environ, "RAY_AUTH_MODE": "token"}  # what Ray 2.60's CLI needs after `ray start` (see README)


def cli(*args: str, cwd: Path, check: bool = True, timeout: float = 300) -> str:
    r = subprocess.run([str(BIN / args[0]), *args[1:]], cwd=cwd, env=ENV, capture_output=True, text=True,
                       timeout=timeout)
    if check and r.returncode:
        raise RuntimeError(f"{' '.join(args)} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


def replica_pids(deployment: str, cwd: Path) -> set[int]:
    """The process ids of one deployment's alive replicas (Ray's state CLI: this process never joins the cluster)."""
    app = DRAFTER_APP_NAME if deployment == DRAFTER_DEPLOYMENT else APP_NAME
    out = cli("ray", "list", "actors", "--format", "json", "--limit", "1000", "--filter", "state=ALIVE",
              "--filter", f"class_name=ServeReplica:{app}:{deployment}", cwd=cwd)
    return {a["pid"] for a in json.loads(out)} if out.lstrip().startswith("[") else set()


def app_yaml(tmp: Path, name: str, drafter: dict | None = None, **sections: dict) -> Path:
    """The shipped ``deploy/cpu.yaml`` (relative model paths kept) drafting at every step (``EVERY_STEP_DRAFTS``),
    ``sections`` merged in (``drafter``: into the drafter application's args)."""
    doc = deploy_yaml.with_changes(deploy_yaml.load(), drafter=drafter,
                                   **{"speculative_config": EVERY_STEP_DRAFTS, **sections})
    return deploy_yaml.write(doc, tmp / name)


def wait_running(cwd: Path, timeout_s: float = 600, replicas: dict[str, int] | None = None) -> float:
    """Until ``serve status`` says both applications are RUNNING (and the deployments have these many
    replicas); the seconds it took."""
    start = time.time()
    while time.time() - start < timeout_s:
        status = yaml.safe_load(cli("serve", "status", cwd=cwd, check=False) or "{}") or {}
        apps = [(status.get("applications") or {}).get(name) or {} for name in (APP_NAME, DRAFTER_APP_NAME)]
        if any(app.get("status") == "DEPLOY_FAILED" for app in apps):
            raise RuntimeError(f"deploy failed: {apps}")
        running = all(app.get("status") == "RUNNING" for app in apps)
        if running and all(len(replica_pids(d, cwd)) == n for d, n in (replicas or {}).items()):
            return time.time() - start
        time.sleep(2)
    raise TimeoutError(f"the app was not RUNNING in {timeout_s} s")


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    from tests.actors import vllm_helpers as vh

    return vh.reference(NUM_STREAMS, MAX_TOKENS)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, reference):
    """A Ray head started in a folder that is not the project's; stopped (with Serve) afterwards."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    stop_ray()  # a Ray a crashed run left in this folder (not another lane's: ``tests.run_isolated``)
    cli("ray", "start", "--head", "--num-cpus", "4", "--disable-usage-stats", cwd=elsewhere)
    try:
        yield elsewhere
    finally:
        cli("serve", "shutdown", "-y", cwd=elsewhere, check=False)
        stop_ray()


async def _streams(prompts: list[str], during=None, spans: list[tuple[float, float]] | None = None,
                   until: Callable[[], bool] | None = None) -> list[tuple[str, list[int] | str]]:
    """Stream ``prompts`` at once; ``during()`` runs in a thread once every stream has its first tokens. ``spans``
    gets each stream's (start, end) wall times; ``until``: each prompt is streamed again as its stream ends, until
    it returns True."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=HTTP + "/v1", api_key="unused", max_retries=0, timeout=600)
    started = asyncio.Event()
    first = 0

    async def one(prompt: str) -> tuple[str, list[int] | str]:
        nonlocal first
        ids: list[int] = []
        start = time.time()
        try:
            stream = await client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True,
                extra_body={"ignore_eos": True, "return_token_ids": True})
            async for chunk in stream:
                if chunk.choices:
                    if not ids:
                        first += 1
                        if first == len(prompts):
                            started.set()
                    ids += chunk.choices[0].token_ids or []
            return prompt, ids
        except Exception as e:
            return prompt, f"{type(e).__name__}: {e}"
        finally:
            if spans is not None:
                spans.append((start, time.time()))

    async def lane(prompt: str) -> list[tuple[str, list[int] | str]]:
        out = [await one(prompt)]
        while until is not None and not until():
            out.append(await one(prompt))
        return out

    tasks = [asyncio.create_task(lane(p)) for p in prompts]
    if during is not None:
        await asyncio.wait_for(started.wait(), timeout=300)
        await asyncio.to_thread(during)
    results = [r for lane_results in await asyncio.gather(*tasks) for r in lane_results]
    await client.close()
    return results


def _check(results, reference) -> None:
    failed = [r for _, r in results if isinstance(r, str)]
    assert not failed, failed[:3]
    assert all(ids == reference[p] for p, ids in results), "outputs differ from target-only"


def _pid(deployment: str, cwd: Path) -> int:
    (pid,) = replica_pids(deployment, cwd)
    return pid


def test_deploy_from_another_folder_serves_exact(cluster, reference, tmp_path):
    cli("serve", "deploy", str(app_yaml(tmp_path, "v1.yaml")), cwd=cluster)
    took = wait_running(cluster)
    print(f"\nserve deploy -> RUNNING: {took:.0f} s")
    assert DRAFTER_APP_NAME in cli("serve", "config", cwd=cluster)
    results = asyncio.run(_streams(list(reference)[:4]))
    _check(results, reference)


def _drafts() -> int:
    """vLLM's drafts verified so far (``/metrics``)."""
    return from_prometheus_text(get("/metrics")[1].decode()).num_drafts


def test_drafter_redeploy_under_16_streams_keeps_the_verifier(cluster, reference, tmp_path):
    verifier_pid = _pid("Verifier", cluster)
    drafter_before = _pid("Drafter", cluster)
    v2 = app_yaml(tmp_path, "v2.yaml", drafter={"num_replicas": 2})
    marks: dict[str, float] = {}
    errors: list[BaseException] = []
    drafts_at_start = _drafts()
    done = threading.Event()

    def redeploy() -> None:  # in a thread of its own, under the streams; what it raises is raised below
        try:
            deadline = time.time() + 60  # drafts verified under this load, before the swap
            while (drafted := _drafts() - drafts_at_start) == 0 and time.time() < deadline:
                time.sleep(0.2)
            marks["drafts_before"] = drafted
            marks["deploy"] = time.time()
            cli("serve", "deploy", str(v2), cwd=cluster)
            while True:  # the swap: the drafter deployment's replicas change
                polled = time.time()
                if replica_pids("Drafter", cluster) not in (set(), {drafter_before}):
                    marks["swapped"] = time.time()
                    return
                assert polled - marks["deploy"] < 300, "the drafter replicas never changed"
                time.sleep(0.5)
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    thread = threading.Thread(target=redeploy)
    spans: list[tuple[float, float]] = []
    results = asyncio.run(_streams(list(reference), during=thread.start, spans=spans, until=done.is_set))
    marks["streams_done"] = time.time()
    thread.join()
    if errors:
        raise errors[0]
    _check(results, reference)
    assert marks["drafts_before"] > 0, "no draft verified before the swap: drafting was off"
    # in flight when the new replica set was seen (the change came after the poll before it: ``ray list actors``
    # takes seconds, longer than a stream here, so "in flight across that whole interval" is not asked)
    across = spanning(spans, marks["swapped"], marks["swapped"])
    assert across > 0, f"no stream was in flight when the drafter replicas changed ({len(spans)} streams)"
    took = wait_running(cluster, replicas={"Drafter": 2})
    assert _pid("Verifier", cluster) == verifier_pid, "a drafter-side redeploy restarted the verifier"
    first = "kept" if drafter_before in replica_pids("Drafter", cluster) else "replaced"
    print(f"\ndrafter redeploy under {NUM_STREAMS} streams: all exact; 2 drafters RUNNING "
          f"{marks['streams_done'] - marks['deploy'] + took:.0f} s after the deploy; verifier pid {verifier_pid} "
          f"kept; first drafter {first}; {len(spans)} streams, {across} in flight at the swap")


def test_target_model_redeploy_restarts_the_verifier(cluster, reference, tmp_path):
    verifier_pid = _pid("Verifier", cluster)
    target = tmp_path / "llama4-tiny-copy"
    shutil.copytree(ROOT / "models" / "llama4-tiny", target)
    v3 = app_yaml(tmp_path, "v3.yaml", verifier={"model": str(target)}, drafter={"num_replicas": 2})
    start = time.time()
    cli("serve", "deploy", str(v3), cwd=cluster)
    down: list[float] = []  # when a health probe failed
    while time.time() - start < 600:
        try:
            ok = get("/health", timeout=2)[0] == 200
        except OSError:
            ok = False
        if not ok:
            down.append(time.time())
        pids = replica_pids("Verifier", cluster)
        if ok and pids and verifier_pid not in pids:
            break
        time.sleep(0.5)
    wait_running(cluster)
    assert _pid("Verifier", cluster) != verifier_pid
    results = asyncio.run(_streams(list(reference)[:4]))
    _check(results, reference)  # same weights, another folder: the same outputs
    print(f"\ntarget-model redeploy: new verifier serving {time.time() - start:.0f} s after the deploy; "
          f"health probes failed for {(down[-1] - down[0]) if down else 0:.0f} s")
