"""Requests that share a long prefix: vLLM's own server (colocated EAGLE-3, prefix caching on, its default) against
the cluster as shipped (``deploy/cpu.yaml``: EAGLE-3, prefix caching on, the drafter's own prefix cache).

    python -m benchmarks.prefix_sharing [--num-prompts 22] [--prefix-tokens 700] [--suffix-tokens 24]
        [--concurrency 4] [--max-tokens 48]
        [--modes colocated-eagle3 cluster-eagle3 [cluster-eagle3-uni | -nospin | -async]] [--out results/prefix]

Each prompt is one shared ~700-token prefix of held-out Python (the training corpus's held-out files, not seen in
training) followed by a different short held-out suffix. Each server is started the same way as in
``benchmarks.serving_compare`` (vLLM's ``api_server`` module with this project's CPU settings; ``serve run`` for the
cluster), warmed up on unrelated prompts (so the shared prefix is computed by the measured requests themselves), then
driven by ``benchmarks.serving``'s load generator. Prints each report, the cluster's prefix hit / miss counters
(``eagle_cluster_draft_prefix_{hit,miss}_tokens``), and the ratios the issue's goals name; writes JSON to ``--out``.
No core pinning: every process shares the machine's cores, as in the issue's measurement. Each run also prints
CPU seconds by process group (``benchmarks.cpu_split``). ``cluster-eagle3-uni`` serves with
``verifier.engine_kwargs.distributed_executor_backend: uni`` (the model in vLLM's engine-core process,
``actors.vllm_engine.worker_in_engine_core``); ``cluster-eagle3-nospin`` with ``verifier.engine_spin_s: null`` (vLLM's
engine core spins for 1 s on its worker, vLLM's default, instead of the shipped 5 ms: ``actors.engine_spin``);
``cluster-eagle3-async`` with pipelined drafting (``drafter.async_drafting.enabled``, its default fan-out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import urllib.request
from dataclasses import asdict
from pathlib import Path

from benchmarks import cpu_split
from benchmarks.serving import run
from benchmarks.serving_compare import cluster_server, vllm_server
from cluster.config import PROJECT_ROOT as ROOT
from cluster.harness import (
    HEADS,
    HTTP,
    TARGET,
    cpu_yaml,
    heldout_prompts,
    load_prompts,
    serve_command,
    start,
    stop,
    wait_healthy,
)

MODES = ["colocated-eagle3", "cluster-eagle3", "cluster-eagle3-uni", "cluster-eagle3-nospin", "cluster-eagle3-async"]
PREFIX_COUNTERS = ("eagle_cluster_draft_prefix_hit_tokens", "eagle_cluster_draft_prefix_miss_tokens")


def shared_prefix_prompts(n: int, prefix_tokens: int, suffix_tokens: int) -> list[str]:
    """``n`` prompts: one shared prefix of about ``prefix_tokens`` tokens, then a different suffix each."""
    from transformers import AutoTokenizer

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


def prefix_counters(base: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        text = r.read().decode()
    values = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln.startswith("eagle_cluster_")}
    return {name: values.get(name, 0.0) for name in PREFIX_COUNTERS}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-prompts", type=int, default=22)
    p.add_argument("--prefix-tokens", type=int, default=700)
    p.add_argument("--suffix-tokens", type=int, default=24)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--modes", nargs="*", default=MODES[:2], choices=MODES)
    p.add_argument("--out", default=str(ROOT / "results" / "prefix"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = shared_prefix_prompts(args.num_prompts, args.prefix_tokens, args.suffix_tokens)
    warm = load_prompts(None, 4)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            if mode in ("cluster-eagle3-uni", "cluster-eagle3-nospin"):
                verifier = ({"engine_kwargs": {"distributed_executor_backend": "uni"}} if mode.endswith("uni")
                            else {"engine_spin_s": None})
                spec = {"method": "eagle3", "model": str(HEADS["eagle3"])}
                cmd, base = serve_command(cpu_yaml(Path(tmp) / f"{mode}.yaml", verifier=verifier,
                                                   speculative_config=spec)), HTTP
            elif mode == "cluster-eagle3-async":
                cmd, base = cluster_server("eagle3", Path(tmp), {"async_drafting": {"enabled": True}}, name="-async")
            elif mode.startswith("cluster"):
                cmd, base = cluster_server("eagle3", Path(tmp))
            else:
                cmd, base = vllm_server("eagle3")  # prefix caching on, vLLM's default
            proc = start(cmd, env=env)
            try:
                wait_healthy(proc, base)
                asyncio.run(run(base, warm, 8, 4, None, f"{mode} warm-up", quiet=True))
                before = prefix_counters(base)
                procs = cpu_split.server_processes(proc.pid)
                cpu_before = cpu_split.snapshot(procs)
                report = asyncio.run(run(base, prompts, args.max_tokens, args.concurrency, None,
                                         f"{mode} c={args.concurrency}"))
                cpu = cpu_split.split(procs, cpu_before, cpu_split.snapshot(procs))
                after = prefix_counters(base)
                print(report.text(), flush=True)
                split = ", ".join(f"{g} {v:.2f}" for g, v in cpu.items())
                print(f"CPU seconds over {report.duration_s:.1f} s: {split}", flush=True)
                results[mode] = asdict(report) | {"prefix": {k: after[k] - before[k] for k in PREFIX_COUNTERS},
                                                  "cpu_s": cpu}
                if mode.startswith("cluster"):
                    print("prefix tokens: " + ", ".join(f"{k.rsplit('_', 2)[-2]} {v:.0f}"
                                                        for k, v in results[mode]["prefix"].items()), flush=True)
            finally:
                stop(proc)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print("\nmode | output tok/s | TTFT p50 ms | TPOT p50 ms | MAL")
    for mode, r in results.items():
        spec = r["spec"]
        mal = 1 + spec["num_accepted_tokens"] / spec["num_drafts"] if spec and spec["num_drafts"] else 1.0
        r["mal"], r["tps"] = mal, r["output_tokens"] / r["duration_s"]
        print(f"{mode} | {r['tps']:.1f} | {r['ttft_ms']['median']:.0f} | {r['tpot_ms']['median']:.1f} | {mal:.2f}")
    v = results.get("colocated-eagle3")
    for mode, c in results.items():
        if v is not None and mode.startswith("cluster"):
            print(f"{mode} / colocated: output tok/s {c['tps'] / v['tps']:.2f}x, TTFT p50 "
                  f"{c['ttft_ms']['median'] / v['ttft_ms']['median']:.2f}x, MAL {c['mal'] / v['mal']:.2f}x")


if __name__ == "__main__":
    main()
