"""Place a new session on the WorldModel replica with the most free session slots.

Replicas report free slots through `record_routing_stats`, but only every
`request_routing_stats_period_s`: sessions opened back to back would all land
on the replica that last looked emptiest. So the router also counts its own
placements since each replica's last report and subtracts them.
"""

from __future__ import annotations

import random
from typing import Any

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    ReplicaResult,
    RequestRouter,
    RunningReplica,
)

SESSION_METHOD = "run_session"  # the default; a deployment names its own in request_router_kwargs


class FreeSlotsRouter(RequestRouter):
    def initialize_state(self, session_method: str = SESSION_METHOD, **kwargs: Any) -> None:
        self._session_method = session_method
        self._placed: dict[ReplicaID, tuple[float, int]] = {}  # replica -> (report time seen, placed since)

    def _free_slots(self, replica: RunningReplica) -> float:
        stats = replica.routing_stats or {}
        free = stats.get("free_slots")
        if free is None:
            return float("inf")  # not reported yet: a fresh replica is the emptiest there is
        reported_at = stats.get("reported_at", 0.0)
        seen_at, placed = self._placed.get(replica.replica_id, (reported_at, 0))
        if seen_at != reported_at:
            placed = 0  # a newer report already counts our earlier placements
        return free - placed

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if pending_request is not None and pending_request.metadata.call_method != self._session_method:
            return [random.sample(candidate_replicas, len(candidate_replicas))]
        by_free: dict[float, list[RunningReplica]] = {}
        for replica in candidate_replicas:
            by_free.setdefault(self._free_slots(replica), []).append(replica)
        # Best first; full replicas last (they refuse at once and the ingress tries again).
        return [random.sample(group, len(group)) for _, group in sorted(by_free.items(), key=lambda kv: -kv[0])]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult) -> None:
        if pending_request.metadata.call_method != self._session_method:
            return
        replica = self.curr_replicas.get(replica_id)
        reported_at = ((replica.routing_stats if replica else None) or {}).get("reported_at", 0.0)
        seen_at, placed = self._placed.get(replica_id, (reported_at, 0))
        self._placed[replica_id] = (reported_at, (placed if seen_at == reported_at else 0) + 1)
