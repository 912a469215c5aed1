"""Autoscale a session deployment on its sessions, not on its requests.

Serve's default policy counts ongoing requests; a session is one long request
that owns a slot, so what matters is sessions against slots. Each replica
reports `active_sessions`, `session_capacity` and the sessions it had to
refuse lately (`record_autoscaling_stats`); the policy asks for enough replicas
to hold the active and the refused sessions plus a headroom of free slots, so
the next viewers find a slot without waiting for a replica to start. Downscaling only ever drains: Serve stops routing to the
replicas it removes and waits `graceful_shutdown_timeout_s` for their
sessions to end.
"""

from __future__ import annotations

import math
from typing import Any


class SessionAutoscalingPolicy:
    def __init__(self, headroom_sessions: int = 0, default_capacity: int = 4) -> None:
        self.headroom_sessions = headroom_sessions
        self.default_capacity = default_capacity

    def desired_replicas(self, active_sessions: float, capacity: float, lowest: int, highest: int) -> int:
        per_replica = max(1.0, capacity)
        wanted = math.ceil((active_sessions + self.headroom_sessions) / per_replica)
        return max(lowest, min(highest, wanted))

    def __call__(self, ctx) -> tuple[int, dict[str, Any]]:
        metrics = ctx.aggregated_metrics or {}
        running = set(ctx.running_replicas)
        active = sum(v for r, v in metrics.get("active_sessions", {}).items() if r in running)
        refused = sum(v for r, v in metrics.get("refused_sessions", {}).items() if r in running)
        capacities = [v for r, v in metrics.get("session_capacity", {}).items() if r in running]
        capacity = max(capacities) if capacities else self.default_capacity
        # A refused viewer usually retries: count it once as demand a new replica should meet.
        target = self.desired_replicas(active + min(refused, capacity), capacity, ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas)
        return target, {"active_sessions": active, "refused_sessions": refused, "capacity": capacity}
