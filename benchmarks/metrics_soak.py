"""2,000 requests through one server with ``/metrics`` scraped every second: the scrape's cost and the processes'
memory at the start and at the end (both should be flat: nothing a scrape reads grows with the requests served).

    python -m benchmarks.metrics_soak [--requests 2000] [--concurrency 16] [--max-tokens 16]

Serves the CPU default (``serve run``, both applications). A scraper thread GETs ``/metrics`` every second and
times it; memory is the resident set of the verifier (its Serve replica and the vLLM engine processes) and of
the drafters (replicas and drafter actors), read at the first and last 10% of the run. Hardware: the verifier,
the drafter and this client share this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from benchmarks.overload import memory
from cluster.harness import HTTP as BASE
from cluster.harness import MODEL, cpu_yaml, load_prompts, serve_run


class Scraper(threading.Thread):
    """GET /metrics every ``period_s``: (time, seconds the scrape took, bytes) per scrape."""

    def __init__(self, period_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.period_s, self.scrapes, self.errors = period_s, [], 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            t = time.perf_counter()
            try:
                with urllib.request.urlopen(BASE + "/metrics", timeout=30) as r:
                    size = len(r.read())
                self.scrapes.append((time.time(), time.perf_counter() - t, size))
            except OSError:
                self.errors += 1
            self.done.wait(max(0.0, self.period_s - (time.perf_counter() - t)))


async def load(prompts: list[str], total: int, concurrency: int, max_tokens: int, progress) -> dict:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=600)
    sem = asyncio.Semaphore(concurrency)
    out = {"ok": 0, "failed": 0}

    async def one(i: int) -> None:
        async with sem:
            try:
                await client.completions.create(model=MODEL, prompt=prompts[i % len(prompts)],
                                                max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True})
                out["ok"] += 1
            except Exception:
                out["failed"] += 1
            progress(out["ok"] + out["failed"])

    await asyncio.gather(*(one(i) for i in range(total)))
    await client.close()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--num-prompts", type=int, default=64)
    args = p.parse_args(argv)

    prompts = load_prompts(None, args.num_prompts)
    mem: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, serve_run(cpu_yaml(Path(tmp) / "soak.yaml")):
        scraper = Scraper()

        def progress(done: int) -> None:  # memory at every tenth of the run
            if done % max(1, args.requests // 10) == 0:
                mem[done] = memory(split=True)

        scraper.start()
        start = time.time()
        result = asyncio.run(load(prompts, args.requests, args.concurrency, args.max_tokens, progress))
        took = time.time() - start
        scraper.done.set()
        scraper.join()
    scrapes = [s for s in scraper.scrapes if start <= s[0]]
    tenth = max(1, len(scrapes) // 10)
    first, last = scrapes[:tenth], scrapes[-tenth:]
    print(f"# /metrics soak: {args.requests} requests of {args.max_tokens} tokens at concurrency "
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
        a, b = mem[marks[1]][name], mem[marks[-1]][name]
        print(f"{name} RSS MB at each tenth of the run: {[round(mem[m][name]) for m in marks]}; "
              f"end / 20% {b / a:.3f}x")


if __name__ == "__main__":
    main()
