"""Drives an OpenAI-compatible endpoint and prints the seed PR #20591 report.

    python -m benchmarks.serving --base-url http://127.0.0.1:8000 [--prompts FILE.jsonl] [--num-prompts 32]
        [--concurrency 16 | --request-rate 4] [--max-tokens 128] [--out results/]

Prompts: a JSONL file of ``{"prompt": ...}`` lines; the default, ``benchmarks/prompts.jsonl``, ships 64 held-out
Python standard library snippets (the models never saw their files), the same ones the other benchmarks use.
Each request streams (``/v1/completions``, greedy, ``ignore_eos``), so
TTFT (time to first token), TPOT (time per output token after the first) and ITL (gaps between streamed
chunks) are measured by the client. The speculative table comes from the server's ``/metrics`` before and
after the run (``vllm:spec_decode_*``), so it covers exactly this run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from actors.metrics import SpecDecodeStats, from_prometheus_text
from cluster.harness import load_prompts


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    error: str = ""


@dataclass
class Report:
    label: str
    concurrency: int | None
    request_rate: float | None
    successful: int
    failed: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    spec: dict | None
    branches: dict[str, float] | None = None  # asynchronous drafting: {"lookups", "hits"} over the run

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration_s

    def text(self) -> str:
        def block(title: str, d: dict[str, float]) -> list[str]:
            return [f"{'-' * 15}{title}{'-' * 15}"] + [
                f"{k.capitalize()} {title.split()[0]} (ms):".ljust(40) + f"{v:.2f}" for k, v in d.items()
            ]

        lines = [
            f"{' Serving Benchmark Result: ' + self.label + ' ':=^50}",
            f"{'Successful requests:':<40}{self.successful}",
            f"{'Failed requests:':<40}{self.failed}",
            f"{'Maximum request concurrency:':<40}{self.concurrency}",
            f"{'Benchmark duration (s):':<40}{self.duration_s:.2f}",
            f"{'Total input tokens:':<40}{self.input_tokens}",
            f"{'Total generated tokens:':<40}{self.output_tokens}",
            f"{'Request throughput (req/s):':<40}{self.successful / self.duration_s:.2f}",
            f"{'Output token throughput (tok/s):':<40}{self.output_throughput:.2f}",
            f"{'Total Token throughput (tok/s):':<40}{(self.input_tokens + self.output_tokens) / self.duration_s:.2f}",
            *block("TTFT", self.ttft_ms),
            *block("TPOT (excl. 1st token)", self.tpot_ms),
            *block("ITL", self.itl_ms),
        ]
        if self.spec and self.spec["num_drafts"]:
            s = SpecDecodeStats(**self.spec)
            lines += ["-" * 50, s.table(self.output_tokens)]
        if self.branches and self.branches["lookups"]:
            b = self.branches
            lines += [f"{'Async drafting: precomputed / hits:':<40}{b['lookups']:.0f} / {b['hits']:.0f}",
                      f"{'Async drafting: hit rate (%):':<40}{100 * b['hits'] / b['lookups']:.2f}"]
        lines.append("=" * 50)
        return "\n".join(lines)


def percentiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"mean": float("nan"), "median": float("nan"), "p99": float("nan")}
    xs = sorted(xs)
    return {
        "mean": statistics.fmean(xs) * 1e3,
        "median": statistics.median(xs) * 1e3,
        "p99": xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))] * 1e3,
    }


BRANCH_COUNTERS = {"lookups": "eagle_cluster_branch_lookups_total", "hits": "eagle_cluster_branch_hits_total"}


def scrape(base_url: str) -> tuple[SpecDecodeStats, dict[str, float]]:
    """vLLM's speculative counters, and the cluster's asynchronous drafting counters (absent elsewhere: 0)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    values = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln.startswith("eagle_cluster_")}
    return from_prometheus_text(text), {k: values.get(name, 0.0) for k, name in BRANCH_COUNTERS.items()}


async def one_request(client, model: str, prompt: str, max_tokens: int) -> RequestResult:
    start = time.perf_counter()
    last = start
    res = RequestResult(ok=False)
    try:
        stream = await client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].text:
                if res.ttft_s == 0.0:
                    res.ttft_s = now - start
                else:
                    res.itl_s.append(now - last)
                last = now
            if chunk.usage:
                res.prompt_tokens = chunk.usage.prompt_tokens
                res.output_tokens = chunk.usage.completion_tokens
        res.latency_s = time.perf_counter() - start
        res.ok = res.output_tokens > 0
    except Exception as e:  # counted as a failed request
        res.error = f"{type(e).__name__}: {e}"[:300]
    return res


async def run(
    base_url: str, prompts: list[str], max_tokens: int, concurrency: int | None, request_rate: float | None,
    label: str, seed: int = 0, quiet: bool = False,
) -> Report:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=600)
    model = (await client.models.list()).data[0].id
    before, branches_before = scrape(base_url)
    sem = asyncio.Semaphore(concurrency or len(prompts))
    rng = random.Random(seed)
    bar = tqdm(total=len(prompts), desc=label, disable=quiet)

    async def guarded(p: str) -> RequestResult:
        async with sem:
            r = await one_request(client, model, p, max_tokens)
            bar.update()
            return r

    start = time.perf_counter()
    tasks = []
    for p in prompts:
        tasks.append(asyncio.create_task(guarded(p)))
        if request_rate:
            await asyncio.sleep(rng.expovariate(request_rate))  # Poisson arrivals
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    bar.close()
    await client.close()
    after, branches_after = scrape(base_url)
    spec = after - before
    branches = {k: branches_after[k] - branches_before[k] for k in BRANCH_COUNTERS}
    ok = [r for r in results if r.ok]
    tpot = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return Report(
        label=label, concurrency=concurrency, request_rate=request_rate, successful=len(ok),
        failed=len(results) - len(ok), duration_s=duration,
        input_tokens=sum(r.prompt_tokens for r in ok), output_tokens=sum(r.output_tokens for r in ok),
        ttft_ms=percentiles([r.ttft_s for r in ok]), tpot_ms=percentiles(tpot),
        itl_ms=percentiles([x for r in ok for x in r.itl_s]),
        spec=asdict(spec) if spec.num_drafts else None, branches=branches if branches["lookups"] else None,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--prompts", help="JSONL of {\"prompt\": ...} lines (default: benchmarks/prompts.jsonl)")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--concurrency", type=int, default=None)
    group.add_argument("--request-rate", type=float, default=None, help="requests/s, Poisson arrivals")
    p.add_argument("--label", default="endpoint")
    p.add_argument("--out", help="folder for the JSON result")
    args = p.parse_args()
    concurrency = args.concurrency if args.concurrency or args.request_rate else 16
    report = asyncio.run(run(args.base_url, load_prompts(args.prompts, args.num_prompts), args.max_tokens,
                             concurrency, args.request_rate, args.label))
    print(report.text())
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{args.label}-c{concurrency}.json").write_text(json.dumps(asdict(report), indent=2))


if __name__ == "__main__":
    main()
