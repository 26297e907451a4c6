"""Step timings that mean the same on a CPU and on CUDA: how long until the work is done.

On CUDA, kernels are queued and a call returns once they are launched; a host clock around it measures launches,
and the work's time lands in whichever later call waits for the device. ``ms_since`` waits for the device first
(``torch.cuda.synchronize``), and does nothing more on a CPU, where calls return when the work is done. Used
where this project records step timings: the verifier's worker (``forward_ms``, ``sample_ms``, vLLM's own
drafter's propose), the remote proposer (``propose_ms``), the drafter (``compute_ms``, the branch pass).

The wait costs each timed CUDA step a host stall until the queue drains (the next call's launches no longer
overlap this call's tail), a few tens of microseconds; timings are what benchmarks read, so they are taken always.
"""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device | str | None) -> None:
    """Wait for the work queued on ``device`` when it is a CUDA device; nothing otherwise."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def ms_since(start: float, device: torch.device | str | None) -> float:
    """Milliseconds from ``start`` (``time.perf_counter()``) until the work queued on ``device`` is done."""
    synchronize(device)
    return (time.perf_counter() - start) * 1e3
