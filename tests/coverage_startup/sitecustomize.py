"""Start-up of every process ``tests.coverage_report`` measures (this folder is on their ``PYTHONPATH``): a daemon
thread saves the process's coverage data every ``EAGLE_CLUSTER_COVERAGE_SAVE_S`` seconds (default 1), so that a
process that never gets to save at exit still leaves what it ran up to its last second: a Ray actor ended by
``ray.kill`` (Ray's core worker exits at once, under Python's atexit and signal handlers) or anything killed with
SIGKILL. Coverage.py flushes data mid-run by design; without coverage running in the process, nothing starts.
"""

from __future__ import annotations

import os
import threading
import time


def _save_every(interval_s: float) -> None:
    from coverage import Coverage

    while True:
        time.sleep(interval_s)
        cov = Coverage.current()  # after a fork, the child's own (coverage's patch = fork restarts it)
        if cov is not None:
            try:
                cov.save()
            except Exception:  # a save racing the process's end; the next one (or the one at exit) writes it
                pass


def _start() -> None:
    if not (os.environ.get("COVERAGE_PROCESS_START") or os.environ.get("COVERAGE_PROCESS_CONFIG")):
        return
    interval_s = float(os.environ.get("EAGLE_CLUSTER_COVERAGE_SAVE_S", "1"))
    threading.Thread(target=_save_every, args=(interval_s,), name="coverage-saver", daemon=True).start()


_start()
os.register_at_fork(after_in_child=_start)  # threads do not survive a fork
