"""``SequenceAffinityRouter``: Ray Serve's request router for the drafter deployment.

Per-step drafting traffic does not go through Serve: each replica owns a drafter actor, and a verifier's
``actors.verifier.remote_speculator`` calls that actor straight by its handle. What goes through Serve is
small and rare, and this router decides where, from a routing key in the handle's ``session_id``
(see ``route_key``):

- ``new:<n>``: ``attach``, a verifier learning a drafter for n new sequences. Routed to the least-loaded replica,
  load being the active sequences each replica reports through ``record_routing_stats``, plus the sequences this
  router has sent it since that report (reports are periodic: successive attaches go round the idle replicas,
  so a client learns the whole pool).
- ``home:<replica id>``: a call for one replica (its ``stats``): routed there, and only there, while it
  runs; if it is gone, routed as new.

Several verifier replicas can share one pool: each has its own router and client, and the replicas' reports
count every verifier's sequences.
"""

from __future__ import annotations

from collections import defaultdict

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

HOME, NEW = "home:", "new:"


def route_key(home: str | None, num_sequences: int) -> str:
    return f"{HOME}{home}" if home else f"{NEW}{num_sequences}"


class SequenceAffinityRouter(RequestRouter):
    def initialize_state(self, **kwargs) -> None:
        self._sent_since_report: dict[ReplicaID, int] = defaultdict(int)
        self._last_report: dict[ReplicaID, float] = {}

    def load(self, replica: RunningReplica) -> int:
        stats = replica.routing_stats or {}
        reported_at = float(stats.get("reported_at", 0.0))
        if self._last_report.get(replica.replica_id) != reported_at:  # a fresh report counts what we sent
            self._last_report[replica.replica_id] = reported_at
            self._sent_since_report[replica.replica_id] = 0
        return int(stats.get("active_sequences", 0)) + self._sent_since_report[replica.replica_id]

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        key = (pending_request.metadata.session_id if pending_request else None) or ""
        if key.startswith(HOME):
            home = key[len(HOME):]
            for r in candidate_replicas:
                if r.replica_id.unique_id == home:
                    return [[r]]  # strictly: a busy home is waited for, never swapped
        num_new = int(key[len(NEW):]) if key.startswith(NEW) and key[len(NEW):].isdigit() else 1
        ranked = sorted(candidate_replicas, key=self.load)
        self._sent_since_report[ranked[0].replica_id] += num_new
        return [[r] for r in ranked]
