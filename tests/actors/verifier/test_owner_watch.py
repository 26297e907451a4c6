"""The engine's processes end when their owner is killed (``actors.verifier.owner_watch``): a real process
chain, owner -> engine -> worker, with the owner SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from tests.conftest import ROOT

WORKER = "import time; from actors.verifier.owner_watch import watch_owner; import sys; " \
         "assert watch_owner(int(sys.argv[1]), 0.1); print('watching', flush=True); time.sleep(60)"
ENGINE = "import os, subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', sys.argv[1], " \
         "str(os.getppid())]); print(p.pid, flush=True); time.sleep(60)"
OWNER = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]]); " \
        "time.sleep(60)"


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_engine_and_worker_end_with_their_owner():
    owner = subprocess.Popen([sys.executable, "-c", OWNER, ENGINE, WORKER], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        worker_pid = int(owner.stdout.readline())
        assert owner.stdout.readline().strip() == "watching"
        engine_pid = psutil.Process(worker_pid).ppid()
        assert psutil.Process(engine_pid).ppid() == owner.pid
        time.sleep(0.5)
        assert not gone(engine_pid) and not gone(worker_pid)  # a live owner: nothing happens
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        deadline = time.time() + 5
        while time.time() < deadline and not (gone(engine_pid) and gone(worker_pid)):
            time.sleep(0.1)
        assert gone(engine_pid) and gone(worker_pid)
    finally:
        for p in psutil.Process().children(recursive=True):
            p.kill()


def test_not_an_ancestor_is_refused():
    from actors.verifier.owner_watch import watch_owner

    assert watch_owner(-12345) is False
