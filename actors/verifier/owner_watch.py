"""Ends vLLM's engine processes when the process that built the engine (its *owner*) dies.

vLLM's engine core runs in a child process of whoever built the ``AsyncLLM`` (here a Serve replica), and its
workers in children of that. If the owner is killed (SIGKILL, OOM), nothing tells the engine core: it lives
on as an orphan holding the model, the KV cache and a CPU, while Serve starts a replacement next to it. Each
worker of ours starts this watch: once the owner is gone, it kills the owner's direct child on its way up
(the engine core, or itself when the worker runs inside it) and exits.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import psutil

logger = logging.getLogger(__name__)


def owners_child(owner_pid: int) -> psutil.Process | None:
    """This process or its ancestor whose parent is ``owner_pid`` (None if the owner is not an ancestor)."""
    proc = psutil.Process()
    while proc is not None and proc.ppid() != owner_pid:
        proc = proc.parent()
    return proc


def watch_owner(owner_pid: int, period_s: float = 1.0) -> bool:
    """Start the watch (a daemon thread). False if ``owner_pid`` is not an ancestor of this process."""
    child = owners_child(owner_pid)
    if child is None:
        return False

    def watch() -> None:
        while True:
            time.sleep(period_s)
            try:
                orphaned = child.ppid() != owner_pid  # reparented: the owner died
            except psutil.NoSuchProcess:
                orphaned = True
            if orphaned:
                logger.warning("the engine's owner (pid %d) died: ending the engine processes", owner_pid)
                if child.pid != os.getpid():
                    try:
                        child.send_signal(signal.SIGKILL)
                    except psutil.NoSuchProcess:
                        pass
                os._exit(1)

    threading.Thread(target=watch, name="eagle-cluster-owner-watch", daemon=True).start()
    return True
