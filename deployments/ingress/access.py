"""Who may open a session: API keys and browser origins (sessions per key: key_sessions.py).

Checked at the WebSocket handshake (and on HTTP routes), before any model work.
A key arrives in one of three places, because browsers cannot set headers on a
WebSocket: `Authorization: Bearer KEY`, a `Sec-WebSocket-Protocol` entry
`openai-insecure-api-key.KEY` (the convention OpenAI's realtime clients use),
or `?api_key=KEY`. No keys configured means open access (the local default).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

KEYS_ENV = "RTV_API_KEYS"  # comma-separated; added to the configured keys
KEY_PROTOCOL_PREFIXES = ("openai-insecure-api-key.", "rtv-api-key.")

UNAUTHORIZED = "unauthorized"
ORIGIN_NOT_ALLOWED = "origin_not_allowed"
TOO_MANY_SESSIONS = "too_many_sessions"
SESSION_LIMIT_UNAVAILABLE = "session_limit_unavailable"  # the sessions-per-key count could not be read


class AccessDenied(Exception):
    def __init__(self, message: str, code: str, http_status: int = 401) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.http_status = http_status


@dataclass(frozen=True)
class Grant:
    """A request that may go on: which key it used (by fingerprint, never the key) and the subprotocol to echo."""

    key_id: str | None
    subprotocol: str | None = None


def key_fingerprint(key: str) -> str:
    """A stable, non-reversible name for a key: safe for logs, metrics and limits."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def keys_from(configured: Iterable[str] | None, environ: Mapping[str, str]) -> frozenset[str]:
    keys = {k.strip() for k in (configured or ()) if k.strip()}
    keys |= {k.strip() for k in environ.get(KEYS_ENV, "").split(",") if k.strip()}
    return frozenset(keys)


@dataclass(frozen=True)
class AccessPolicy:
    keys: frozenset[str] = frozenset()
    # None: any origin. Requests without an Origin header (non-browser clients) are not origin-checked.
    allowed_origins: tuple[str, ...] | None = None

    @property
    def open(self) -> bool:
        return not self.keys

    def check(self, headers: Mapping[str, str], query: Mapping[str, str], offered_protocols: list[str] | None = None) -> Grant:
        """Raises AccessDenied naming what was wrong; otherwise says which key was used."""
        self._check_origin(headers.get("origin"), headers.get("host"))
        offered = offered_protocols if offered_protocols is not None else _offered(headers)
        token, via_protocol = _find_key(headers, query, offered)
        subprotocol = _echo(offered, via_protocol)
        if self.open:
            return Grant(None, subprotocol)
        if token is None:
            raise AccessDenied(
                "Missing API key: send 'Authorization: Bearer KEY', a Sec-WebSocket-Protocol 'openai-insecure-api-key.KEY', or ?api_key=KEY",
                UNAUTHORIZED,
            )
        # Compare against every key so the time taken does not say which prefix matched.
        matched = None
        for key in self.keys:
            if hmac.compare_digest(token.encode(), key.encode()):
                matched = key
        if matched is None:
            raise AccessDenied("Invalid API key", UNAUTHORIZED)
        return Grant(key_fingerprint(matched), subprotocol)

    def _check_origin(self, origin: str | None, host: str | None) -> None:
        if origin is None or self.allowed_origins is None or "*" in self.allowed_origins:
            return
        if host is not None and urlsplit(origin).netloc == host:
            return  # same origin: the server's own pages
        if origin.rstrip("/") not in self.allowed_origins:
            raise AccessDenied(f"Origin {origin!r} is not allowed on this server", ORIGIN_NOT_ALLOWED, http_status=403)


def _offered(headers: Mapping[str, str]) -> list[str]:
    raw = headers.get("sec-websocket-protocol") or ""
    return [p.strip() for p in raw.split(",") if p.strip()]


def _find_key(headers: Mapping[str, str], query: Mapping[str, str], offered: list[str]) -> tuple[str | None, str | None]:
    """The key and, when it came as a subprotocol, that protocol entry."""
    auth = headers.get("authorization") or ""
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip(), None
    for entry in offered:
        for prefix in KEY_PROTOCOL_PREFIXES:
            if entry.startswith(prefix) and len(entry) > len(prefix):
                return entry[len(prefix):], entry
    key = query.get("api_key")
    return (key or None), None


def choose_subprotocol(headers: Mapping[str, str]) -> str | None:
    """The subprotocol to accept with, whatever the key check says."""
    offered = _offered(headers)
    return _echo(offered, next((p for p in offered if p.startswith(KEY_PROTOCOL_PREFIXES)), None))


def _echo(offered: list[str], key_protocol: str | None) -> str | None:
    """A browser fails the handshake unless the server picks one offered protocol: prefer one that is not the key."""
    others = [p for p in offered if p != key_protocol and not p.startswith(KEY_PROTOCOL_PREFIXES)]
    if others:
        return others[0]
    return offered[0] if offered else None
