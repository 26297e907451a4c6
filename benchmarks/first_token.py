"""Where the first token's time goes: the client's TTFT against vLLM's own, for vLLM's server and the cluster.

    python -m benchmarks.first_token [--modes colocated-eagle3 cluster-eagle3 cluster-eagle3-pyproxy]
        [--num-prompts 16] [--rounds 1]

For each mode, one request at a time (held-out prompts, 32 greedy tokens, streamed), three figures per request set,
from the server's own ``/metrics`` before and after (the means of vLLM's histograms over those requests):

- **client TTFT**: request sent to the first streamed token read, as ``benchmarks.serving`` measures it;
- **engine TTFT**: vLLM's ``vllm:time_to_first_token_seconds``, from the request reaching ``AsyncLLM`` to its first
  token coming out of it: the engine core, its worker, and in the cluster the prompt step's drafting as far as it
  delays the token;
- **prefill**: vLLM's ``vllm:request_prefill_time_seconds``, scheduled to first token, inside the engine core.

Client TTFT minus engine TTFT is the serving path's part: HTTP, parsing and tokenizing, and for the cluster Serve's
ingress and its hop to the replica (HAProxy, the shipped default; ``*-pyproxy``: Serve's Python proxy instead).
Nothing is pinned: run it on a quiet machine, and compare modes within one run (``--rounds 2`` alternates them).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.serving_compare import cluster_server, ingress_env, vllm_server
from cluster.harness import heldout_prompts, start, stop, wait_healthy

MODES = ["colocated-eagle3", "cluster-eagle3", "cluster-eagle3-pyproxy", "cluster-eagle3-haproxy", "target-only",
         "colocated-eagle", "cluster-eagle"]
HISTOGRAMS = {"engine": "vllm:time_to_first_token_seconds", "prefill": "vllm:request_prefill_time_seconds"}


def histogram_sums(prometheus_text: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of each of ``HISTOGRAMS`` in a ``/metrics`` page, over all label sets (read with
    ``prometheus_client``'s parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = {name + suffix: 0.0 for name in HISTOGRAMS.values() for suffix in ("_sum", "_count")}
    for family in text_string_to_metric_families(prometheus_text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return {key: (totals[name + "_sum"], totals[name + "_count"]) for key, name in HISTOGRAMS.items()}


def metrics(base: str) -> dict[str, tuple[float, float]]:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        return histogram_sums(r.read().decode())


def first_tokens(base: str, prompts: list[str]) -> dict[str, float]:
    """Mean milliseconds over ``prompts``, one at a time: client TTFT (and its median), engine TTFT, prefill."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base}/v1", api_key="unused")
    model = client.models.list().data[0].id
    for p in prompts[:3]:  # warm
        client.completions.create(model=model, prompt=p, max_tokens=8, temperature=0)
    before = metrics(base)
    ttfts = []
    for p in prompts:
        start_t, first = time.perf_counter(), None
        for _ in client.completions.create(model=model, prompt=p, max_tokens=32, temperature=0, stream=True):
            if first is None:
                first = time.perf_counter() - start_t
        ttfts.append(first * 1e3)
    after = metrics(base)
    row = {"client": statistics.mean(ttfts), "client_p50": statistics.median(ttfts)}
    for key in HISTOGRAMS:
        n = after[key][1] - before[key][1]
        row[key] = 1e3 * (after[key][0] - before[key][0]) / n if n else float("nan")
    row["serving"] = row["client"] - row["engine"]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", nargs="*", choices=MODES, default=MODES[:3])
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    prompts = heldout_prompts(args.num_prompts)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in args.modes:
                kind, _, method = mode.partition("-")
                env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
                if kind == "cluster":
                    method, *variants = method.split("-")
                    env.update(ingress_env(variants))
                    cmd, base = cluster_server(method, Path(tmp), name="-".join(variants))
                else:
                    cmd, base = vllm_server(None if kind == "target" else method)
                log = Path(tmp) / f"{mode}-{r}.log"
                proc = start(cmd, env=env, log=log)
                try:
                    wait_healthy(proc, base, log=log)
                    row = first_tokens(base, prompts)
                finally:
                    stop(proc)
                rows.append((r + 1, mode, row))
                print(f"round {r + 1} {mode}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
    print("\nround | mode | client TTFT mean ms | p50 | engine TTFT | prefill | serving path (client - engine)")
    for r, mode, row in rows:
        print(f"{r} | {mode} | {row['client']:.1f} | {row['client_p50']:.1f} | {row['engine']:.1f} | "
              f"{row['prefill']:.1f} | {row['serving']:.1f}")


if __name__ == "__main__":
    main()
