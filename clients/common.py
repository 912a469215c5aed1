"""What every `rtv` client shares: one-line messages and opening a WebSocket with clear errors."""

from __future__ import annotations

import asyncio


def one_line(text: object) -> str:
    """A message for one line of a terminal: whitespace runs folded."""
    return " ".join(str(text).split())


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
