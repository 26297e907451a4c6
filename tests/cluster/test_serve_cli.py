"""``cluster.serve_cli``'s bound on Ctrl-C, on a stand-in server whose graceful shutdown hangs: the process exits
130 once the grace has passed (or at a second Ctrl-C), and takes every process it started with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from cluster.serve_cli import EXIT_SIGINT
from tests.conftest import ROOT
from tests.waits import wait_for

# A server that starts a child, then hangs in its KeyboardInterrupt path, as a stuck ``serve.shutdown()`` does.
STUCK_SERVER = """
import signal, subprocess, sys, time
from cluster.serve_cli import BoundedInterrupt
signal.signal(signal.SIGINT, BoundedInterrupt(grace_s=float(sys.argv[1])))
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
try:  # the pid is printed inside the try: the test's Ctrl-C may come the moment it reads it
    print(child.pid, flush=True)
    time.sleep(120)
except KeyboardInterrupt:
    print("graceful path", flush=True)
    time.sleep(120)
"""


def start_stuck(grace_s: float) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", STUCK_SERVER, str(grace_s)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    return proc, int(proc.stdout.readline())


@pytest.mark.parametrize("second_ctrl_c", [False, True])
def test_ctrl_c_stops_a_stuck_server_and_its_children(second_ctrl_c):
    grace_s = 60.0 if second_ctrl_c else 0.5  # a second Ctrl-C does not wait for the grace
    proc, child = start_stuck(grace_s)
    try:
        os.kill(proc.pid, signal.SIGINT)
        assert proc.stdout.readline().strip() == "graceful path"  # the first Ctrl-C is Ray's KeyboardInterrupt
        if second_ctrl_c:
            os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == EXIT_SIGINT
        assert wait_for(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie", 10)
    finally:
        proc.kill()
        if psutil.pid_exists(child):
            os.kill(child, signal.SIGKILL)
