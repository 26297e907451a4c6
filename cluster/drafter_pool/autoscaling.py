"""``DrafterLoadPolicy``: the drafter deployment's Ray Serve autoscaling policy, on drafter load.

A drafter's request count says little (one call per step per verifier, whatever the batch), so the pool scales
on what each replica reports in ``record_autoscaling_stats`` (``cluster.drafter_pool.server``), aggregated by Serve
over the look-back window:

- ``active_sequences``: sequences holding draft state; the pool wants ``target_sequences_per_replica`` each;
- ``draft_ms``: mean drafter compute per step; if ``target_draft_ms`` is set, the pool also grows while
  replicas draft slower than that (a replica's batch cost grows with its sequences and their lengths).

The wanted size is the larger of the two; Serve applies ``min_replicas`` / ``max_replicas`` and the up / down
delays around it (``cluster.config.AutoscalingConfig``). Scale-down needs nothing more: a drained replica's
sequences are re-homed by ``cluster.drafter_pool.router``.
"""

from __future__ import annotations

import math
from typing import Any


def wanted_replicas(
    active_sequences: dict[Any, float],
    draft_ms: dict[Any, float],
    current: int,
    target_sequences_per_replica: float,
    target_draft_ms: float | None,
) -> int:
    """Worked example: 40 active sequences over 2 replicas at 16 per replica -> 3; with draft times
    [30, 50] ms against a 20 ms target -> 2 * 40 / 20 = 4; the policy asks for max(3, 4) = 4."""
    by_sequences = math.ceil(sum(active_sequences.values()) / target_sequences_per_replica)
    by_latency = 0
    times = [t for t in draft_ms.values() if t > 0]
    if target_draft_ms and times and current > 0:
        by_latency = math.ceil(current * (sum(times) / len(times)) / target_draft_ms)
    return max(by_sequences, by_latency)


class DrafterLoadPolicy:
    def __init__(self, target_sequences_per_replica: float = 16, target_draft_ms: float | None = None) -> None:
        if target_sequences_per_replica <= 0:
            raise ValueError(f"target_sequences_per_replica must be > 0, got {target_sequences_per_replica}")
        self.target_sequences_per_replica = target_sequences_per_replica
        self.target_draft_ms = target_draft_ms

    def __call__(self, ctx) -> tuple[int, dict[str, Any]]:  # ctx: ray.serve.config.AutoscalingContext
        metrics = ctx.aggregated_metrics or {}
        wanted = wanted_replicas(
            metrics.get("active_sequences", {}), metrics.get("draft_ms", {}), ctx.current_num_replicas,
            self.target_sequences_per_replica, self.target_draft_ms,
        )
        return wanted, {"wanted_replicas": wanted}
