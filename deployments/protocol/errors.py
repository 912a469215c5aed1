"""Protocol errors: what goes wrong on the wire, its stable code, and whether it ends the session.

Every error a client sees is `{"type": "error", "message": str}` plus, where
known, `code`, `request_id` and `event_id` (PROTOCOL.md, conventions). The
message texts listed in PROTOCOL.md are matched by clients: they live here and
in `video.py` verbatim, never rephrased.
"""

from __future__ import annotations

from typing import Any

# -- limits (PROTOCOL.md section 1) ------------------------------------------------
START_MESSAGE_MAX_BYTES = 4 * 1024 * 1024
CONTROL_MESSAGE_MAX_BYTES = 128 * 1024
START_TIMEOUT_S = 10.0
STALL_TIMEOUT_S = 60.0

# -- close codes (PROTOCOL.md, conventions) ------------------------------------------
CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008  # auth, or a session.start the server cannot accept
CLOSE_TOO_BIG = 1009
CLOSE_SERVER_FAULT = 1011
CLOSE_TRY_AGAIN = 1013  # over capacity; the error before it carries retry_after_s

# -- stable codes for our own errors ---------------------------------------------------
INVALID_REQUEST = "invalid_request"
TIMEOUT = "timeout"
MESSAGE_TOO_LARGE = "message_too_large"
INVALID_JSON = "invalid_json"
UNKNOWN_TYPE = "unknown_type"
EVENT_ID_CONFLICT = "event_id_conflict"
INTERACTION_FAILED = "interaction_failed"
MODEL_MISMATCH = "model_mismatch"
OVER_CAPACITY = "over_capacity"
REPLICA_LOST = "replica_lost"
STALL_TIMEOUT = "stall_timeout"
INTERNAL_ERROR = "internal_error"
CLIENT_TOO_SLOW = "client_too_slow"
RATE_LIMITED = "rate_limited"
SESSION_ABORTED = "session_aborted"  # the replica dropped the session (its lease lapsed)
MODEL_NOT_READY = "model_not_ready"  # the model's replicas were still loading when the session started

# -- fixed texts that are not produced by a parser ------------------------------------
START_TIMEOUT_MESSAGE = "Timeout waiting for session.start"
STALL_TIMEOUT_MESSAGE = "Stall timeout: no generation progress"
EVENT_ID_CONFLICT_MESSAGE = "event_id_conflict"
INTERACTION_FAILED_MESSAGE = "Failed to apply interaction"


class ProtocolError(Exception):
    """An error to send to the client; `close_code` is set when it must also end the session."""

    def __init__(
        self,
        message: str,
        code: str | None = None,
        *,
        event_id: str | None = None,
        close_code: int | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.event_id = event_id
        self.close_code = close_code
        self.extra = extra  # more fields for the error message, e.g. retry_after_s

    @property
    def ends_session(self) -> bool:
        return self.close_code is not None

    def to_message(self, request_id: str | None = None) -> dict:
        return error_message(self.message, self.code, request_id=request_id, event_id=self.event_id, **self.extra)

    def __repr__(self) -> str:
        return f"ProtocolError({self.message!r}, code={self.code!r}, event_id={self.event_id!r}, close_code={self.close_code!r})"


def error_message(
    message: str,
    code: str | None = None,
    request_id: str | None = None,
    event_id: str | None = None,
    **extra: Any,
) -> dict:
    """`{"type": "error", "message": ...}` with `code`, `request_id`, `event_id` and extras only when known."""
    from deployments.protocol.server_messages import ErrorMessage

    return ErrorMessage(message=message, code=code, request_id=request_id, event_id=event_id, **extra).wire()


# -- errors other layers raise, so their codes and texts stay in one place --------------
def start_timeout() -> ProtocolError:
    return ProtocolError(START_TIMEOUT_MESSAGE, TIMEOUT, close_code=CLOSE_POLICY)


def stall_timeout() -> ProtocolError:
    """No generation progress for STALL_TIMEOUT_S: the server aborts the session."""
    return ProtocolError(STALL_TIMEOUT_MESSAGE, STALL_TIMEOUT, close_code=CLOSE_SERVER_FAULT)


def event_id_conflict(event_id: str) -> ProtocolError:
    """An event id already used in this session; the session goes on."""
    return ProtocolError(EVENT_ID_CONFLICT_MESSAGE, EVENT_ID_CONFLICT, event_id=event_id)


def interaction_failed(event_id: str) -> ProtocolError:
    """The engine refused the interaction; generation goes on and the id may be reused."""
    return ProtocolError(INTERACTION_FAILED_MESSAGE, INTERACTION_FAILED, event_id=event_id)


def model_not_ready(waited_s: float, retry_after_s: float) -> ProtocolError:
    return ProtocolError(f"The model is still loading (waited {waited_s:g} s); try again shortly", MODEL_NOT_READY,
                         close_code=CLOSE_TRY_AGAIN, retry_after_s=retry_after_s)


def over_capacity(retry_after_s: float, message: str = "Server is at capacity; try again later") -> ProtocolError:
    return ProtocolError(message, OVER_CAPACITY, close_code=CLOSE_TRY_AGAIN, retry_after_s=retry_after_s)


def replica_lost(message: str = "The generation replica was lost") -> ProtocolError:
    return ProtocolError(message, REPLICA_LOST, close_code=CLOSE_SERVER_FAULT)


def client_too_slow(behind_s: float) -> ProtocolError:
    """The client stopped taking chunks while generation waited on it (world_model/flow.py)."""
    return ProtocolError(
        f"Client too slow: no playback progress while {behind_s:g} s of media waited; session ended",
        CLIENT_TOO_SLOW,
        close_code=CLOSE_POLICY,
    )


def rate_limited(what: str, limit: float) -> ProtocolError:
    """Over a per-session rate: this message is dropped, the session goes on."""
    return ProtocolError(f"Too many {what}: the limit is {limit:g} per second; this one was dropped", RATE_LIMITED)


def internal_error(message: str = "Internal server error") -> ProtocolError:
    return ProtocolError(message, INTERNAL_ERROR, close_code=CLOSE_SERVER_FAULT)
