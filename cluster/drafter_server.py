"""The drafter deployment: a Ray Serve replica around ``actors.drafter.engine.DrafterEngine``.

Undecorated (``cluster.app`` makes it a deployment with the configured resources and autoscaling). The verifier's
``RemoteEagleProposer`` reaches it through ``cluster.draft_client.ServeDraftClient``: a packed ``DraftStep`` and
the ``ObjectRef`` of the step's hidden states in, a packed ``DraftResult`` out (carrying this replica's id,
so the client can send the step's sequences back here: ``cluster.drafter_router``). Health reflects real
health: the head is loaded and answers a one-token draft.

Load reports: ``record_routing_stats`` (active sequences, for the router's least-loaded choice) and
``record_autoscaling_stats`` (active sequences and mean draft time, for ``cluster.drafter_autoscaling``).
"""

from __future__ import annotations

import time
from typing import Any

from actors.drafter.actor import DrafterActor


class DrafterServer:
    def __init__(self, head_dir: str, target_dir: str, max_model_len: int = 4096, num_threads: int = 1,
                 branches: dict[str, int] | None = None) -> None:
        from ray import serve

        replica_id = serve.get_replica_context().replica_id.unique_id
        self.actor = DrafterActor(head_dir, target_dir, max_model_len=max_model_len, num_threads=num_threads,
                                  drafter_id=replica_id, branches=branches)

    async def propose(self, step_bytes: bytes, hidden: Any) -> bytes:
        import ray

        if isinstance(hidden, ray.ObjectRef):  # Serve passes refs through unresolved
            hidden = await hidden
        return self.actor.propose(step_bytes, hidden)

    async def stats(self) -> dict[str, Any]:
        import ray

        return {**self.actor.stats(), "node_id": ray.get_runtime_context().get_node_id()}

    def record_routing_stats(self) -> dict[str, Any]:
        return {"active_sequences": self.actor.engine.num_active_sequences, "reported_at": time.time()}

    def record_autoscaling_stats(self) -> dict[str, float]:
        return self.actor.load_window()

    async def free(self, req_ids: list[str]) -> int:
        return self.actor.free(req_ids)

    async def check_health(self) -> None:
        shape = self.actor.probe()
        if tuple(shape) != (1, 1):
            raise RuntimeError(f"drafter unhealthy: probe drafted shape {shape}")
