"""How many generation requests one verifier replica has in flight, and whether it takes one more.

``cluster.http_guard.HttpGuard`` (HTTP) and the verifier replica's gRPC methods share one ``InflightLimit``: past
``ingress.max_inflight_requests`` a request is answered at once (HTTP 503 with ``Retry-After``, gRPC
``UNAVAILABLE``) rather than queued without bound in front of a verifier that is already full. The count lives in
one replica's event loop (no locks: acquire and release run on that loop).

Each refusal counts in ``eagle_cluster_admission_rejections_total`` (``prometheus_client``'s registry of the
process that admits: its ``/metrics`` shows it where that process renders the registry).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

REJECTIONS_METRIC = "eagle_cluster_admission_rejections_total"


def _rejections_counter():
    """The process's rejection counter, made once (``prometheus_client`` refuses a name registered twice)."""
    global _REJECTIONS
    if _REJECTIONS is None:
        from prometheus_client import Counter

        _REJECTIONS = Counter(REJECTIONS_METRIC.removesuffix("_total"),
                              "generation requests refused at admission: too many in flight (HTTP 503, gRPC "
                              "UNAVAILABLE)")
    return _REJECTIONS


_REJECTIONS = None


class Overloaded(Exception):
    def __init__(self, limit: int, retry_after_s: int) -> None:
        super().__init__(f"overloaded: {limit} requests in flight at this replica; retry after "
                         f"{retry_after_s} s")
        self.retry_after_s = retry_after_s


class InflightLimit:
    def __init__(self, limit: int, retry_after_s: int = 1) -> None:
        self.limit, self.retry_after_s, self.inflight = limit, retry_after_s, 0
        self.rejected = 0  # refusals by this limit
        _rejections_counter()  # exported from the start, at 0

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Holds one slot for the ``with`` block; raises ``Overloaded`` when all are taken."""
        if self.inflight >= self.limit:
            self.rejected += 1
            _rejections_counter().inc()
            raise Overloaded(self.limit, self.retry_after_s)
        self.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1
