"""``benchmarks.idle_split.idle_rates``: the CPU a process tree spends per second, by process, on a tree with one
child that spins and one that sleeps (the benchmark's own reading of ``/proc``, not a timed test)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from benchmarks.idle_split import idle_rates


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
