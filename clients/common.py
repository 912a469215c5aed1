"""What every `rtv` client shares: one-line messages and opening a WebSocket with clear errors."""

from __future__ import annotations

import asyncio
import os

API_KEY_ENV = "RTV_API_KEY"


def one_line(text: object) -> str:
    """A message for one line of a terminal: whitespace runs folded."""
    return " ".join(str(text).split())


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
