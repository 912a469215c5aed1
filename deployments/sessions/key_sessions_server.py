"""The `KeySessions` deployment: the one sessions-per-key ledger every ingress replica asks (thin; see key_ledger.py)."""

from __future__ import annotations

from deployments.config import AppConfig
from deployments.sessions.key_ledger import KeyLedger


class KeySessionsServer:
    def __init__(self, config: AppConfig) -> None:
        self.ledger = KeyLedger(config.max_sessions_per_key)

    async def acquire(self, holder: str, key_id: str) -> str | None:
        return self.ledger.acquire(holder, key_id)

    async def release(self, holder: str, lease: str) -> None:
        self.ledger.release(holder, lease)

    async def renew(self, holder: str, leases: dict[str, str]) -> None:
        self.ledger.renew(holder, leases)

    async def stats(self) -> dict:
        return {"open_sessions": self.ledger.open_sessions()}
