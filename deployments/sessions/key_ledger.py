"""Open sessions per API key across every ingress replica: one count, held as leases.

Each ingress replica (a holder) takes a lease per keyed session and sends the
full set of its live leases every `renew_s`. The ledger forgets a holder
that has not renewed for `lease_s` (its replica died or was cut off), so a
lost ingress frees its keys' counts within seconds instead of never. The
ingresses are the truth and the ledger is soft state: a restarted ledger is
rebuilt from the next round of renewals, and until then it may admit a few
sessions over the limit (never fewer than allowed).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

LEASE_S = 15.0
RENEW_S = 3.0


@dataclass
class _Holder:
    expires_at: float
    leases: dict[str, str] = field(default_factory=dict)  # lease id -> key id
    fresh: set[str] = field(default_factory=set)  # issued since the last renewal: the holder may not know them yet


class KeyLedger:
    def __init__(self, limit: int, lease_s: float = LEASE_S, clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self.lease_s = lease_s
        self._clock = clock
        self._holders: dict[str, _Holder] = {}

    def acquire(self, holder: str, key_id: str) -> str | None:
        """A new lease for one session of `key_id`, or None when the key already has `limit` open."""
        self._expire()
        if self.open_sessions(key_id) >= self.limit:
            return None
        lease = uuid.uuid4().hex
        entry = self._holder(holder)
        entry.leases[lease] = key_id
        entry.fresh.add(lease)
        return lease

    def release(self, holder: str, lease: str) -> None:
        entry = self._holders.get(holder)
        if entry is not None:
            entry.leases.pop(lease, None)
            entry.fresh.discard(lease)

    def renew(self, holder: str, leases: Mapping[str, str]) -> None:
        """`leases` is everything the holder still holds: a lease it no longer names is gone (a lost release),
        unless it was issued since the last renewal (its grant may still be on the way to the holder).
        Leases the ledger does not know are taken in: that is how a restarted ledger learns its count."""
        entry = self._holder(holder)
        entry.leases = {lease: key for lease, key in entry.leases.items() if lease in entry.fresh} | dict(leases)
        entry.fresh = set()

    def open_sessions(self, key_id: str | None = None) -> int:
        self._expire()
        return sum(1 for h in self._holders.values() for k in h.leases.values() if key_id is None or k == key_id)

    def _holder(self, holder: str) -> _Holder:
        entry = self._holders.setdefault(holder, _Holder(0.0))
        entry.expires_at = self._clock() + self.lease_s
        return entry

    def _expire(self) -> None:
        now = self._clock()
        for name in [n for n, h in self._holders.items() if h.expires_at <= now]:
            del self._holders[name]
