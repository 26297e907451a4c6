"""Fault and stress runs on a served cluster under load: a drafter stopped (SIGSTOP) and resumed, the drafter
application deleted and deployed again, overload past what the ingress admits, a ``/metrics`` soak, and the drafter
pool growing under load. Each serves a ``benchmarks.modes`` cluster mode (``--mode``) through its launcher, nothing
pinned: the verifier, the drafters and this client share the machine's cores.

    python -m benchmarks.faults drafter-stop [--streams 32] [--stop-s 20] [--max-tokens 96]
    python -m benchmarks.faults only-drafter-stop [--requests-per-stream 4]
    python -m benchmarks.faults drafter-redeploy [--requests-per-stream 4]
    python -m benchmarks.faults overload [--limit 8] [--factor 4] [--requests 256] [--max-tokens 32]
    python -m benchmarks.faults metrics-soak [--requests 2000] [--concurrency 16] [--max-tokens 16]
    python -m benchmarks.faults pool-scale [--max-tokens 96]

- ``drafter-stop`` (default mode ``cluster-eagle3-k3-d2``: two drafter replicas, k = 3 at every step, never ``auto``,
  which may draft nothing at 32 streams on a CPU): ``--streams`` clients stream greedy completions back to back,
  ``--warmup-s`` before the stop, ``--stop-s`` stopped, ``--after-s`` after. The drafter actor of the replica holding
  most of the verifier's sequences is SIGSTOPped. Reports failed requests, outputs that differ from vLLM
  target-only (run first, offline, same prompts), the longest gap between two chunks of a stream, the verifier's
  deadline for a drafter, the draft client's events (dropped, re-homed, readmitted), and the acceptance length
  before, during and after the stop.
- ``only-drafter-stop`` (``cluster-eagle3-k3``): the only drafter's replica process and actor both SIGSTOPped;
  each stream sends ``--requests-per-stream`` requests, once without the fault and once with it: both wall times
  (goal: with <= 1.5x without + 5 s), failures, exactness, the longest gap, and how long after SIGCONT the verifier
  drafted again.
- ``drafter-redeploy`` (``cluster-eagle3-k3``): the same workload; ``--warmup-s`` in, the drafter application is
  deleted (``serve.delete``) and deployed again: wall time, failures, exactness, the longest gap, how long after it
  was RUNNING again the verifier drafted again (goal: <= 10 s).
- ``overload`` (``cluster-eagle3``, ``ingress.max_inflight_requests: LIMIT``): each distinct prompt alone first (the
  reference tokens), then ``--requests`` with LIMIT x FACTOR in flight: 200s and 503s (with ``Retry-After``, at
  once), admitted requests' exactness, the verifier's and drafters' resident memory before and after.
- ``metrics-soak`` (``cluster-eagle3``): ``--requests`` requests with ``/metrics`` scraped every second: the scrape's
  time and size in the first and last 10% of the run, and resident memory at every tenth (both should be flat).
- ``pool-scale`` (``cluster-eagle3`` with an autoscaled pool: min 1, max 2, 8 sequences per replica): seconds from
  the start of a concurrency-32 load to the second replica drafting its first step.

The verifier alone (no drafter application) against vLLM target-only, and fixed pools of 1 and 2 drafters, are
served runs: ``python -m benchmarks.served --pinning none --modes target-only cluster-eagle3-nodrafter`` and
``--modes cluster-eagle3-d1 cluster-eagle3-d2``.

Each run prints ``benchmarks.stamp``'s line first (commit, date, hardware, the machine's other busy processes).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import statistics
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from actors.metrics import SpecDecodeStats, from_prometheus_text
from benchmarks import load, modes, stamp
from cluster.config import APP_NAME, DRAFTER_APP_NAME, DRAFTER_DEPLOYMENT
from cluster.harness import HTTP, MODEL, load_prompts

DEFAULT_MODES = {"drafter-stop": "cluster-eagle3-k3-d2", "only-drafter-stop": "cluster-eagle3-k3",
                 "drafter-redeploy": "cluster-eagle3-k3", "overload": "cluster-eagle3",
                 "metrics-soak": "cluster-eagle3", "pool-scale": "cluster-eagle3"}
AUTOSCALED = {"num_replicas": None, "autoscaling_config": {
    "min_replicas": 1, "max_replicas": 2, "target_sequences_per_replica": 8, "upscale_delay_s": 0,
    "downscale_delay_s": 600, "look_back_period_s": 4, "metrics_interval_s": 0.5}}


# --- the server, through Ray -------------------------------------------------------------------------------------
@contextmanager
def served(mode: modes.Mode, overrides: dict[str, dict[str, Any]] | None = None, ray: bool = True
           ) -> Iterator[str]:
    """``mode``'s server (``benchmarks.modes.launch``, nothing pinned), with this process a Ray driver of its
    cluster if ``ray``; yields the base URL."""
    with tempfile.TemporaryDirectory() as tmp, modes.launch(mode, "none", Path(tmp), overrides=overrides) as srv:
        if not ray:
            yield srv.base
            return
        import ray as ray_

        ray_.init(address="auto", namespace="faults", log_to_driver=False)
        try:
            yield srv.base
        finally:
            ray_.shutdown()


def spec(base: str = HTTP) -> SpecDecodeStats:
    return from_prometheus_text(load.metrics_text(base))


def verifier_client_stats() -> dict:
    """The verifier's draft client's stats (``ProposerStats.client``): drafters in use, homes, deadline, events."""
    from ray import serve

    handle = serve.get_deployment_handle("Verifier", app_name=APP_NAME)
    return handle.spec_stats.remote().result(timeout_s=30).client


def short_request(base: str = HTTP) -> None:
    body = f'{{"model": "{MODEL}", "prompt": "def f(x):", "max_tokens": 8}}'.encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=120).read()


def warm_up(num_drafters: int, timeout_s: float = 180) -> None:
    """Short requests until the verifier's draft client uses every drafter replica (it learns them from the
    pool's router, about one a second)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        short_request()
        if verifier_client_stats()["drafters"] >= num_drafters:
            return
        time.sleep(0.5)
    raise TimeoutError(f"the verifier did not find {num_drafters} drafters in {timeout_s} s")


def drafting_again(since: float, timeout_s: float = 120) -> float:
    """Short requests until the verifier uses a drafter and vLLM verifies draft tokens again: seconds after
    ``since``."""
    first = spec().num_draft_tokens
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        short_request()
        if verifier_client_stats()["drafters"] >= 1 and spec().num_draft_tokens > first:
            return time.time() - since
        time.sleep(0.2)
    return float("nan")


def reference(prompts: list[str], max_tokens: int) -> dict[str, list[int]]:
    """vLLM target-only greedy token ids (offline engine, before the server starts)."""
    from vllm import SamplingParams

    from actors.vllm_engine import make_llm
    from cluster.harness import TARGET

    llm = make_llm(str(TARGET))
    try:
        outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
        return {o.prompt: list(o.outputs[0].token_ids) for o in outs}
    finally:
        del llm
        gc.collect()


# --- clients ------------------------------------------------------------------------------------------------------
async def streams(base: str, prompts: list[str], ref: dict[str, list[int]], n: int, max_tokens: int,
                  until: Callable[[], float], on_tick: Callable[[], None], per_stream: int | None = None) -> dict:
    """``n`` clients streaming greedy completions back to back until time ``until()`` (or ``per_stream`` requests
    each); ``on_tick()`` every 0.5 s meanwhile. Counts requests, failures, outputs differing from ``ref``, and the
    longest gap between two chunks of a stream (after its first)."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
    out: dict[str, Any] = {"requests": 0, "failed": [], "wrong": 0, "max_gap_s": 0.0, "max_gap_at": 0.0}

    async def user(i: int) -> None:
        j = i
        while time.time() < until() and (per_stream is None or (j - i) // n < per_stream):
            prompt = prompts[j % len(prompts)]
            j += n
            ids: list[int] = []
            last = None  # the first chunk's wait is queueing and prefill (TTFT), not a stall
            try:
                stream = await client.completions.create(
                    model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                    extra_body={"ignore_eos": True, "return_token_ids": True})
                async for chunk in stream:
                    now = time.time()
                    if last is not None and now - last > out["max_gap_s"]:
                        out["max_gap_s"], out["max_gap_at"] = now - last, now
                    last = now
                    if chunk.choices:
                        ids += list(getattr(chunk.choices[0], "token_ids", None) or [])
            except Exception as e:
                out["failed"].append(f"{type(e).__name__}: {e}"[:200])
                continue
            out["requests"] += 1
            out["wrong"] += ids != ref[prompt]

    tasks = [asyncio.create_task(user(i)) for i in range(n)]
    while not all(t.done() for t in tasks):
        await asyncio.to_thread(on_tick)
        await asyncio.sleep(0.5)
    await asyncio.gather(*tasks)
    await client.close()
    return out


async def one(client: Any, prompt: str, max_tokens: int) -> tuple[int, list[int] | None, str | None]:
    """(HTTP status, token ids of a 200, the Retry-After of a 503)."""
    import openai

    try:
        out = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                              extra_body={"ignore_eos": True, "return_token_ids": True})
        return 200, list(out.choices[0].token_ids), None
    except openai.APIStatusError as e:
        return e.status_code, None, e.response.headers.get("retry-after")


async def overload(base: str, prompts: list[str], ref: dict[str, list[int]] | None, in_flight: int, total: int,
                   max_tokens: int) -> dict:
    """``total`` requests, ``in_flight`` at all times (a 503's slot goes to the next request); with ``ref`` None,
    each distinct prompt is first sent alone for its reference tokens. Statuses, admitted requests with tokens
    other than the reference, the Retry-After values and the slowest 503."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
    if ref is None:
        ref = {}
        for prompt in dict.fromkeys(prompts):  # alone: greedy, the tokens every admitted request must get
            status, ids, _ = await one(client, prompt, max_tokens)
            assert status == 200 and ids is not None, status
            ref[prompt] = ids
    sem = asyncio.Semaphore(in_flight)
    statuses: Counter[int] = Counter()
    wrong, retry_after, slowest_503 = 0, set(), 0.0

    async def guarded(i: int) -> None:
        nonlocal wrong, slowest_503
        prompt = prompts[i % len(prompts)]
        async with sem:
            t = time.perf_counter()
            status, ids, retry = await one(client, prompt, max_tokens)
        statuses[status] += 1
        if status == 200 and ids != ref[prompt]:
            wrong += 1
        if status == 503:
            retry_after.add(retry)
            slowest_503 = max(slowest_503, time.perf_counter() - t)

    start = time.perf_counter()
    await asyncio.gather(*(guarded(i) for i in range(total)))
    took = time.perf_counter() - start
    await client.close()
    return {"statuses": dict(statuses), "wrong": wrong, "retry_after": sorted(map(str, retry_after)),
            "slowest_503_s": slowest_503, "seconds": took}


class Scraper(threading.Thread):
    """GET ``base/metrics`` every ``period_s``: (time, seconds the scrape took, bytes) per scrape."""

    def __init__(self, base: str = HTTP, period_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.base, self.period_s = base, period_s
        self.scrapes: list[tuple[float, float, int]] = []
        self.errors = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            t = time.perf_counter()
            try:
                with urllib.request.urlopen(self.base + "/metrics", timeout=30) as r:
                    size = len(r.read())
                self.scrapes.append((time.time(), time.perf_counter() - t, size))
            except OSError:
                self.errors += 1
            self.done.wait(max(0.0, self.period_s - (time.perf_counter() - t)))


async def requests(base: str, prompts: list[str], total: int, concurrency: int, max_tokens: int,
                   progress: Callable[[int], None]) -> dict:
    """``total`` plain (not streamed) requests, ``concurrency`` at a time; ``progress(done)`` after each."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
    sem = asyncio.Semaphore(concurrency)
    out = {"ok": 0, "failed": 0}

    async def one_request(i: int) -> None:
        async with sem:
            try:
                await client.completions.create(model=MODEL, prompt=prompts[i % len(prompts)],
                                                max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True})
                out["ok"] += 1
            except Exception:
                out["failed"] += 1
            progress(out["ok"] + out["failed"])

    await asyncio.gather(*(one_request(i) for i in range(total)))
    await client.close()
    return out


def rss_mb(marker: str, tree: bool = True) -> float:
    """Resident MB of the processes whose command line holds ``marker``, and (``tree``) of their children."""
    import psutil

    seen: dict[int, float] = {}
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []):
                for q in [p, *p.children(recursive=True)] if tree else [p]:
                    seen[q.pid] = q.memory_info().rss / 2**20
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return sum(seen.values())


def memory(split: bool = False) -> dict[str, float]:
    """Resident MB of the verifier (its Serve replica and the vLLM engine processes under it) and of the drafters
    (replicas and actors); ``split``: also the verifier's engine-core process alone, and the verifier replica's own
    process (which is the ingress)."""
    out = {"verifier": rss_mb(f"ServeReplica:{APP_NAME}:Verifier"),
           "drafters": rss_mb(f"ServeReplica:{DRAFTER_APP_NAME}:{DRAFTER_DEPLOYMENT}") + rss_mb("DrafterActor")}
    if split:
        out["verifier engine core"] = rss_mb("VLLM::EngineCore")
        out["ingress"] = rss_mb(f"ServeReplica:{APP_NAME}:Verifier", tree=False)
    return out


def stream_report(name: str, result: dict, took: float) -> str:
    return (f"{name}: {took:.1f} s, requests {result['requests']}, failed {len(result['failed'])}, differing from "
            f"target-only {result['wrong']}, longest gap between two chunks {result['max_gap_s']:.2f} s")


# --- the runs -----------------------------------------------------------------------------------------------------
def drafter_stop(args: argparse.Namespace, mode: modes.Mode, prompts: list[str]) -> None:
    """One of two drafters' actor SIGSTOPped under load: fail-over, exactness, the stall, acceptance."""
    from cluster.harness import drafter_stats, replica_actors

    ref = reference(prompts, args.max_tokens)
    marks: dict[str, Any] = {}
    with served(mode):
        pids = {a["replica_id"]: drafter_stats(a["replica_id"])["pid"] for a in replica_actors(DRAFTER_DEPLOYMENT)}
        warm_up(len(pids))
        marks["start"] = spec()
        stop_at = time.time() + args.warmup_s

        def until() -> float:
            return marks["resumed"] + args.after_s if "resumed" in marks else float("inf")

        def on_tick() -> None:
            now = time.time()
            if "stopped" not in marks and now >= stop_at:
                t = time.time()
                client = verifier_client_stats()
                homes = client["homes"]
                if sum(1 for rid in pids if homes.get(rid, 0) > 0) < 2 and now < stop_at + 30:
                    return  # stop a drafter in use, with another in use to fail over to
                marks["victim"] = max(pids, key=lambda rid: homes.get(rid, 0))
                marks["homes"], marks["deadline_s"], marks["before"] = homes, client["deadline_s"], spec()
                marks["stopped"], marks["tick_s"] = time.time(), time.time() - t
                os.kill(pids[marks["victim"]], signal.SIGSTOP)
            elif "stopped" in marks and "resumed" not in marks and now >= marks["stopped"] + args.stop_s:
                marks["during"] = spec()
                os.kill(pids[marks["victim"]], signal.SIGCONT)
                marks["resumed"] = time.time()

        try:
            result = asyncio.run(streams(HTTP, prompts, ref, args.streams, args.max_tokens, until, on_tick))
        finally:
            if "stopped" in marks and "resumed" not in marks:
                os.kill(pids[marks["victim"]], signal.SIGCONT)
        marks["end"] = spec()
        client = verifier_client_stats()
    events = [(round(t - marks["stopped"], 2), kind, n) for t, kind, n in client["events"] if t >= marks["stopped"]]
    before, during = marks["before"] - marks["start"], marks["during"] - marks["before"]
    after = marks["end"] - marks["during"]
    print(f"# {mode.name}, a drafter stopped: {args.streams} streams of {args.max_tokens} tokens back to back; drafter "
          f"actor of {marks['victim']} (homing {marks['homes'].get(marks['victim'], 0)} of the verifier's sequences) "
          f"SIGSTOPped {marks['resumed'] - marks['stopped']:.1f} s; verifier, drafters and client on this machine's "
          f"{os.cpu_count()} cores")
    print(f"requests finished: {result['requests']}  failed: {len(result['failed'])}  "
          f"outputs differing from target-only: {result['wrong']}")
    print(f"the verifier's deadline for a drafter at the stop: {marks['deadline_s']:.2f} s")
    print(f"longest gap between two chunks of a stream (after its first): {result['max_gap_s']:.2f} s "
          f"({result['max_gap_at'] - marks['stopped']:+.1f} s from the stop)")
    print(f"(reading the verifier's stats and /metrics before the stop took {marks['tick_s']:.1f} s under this load)")
    print(f"draft client events after the stop (s from it, kind, sequences): {events}")
    print(f"acceptance length: before {before.mean_acceptance_length:.2f}, during the stop "
          f"{during.mean_acceptance_length:.2f}, after {after.mean_acceptance_length:.2f}; drafters in use at the "
          f"end {client.get('drafters')}, quarantined {client.get('quarantined')}")
    if result["failed"]:
        print("failures:", result["failed"][:3])


def only_drafter_stop(args: argparse.Namespace, mode: modes.Mode, prompts: list[str]) -> None:
    """The sole drafter (replica process and drafter actor) stopped, against the same workload without a fault."""
    from cluster.harness import drafter_pids

    ref = reference(prompts, args.max_tokens)

    def run(fault: bool, pids: tuple[int, int]) -> tuple[dict, float, dict]:
        marks: dict[str, float] = {}
        start = time.time()

        def on_tick() -> None:
            now = time.time()
            if fault and "stopped" not in marks and now >= start + args.warmup_s:
                for pid in pids:
                    os.kill(pid, signal.SIGSTOP)
                marks["stopped"] = time.time()
            elif "stopped" in marks and "resumed" not in marks and now >= marks["stopped"] + args.stop_s:
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)
                marks["resumed"] = time.time()

        try:
            result = asyncio.run(streams(HTTP, prompts, ref, args.streams, args.max_tokens, lambda: float("inf"),
                                         on_tick, per_stream=args.requests_per_stream))
        finally:
            if "stopped" in marks and "resumed" not in marks:
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)
                marks["resumed"] = time.time()
        return result, time.time() - start, marks

    with served(mode):
        warm_up(1)
        (pids,) = drafter_pids()
        clean, clean_s, _ = run(False, pids)
        before = spec()
        hung, hung_s, marks = run(True, pids)
        during = spec() - before
        again = drafting_again(marks["resumed"])
        client = verifier_client_stats()
    print(f"# {mode.name}, the only drafter stopped: {args.streams} streams x {args.requests_per_stream} requests of "
          f"{args.max_tokens} tokens; the drafter replica process and its drafter actor SIGSTOPped "
          f"{marks['resumed'] - marks['stopped']:.1f} s, {args.warmup_s:.0f} s in; verifier, drafter and client on "
          f"this machine's {os.cpu_count()} cores")
    print(stream_report("without the fault", clean, clean_s))
    print(stream_report("with the fault   ", hung, hung_s))
    print(f"with / without: {hung_s / clean_s:.2f}x (goal: <= 1.5x + 5 s, i.e. <= {1.5 * clean_s + 5:.1f} s)")
    print(f"drafting again {again:.1f} s after SIGCONT; acceptance length over the faulty run "
          f"{during.mean_acceptance_length:.2f}; drafters in use at the end {client.get('drafters')}")
    for r in (clean, hung):
        if r["failed"]:
            print("failures:", r["failed"][:3])


def drafter_redeploy(args: argparse.Namespace, mode: modes.Mode, prompts: list[str]) -> None:
    """``serve.delete`` of the drafter application under load, then deployed again."""
    from ray import serve

    from cluster import deploy_yaml
    from cluster.harness import app_status, deploy_apps

    ref = reference(prompts, args.max_tokens)
    marks: dict[str, float] = {}

    def redeploy(doc: dict) -> None:
        marks["delete"] = time.time()
        serve.delete(DRAFTER_APP_NAME)
        marks["deleted"] = time.time()
        deploy_apps(doc)
        while app_status(DRAFTER_APP_NAME) != "RUNNING":
            time.sleep(0.2)
        marks["running"] = time.time()

    with tempfile.TemporaryDirectory() as tmp:
        from cluster.harness import cpu_yaml

        doc = deploy_yaml.load(cpu_yaml(Path(tmp) / "doc.yaml", **modes.yaml_changes(mode, "none")))
        with served(mode):
            warm_up(1)
            thread = threading.Thread(target=redeploy, args=(doc,))
            start = time.time()

            def on_tick() -> None:
                if "delete" not in marks and not thread.is_alive() and time.time() >= start + args.warmup_s:
                    thread.start()

            result = asyncio.run(streams(HTTP, prompts, ref, args.streams, args.max_tokens, lambda: float("inf"),
                                         on_tick, per_stream=args.requests_per_stream))
            took = time.time() - start
            thread.join()
            again = drafting_again(marks["running"])
    print(f"# {mode.name}, the drafter application deleted under load and deployed again: {args.streams} streams x "
          f"{args.requests_per_stream} requests of {args.max_tokens} tokens, {args.warmup_s:.0f} s in")
    print(stream_report("run", result, took))
    print(f"delete took {marks['deleted'] - marks['delete']:.1f} s; RUNNING again "
          f"{marks['running'] - marks['deleted']:.1f} s after; drafting again {again:.1f} s after RUNNING "
          "(goal: <= 10 s)")
    if result["failed"]:
        print("failures:", result["failed"][:3])


def overload_run(args: argparse.Namespace, mode: modes.Mode, prompts: list[str]) -> None:
    """``--requests`` at LIMIT x FACTOR in flight against ``ingress.max_inflight_requests: LIMIT``."""
    with served(mode, {"ingress": {"max_inflight_requests": args.limit}}, ray=False) as base:
        before = memory()
        result = asyncio.run(overload(base, prompts, None, args.limit * args.factor, args.requests, args.max_tokens))
        time.sleep(2)
        after = memory()
    s = result["statuses"]
    print(f"# {mode.name}, overload: ingress.max_inflight_requests {args.limit}, {args.limit * args.factor} in "
          f"flight ({args.factor}x), {args.requests} requests of {args.max_tokens} tokens; everything on this "
          f"machine's {os.cpu_count()} cores")
    print(f"200: {s.get(200, 0)}  503: {s.get(503, 0)}  other: "
          f"{ {k: v for k, v in s.items() if k not in (200, 503)} }  admitted with wrong tokens: {result['wrong']}")
    print(f"503 Retry-After: {result['retry_after']}; slowest 503 answer {result['slowest_503_s'] * 1e3:.0f} ms; "
          f"run {result['seconds']:.1f} s")
    for name in ("verifier", "drafters"):
        print(f"{name} RSS MB: before {before[name]:.0f}, after {after[name]:.0f} "
              f"({after[name] / before[name]:.3f}x)" if before[name] else f"{name}: no process found")


def metrics_soak(args: argparse.Namespace, mode: modes.Mode, prompts: list[str]) -> None:
    """Many requests with ``/metrics`` scraped every second: scrape time and memory, start against end."""
    mem: dict[int, dict[str, float]] = {}
    with served(mode, ray=False) as base:
        scraper = Scraper(base)

        def progress(done: int) -> None:  # memory at every tenth of the run
            if done % max(1, args.requests // 10) == 0:
                mem[done] = memory(split=True)

        scraper.start()
        start = time.time()
        result = asyncio.run(requests(base, prompts, args.requests, args.concurrency, args.max_tokens, progress))
        took = time.time() - start
        scraper.done.set()
        scraper.join()
    scrapes = [s for s in scraper.scrapes if start <= s[0]]
    tenth = max(1, len(scrapes) // 10)
    first, last = scrapes[:tenth], scrapes[-tenth:]
    print(f"# {mode.name}, /metrics soak: {args.requests} requests of {args.max_tokens} tokens at concurrency "
          f"{args.concurrency}, /metrics scraped every second; everything on this machine's {os.cpu_count()} cores")
    print(f"requests: {result['ok']} ok, {result['failed']} failed, {took:.0f} s; scrapes: {len(scrapes)} "
          f"({scraper.errors} failed)")
    for name, part in (("first", first), ("last", last)):
        print(f"scrape, {name} 10%: median {statistics.median(s[1] for s in part) * 1e3:.1f} ms, "
              f"max {max(s[1] for s in part) * 1e3:.1f} ms, {statistics.median(s[2] for s in part) / 1e3:.1f} kB")
    ratio = statistics.median(s[1] for s in last) / statistics.median(s[1] for s in first)
    print(f"scrape time last / first: {ratio:.2f}x")
    marks = sorted(mem)
    for name in mem[marks[0]]:
        a, b = mem[marks[1 if len(marks) > 1 else 0]][name], mem[marks[-1]][name]
        print(f"{name} RSS MB at each tenth of the run: {[round(mem[m][name]) for m in marks]}; "
              f"end / 20% {b / a:.3f}x")


def drafters_serving() -> dict[str, int]:
    """Drafter replica id -> steps drafted, for every live replica (a Ray driver in this process)."""
    from cluster.harness import drafter_stats, replica_actors

    steps = {}
    for a in replica_actors(DRAFTER_DEPLOYMENT):
        try:
            steps[a["replica_id"]] = drafter_stats(a["replica_id"])["steps"]
        except Exception:  # still starting
            steps[a["replica_id"]] = 0
    return steps


def pool_scale(args: argparse.Namespace, mode: modes.Mode, prompts: list[str]) -> None:
    """An autoscaled pool (min 1, max 2): seconds from a concurrency-32 load's start to the second replica
    drafting."""
    found: dict[str, float] = {}
    with served(mode, {"drafter": AUTOSCALED}) as base:
        done = threading.Event()
        start = time.time()

        def poll() -> None:
            while not done.is_set() and len(found) < 2:
                for rid, steps in drafters_serving().items():
                    if steps > 0 and rid not in found:
                        found[rid] = time.time() - start
                time.sleep(0.5)

        t = threading.Thread(target=poll)
        t.start()
        load.drive(base, load_prompts(None, 128), args.max_tokens, 32, "autoscaled pool, c=32")
        done.set()
        t.join()
    scale_s = max(found.values()) if len(found) == 2 else None
    print(f"# {mode.name}, autoscaled pool (min 1, max 2 replicas, 8 sequences per replica): load increase (c=32) -> "
          f"second drafter replica drafting: {'did not scale' if scale_s is None else f'{scale_s:.1f} s'}")


RUNS: dict[str, Callable[[argparse.Namespace, modes.Mode, list[str]], None]] = {
    "drafter-stop": drafter_stop, "only-drafter-stop": only_drafter_stop, "drafter-redeploy": drafter_redeploy,
    "overload": overload_run, "metrics-soak": metrics_soak, "pool-scale": pool_scale}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="run", required=True)
    for name in RUNS:
        s = sub.add_parser(name)
        s.add_argument("--mode", default=DEFAULT_MODES[name], help=f"a cluster mode (default {DEFAULT_MODES[name]})")
        s.add_argument("--max-tokens", type=int, default={"overload": 32, "metrics-soak": 16}.get(name, 96))
        s.add_argument("--num-prompts", type=int, default={"overload": 16, "metrics-soak": 64}.get(name, 32))
        if name in ("drafter-stop", "only-drafter-stop", "drafter-redeploy"):
            s.add_argument("--streams", type=int, default=32)
            s.add_argument("--stop-s", type=float, default=20.0)
            s.add_argument("--warmup-s", type=float, default=8.0)
            s.add_argument("--after-s", type=float, default=15.0)
            s.add_argument("--requests-per-stream", type=int, default=4, help="only-drafter-stop, drafter-redeploy")
        if name == "overload":
            s.add_argument("--limit", type=int, default=8, help="ingress.max_inflight_requests")
            s.add_argument("--factor", type=int, default=4, help="requests in flight = limit x factor")
            s.add_argument("--requests", type=int, default=256)
        if name == "metrics-soak":
            s.add_argument("--requests", type=int, default=2000)
            s.add_argument("--concurrency", type=int, default=16)
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    args = p.parse_args(argv)
    try:
        mode = modes.parse(args.mode)
    except modes.ModeError as e:
        p.error(str(e))
    if not mode.is_cluster:
        p.error(f"--mode {mode.name}: fault runs need a cluster mode")
    print(stamp.line(stamp.stamp("none")), flush=True)
    RUNS[args.run](args, mode, load_prompts(None, args.num_prompts))


if __name__ == "__main__":
    main()
