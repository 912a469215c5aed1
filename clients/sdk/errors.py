"""What the SDK raises on purpose (one family for both endpoints), and the server's `error` message, typed.

Every message is one line for people; `ClientInputError` is also a ValueError
and `ClientTimeoutError` a TimeoutError, so callers may catch either family.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class ClientError(Exception):
    """Base class of everything the SDK raises on purpose."""


class ClientInputError(ClientError, ValueError):
    """A bad argument (missing image file, blank prompt, unknown key, odd PCM length...), found before anything is sent."""


class ClientConnectionError(ClientError):
    """The server could not be reached, or refused the WebSocket handshake."""


class ClientProtocolError(ClientError):
    """The server broke the wire contract (binary without metadata, wrong byte_length, a text message that is not JSON...)."""


class ClientTimeoutError(ClientError, TimeoutError):
    """Nothing came within the time given."""


class MediaError(ClientError):
    """A media file opened fine but could not be decoded part way through."""


class SessionEndedError(ClientError):
    """The session ended (an error and/or a close) before what was being waited for."""

    def __init__(self, message: str, error: "ServerError | None" = None, close_code: int | None = None) -> None:
        super().__init__(message)
        self.error = error
        self.close_code = close_code


@dataclass(frozen=True)
class ServerError:
    """An `error` message from either endpoint."""

    message: str
    code: str | None
    received_at: float
    request_id: str | None = None
    event_id: str | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    def __str__(self) -> str:
        extra = f" [{self.code}]" if self.code else ""
        if self.event_id:
            extra += f" (event {self.event_id})"
        return f"{self.message}{extra}"

    def summary(self) -> dict:
        return {k: v for k, v in self.raw.items() if k != "type"} | {"received_at_seconds": self.received_at}


def server_error(message, received_at: float, raw: dict) -> ServerError:
    """An `error` read with the contract's model (`deployments.protocol.server_messages.ErrorMessage`), either endpoint."""
    event_id = message.event_id if isinstance(message.event_id, str) else None
    return ServerError(message.message, message.code, received_at, message.request_id, event_id, raw)
