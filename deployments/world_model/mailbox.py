"""Control messages for the sessions of one replica.

Serve-routed calls may land on another replica (and never on a draining one),
so interactions, stop and lease renewals go to a small actor the replica owns
instead. Being the replica's child it dies with it, and lives exactly as long
as the sessions it serves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import ray


@dataclass
class _Box:
    lease_s: float
    renewed_at: float = field(default_factory=time.monotonic)
    messages: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class Delivery:
    messages: list[Any]
    lease_expired: bool


class Mailbox:
    """Plain class so it can be tested without Ray; `MailboxActor` is the deployed form."""

    def __init__(self) -> None:
        self._boxes: dict[str, _Box] = {}

    def open(self, session_id: str, lease_s: float) -> None:
        self._boxes[session_id] = _Box(lease_s)

    def post(self, session_id: str, message: Any) -> bool:
        """False when the session is gone (ended, or never here)."""
        box = self._boxes.get(session_id)
        if box is None:
            return False
        box.messages.append(message)
        box.renewed_at = time.monotonic()  # a client that talks is alive
        return True

    def renew(self, session_id: str) -> bool:
        box = self._boxes.get(session_id)
        if box is None:
            return False
        box.renewed_at = time.monotonic()
        return True

    def take(self, session_id: str) -> Delivery:
        box = self._boxes.get(session_id)
        if box is None:
            return Delivery([], True)
        messages, box.messages = box.messages, []
        return Delivery(messages, time.monotonic() - box.renewed_at > box.lease_s)

    def close(self, session_id: str) -> None:
        self._boxes.pop(session_id, None)

    def sessions(self) -> list[str]:
        return list(self._boxes)


MailboxActor = ray.remote(num_cpus=0, max_concurrency=1)(Mailbox)
