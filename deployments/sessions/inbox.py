"""One session's mailbox, read ahead on the replica.

A block boundary that asked the mailbox actor for its messages paid a Ray
call (a few ms on a busy CPU) on the path between one block's frames and the
next block's start. Instead a long poll runs beside the session: whatever the
ingress posts comes back as soon as it lands, and the boundary reads it here,
in process. The lease is checked at the same pace (the poll returns at least
every `poll_s`), so an abandoned session still ends within a poll of its
lease running out.
"""

from __future__ import annotations

import asyncio
import logging

from deployments.sessions.mailbox import Delivery

logger = logging.getLogger("ray.serve")


class Inbox:
    def __init__(self, mailbox, session_id: str, poll_s: float) -> None:
        self.mailbox, self.session_id, self.poll_s = mailbox, session_id, poll_s
        self._messages: list = []
        self._lease_expired = False
        self._arrived = asyncio.Event()
        self._pump: asyncio.Task | None = None

    def start(self) -> None:
        """Start reading ahead (the session's box must be open: a missing box reads as an expired lease)."""
        if self._pump is None:
            self._pump = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while not self._lease_expired:
            try:
                delivery = await self.mailbox.wait_take.remote(self.session_id, self.poll_s)
            except Exception as exc:  # noqa: BLE001 - the mailbox is gone: nobody can steer or renew the session
                logger.warning("session %s: mailbox unreachable (%s), ending the session", self.session_id, exc)
                delivery = Delivery([], True)
            self._messages.extend(delivery.messages)
            self._lease_expired = delivery.lease_expired
            if delivery.messages or delivery.lease_expired:
                self._arrived.set()

    def take(self) -> Delivery:
        """What arrived since the last take, and whether the lease has run out."""
        self._arrived.clear()
        messages, self._messages = self._messages, []
        return Delivery(messages, self._lease_expired)

    async def wait_take(self, timeout: float) -> Delivery:
        """Like `take`, but waits up to `timeout` for something to arrive."""
        if not self._messages and not self._lease_expired:
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        return self.take()

    async def close(self) -> None:
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
            await asyncio.wait([self._pump])
