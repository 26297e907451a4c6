"""What every benchmark writes beside its figures: the commit it measured, the date, the hardware and where its
processes ran, and what else was running on the machine.

Where it sits: ``benchmarks.served`` puts the stamp at the top of its ``results.json`` (and so in every table file it
writes for ``docs/results/``), ``benchmarks.faults``, ``benchmarks.offline`` and ``benchmarks.drafter`` print it as
one ``# stamp: {...}`` line before their figures (``benchmarks.offline`` also writes it into its ``--json`` files).
``benchmarks.report`` reads the commit back to tell whether a table is stale.

Imports only the standard library at the top: ``benchmarks.drafter`` runs on a GPU machine with torch, numpy and
msgpack alone. Without psutil there the stamp has no ``others``; without git (or outside a checkout) its commit is
``not recorded``.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NOT_RECORDED = "not recorded"
# The placement sentence of each ``--pinning`` of the served benchmarks (``benchmarks.modes.PINNINGS``).
PINNING = {
    "strict": "core 1: the drafter (replica and actor) alone; core 0: every other process of the server (API server or "
              "Serve ingress and verifier replica, vLLM's engine core and worker, Ray's control plane); the client "
              "unbound",
    "none": "nothing pinned: every process on every core",
}


def git(root: Path, *args: str) -> str | None:
    """``git args`` in ``root``: its stdout, or None where git is absent or fails (not a checkout)."""
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def commit(root: Path = ROOT) -> str:
    """HEAD's short hash, `` (dirty tree)`` after it where tracked files differ from it; ``not recorded`` without
    git."""
    head = git(root, "rev-parse", "--short", "HEAD")
    if not head:
        return NOT_RECORDED
    return head + (" (dirty tree)" if git(root, "status", "--porcelain", "--untracked-files=no") else "")


def today() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")),
                platform.processor() or "CPU model unknown")


def hardware(placement: str) -> str:
    """The CPU, its cores, and where the processes ran: ``placement`` is a ``--pinning`` name (``PINNING``) or the
    sentence itself."""
    return f"{cpu_model()}, {os.cpu_count()} cores; {PINNING.get(placement, placement)}"


def others(window_s: float = 1.0, top: int = 5) -> list[dict[str, Any]] | None:
    """The ``top`` processes by CPU over ``window_s`` that are neither this process nor its children, busiest first:
    ``{"pid", "name", "cpu_pct"}`` (percent of one core). None without psutil."""
    try:
        import psutil
    except ImportError:
        return None
    me = psutil.Process()
    mine = {me.pid} | {p.pid for p in me.children(recursive=True)}
    procs = [p for p in psutil.process_iter(["name"]) if p.pid not in mine]
    for p in procs:
        try:
            p.cpu_percent(None)
        except psutil.Error:
            pass
    time.sleep(window_s)
    busy = []
    for p in procs:
        try:
            pct = p.cpu_percent(None)
        except psutil.Error:
            continue
        if pct > 0:
            busy.append({"pid": p.pid, "name": p.info["name"], "cpu_pct": round(pct, 1)})
    return sorted(busy, key=lambda o: -o["cpu_pct"])[:top]


def stamp(placement: str, root: Path = ROOT, window_s: float = 1.0) -> dict[str, Any]:
    """``commit``, ``date`` (UTC), ``hardware`` (``placement``: see ``hardware``) and, with psutil, ``others``."""
    out: dict[str, Any] = {"commit": commit(root), "date": today(), "hardware": hardware(placement)}
    busy = others(window_s)
    if busy is not None:
        out["others"] = busy
    return out


def line(s: dict[str, Any]) -> str:
    """The stamp as the one line the printing benchmarks start with."""
    return "# stamp: " + json.dumps(s)
