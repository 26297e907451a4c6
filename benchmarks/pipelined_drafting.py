"""Pipelined drafting against vLLM, with the drafter on a core of its own ("pinned") and on shared cores.

    python -m benchmarks.pipelined_drafting [--pinning pinned shared] [--concurrency 1 8 16]
        [--num-prompts 32] [--max-tokens 128] [--modes ...] [--out results/pipelined]

Pinned: every verifier's compute on core 0: vLLM-CPU binds its OpenMP threads with ``VLLM_CPU_OMP_THREADS_BIND=0``
(``OMP_NUM_THREADS=1``); that is target-only, vLLM's colocated EAGLE (its draft model runs in the verifier, so on
core 0 too) and the cluster's verifier. The cluster's drafter replica is bound to core 1 (``drafter.cpu_affinity:
[1]``, one torch thread): the drafter's "device of its own". Shared: nothing bound, everything on both cores.
HTTP servers, Serve's proxy and Ray's own processes are bound to nothing in either case.

Each mode is served by its real HTTP server (``benchmarks.serving_compare``): vLLM's OpenAI server for target-only
and colocated, ``serve run`` for the cluster. Same prompts (the shipped held-out set), greedy, ``max_tokens``
tokens each. For the cluster, the verifier's per-step timings (``VerifierServer.step_timings``) give the share
of steps answered without waiting on a drafter and how long propose waited on those (the pipelining's goal:
<= 1 ms), and the branch hit rate. Prints one table and writes ``results.json`` and ``pipelined.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

from benchmarks.serving import run
from benchmarks.serving_compare import cluster_server, vllm_server
from cluster.config import PROJECT_ROOT as ROOT
from cluster.harness import load_prompts, start, stop, wait_healthy

MODES = ["target-only", "colocated-eagle", "colocated-eagle3", "cluster-eagle", "cluster-eagle3",
         "cluster-eagle3-sync"]
DEFAULT_MODES = MODES[:5]
PIN_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1"}
ASYNC_SETTINGS: dict = {}  # drafter.async_drafting overrides (--async-drafting)


def server(mode: str, pinned: bool, tmp: Path) -> tuple[list[str], str, dict[str, str]]:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **(PIN_ENV if pinned else {})}
    kind, _, rest = mode.partition("-")
    if kind != "cluster":
        cmd, base = vllm_server(None if kind == "target" else rest)
        return cmd, base, env
    method, _, variant = rest.partition("-")
    drafter: dict = {"async_drafting": {**ASYNC_SETTINGS, "enabled": variant != "sync"}}
    if pinned:
        drafter["cpu_affinity"] = [1]
    cmd, base = cluster_server(method, tmp, drafter, name=f"-{variant}-{pinned}")
    return cmd, base, env


def step_timings(reset: bool) -> dict[str, list]:
    from ray import serve

    handle = serve.get_deployment_handle("Verifier", app_name="eagle-cluster")
    return handle.step_timings.remote(reset=reset).result(timeout_s=60)


def pipeline_figures(steps: dict[str, list]) -> dict[str, float]:
    """Share of steps answered with no drafter answer awaited, what propose waited on those, and the median
    split of a step on the verifier (target forward; rejection sampling + propose)."""
    timings = steps["timings"]
    hits = [t for t in timings if t["all_hits"]]
    return {
        "forward_ms_median": statistics.median(steps["forward_ms"]) if steps["forward_ms"] else float("nan"),
        "sample_ms_median": statistics.median(steps["sample_ms"]) if steps["sample_ms"] else float("nan"),
        "period_ms_median": statistics.median(steps["period_ms"]) if steps["period_ms"] else float("nan"),
        "steps": len(timings),
        "all_hit_share": len(hits) / len(timings) if timings else 0.0,
        "hit_wait_ms_median": statistics.median(t["wait_ms"] for t in hits) if hits else float("nan"),
        "hit_propose_ms_median": statistics.median(t["propose_ms"] for t in hits) if hits else float("nan"),
        "miss_wait_ms_median": statistics.median(t["wait_ms"] for t in timings if not t["all_hits"])
        if len(hits) < len(timings) else float("nan"),
    }


def measure(mode: str, pinned: bool, prompts: list[str], args, tmp: Path) -> dict[str, dict]:
    """One mode's server, warmed up, at each concurrency. Runs in a process of its own (``measure_apart``):
    Serve's client state does not survive one Ray cluster being stopped and another started."""
    import ray

    ASYNC_SETTINGS.update(args.async_drafting)

    cmd, base, env = server(mode, pinned, tmp)
    proc = start(cmd, env=env)
    is_cluster = mode.startswith("cluster")
    out: dict[str, dict] = {}
    try:
        wait_healthy(proc, base)
        asyncio.run(run(base, prompts[:4], 8, 4, None, f"{mode} warm-up", quiet=True))
        if is_cluster:
            ray.init(address="auto", log_to_driver=False)
        for c in args.concurrency:
            if is_cluster:
                step_timings(reset=True)
            report = asyncio.run(run(base, prompts, args.max_tokens, c, None, f"{mode} {pinned=} c={c}"))
            out[str(c)] = asdict(report)
            if is_cluster:
                out[str(c)]["pipeline"] = pipeline_figures(step_timings(reset=True))
    finally:
        if ray.is_initialized():
            ray.shutdown()
        stop(proc)
    return out


def measure_apart(*args) -> dict[str, dict]:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure, *args).result()


def tok_s(r: dict) -> float:
    return r["output_tokens"] / r["duration_s"]


def mal(r: dict) -> float:
    s = r["spec"]
    return 1 + s["num_accepted_tokens"] / s["num_drafts"] if s and s["num_drafts"] else 1.0


def table(results: dict[str, dict[str, dict[str, dict]]]) -> str:
    head = ("pinning | mode | c | tok/s | vs target-only | vs colocated | MAL | efficiency | TTFT median ms | "
            "TTFT vs colocated | median TPOT ms | hit rate | steps all hits | wait on hits ms (median)")
    lines = [head, "|".join([" --- "] * head.count("|") + [" --- "])]
    for pinning, by_mode in results.items():
        for mode, by_c in by_mode.items():
            method = mode.split("-")[1] if "-" in mode else ""
            for c, r in by_c.items():
                base = by_mode.get("target-only", {}).get(c)
                colo = by_mode.get(f"colocated-{method}", {}).get(c) if mode.startswith("cluster") else None
                speedup = tok_s(r) / tok_s(base) if base else float("nan")
                vs_colo = f"{tok_s(r) / tok_s(colo):.2f}" if colo else ""
                ttft_colo = f"{r['ttft_ms']['median'] / colo['ttft_ms']['median']:.2f}" if colo else ""
                b, p = r.get("branches"), r.get("pipeline")
                hit = f"{b['hits'] / b['lookups']:.2f}" if b and b["lookups"] else ""
                steps = f"{p['all_hit_share']:.2f}" if p else ""
                wait = f"{p['hit_wait_ms_median']:.2f}" if p else ""
                lines.append(f"{pinning} | {mode} | {c} | {tok_s(r):.1f} | {speedup:.2f} | {vs_colo} | {mal(r):.2f} | "
                             f"{speedup / mal(r):.2f} | {r['ttft_ms']['median']:.1f} | {ttft_colo} | "
                             f"{r['tpot_ms']['median']:.2f} | {hit} | {steps} | {wait}")
    return "\n".join(lines)


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, (pinning, by_mode) in zip(axes[0], results.items(), strict=True):
        for mode, by_c in by_mode.items():
            cs = sorted(int(c) for c in by_c)
            ax.plot(cs, [tok_s(by_c[str(c)]) for c in cs], "o-", label=mode)
        ax.set(xlabel="concurrency", ylabel="output tokens/s", xscale="log", title=f"{pinning} cores")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "pipelined.png", dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pinning", nargs="*", default=["pinned", "shared"], choices=["pinned", "shared"])
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 16])
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--modes", nargs="*", default=DEFAULT_MODES, choices=MODES)
    p.add_argument("--prompts", default=None, help="a JSONL prompt file (default: the shipped held-out set)")
    p.add_argument("--async-drafting", type=json.loads, default={},
                   help='drafter.async_drafting settings for the cluster, e.g. \'{"bonus_fanout": 3}\'')
    p.add_argument("--out", default=str(ROOT / "results" / "pipelined"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(args.prompts, args.num_prompts)
    results: dict[str, dict[str, dict[str, dict]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pinning in args.pinning:
            results[pinning] = {}
            for mode in args.modes:
                results[pinning][mode] = measure_apart(mode, pinning == "pinned", prompts, args, Path(tmp))
                (out / "results.json").write_text(json.dumps(results, indent=2))
    print(table(results))
    plot(results, out)
    print(f"\nresults and plot in {out}")


if __name__ == "__main__":
    main()
