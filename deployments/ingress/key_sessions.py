"""This ingress replica's side of the sessions-per-key limit: a lease from the one ledger per keyed session.

The count is global (every ingress replica asks the same `KeySessions`
deployment, see deployments/sessions/key_ledger.py); this side keeps the
leases it holds and renews them all every few seconds, so a ledger that
restarts learns them again and a replica that dies frees them when its
renewals stop.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from deployments.ingress.access import SESSION_LIMIT_UNAVAILABLE, TOO_MANY_SESSIONS, AccessDenied
from deployments.sessions.key_ledger import RENEW_S

log = logging.getLogger(__name__)

LEDGER_TIMEOUT_S = 5.0


class SessionsPerKey:
    """`ledger`: a handle to the KeySessions deployment (None: no limit)."""

    def __init__(self, ledger, limit: int | None, renew_s: float = RENEW_S, timeout_s: float = LEDGER_TIMEOUT_S) -> None:
        if limit is not None and ledger is None:
            raise ValueError("max_sessions_per_key needs the KeySessions deployment (build_app binds it)")
        self.ledger = ledger if limit is not None else None
        self.limit = limit
        self.holder = uuid.uuid4().hex  # this replica, as the ledger knows it
        self.renew_s = renew_s
        self.timeout_s = timeout_s
        self._held: dict[str, str] = {}  # lease -> key id
        self._renewing: asyncio.Task | None = None

    async def acquire(self, key_id: str | None) -> str | None:
        """A lease for one more session of `key_id` (None when nothing is counted); AccessDenied when the key is
        at its limit, or when the count cannot be read (refused, not let through: the limit guards capacity)."""
        if key_id is None or self.ledger is None:
            return None
        self._start_renewing()
        try:
            lease = await asyncio.wait_for(self.ledger.acquire.remote(self.holder, key_id), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - the ledger replica lost, restarting or slow: the client may retry
            log.warning("sessions-per-key ledger unavailable: %s", type(exc).__name__)
            raise AccessDenied("The sessions-per-key count cannot be checked right now; try again shortly",
                               SESSION_LIMIT_UNAVAILABLE, http_status=503) from None
        if lease is None:
            raise AccessDenied(f"Too many sessions for this API key: the limit is {self.limit} at once", TOO_MANY_SESSIONS,
                               http_status=429)
        self._held[lease] = key_id
        return lease

    async def release(self, lease: str | None) -> None:
        if lease is None or self._held.pop(lease, None) is None:
            return
        try:
            await asyncio.wait_for(self.ledger.release.remote(self.holder, lease), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - the next renewal no longer names it, which frees it all the same
            log.warning("sessions-per-key release not delivered: %s", type(exc).__name__)

    def open_sessions(self) -> int:
        return len(self._held)

    def _start_renewing(self) -> None:
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.get_running_loop().create_task(self._renew_forever())

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.renew_s)
            try:
                await asyncio.wait_for(self.ledger.renew.remote(self.holder, dict(self._held)), self.timeout_s)
            except Exception as exc:  # noqa: BLE001 - a missed renewal is retried; the lease outlives a few
                log.warning("sessions-per-key renewal failed: %s", type(exc).__name__)
