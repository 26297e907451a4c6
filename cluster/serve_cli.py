"""Ray's ``serve`` command with a Ctrl-C that always stops: what ``eagle-cluster serve`` becomes, and ``make serve``.

Ray's ``serve run`` takes Ctrl-C as ``KeyboardInterrupt``: ``serve.shutdown()`` (the controller's graceful shutdown,
each replica draining for up to its ``graceful_shutdown_timeout_s``, bounded at 30 s in all), then at interpreter
exit ``ray.shutdown()`` ends the local cluster ``serve run`` started (GCS, raylet, their workers, and under the
workers vLLM's engine processes and Serve's HAProxy). Each of those steps waits on other processes; when one of
them does not answer (seen here on loaded machines), the command outlives Ctrl-C by minutes.

This entry point keeps Ray's path and bounds it: the first Ctrl-C starts it and a timer; when the timer
(``GRACE_S``) fires first, or at a second Ctrl-C, every process this one started is killed and it exits 130, as a
shell expects of a command stopped by SIGINT. Nothing of vLLM is imported here.

    python -m cluster.serve_cli run deploy/cpu.yaml     # = serve run deploy/cpu.yaml
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from types import FrameType

GRACE_S = 10.0  # Ray's own shutdown takes ~5 s here when every process answers
EXIT_SIGINT = 130  # 128 + SIGINT


def kill_descendants() -> int:
    """SIGKILL to every process under this one (children first listed, grandchildren after); returns how many."""
    import psutil

    procs = psutil.Process().children(recursive=True)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=5)
    return len(procs)


def hard_stop(why: str) -> None:
    n = kill_descendants()
    print(f"\n{why}: killed {n} processes of this server", file=sys.stderr, flush=True)
    os._exit(EXIT_SIGINT)


class BoundedInterrupt:
    """The SIGINT handler: the first raises ``KeyboardInterrupt`` (Ray's graceful path) and arms the bound."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.grace_s = grace_s
        self.armed = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:
            hard_stop("second Ctrl-C")
        self.armed = True
        timer = threading.Timer(self.grace_s, hard_stop, args=(f"not stopped {self.grace_s:.0f} s after Ctrl-C",))
        timer.daemon = True  # a graceful exit inside the bound does not wait for it
        timer.start()
        raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    from ray.serve.scripts import cli

    from cluster import serve_env

    serve_env.apply()  # `serve run` starts Ray in this process: its Serve processes take the product's defaults
    signal.signal(signal.SIGINT, BoundedInterrupt())
    sys.argv[0] = "serve"
    return cli(args=sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
