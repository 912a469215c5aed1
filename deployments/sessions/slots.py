"""A replica's session slots, and what it tells the router about them."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

# Refusals this recent count as unmet demand for the autoscaler.
REFUSAL_MEMORY_S = 10.0


class SessionSlots:
    def __init__(self, capacity: int, on_change: Callable[[int, int], None] | None = None) -> None:
        self.capacity = capacity
        self._held: set[str] = set()
        self._refusals: deque[float] = deque()
        self._on_change = on_change  # (active, free), e.g. for gauges
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(len(self._held), max(0, self.capacity - len(self._held)))

    def try_take(self, session_id: str) -> bool:
        """False when full: the replica then refuses at once so the ingress can try another one."""
        if len(self._held) >= self.capacity:
            self._refusals.append(time.monotonic())
            return False
        self._held.add(session_id)
        self._changed()
        return True

    def recent_refusals(self) -> int:
        horizon = time.monotonic() - REFUSAL_MEMORY_S
        while self._refusals and self._refusals[0] < horizon:
            self._refusals.popleft()
        return len(self._refusals)

    def release(self, session_id: str) -> None:
        self._held.discard(session_id)
        self._changed()

    @property
    def held(self) -> list[str]:
        return sorted(self._held)

    def autoscaling_stats(self) -> dict:
        """For `record_autoscaling_stats`: what the session autoscaling policy adds up."""
        return {"active_sessions": len(self._held), "session_capacity": self.capacity, "refused_sessions": self.recent_refusals()}

    def routing_stats(self) -> dict:
        """For `record_routing_stats`; `reported_at` lets the router tell a fresh report from an old one."""
        return {
            "free_slots": max(0, self.capacity - len(self._held)),
            "capacity": self.capacity,
            "active": len(self._held),
            "reported_at": time.time(),
        }
