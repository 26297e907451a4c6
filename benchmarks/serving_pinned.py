"""vLLM's own server against the cluster with the drafter on a core of its own, one run, and where the CPU goes.

    python -m benchmarks.serving_pinned [--pinning strict|none] [--concurrency 1 8 16] [--num-prompts 16]
        [--max-tokens 128] [--modes ...] [--out results/pinned] [--summary-from results/pinned/results-strict.json]

``--pinning strict`` (the default) emulates "the drafter has a device of its own" on a 2-core machine: everything
a verifier node runs (vLLM's API server, or Serve's proxy and the verifier application's replicas; vLLM's engine
core and worker) bound to core 0 in every mode, the cluster's drafter (its replica and its actor) alone on core 1,
Ray's control plane and the load generator unbound. The cluster gets exactly one core more than the baselines:
the drafter's. ``--pinning none`` binds nothing. Cluster modes serve behind Serve's HAProxy ingress, the shipped
default (``cluster.serve_env``; ``*-haproxy`` says so explicitly); ``*-pyproxy`` modes serve behind Serve's Python
HTTP proxy instead (``RAY_SERVE_ENABLE_HA_PROXY=0``); ``*-grpc`` modes keep the Python proxy and have
it call the replica over gRPC (``RAY_SERVE_PROXY_USE_GRPC=1``) instead of by ObjectRef; ``*-nospin`` modes set
``verifier.engine_spin_s: null`` (vLLM's own 1 s busy loop, not the shipped 5 ms: ``actors.engine_spin``). vLLM's
OpenMP threads: ``VLLM_CPU_OMP_THREADS_BIND=0`` and ``OMP_NUM_THREADS=1`` in every mode when strict.

The draft length (issue 23): cluster modes run the shipped default (``num_speculative_tokens_per_batch_size:
auto``); ``*-auto`` sets it explicitly, ``*-sched`` the fixed schedule ``SCHEDULE`` through the same key,
``*-k3`` removes the key (k = 3 at every step, whatever the shipped YAML says), ``*-nodrafter`` deploys the
verifier application alone (no drafter pool: every step target-only), ``*-k0`` / ``-k1`` / ``-k2`` hold that
k at every batch size through the key (``[[1, 1024, k]]``: each k's steady cost, beside what ``auto`` measures when
it only probes a k). Each cluster row also reports the
chosen k per step (``eagle_cluster_speculative_tokens`` from ``/metrics``, steps per k over the run).

Each concurrency c runs ``max(--num-prompts, c)`` prompts (cycled from the shipped set), so c streams are open at
once. For each mode and concurrency: the seed-style report (``benchmarks.serving``), then CPU milliseconds per output
token by process group (``benchmarks.cpu_split``), then the ratios to vLLM colocated and target-only. The first
request after ready and the median of the next ten (each 32 greedy tokens) are measured once per mode. With strict
pinning the summary also says what core 0 allows each mode: its CPU per output token there, and the tok/s it would
reach if it never waited for a drafter, against vLLM colocated's (``core0_ms_per_token``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks import cpu_split
from benchmarks.serving import run
from benchmarks.serving_compare import cluster_server, ingress_env, vllm_server
from cluster.config import PROJECT_ROOT as ROOT
from cluster.harness import HEADS, HTTP, cpu_yaml, load_prompts, post, serve_command, start, stop, wait_healthy

MODES = ["target-only", "colocated-eagle", "colocated-eagle3", "cluster-eagle3", "cluster-eagle3-async",
         "cluster-eagle", "cluster-eagle-async", "cluster-eagle3-haproxy", "cluster-eagle3-async-haproxy",
         "cluster-eagle3-sched", "cluster-eagle3-k0", "cluster-eagle3-k1", "cluster-eagle3-k2", "cluster-eagle3-k3",
         "cluster-eagle3-auto", "cluster-eagle3-auto-haproxy",
         "cluster-eagle3-grpc", "cluster-eagle3-async-grpc", "cluster-eagle3-nospin", "cluster-eagle3-async-nospin",
         "cluster-eagle3-k0-nospin", "cluster-eagle3-nodrafter",
         "cluster-eagle3-pyproxy", "cluster-eagle3-async-pyproxy"]
DRAFT_LENGTH_KEY = "num_speculative_tokens_per_batch_size"
SCHEDULE = [[1, 2, 3], [3, 8, 1], [9, 1024, 0]]  # the fixed schedule of ``*-sched`` modes
DEFAULT_MODES = ["target-only", "colocated-eagle3", "cluster-eagle3", "cluster-eagle3-async"]
STRICT = {"engine core": {0}, "worker": {0}, "serving path": {0}, "drafter": {1}}


def first_requests(base: str) -> tuple[float, float]:
    """(the first request's seconds, the median of the next ten): 32 greedy tokens each, one at a time."""
    times = []
    for i in range(11):
        t = time.perf_counter()
        status, body = post("/v1/completions", json.dumps(
            {"prompt": f"def first_{i}(", "max_tokens": 32, "temperature": 0, "ignore_eos": True}).encode(), base=base)
        assert status == 200, body
        times.append(time.perf_counter() - t)
    return times[0], statistics.median(times[1:])


def metrics_text(base: str) -> str:
    """The server's ``/metrics`` page."""
    import urllib.request

    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        return r.read().decode()


def chosen_k(text: str) -> list[int]:
    """Steps per chosen k so far (``eagle_cluster_speculative_tokens``' cumulative buckets in ``/metrics`` text)."""
    cum = [int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
           if line.startswith("eagle_cluster_speculative_tokens_bucket") and '"+Inf"' not in line]
    return [b - a for a, b in zip([0, *cum], cum, strict=False)]


def goodput_estimates(text: str) -> dict[str, list[float | None]]:
    """``auto``'s table in ``/metrics`` text (``eagle_cluster_estimated_goodput_by_draft_length``): estimated output
    tokens per second by batch-size bucket and k; empty for a fixed k or a schedule."""
    table: dict[str, dict[int, float]] = {}
    for m in re.finditer(r'^eagle_cluster_estimated_goodput_by_draft_length\{batch="([^"]+)",k="(\d+)"\} (\S+)$', text,
                         re.MULTILINE):
        table.setdefault(m[1], {})[int(m[2])] = float(m[3])
    width = 1 + max((k for row in table.values() for k in row), default=-1)
    return {b: [row.get(k) for k in range(width)] for b, row in table.items()}


def policy_periods() -> list[list[float]]:
    """The periods the verifier's draft-length policy timed since the last call, ``[batch size, k, ms]`` in step order
    (``VerifierServer.step_timings``; ``auto`` only), read through Ray and reset."""
    import ray

    from benchmarks.pipelined_drafting import step_timings

    if not ray.is_initialized():
        ray.init(address="auto", log_to_driver=False)
    return step_timings(reset=True)["draft_length_periods"]


def periods_by_run_position(periods: list[list[float]], batch: range) -> dict[int, dict[str, float]]:
    """Median period (ms) by k and by position in a run of steps at one k (1, 2, 3, 4+), over steps whose batch size
    is in ``batch``: whether a k's first steps after a change cost more than its steady ones."""
    cells: dict[tuple[int, int], list[float]] = {}
    run, last = 0, None
    for b, k, ms in periods:
        run = run + 1 if k == last else 1
        last = k
        if int(b) in batch:
            cells.setdefault((int(k), min(run, 4)), []).append(ms)
    out: dict[int, dict[str, float]] = {}
    for (k, pos), v in sorted(cells.items()):
        out.setdefault(k, {})[f"{pos}{'+' if pos == 4 else ''} (n={len(v)})"] = statistics.median(v)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pinning", choices=["strict", "none"], default="strict")
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 16])
    p.add_argument("--num-prompts", type=int, default=16,
                   help="prompts per concurrency, at least the concurrency (so c streams are really open)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--modes", nargs="*", default=DEFAULT_MODES, choices=MODES)
    p.add_argument("--periods", action="store_true",
                   help="cluster modes: read the draft-length policy's timed periods after each concurrency (through "
                        "Ray) and print their median by k and position in a run of one k")
    p.add_argument("--out", default=str(ROOT / "results" / "pinned"))
    p.add_argument("--summary-from", metavar="RESULTS_JSON",
                   help="print the summary of an earlier run's results and exit")
    args = p.parse_args()
    if args.summary_from:
        summary(json.loads(Path(args.summary_from).read_text()), args.pinning)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(None, max([args.num_prompts, *args.concurrency]))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    if args.pinning == "strict":
        env.update(VLLM_CPU_OMP_THREADS_BIND="0", OMP_NUM_THREADS="1")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            kind, _, method = mode.partition("-")
            mode_env = dict(env)
            if kind == "cluster":
                method, *variants = method.split("-")
                drafter: dict = {"async_drafting": {"enabled": "async" in variants}}
                if args.pinning == "strict":
                    drafter["cpu_affinity"] = [1]
                mode_env.update(ingress_env(variants))  # HAProxy (the default), *-pyproxy, *-grpc
                fixed = [int(v[1:]) for v in variants if re.fullmatch(r"k[0-2]", v)]
                if fixed or {"sched", "k3", "auto", "nospin", "nodrafter"} & set(variants):
                    length = (SCHEDULE if "sched" in variants else "auto" if "auto" in variants
                              else [[1, 1024, fixed[0]]] if fixed else None)
                    spec = {"method": method, "model": str(HEADS[method]), DRAFT_LENGTH_KEY: length}
                    verifier = {"engine_spin_s": None} if "nospin" in variants else {}  # vLLM's own 1 s
                    cmd, base = serve_command(cpu_yaml(Path(tmp) / f"{mode}.yaml", drafter=drafter, verifier=verifier,
                                                       drafter_app="nodrafter" not in variants,
                                                       speculative_config=spec)), HTTP
                else:
                    cmd, base = cluster_server(method, Path(tmp), drafter, name="-".join(variants) or "sync")
            else:
                cmd, base = vllm_server(None if kind == "target" else method)
            proc = start(cmd, env=mode_env, log=Path(tmp) / f"{mode}.log")
            try:
                wait_healthy(proc, base, log=Path(tmp) / f"{mode}.log")
                procs = cpu_split.server_processes(proc.pid)
                pinned = cpu_split.pin(procs, STRICT) if args.pinning == "strict" else {}
                first, rest = first_requests(base)
                asyncio.run(run(base, prompts[:4], 8, 4, None, f"{mode} warm-up", quiet=True))
                results[mode] = {"first_request_s": first, "next_ten_median_s": rest, "by_c": {},
                                 "pinned": {g: len(v) for g, v in pinned.items()}}
                print(f"{mode}: first request {first * 1000:.0f} ms, next ten median {rest * 1000:.0f} ms; "
                      f"pinned processes {results[mode]['pinned']}", flush=True)
                for c in args.concurrency:
                    ks_before = chosen_k(metrics_text(base)) if kind == "cluster" else []
                    procs = cpu_split.server_processes(proc.pid)
                    before = cpu_split.snapshot(procs)
                    batch = prompts[: max(args.num_prompts, c)]  # fewer prompts than streams would cap c
                    report = asyncio.run(run(base, batch, args.max_tokens, c, None, f"{mode} c={c}", quiet=True))
                    cpu = cpu_split.split(procs, before, cpu_split.snapshot(procs))
                    print(report.text(), flush=True)
                    per_tok = {g: 1000 * s / max(report.output_tokens, 1) for g, s in cpu.items()}
                    print("CPU ms per output token: " + ", ".join(f"{g} {v:.2f}" for g, v in per_tok.items()),
                          flush=True)
                    text = metrics_text(base) if kind == "cluster" else ""
                    ks = [b - a for a, b in zip(ks_before, chosen_k(text), strict=False)]
                    if ks:
                        print(f"steps per chosen k (0..K): {ks}", flush=True)
                    estimates = goodput_estimates(text)
                    if estimates:
                        print("auto's estimated tokens/s by batch and k: " + "; ".join(
                            f"{b}: " + " ".join("-" if v is None else f"{v:.0f}" for v in row)
                            for b, row in estimates.items()), flush=True)
                    periods = policy_periods() if args.periods and kind == "cluster" else []
                    if periods:
                        low = c // 2 + 1  # the batch sizes of c's bucket, ``draft_length.bucket``
                        for k, cells in periods_by_run_position(periods, range(low, c + 1)).items():
                            print(f"periods at batch {low}-{c}, k = {k}, by position in its run: " + ", ".join(
                                f"{pos} {ms:.1f} ms" for pos, ms in cells.items()), flush=True)
                    results[mode]["by_c"][str(c)] = {**asdict(report), "cpu_ms_per_token": per_tok,
                                                     "steps_per_k": ks, "goodput_estimates": estimates,
                                                     "periods": periods}
            finally:
                stop(proc)
    (out / f"results-{args.pinning}.json").write_text(json.dumps(results, indent=2))
    summary(results, args.pinning)


def core0_ms_per_token(cpu_ms_per_token: dict[str, float]) -> float:
    """CPU milliseconds per output token of the groups strict pinning binds to core 0 (``STRICT``)."""
    return sum(v for g, v in cpu_ms_per_token.items() if STRICT.get(g) == {0})


def summary(results: dict, pinning: str) -> None:
    def tps(mode: str, c: str) -> float:
        r = results[mode]["by_c"][c]
        return r["output_tokens"] / r["duration_s"]

    print(f"\npinning: {pinning}")
    print("mode | c | output tok/s | TTFT p50 ms | TPOT p50 ms | MAL | x colocated-eagle3 | x target-only | "
          "serving path CPU ms/token | steps per k")
    for mode, res in results.items():
        for c, r in res["by_c"].items():
            spec = r["spec"]
            mal = 1 + spec["num_accepted_tokens"] / spec["num_drafts"] if spec and spec["num_drafts"] else 1.0
            colo = f"{tps(mode, c) / tps('colocated-eagle3', c):.2f}" if "colocated-eagle3" in results else ""
            base = f"{tps(mode, c) / tps('target-only', c):.2f}" if "target-only" in results else ""
            print(f"{mode} | {c} | {tps(mode, c):.1f} | {r['ttft_ms']['median']:.0f} | {r['tpot_ms']['median']:.2f} | "
                  f"{mal:.2f} | {colo} | {base} | {r['cpu_ms_per_token']['serving path']:.2f} | "
                  f"{r.get('steps_per_k', '')}")
    if pinning == "strict":
        print("\nWhat core 0 allows (strict pinning: engine core, worker and serving path all on core 0). "
              "The ceiling is 1000 / core-0 CPU ms per output token: the tok/s a mode would reach with core 0 "
              "busy all the time, i.e. never waiting for a drafter (same acceptance).")
        print("mode | c | core-0 CPU ms/token | core 0 busy | ceiling tok/s | ceiling x colocated-eagle3's tok/s")
        for mode, res in results.items():
            for c, r in res["by_c"].items():
                ms = core0_ms_per_token(r["cpu_ms_per_token"])
                ceiling = 1000 / ms if ms else float("nan")
                colo = f"{ceiling / tps('colocated-eagle3', c):.2f}" if "colocated-eagle3" in results else ""
                print(f"{mode} | {c} | {ms:.2f} | {ms * tps(mode, c) / 1000:.0%} | {ceiling:.1f} | {colo}")
    print("\nmode | first request ms | median of the next ten ms | ratio")
    for mode, res in results.items():
        f, n = res["first_request_s"], res["next_ten_median_s"]
        print(f"{mode} | {f * 1000:.0f} | {n * 1000:.0f} | {f / n:.2f}")


if __name__ == "__main__":
    main()
