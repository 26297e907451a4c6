"""The environment a Ray node that serves the cluster starts with (``ray start``, or ``serve run`` / ``ray.init``
starting a local one): read by Ray's raylet when the node starts, so it cannot be set per application.

Ray starts its worker processes at nice 15 (the raylet's ``worker_niceness``), below its own control plane (GCS,
raylet, dashboard: nice 0) and below any other process at nice 0 on the node. Every replica and actor of the cluster
is such a worker, and vLLM's engine-core process is a child of the verifier replica, so on a busy node the
verifier's engine loses its core to the control plane and to the node's other work; vLLM's own server runs at
nice 0. ``make serve`` / ``make deploy``, ``eagle-cluster serve``, the demo and the benchmarks start Ray with
``RAY_worker_niceness=0``; set it in the environment of ``ray start`` on nodes you start yourself. A value already
in the environment wins.
"""

from __future__ import annotations

import os

NODE_ENV = {"RAY_worker_niceness": "0"}


def set_node_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``NODE_ENV`` set in ``env`` (default ``os.environ``) where not already set; returns ``env``."""
    env = os.environ if env is None else env
    for key, value in NODE_ENV.items():
        env.setdefault(key, value)
    return env
