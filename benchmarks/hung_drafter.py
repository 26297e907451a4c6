"""Drafter faults under load: a drafter SIGSTOPped for 20 s while 32 streams generate, then SIGCONTed; the drafter
application deleted and deployed again; no drafter application at all.

    python -m benchmarks.hung_drafter [--scenario pair|only|delete|none] [--streams 32] [--stop-s 20]
        [--max-tokens 96] [--requests-per-stream 4]

``--scenario only``: the CPU default's one drafter replica; its replica process and its drafter actor are both
SIGSTOPped ``--stop-s`` after ``--warmup-s``, then SIGCONTed. Each of ``--streams`` clients streams
``--requests-per-stream`` greedy completions back to back, once without the fault and once with it: reports both
wall times (the goal: with the fault <= 1.5x without + 5 s), failures, outputs differing from target-only, the
longest gap between two chunks, and how long after SIGCONT the verifier drafted again.

``--scenario delete``: the same workload; ``--warmup-s`` in, the drafter application is deleted (``serve.delete``)
and deployed again (as ``serve deploy`` does); reports the wall time, failures, exactness, the longest gap, and how
long after the application was RUNNING again the verifier drafted again.

``--scenario none``: the verifier served with no drafter application, against vLLM's own OpenAI server target-only
(same prompts, ``benchmarks.serving.run`` at each ``--concurrency``): output tokens/s of each and the ratio.

``--scenario pair`` (the default, what follows): serves the CPU default (``serve run``, both applications) with two
drafter replicas. ``--streams`` clients each
stream greedy completions back to back (the openai client, ``stream=True``) until the run ends: ``--warmup-s``
before the stop, ``--stop-s`` stopped, ``--after-s`` after. The drafter stopped is the drafter actor (the process
that drafts, ``actors.drafter.actor.DrafterActor``) of the replica holding most of the verifier's sequences.

Reports: failed requests, outputs that differ from vLLM target-only (run first, offline, same prompts), the
longest gap between two chunks of any stream (the stall), the verifier's deadline for a drafter, events from the
verifier's draft client (drafter dropped, sequences re-homed, drafter readmitted), and the acceptance length
(``vllm:spec_decode_*``) before, during and after the stop. Hardware: the verifier, both drafters and this
client share this machine's cores. Every scenario with drafters drafts k = ``num_speculative_tokens`` at every step
(``EVERY_STEP_DRAFTS``), never ``auto``, which may draft nothing at 32 streams on a CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import tempfile
import time
from pathlib import Path

from actors.metrics import ProposerStats, SpecDecodeStats, from_prometheus_text
from cluster.config import APP_NAME
from cluster.harness import (
    EVERY_STEP_DRAFTS,
    MODEL,
    TARGET,
    cpu_yaml,
    drafter_stats,
    load_prompts,
    replica_actors,
    serve_command,
    serve_run,
)
from cluster.harness import HTTP as BASE


def reference(prompts: list[str], max_tokens: int) -> dict[str, list[int]]:
    """vLLM target-only greedy token ids (offline engine, before the server starts)."""
    from vllm import SamplingParams

    from actors.vllm_engine import make_llm

    target = str(TARGET)
    llm = make_llm(target)
    try:
        outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
        return {o.prompt: list(o.outputs[0].token_ids) for o in outs}
    finally:
        del llm
        gc.collect()


def spec() -> SpecDecodeStats:
    import urllib.request

    with urllib.request.urlopen(BASE + "/metrics", timeout=120) as r:
        return from_prometheus_text(r.read().decode())


def verifier_client_stats() -> dict:
    from ray import serve

    handle = serve.get_deployment_handle("Verifier", app_name=APP_NAME)
    stats: ProposerStats = handle.spec_stats.remote().result(timeout_s=30)
    return stats.client


def warm_up(num_drafters: int, timeout_s: float = 180) -> None:
    """Short requests until the verifier's draft client uses every drafter replica (it learns them from the
    pool's router, about one a second)."""
    import urllib.request

    body = f'{{"model": "{MODEL}", "prompt": "def f(x):", "max_tokens": 8}}'.encode()
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        req = urllib.request.Request(BASE + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=120).read()
        if verifier_client_stats()["drafters"] >= num_drafters:
            return
        time.sleep(0.5)
    raise TimeoutError(f"the verifier did not find {num_drafters} drafters in {timeout_s} s")


def drafter_actor_pids() -> dict[str, int]:
    """Drafter replica id -> the pid of its drafter actor (asked of each replica through the pool's router)."""
    return {a["replica_id"]: drafter_stats(a["replica_id"])["pid"] for a in replica_actors("Drafter")}


async def streams(prompts: list[str], ref: dict[str, list[int]], n: int, max_tokens: int, until, on_tick,
                  per_stream: int | None = None) -> dict:
    """``n`` clients streaming back to back until time ``until()`` (or ``per_stream`` requests each);
    ``on_tick()`` every 0.5 s meanwhile."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=600)
    out = {"requests": 0, "failed": [], "wrong": 0, "max_gap_s": 0.0, "max_gap_at": 0.0}

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


def drafting_again(since: float, timeout_s: float = 120) -> float:
    """Short requests until the verifier uses a drafter and vLLM verifies draft tokens again: seconds after
    ``since``."""
    first = spec().num_draft_tokens
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        _short_request()
        if verifier_client_stats()["drafters"] >= 1 and spec().num_draft_tokens > first:
            return time.time() - since
        time.sleep(0.2)
    return float("nan")


def _short_request() -> None:
    import urllib.request

    body = f'{{"model": "{MODEL}", "prompt": "def f(x):", "max_tokens": 8}}'.encode()
    req = urllib.request.Request(BASE + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=120).read()


def _report(name: str, result: dict, took: float) -> str:
    return (f"{name}: {took:.1f} s, requests {result['requests']}, failed {len(result['failed'])}, differing from "
            f"target-only {result['wrong']}, longest gap between two chunks {result['max_gap_s']:.2f} s")


def only_drafter(args, prompts: list[str], ref: dict[str, list[int]]) -> None:
    """The sole drafter (replica process and drafter actor) stopped, against the same workload without a fault."""
    import ray

    from cluster.harness import drafter_pids

    def run(fault: bool) -> tuple[dict, float, dict]:
        marks: dict = {}
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
            result = asyncio.run(streams(prompts, ref, args.streams, args.max_tokens, lambda: float("inf"), on_tick,
                                         per_stream=args.requests_per_stream))
        finally:
            if "stopped" in marks and "resumed" not in marks:
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)
                marks["resumed"] = time.time()
        return result, time.time() - start, marks

    only = {"speculative_config": EVERY_STEP_DRAFTS}  # drafts at every step: the hang is met under load
    with tempfile.TemporaryDirectory() as tmp, serve_run(cpu_yaml(Path(tmp) / "only.yaml", **only)):
        try:
            ray.init(address="auto", namespace="hung-drafter", log_to_driver=False)
            warm_up(1)
            (pids,) = drafter_pids()
            clean, clean_s, _ = run(fault=False)
            before = spec()
            hung, hung_s, marks = run(fault=True)
            during = spec() - before
            again = drafting_again(marks["resumed"])
            client = verifier_client_stats()
        finally:
            ray.shutdown()
    print(f"# the only drafter hung: {args.streams} streams x {args.requests_per_stream} requests of "
          f"{args.max_tokens} tokens; the drafter replica process and its drafter actor SIGSTOPped "
          f"{marks['resumed'] - marks['stopped']:.1f} s, {args.warmup_s:.0f} s in; one drafter replica (0.5 CPU), "
          f"verifier and client on this machine's {os.cpu_count()} cores")
    print(_report("without the fault", clean, clean_s))
    print(_report("with the fault   ", hung, hung_s))
    print(f"with / without: {hung_s / clean_s:.2f}x (goal: <= 1.5x + 5 s, i.e. <= {1.5 * clean_s + 5:.1f} s)")
    print(f"drafting again {again:.1f} s after SIGCONT; acceptance length over the faulty run "
          f"{during.mean_acceptance_length:.2f}; drafters in use at the end {client.get('drafters')}")
    for r in (clean, hung):
        if r["failed"]:
            print("failures:", r["failed"][:3])


def delete_redeploy(args, prompts: list[str], ref: dict[str, list[int]]) -> None:
    """``serve.delete`` of the drafter application under load, then deployed again."""
    import threading

    import ray
    from ray import serve

    from cluster import deploy_yaml
    from cluster.config import DRAFTER_APP_NAME
    from cluster.harness import app_status, deploy_apps

    marks: dict = {}

    def redeploy(doc: dict) -> None:
        marks["delete"] = time.time()
        serve.delete(DRAFTER_APP_NAME)
        marks["deleted"] = time.time()
        deploy_apps(doc)
        while app_status(DRAFTER_APP_NAME) != "RUNNING":
            time.sleep(0.2)
        marks["running"] = time.time()

    with tempfile.TemporaryDirectory() as tmp:
        path = cpu_yaml(Path(tmp) / "delete.yaml", speculative_config=EVERY_STEP_DRAFTS)
        doc = deploy_yaml.load(path)
        with serve_run(path):
            try:
                ray.init(address="auto", namespace="hung-drafter", log_to_driver=False)
                warm_up(1)
                thread = threading.Thread(target=redeploy, args=(doc,))
                start = time.time()

                def on_tick() -> None:
                    if "delete" not in marks and time.time() >= start + args.warmup_s:
                        thread.start()

                result = asyncio.run(streams(prompts, ref, args.streams, args.max_tokens, lambda: float("inf"),
                                             on_tick, per_stream=args.requests_per_stream))
                took = time.time() - start
                thread.join()
                again = drafting_again(marks["running"])
            finally:
                ray.shutdown()
    print(f"# the drafter application deleted under load and deployed again: {args.streams} streams x "
          f"{args.requests_per_stream} requests of {args.max_tokens} tokens, {args.warmup_s:.0f} s in")
    print(_report("run", result, took))
    print(f"delete took {marks['deleted'] - marks['delete']:.1f} s; RUNNING again "
          f"{marks['running'] - marks['deleted']:.1f} s after; drafting again {again:.1f} s after RUNNING "
          "(goal: <= 10 s)")
    if result["failed"]:
        print("failures:", result["failed"][:3])


def no_drafter_app(args, prompts: list[str]) -> None:
    """The verifier alone (no drafter application) against vLLM's own server target-only."""
    from benchmarks.serving import run
    from benchmarks.serving_compare import vllm_server
    from cluster import deploy_yaml
    from cluster.harness import start, stop, wait_healthy, without_drafter_app

    results: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        alone = deploy_yaml.write(without_drafter_app(deploy_yaml.load(cpu_yaml(Path(tmp) / "full.yaml"))),
                                  Path(tmp) / "alone.yaml")
        cmd, base = vllm_server(None)
        for label, (command, url) in {"vLLM target-only": (cmd, base),
                                      "cluster, no drafter app": (serve_command(alone), BASE)}.items():
            proc = start(command, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}, log=Path(tmp) / "server.log")
            try:
                wait_healthy(proc, url, log=Path(tmp) / "server.log")
                asyncio.run(run(url, prompts[:4], 8, 4, None, "warm-up", quiet=True))
                results[label] = {}
                for c in args.concurrency:
                    rep = asyncio.run(run(url, prompts, args.max_tokens, c, None, label, quiet=True))
                    assert rep.failed == 0, rep
                    results[label][c] = rep.output_throughput
            finally:
                stop(proc)
    print(f"# no drafter application: output tokens/s, {len(prompts)} prompts of {args.max_tokens} tokens, "
          f"this machine's {os.cpu_count()} cores")
    for label, by_c in results.items():
        print(f"{label:24s} " + "  ".join(f"c={c}: {v:7.1f}" for c, v in by_c.items()))
    ref, got = results["vLLM target-only"], results["cluster, no drafter app"]
    print("cluster / vLLM target-only: " + "  ".join(f"c={c}: {got[c] / ref[c]:.2f}x" for c in ref)
          + " (goal: >= 0.9x)")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenario", choices=["pair", "only", "delete", "none"], default="pair")
    p.add_argument("--requests-per-stream", type=int, default=4, help="only / delete: each stream's requests")
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 32], help="none: the concurrencies")
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--stop-s", type=float, default=20.0)
    p.add_argument("--warmup-s", type=float, default=8.0)
    p.add_argument("--after-s", type=float, default=15.0)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--num-prompts", type=int, default=32)
    args = p.parse_args(argv)

    import ray

    prompts = load_prompts(None, args.num_prompts)
    if args.scenario == "none":
        return no_drafter_app(args, prompts)
    ref = reference(prompts, args.max_tokens)
    if args.scenario == "only":
        return only_drafter(args, prompts, ref)
    if args.scenario == "delete":
        return delete_redeploy(args, prompts, ref)
    marks: dict = {}
    pids: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp, serve_run(
            cpu_yaml(Path(tmp) / "hung.yaml", drafter={"num_replicas": 2, "num_cpus": 0.5},
                     speculative_config=EVERY_STEP_DRAFTS)):
        try:
            ray.init(address="auto", namespace="hung-drafter", log_to_driver=False)
            pids = drafter_actor_pids()
            warm_up(len(pids))
            marks["start"] = spec()
            start = time.time()
            stop_at = start + args.warmup_s

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

            result = asyncio.run(streams(prompts, ref, args.streams, args.max_tokens, until, on_tick))
            marks["end"] = spec()
            client = verifier_client_stats()
        finally:
            if "stopped" in marks and "resumed" not in marks:
                os.kill(pids[marks["victim"]], signal.SIGCONT)
            ray.shutdown()
    events = [(round(t - marks["stopped"], 2), kind, n) for t, kind, n in client["events"] if t >= marks["stopped"]]
    before = marks["before"] - marks["start"]
    during = marks["during"] - marks["before"]
    after = marks["end"] - marks["during"]
    print(f"# hung drafter: {args.streams} streams of {args.max_tokens} tokens back to back; drafter actor of "
          f"{marks['victim']} (homing {marks['homes'].get(marks['victim'], 0)} of the verifier's sequences) "
          f"SIGSTOPped {marks['resumed'] - marks['stopped']:.1f} s; two drafter replicas (0.5 CPU each), verifier and "
          f"client on this machine's {os.cpu_count()} cores")
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


if __name__ == "__main__":
    main()
