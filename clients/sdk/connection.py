"""What every `rtv` client shares: one-line messages, opening a WebSocket with clear errors, a session's connection."""

from __future__ import annotations

import asyncio
import json
import os
import time

from clients.sdk.errors import ClientError, ClientInputError, SessionEndedError

API_KEY_ENV = "RTV_API_KEY"


def one_line(text: object) -> str:
    """A message for one line of a terminal: whitespace runs folded."""
    return " ".join(str(text).split())


def short(value: object, limit: int = 160) -> str:
    """A value for an error message: as JSON when it is not text, cut at `limit` characters."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


def endpoint_url(url: str, path: str) -> str:
    """`ws://host:port` (or http(s)://, or a full endpoint URL) -> the endpoint's ws(s) URL, `path` when none is given;
    raises ClientInputError."""
    if not isinstance(url, str) or not url.strip():
        raise ClientInputError("the server URL must be a non-empty string like ws://127.0.0.1:8000")
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ClientInputError(f"server URL {url!r} has no scheme: use ws://HOST:PORT (or wss://)")
    scheme = {"http": "ws", "https": "wss"}.get(scheme.lower(), scheme.lower())
    if scheme not in ("ws", "wss"):
        raise ClientInputError(f"server URL {url!r}: scheme must be ws:// or wss://")
    host, slash, rest_path = rest.partition("/")
    if not host:
        raise ClientInputError(f"server URL {url!r} has no host")
    given = "/" + rest_path if slash else ""
    return f"{scheme}://{host}{given if given not in ('', '/') else path}"


def as_the_server_reads_it(message: dict, parse) -> dict:
    """Check a built message with the server's own parser (`deployments/protocol`): one set of rules at both ends,
    so a message the SDK lets through is one the server takes, and its refusal reads the same."""
    from deployments.protocol.errors import ProtocolError

    try:
        parse(json.dumps(message))
    except ProtocolError as exc:
        raise ClientInputError(exc.message) from None
    return message


def connect_kwargs(open_timeout: float, max_size: int | None, ping_interval: float | None, ping_timeout: float | None, close_timeout: float, additional_headers: dict | None) -> dict:
    """The `websockets` connect options both clients take (keepalive pings, no size cap on media).

    A server with API keys gets `$RTV_API_KEY` as a Bearer token unless the caller sets Authorization itself.
    """
    key = os.environ.get(API_KEY_ENV)
    if key and not any(name.lower() == "authorization" for name in (additional_headers or {})):
        additional_headers = {**(additional_headers or {}), "Authorization": f"Bearer {key}"}
    return dict(
        max_size=max_size,
        ping_interval=ping_interval,
        ping_timeout=ping_timeout,
        close_timeout=close_timeout,
        additional_headers=additional_headers,
        open_timeout=open_timeout,
    )


async def open_websocket(url: str, open_timeout: float, connect_kwargs: dict, input_error: type[Exception], connection_error: type[Exception]):
    """`websockets` connect, with every way it can fail turned into one readable line."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidHandshake, InvalidURI

    try:
        return await connect(url, **connect_kwargs)
    except InvalidURI as exc:
        raise input_error(f"invalid server URL {url}: {one_line(exc)}") from None
    except InvalidHandshake as exc:
        raise connection_error(f"cannot open {url}: handshake refused: {one_line(exc)}") from None
    except (TimeoutError, asyncio.TimeoutError):
        raise connection_error(f"cannot connect to {url}: timed out after {open_timeout:g}s") from None
    except ConnectionRefusedError:
        raise connection_error(f"cannot connect to {url}: connection refused (is the server running?)") from None
    except OSError as exc:
        reason = exc.strerror or one_line(exc) or type(exc).__name__
        if "Connect call failed" in reason:
            reason = "connection refused (is the server running?)"
        raise connection_error(f"cannot connect to {url}: {one_line(reason)}") from None


class WebSocketClient:
    """What both session clients share: the connection, its lifetime, its clock and how it closed.

    Subclasses set `self._result` (anything with `close_code` and `close_reason`) and define `connect()`
    and `close()`; `_t0` starts the clock `elapsed()` reads.
    """

    def __init__(self, url: str, open_timeout: float, connect_options: dict, result) -> None:
        self.url = url
        self.open_timeout = open_timeout
        self._connect_kwargs = connect_options
        self._result = result
        self._ws = None
        self._t0: float | None = None
        self._finished = False
        self._send_lock = asyncio.Lock()

    async def send_json(self, message: dict) -> None:
        await self.send_raw(json.dumps(message))

    async def send_raw(self, data: str | bytes) -> None:
        """Send anything (tests of malformed input). Raises SessionEndedError once the connection is gone."""
        from websockets.exceptions import ConnectionClosed

        if self._ws is None:
            raise ClientError("not connected")
        if self._finished:
            raise SessionEndedError(self._result.failure() or "the session is over")
        try:
            async with self._send_lock:
                await self._ws.send(data)
        except ConnectionClosed:
            self._note_close(self._ws)
            raise SessionEndedError(self._result.failure() or "the connection closed") from None

    async def _close_socket(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                await ws.close()
            except Exception:  # already gone
                pass
            self._note_close(ws)

    async def __aenter__(self):
        if self._ws is None:
            await self.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def connection(self):
        """The underlying `websockets` connection (for tests that need raw access)."""
        return self._ws

    @property
    def finished(self) -> bool:
        """True once the session is over (its last message arrived, or the connection closed)."""
        return self._finished

    def elapsed(self) -> float:
        """Seconds on the session's clock (0 before it starts)."""
        return 0.0 if self._t0 is None else time.perf_counter() - self._t0

    def result(self):
        return self._result

    def _note_close(self, ws) -> None:
        code = getattr(ws, "close_code", None)
        if code is not None and self._result.close_code is None:
            self._result.close_code = code
            self._result.close_reason = getattr(ws, "close_reason", None) or None
