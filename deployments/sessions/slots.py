"""A replica's session slots, and what it tells the router about them."""

from __future__ import annotations

import time


class SessionSlots:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._held: set[str] = set()

    def try_take(self, session_id: str) -> bool:
        """False when full: the replica then refuses at once so the ingress can try another one."""
        if len(self._held) >= self.capacity:
            return False
        self._held.add(session_id)
        return True

    def release(self, session_id: str) -> None:
        self._held.discard(session_id)

    @property
    def held(self) -> list[str]:
        return sorted(self._held)

    def routing_stats(self) -> dict:
        """For `record_routing_stats`; `reported_at` lets the router tell a fresh report from an old one."""
        return {
            "free_slots": max(0, self.capacity - len(self._held)),
            "capacity": self.capacity,
            "active": len(self._held),
            "reported_at": time.time(),
        }
