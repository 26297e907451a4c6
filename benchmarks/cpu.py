"""Where a server's CPU goes: its processes grouped by job, bound to cores, and the CPU time each group spends, under
load (``split``) or idle (``idle_rates``).

Process groups, by the title Ray, Serve and vLLM give each process:

    engine core   vLLM's engine core (``VLLM::EngineCore``): scheduler, output processing, the step loop
    worker        vLLM's worker (``VLLM::Worker``, or the engine core itself when it runs the model in-process)
    serving path  vLLM's API server, or Serve's ingress (HAProxy and its manager actor, or the Python HTTP proxy)
                  and the verifier application's replicas
    drafter       the drafter application's replicas and their drafter actors
    control plane everything else of Ray's: GCS, raylet, the Serve controller, dashboard and its agents, log monitor

CPU time is utime + stime from ``/proc/PID/stat`` (all threads), read before and after a run. ``STRICT`` is the one
pinning scheme of the served benchmarks (``benchmarks.modes.launch``): the drafter has core 1 to itself, and
everything else a server runs is on core 0, Ray's control plane included: a baseline has no control plane, so the
cluster's must be paid for on the verifier's core, not on the drafter's idle one.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass

import psutil

GROUPS = ("engine core", "worker", "serving path", "drafter", "control plane")
STRICT = {"engine core": {0}, "worker": {0}, "serving path": {0}, "control plane": {0}, "drafter": {1}}
TICK = os.sysconf("SC_CLK_TCK")


def _title(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline()) or p.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def group_of(title: str, is_server_root: bool = False) -> str | None:
    """The group of a process of a server by its title; None for the rest of Ray's (the control plane)."""
    if "EngineCore" in title:
        return "engine core"
    if "VLLM::Worker" in title or "VllmWorker" in title:
        return "worker"
    if "ServeReplica:eagle-drafters" in title or "DrafterActor" in title:
        return "drafter"
    if is_server_root or "ServeReplica:eagle-cluster" in title or "ProxyActor" in title:
        return "serving path"
    if "HAProxyManager" in title or title.split(" ", 1)[0].endswith("/haproxy"):  # Serve's HAProxy ingress
        return "serving path"
    return None


@dataclass
class Proc:
    pid: int
    group: str
    title: str


def server_processes(root_pid: int) -> list[Proc]:
    """Every process of the running server: ``root_pid`` (vLLM's API server, or ``serve run``, which starts Ray's
    processes as its children) and its descendants; other processes on the machine are left out."""
    try:
        root = psutil.Process(root_pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in tree:
        title = _title(p)
        group = group_of(title, is_server_root=p.pid == root_pid and "serve run" not in title) or "control plane"
        out.append(Proc(p.pid, group, title[:80]))
    return out


def pin(procs: list[Proc], cores: dict[str, set[int]]) -> dict[str, list[int]]:
    """Binds every thread of each process of a group in ``cores`` to those cores (as ``taskset -a -cp``);
    returns {group: pids pinned}."""
    pinned: dict[str, list[int]] = defaultdict(list)
    for proc in procs:
        if proc.group not in cores:
            continue
        try:
            for tid in os.listdir(f"/proc/{proc.pid}/task"):
                try:
                    os.sched_setaffinity(int(tid), cores[proc.group])
                except OSError:
                    pass
            pinned[proc.group].append(proc.pid)
        except OSError:
            pass
    return dict(pinned)


def cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)
    except (OSError, IndexError, ValueError):
        return None


def snapshot(procs: list[Proc]) -> dict[int, float]:
    return {p.pid: s for p in procs if (s := cpu_seconds(p.pid)) is not None}


def split(procs: list[Proc], before: dict[int, float], after: dict[int, float]) -> dict[str, float]:
    """CPU seconds per group between two snapshots (processes alive at both)."""
    out = dict.fromkeys(GROUPS, 0.0)
    for p in procs:
        if p.pid in before and p.pid in after:
            out[p.group] += after[p.pid] - before[p.pid]
    return out


def core0_ms_per_token(cpu_ms_per_token: dict[str, float]) -> float:
    """CPU milliseconds per output token of the groups strict pinning binds to core 0 (``STRICT``)."""
    return sum(v for g, v in cpu_ms_per_token.items() if STRICT.get(g) == {0})


def idle_rates(root_pid: int, window_s: float) -> list[tuple[str, str, float]]:
    """(group, title, ms of CPU per second) for every process of the tree under ``root_pid`` over ``window_s``,
    largest first: what a server costs while no request arrives."""
    procs = server_processes(root_pid)
    before = snapshot(procs)
    t0 = time.monotonic()
    time.sleep(window_s)
    after = snapshot(procs)
    wall = time.monotonic() - t0
    rows = [(p.group, p.title, 1000 * (after[p.pid] - before[p.pid]) / wall)
            for p in procs if p.pid in before and p.pid in after]
    return sorted(rows, key=lambda r: -r[2])


def by_group(rows: list[tuple[str, str, float]]) -> dict[str, float]:
    """``idle_rates``' rows summed per group, and their ``total``."""
    groups = dict.fromkeys(GROUPS, 0.0)
    for group, _, rate in rows:
        groups[group] += rate
    return {"total": sum(groups.values()), **groups}
