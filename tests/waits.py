"""Waiting on a state, never on the clock: the one poll loop tests use."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], timeout_s: float, interval_s: float = 0.1) -> bool:
    """Polls ``predicate`` until it is truthy (True) or ``timeout_s`` has passed (False, after one last try)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())
