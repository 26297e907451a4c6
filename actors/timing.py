"""Step timings that mean the same on a CPU and on CUDA: how long until the work is done.

On CUDA, kernels are queued and a call returns once they are launched; a host clock around it measures launches,
and the work's time lands in whichever later call waits for the device. ``ms_since`` waits for the device first
(``torch.cuda.synchronize``), and does nothing more on a CPU, where calls return when the work is done. Used
where this project records step timings: the verifier's worker (``forward_ms``, ``sample_ms``, vLLM's own
drafter's propose), the remote proposer (``propose_ms``), the drafter (``compute_ms``, the branch pass).

The wait costs each timed CUDA call a host stall until the queue drains (the next call's launches no longer
overlap this call's tail). The drafter's calls pay it (their drafts are read back at once anyway). The verifier's
worker, whose steps must not stall (asynchronous scheduling overlaps a step's host work with the previous step's
device work), records ``DeviceSpans`` instead: two CUDA events per call, read only when the timings are read.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch


def synchronize(device: torch.device | str | None) -> None:
    """Wait for the work queued on ``device`` when it is a CUDA device; nothing otherwise."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)  # cuda-only


def ms_since(start: float, device: torch.device | str | None) -> float:
    """Milliseconds from ``start`` (``time.perf_counter()``) until the work queued on ``device`` is done."""
    synchronize(device)
    return (time.perf_counter() - start) * 1e3


class DeviceSpans:
    """Durations (ms) of calls until the device finished their work, taken without waiting for it: on CUDA, events
    recorded before and after each call on the current stream, resolved when ``values`` is read (which waits for
    the last one); elsewhere the host clock (a CPU call returns when its work is done). The latest ``maxlen``."""

    def __init__(self, maxlen: int) -> None:
        self._spans: deque[float | tuple[Any, Any]] = deque(maxlen=maxlen)

    def time(self, device: torch.device | str | None, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, its span recorded."""
        if device is None or torch.device(device).type != "cuda":
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._spans.append((time.perf_counter() - start) * 1e3)
        begin = torch.cuda.Event(enable_timing=True)  # cuda-only
        begin.record()  # cuda-only
        try:  # cuda-only
            return fn(*args, **kwargs)
        finally:  # cuda-only
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._spans.append((begin, end))

    def values(self) -> list[float]:
        return [s if isinstance(s, float) else float(s[0].elapsed_time(s[1])) for s in self._spans]

    def clear(self) -> None:
        self._spans.clear()

    def __len__(self) -> int:
        return len(self._spans)
