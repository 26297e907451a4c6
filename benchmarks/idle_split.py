"""What a served cluster costs while no request arrives: CPU per second by process, against vLLM's own server idle.

    python -m benchmarks.idle_split [--settle-s 20] [--window-s 20] [--servers cluster vllm] [--out results/idle]

Each server is started (``serve run deploy/cpu.yaml``, the shipped default, or vLLM's own OpenAI server with its
colocated EAGLE-3 on the same checkpoints), answers one request, is left alone ``--settle-s`` (Serve's autoscaler
and health checks reach their steady rate; vLLM's engine core stops spinning), then every process of its tree is
read (``/proc/PID/stat``, ``benchmarks.cpu_split``) at the start and the end of ``--window-s`` of idleness. Prints
milliseconds of CPU per second of wall time for each process (largest first) and each process group (engine core,
worker, serving path, drafter, control plane). Nothing is pinned: on a machine whose cores the verifier and the
drafter need, every one of these milliseconds is theirs.

Ray's per-process wakeups (every worker process re-arms a 10 ms timer) and the Serve controller's loop
(``RAY_SERVE_CONTROL_LOOP_INTERVAL_S``, 0.5 s in ``cluster.serve_env``) are most of the cluster's idle cost;
``docs/BENCHMARKS.md`` (issue 20) has the figures.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks import cpu_split
from benchmarks.serving_compare import vllm_server
from cluster.config import PROJECT_ROOT as ROOT
from cluster.deploy_yaml import CPU_YAML
from cluster.harness import HTTP, post, serve_command, start, stop, wait_healthy


def idle_rates(root_pid: int, window_s: float) -> list[tuple[str, str, float]]:
    """(group, title, ms of CPU per second) for every process of the tree under ``root_pid`` over ``window_s``."""
    procs = cpu_split.server_processes(root_pid)
    before = cpu_split.snapshot(procs)
    t0 = time.monotonic()
    time.sleep(window_s)
    after = cpu_split.snapshot(procs)
    wall = time.monotonic() - t0
    rows = [(p.group, p.title, 1000 * (after[p.pid] - before[p.pid]) / wall)
            for p in procs if p.pid in before and p.pid in after]
    return sorted(rows, key=lambda r: -r[2])


def measure(cmd: list[str], base: str, settle_s: float, window_s: float, log: Path
            ) -> list[tuple[str, str, float]]:
    proc = start(cmd, env={"VLLM_CPU_KVCACHE_SPACE": "1"}, log=log)  # as benchmarks.serving_pinned: 1 GiB of KV
    try:
        wait_healthy(proc, base, log=log)
        body = json.dumps({"prompt": "def f(x):", "max_tokens": 16, "temperature": 0}).encode()
        status, reply = post("/v1/completions", body, base=base)
        assert status == 200, reply
        time.sleep(settle_s)
        return idle_rates(proc.pid, window_s)
    finally:
        stop(proc)


def report(name: str, rows: list[tuple[str, str, float]]) -> dict[str, float]:
    total = sum(r[2] for r in rows)
    print(f"\n{name}: {total:.1f} ms of CPU per second idle, {len(rows)} processes")
    for group, title, rate in rows:
        if rate >= 0.5:
            print(f"  {rate:6.1f}  {group:<13}  {title}")
    groups = dict.fromkeys(cpu_split.GROUPS, 0.0)
    for group, _, rate in rows:
        groups[group] += rate
    print("  by group: " + ", ".join(f"{g} {v:.1f}" for g, v in groups.items()))
    return {"total": total, **groups}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settle-s", type=float, default=20.0)
    p.add_argument("--window-s", type=float, default=20.0)
    p.add_argument("--servers", nargs="*", choices=["cluster", "vllm"], default=["cluster", "vllm"])
    p.add_argument("--out", default=str(ROOT / "results" / "idle"))
    args = p.parse_args()
    if args.settle_s < 0 or args.window_s <= 0:
        p.error("--settle-s must be >= 0 and --window-s > 0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for name in args.servers:
        cmd, base = (serve_command(CPU_YAML), HTTP) if name == "cluster" else vllm_server("eagle3")
        rows = measure(cmd, base, args.settle_s, args.window_s, out / f"{name}.log")
        summary[name] = {"groups": report(name, rows), "processes": rows}
    (out / "idle.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
