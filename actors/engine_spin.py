"""How long vLLM's engine core and its workers spin while they wait for each other: a ``vllm.general_plugins``
entry point (``pyproject.toml``), so it runs in every vLLM process, the engine core's included.

vLLM's shared-memory message queue (``vllm/distributed/device_communicators/shm_broadcast.py``, ``SpinCondition``)
has a reader busy-loop on ``sched_yield`` for ``busy_loop_s`` (1 s) after each read before it sleeps on a socket:
the worker spins while the engine core schedules, and the engine core spins while the worker runs the step. On a
core of its own that costs nothing; on the cores the verifier's worker, its serving path and (on a small machine)
a drafter need, every spin is their time. ``EAGLE_CLUSTER_ENGINE_SPIN_S`` sets that busy loop for the engines that
the cluster's verifier starts (``cluster.verifier_engine``); unset (vLLM's own servers, the baselines), vLLM keeps
its default. 0 means a reader sleeps on the queue's socket at once (a wake-up costs tens of microseconds).
"""

from __future__ import annotations

import os

SPIN_ENV = "EAGLE_CLUSTER_ENGINE_SPIN_S"


def register() -> None:
    """Sets ``SpinCondition``'s default busy loop from ``EAGLE_CLUSTER_ENGINE_SPIN_S``, if set (before any queue
    is built: vLLM loads general plugins when a process's engine or worker starts)."""
    value = os.environ.get(SPIN_ENV)
    if value is None:
        return
    spin_s = float(value)
    if spin_s < 0:
        raise ValueError(f"{SPIN_ENV}: a number of seconds >= 0, got {value!r}")
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    SpinCondition.__init__.__defaults__ = (spin_s,)
