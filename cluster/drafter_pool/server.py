"""The drafter deployment: a Ray Serve replica that owns one drafter actor (``actors.drafter.actor.DrafterActor``).

Undecorated (``cluster.app`` makes it a deployment with a one-bundle placement group holding the configured
resources, and autoscaling, and binds it the pool's ``actors.drafter.config.DrafterSettings``). Serve places,
health-checks and scales the replicas; the replica starts its drafter actor with those settings in its own bundle
(so the actor gets the replica's CPUs / GPU), and the actor dies with it (Ray ends an actor whose owner dies).
Verifiers reach the actor straight by its handle, which ``attach`` hands out
(``cluster.drafter_pool.finder.ServeFinder``): a step's traffic never goes through Serve.

Health reflects real health: the actor is alive and answers a one-token draft. Load reports:
``record_routing_stats`` (active sequences, for the router's least-loaded choice) and
``record_autoscaling_stats`` (active sequences and mean draft time, for ``cluster.drafter_pool.autoscaling``).
"""

from __future__ import annotations

import time
from typing import Any

from actors.drafter.actor import drafter_actor_class
from actors.drafter.config import DrafterSettings
from actors.verifier.drafters import DRAFT_TIMEOUT_S


class DrafterServer:
    async def __init__(self, settings: DrafterSettings, actor_options: dict[str, Any] | None = None,
                       timeout_s: float = DRAFT_TIMEOUT_S, target_sequences: float = float("inf")) -> None:
        """``settings``: the drafter actor's, as the pool config built them (``DrafterPoolConfig.for_drafter``),
        handed to it whole. ``actor_options``: its Ray resources (``num_cpus``, ``num_gpus``, ``resources``).
        ``timeout_s``: how long a verifier waits for a draft call here, handed to it with ``attach`` (a drafter
        setting that verifiers learn), and ``target_sequences``: the pool's target per replica, past which a verifier
        homes no more sequences here by their prompt's prefix (``actors.verifier.homes``)."""
        from ray import serve
        from ray.util import get_current_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.replica_id = serve.get_replica_context().replica_id.unique_id
        opts = dict(actor_options or {})
        pg = get_current_placement_group()
        if pg is not None:
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
        self.drafter = drafter_actor_class(**opts).remote(settings, self.replica_id)
        self.info = {**await self.drafter.info.remote(), "timeout_s": timeout_s, "target_sequences": target_sequences}

    async def attach(self) -> tuple[str, Any, dict[str, Any]]:
        """(this replica's id, its drafter actor's handle, the drafter's info) for a verifier's client."""
        return self.replica_id, self.drafter, self.info

    async def stats(self) -> dict[str, Any]:
        return await self.drafter.stats.remote()

    async def record_routing_stats(self) -> dict[str, Any]:
        stats = await self.drafter.stats.remote()
        return {"active_sequences": stats["active_sequences"], "reported_at": time.time()}

    async def record_autoscaling_stats(self) -> dict[str, float]:
        return await self.drafter.load_window.remote()

    async def check_health(self) -> None:
        shape = await self.drafter.probe.remote()
        if tuple(shape) != (1, 1):
            raise RuntimeError(f"drafter unhealthy: probe drafted shape {shape}")
