"""Place a new session on the WorldModel replica with the most free session slots.

Replicas report free slots through `record_routing_stats`, but only every
`request_routing_stats_period_s`: sessions opened back to back would all land
on the replica that last looked emptiest. So the router also remembers when it
placed each session and subtracts those placed after a replica's last report
(a report taken before a placement may arrive after it).
"""

from __future__ import annotations

import random
import time
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
        self._placed: dict[ReplicaID, list[float]] = {}  # replica -> when we sent it each recent session

    def _free_slots(self, replica: RunningReplica) -> float:
        stats = replica.routing_stats or {}
        free = stats.get("free_slots")
        if free is None:
            return float("inf")  # not reported yet: a fresh replica is the emptiest there is
        # A report counts the sessions placed before it was taken; subtract the ones placed after.
        reported_at = stats.get("reported_at", 0.0)
        placed = [t for t in self._placed.get(replica.replica_id, []) if t > reported_at]
        self._placed[replica.replica_id] = placed
        return free - len(placed)

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
        self._placed.setdefault(replica_id, []).append(time.time())
