"""Control messages for the sessions of one replica (world model or understanding).

Serve-routed calls may land on another replica (and never on a draining one),
so interactions, stop and lease renewals go to a small actor the replica owns
instead. Being the replica's child it dies with it, and lives exactly as long
as the sessions it serves.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import ray


@dataclass
class _Box:
    lease_s: float
    renewed_at: float = field(default_factory=time.monotonic)
    messages: list[Any] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class Delivery:
    messages: list[Any]
    lease_expired: bool


# Session ids are unique, so a closed id only has to be remembered while a late `open` for it may
# still be on its way; this many is far more than the sessions a replica ends in that time.
CLOSED_IDS_KEPT = 4096
# A box whose lease ran out this many leases ago belongs to a session that has ended or is ending (its
# replica reads an expired lease, or a missing box, as "drop the session" alike), so it is dropped even
# if its close never came: a close lost on some cancellation path cannot leak boxes for the replica's life.
STALE_AFTER_LEASES = 4


class Mailbox:
    """Plain class so it can be tested without Ray; `MailboxActor` is the deployed form."""

    def __init__(self) -> None:
        self._boxes: dict[str, _Box] = {}
        self._closed: OrderedDict[str, None] = OrderedDict()

    def open(self, session_id: str, lease_s: float) -> bool:
        """False when the session was already closed.

        Ray does not keep the order of calls to an async actor: a session cancelled right after it
        opened may have its `close` run first, and its `open` must not then leave a box behind.
        """
        if session_id in self._closed:
            return False
        self._drop_stale()
        self._boxes[session_id] = _Box(lease_s, renewed_at=time.monotonic())
        return True

    def post(self, session_id: str, message: Any) -> bool:
        """False when the session is gone (ended, or never here)."""
        box = self._boxes.get(session_id)
        if box is None:
            return False
        box.messages.append(message)
        box.renewed_at = time.monotonic()  # a client that talks is alive
        box.arrived.set()
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

    async def wait_take(self, session_id: str, timeout: float) -> Delivery:
        """Like `take`, but waits up to `timeout` for a message: for sessions that idle between requests."""
        box = self._boxes.get(session_id)
        if box is not None and not box.messages:
            box.arrived.clear()
            try:
                await asyncio.wait_for(box.arrived.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        return self.take(session_id)

    def close(self, session_id: str) -> None:
        self._closed[session_id] = None
        while len(self._closed) > CLOSED_IDS_KEPT:
            self._closed.popitem(last=False)
        box = self._boxes.pop(session_id, None)
        if box is not None:
            box.arrived.set()  # wake a waiter: its session is gone

    def sessions(self) -> list[str]:
        self._drop_stale()
        return list(self._boxes)

    def _drop_stale(self) -> None:
        now = time.monotonic()
        for session_id in [s for s, box in self._boxes.items() if now - box.renewed_at > STALE_AFTER_LEASES * box.lease_s]:
            self._boxes.pop(session_id).arrived.set()


# Async actor: a `wait_take` in progress must not hold up `post` (Ray runs its coroutines concurrently).
MailboxActor = ray.remote(num_cpus=0)(Mailbox)
