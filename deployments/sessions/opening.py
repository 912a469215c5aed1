"""Opening a pinned session, and keeping its lease: what every client of a session replica does.

A session is one streaming call whose first item says whether the replica took
it (an `accepted` message carrying the replica's mailbox) or refused it. A
full replica refuses at once so the router can place the next try elsewhere.
Once open, the replica drops the session unless someone renews its lease in
the mailbox: a client that dies (an ingress, the jobs owner) frees the slot.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ray.exceptions import RayActorError

from deployments.protocol.errors import OVER_CAPACITY

OPEN_ATTEMPTS = 3


@dataclass(frozen=True)
class Opened:
    stream: Any | None  # the streaming response, set only when the replica accepted
    first: Any | None  # the accepted item, else the last refusal (None: every try ended empty)


async def open_session(handle, method: str, request: object, accepted: type, attempts: int = OPEN_ATTEMPTS) -> Opened:
    """Try up to `attempts` replicas; stop early on a refusal other than over capacity."""
    refusal = None
    for attempt in range(attempts):
        stream = handle.options(stream=True, method_name=method).remote(request)
        try:
            first = await stream.__anext__()
        except StopAsyncIteration:
            continue
        if isinstance(first, accepted):
            return Opened(stream, first)
        refusal = first
        if first.code != OVER_CAPACITY:
            break
        await asyncio.sleep(0.05 * (attempt + 1))
    return Opened(None, refusal)


def lease_interval(lease_timeout_s: float) -> float:
    """Renew three times per lease, at least every second."""
    return min(lease_timeout_s / 3, 1.0)


async def keep_lease(mailbox, session_id: str, lease_timeout_s: float) -> None:
    """Renew until cancelled; a mailbox that died with its replica ends it (the stream reports the loss)."""
    interval = lease_interval(lease_timeout_s)
    try:
        while True:
            await asyncio.sleep(interval)
            await mailbox.renew.remote(session_id)
    except RayActorError:
        return
