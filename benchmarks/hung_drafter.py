"""A hung drafter under load: one drafter actor SIGSTOPped for 20 s while 32 streams generate, then SIGCONTed.

    python -m benchmarks.hung_drafter [--streams 32] [--stop-s 20] [--max-tokens 96]

Serves the CPU default (``serve run``, both applications) with two drafter replicas. ``--streams`` clients each
stream greedy completions back to back (the openai client, ``stream=True``) until the run ends: ``--warmup-s``
before the stop, ``--stop-s`` stopped, ``--after-s`` after. The drafter stopped is the drafter actor (the process
that drafts, ``actors.drafter.actor.DrafterActor``) of the replica holding most of the verifier's sequences.

Reports: failed requests, outputs that differ from vLLM target-only (run first, offline, same prompts), the
longest gap between two chunks of any stream (the stall), the verifier's deadline for a drafter, events from the
verifier's draft client (drafter dropped, sequences re-homed, drafter readmitted), and the acceptance length
(``vllm:spec_decode_*``) before, during and after the stop. Hardware: the verifier, both drafters and this
client share this machine's cores.
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
from cluster.harness import HTTP as BASE
from cluster.harness import (
    MODEL,
    TARGET,
    cpu_yaml,
    drafter_stats,
    load_prompts,
    replica_actors,
    serve_run,
)


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


async def streams(prompts: list[str], ref: dict[str, list[int]], n: int, max_tokens: int, until, on_tick) -> dict:
    """``n`` clients streaming back to back until time ``until()``; ``on_tick()`` every 0.5 s meanwhile."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=600)
    out = {"requests": 0, "failed": [], "wrong": 0, "max_gap_s": 0.0, "max_gap_at": 0.0}

    async def user(i: int) -> None:
        j = i
        while time.time() < until():
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--stop-s", type=float, default=20.0)
    p.add_argument("--warmup-s", type=float, default=8.0)
    p.add_argument("--after-s", type=float, default=15.0)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--num-prompts", type=int, default=32)
    args = p.parse_args(argv)

    import ray

    prompts = load_prompts(None, args.num_prompts)
    ref = reference(prompts, args.max_tokens)
    marks: dict = {}
    pids: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp, serve_run(
            cpu_yaml(Path(tmp) / "hung.yaml", drafter={"num_replicas": 2, "num_cpus": 0.5})):
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
