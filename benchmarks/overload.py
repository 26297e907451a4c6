"""Overload at a multiple of what the verifier replica admits: what is not admitted gets 503 with ``Retry-After``
at once, what is admitted finishes with exact output, and the processes' memory is where it was.

    python -m benchmarks.overload [--limit 8] [--factor 4] [--requests 256] [--max-tokens 32]

Serves the CPU default (``serve run``, both applications) with ``ingress.max_inflight_requests: LIMIT``. First
each distinct prompt is sent alone (greedy: the reference tokens); then REQUESTS requests are sent with
LIMIT x FACTOR in flight at all times (a 503 is answered at once, and its slot goes to the next request), counting
200s and 503s and comparing every 200's tokens with the reference. Memory: the resident set of the verifier
(its Serve replica and the vLLM engine processes under it) and of the drafter replicas (and their drafter actors),
before and after. Hardware: the verifier, the drafter and this client share this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

from cluster.config import APP_NAME, DRAFTER_APP_NAME
from cluster.harness import cpu_yaml, load_prompts, serve_command, start, stop, wait_healthy

BASE = "http://127.0.0.1:8000"
MODEL = "llama4-tiny"


def rss_mb(marker: str, tree: bool = True) -> float:
    """Resident MB of the processes whose command line holds ``marker``, and (``tree``) of their children."""
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
           "drafters": rss_mb(f"ServeReplica:{DRAFTER_APP_NAME}:Drafter") + rss_mb("DrafterActor")}
    if split:
        out["verifier engine core"] = rss_mb("VLLM::EngineCore")
        out["ingress"] = rss_mb(f"ServeReplica:{APP_NAME}:Verifier", tree=False)
    return out


async def one(client, prompt: str, max_tokens: int) -> tuple[int, list[int] | None, str | None]:
    """(HTTP status, token ids of a 200, the Retry-After of a 503)."""
    import openai

    try:
        out = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                              extra_body={"ignore_eos": True, "return_token_ids": True})
        return 200, list(out.choices[0].token_ids), None
    except openai.APIStatusError as e:
        return e.status_code, None, e.response.headers.get("retry-after")


async def overload(prompts: list[str], reference: dict[str, list[int]], in_flight: int, total: int,
                   max_tokens: int) -> dict:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=600)
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
        if status == 200 and ids != reference[prompt]:
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--limit", type=int, default=8, help="ingress.max_inflight_requests")
    p.add_argument("--factor", type=int, default=4, help="requests in flight = limit x factor")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--num-prompts", type=int, default=16)
    args = p.parse_args(argv)

    prompts = load_prompts(None, args.num_prompts)
    with tempfile.TemporaryDirectory() as tmp:
        path = cpu_yaml(Path(tmp) / "overload.yaml", ingress={"max_inflight_requests": args.limit})
        proc = start(serve_command(path))
        try:
            wait_healthy(proc, BASE)
            reference = {}
            for prompt in prompts:  # alone: greedy, the tokens every admitted request must get
                status, ids, _ = asyncio.run(_alone(prompt, args.max_tokens))
                assert status == 200, status
                reference[prompt] = ids
            before = memory()
            result = asyncio.run(overload(prompts, reference, args.limit * args.factor, args.requests,
                                          args.max_tokens))
            time.sleep(2)
            after = memory()
        finally:
            stop(proc)
    s = result["statuses"]
    print(f"# overload: ingress.max_inflight_requests {args.limit}, {args.limit * args.factor} in flight "
          f"({args.factor}x), {args.requests} requests of {args.max_tokens} tokens; everything on this machine's "
          f"{os.cpu_count()} cores")
    print(f"200: {s.get(200, 0)}  503: {s.get(503, 0)}  other: "
          f"{ {k: v for k, v in s.items() if k not in (200, 503)} }  admitted with wrong tokens: {result['wrong']}")
    print(f"503 Retry-After: {result['retry_after']}; slowest 503 answer {result['slowest_503_s'] * 1e3:.0f} ms; "
          f"run {result['seconds']:.1f} s")
    for name in ("verifier", "drafters"):
        print(f"{name} RSS MB: before {before[name]:.0f}, after {after[name]:.0f} "
              f"({after[name] / before[name]:.3f}x)" if before[name] else f"{name}: no process found")


async def _alone(prompt: str, max_tokens: int):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=600)
    try:
        return await one(client, prompt, max_tokens)
    finally:
        await client.close()


if __name__ == "__main__":
    main()
