"""The messages of `WS /v1/video/chat/stream` (PROTOCOL.md section 2): parse, validate, build.

No Ray, no sockets, no torch. The ingress feeds raw messages in and gets typed
values (or a `ProtocolError` with the exact text clients match on) out:

    config = parse_session_config(raw)            # first message, within CONFIG_TIMEOUT_S
    check_model(config, [served_name])
    message = parse_chat_message(raw)             # every later message
    ... send(response_start()), send(text_delta(d)) ..., send(text_done(text))

Matched to vLLM-Omni's handler (`VideoStreamHandler` / `VideoStreamConfig`),
whose clients must work unchanged:
- `session.config`: the field set and defaults; unknown keys ignored; the
  type check and its text, `Invalid type for '{field}': expected {types},
  got {type}` with Python type names joined by "/" (`int`, `int/float`,
  `str/NoneType`, got `bool`, `NoneType`, ...). Stricter than theirs: a bool
  is not an int here (theirs lets `max_frames: true` through as 1), and
  values are range-checked (theirs takes `max_frames: 0`, a buffer that keeps
  nothing). Aliases as in their later handler: the canonical name wins
  when both are sent.
- `Expected session.config, got: {type}`: the message's `type` value when it
  is an object (`None` when absent), else the JSON value's Python type name.
- `response.start` carries no fields in theirs; `response_id` is ours (additive).
- `video.frame.ack` (their later handler): sent only for a non-empty string
  `frame_id`; `reason: "filtered"` for an EVS drop, `pts_ms` echoed,
  `dropped_frame_id` when the ring pushed a frame out. We also ack integer ids.
- Model: theirs does not check `model` at config time; it passes it to the
  chat service, which answers every query with vLLM's ``The model `{model}`
  does not exist.``. `check_model` refuses it at config time with that text.
- Their `video.query` may carry `audio_data` (base64 PCM16), added to the
  audio buffer before the query; and they answer `ping` with `pong`. Both kept.

Base64 is decoded strictly (the alphabet and padding; theirs silently
skips junk characters); ASCII whitespace (MIME line breaks) and a
`data:image/...;base64,` prefix are tolerated.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from deployments.protocol.errors import (
    CLOSE_POLICY,
    CLOSE_TOO_BIG,
    INVALID_JSON,
    INVALID_REQUEST,
    MESSAGE_TOO_LARGE,
    MODEL_MISMATCH,
    TIMEOUT,
    UNKNOWN_TYPE,
    ProtocolError,
    error_message,
)
from deployments.protocol import server_messages
from deployments.protocol.jsonwire import byte_length, loads, short

# -- limits (PROTOCOL.md section 2) --------------------------------------------------
CONFIG_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 60.0
MAX_FRAME_BYTES = 10 * 1024 * 1024  # decoded frame bytes (10485760)
# One WebSocket message: a 10 MiB frame is 13,981,016 base64 characters, plus the JSON around it.
# 16 MiB leaves ~2.7 MiB for that, and is uvicorn's default WebSocket limit, which vLLM-Omni's
# clients already live within. The ingress should set its WebSocket max message size to this,
# so that a bigger message is refused by the socket layer (close 1009) before it is buffered.
CHAT_MESSAGE_MAX_BYTES = 16 * 1024 * 1024
CONFIG_MESSAGE_MAX_BYTES = 1024 * 1024  # session.config: the system prompt is its only large field
MAX_FRAMES_LIMIT = 1024  # upper bound of max_frames and num_sample_frames
FRAME_ID_MAX_CHARS = 256
AUDIO_SAMPLE_RATE = 16000

MODALITIES = ("text", "audio")  # accepted in session.config; the answer is always text (as in vLLM-Omni's)

# -- stable codes of this endpoint (the shared ones live in errors.py) ------------------
IDLE_TIMEOUT = "idle_timeout"
INVALID_BASE64 = "invalid_base64"
FRAME_TOO_LARGE = "frame_too_large"
INVALID_IMAGE = "invalid_image"
INVALID_AUDIO = "invalid_audio"
NO_FRAMES = "no_frames"
QUERY_FAILED = "query_failed"

# -- fixed texts (PROTOCOL.md section 2; clients match on them) -------------------------
CONFIG_TIMEOUT_MESSAGE = "Timeout waiting for session.config"
CONFIG_INVALID_JSON_MESSAGE = "Invalid JSON in session.config"
CONFIG_TOO_LARGE_MESSAGE = "session.config message too large"
IDLE_TIMEOUT_MESSAGE = "Idle timeout: no message received"
INVALID_JSON_MESSAGE = "Invalid JSON"
NOT_AN_OBJECT_MESSAGE = "Messages must be JSON objects"
FRAME_BASE64_MESSAGE = "Invalid base64 in video.frame"
AUDIO_BASE64_MESSAGE = "Invalid base64 in audio.chunk"
QUERY_TEXT_MESSAGE = "video.query requires a non-empty 'text' field"
NO_FRAMES_MESSAGE = "No frames available. Send video.frame before video.query."
QUERY_FAILED_MESSAGE = "Query processing failed"
# ours (not in vLLM-Omni)
FRAME_DATA_MESSAGE = "video.frame requires a non-empty 'data' field"
AUDIO_DATA_MESSAGE = "audio.chunk requires a 'data' field with base64 PCM16 audio"
QUERY_AUDIO_BASE64_MESSAGE = "Invalid base64 in video.query audio_data"

# video.frame.ack reasons (accepted: false)
ACK_FILTERED = "filtered"  # EVS dropped it (vLLM-Omni's reason)
ACK_INVALID_IMAGE = "invalid_image"  # ours: not a decodable JPEG/PNG within the limits
ACK_RATE_LIMITED = "rate_limited"  # ours: over the session's frames-per-second limit
AUDIO_BUFFER_FULL = "audio_buffer_full"


# =====================================================================================
# Raw frames -> JSON
# =====================================================================================








def _type_name(value: Any) -> str:
    return type(value).__name__


_WHITESPACE = re.compile(rb"[ \t\r\n\f\v]+")
_DATA_URL = re.compile(r"^data:[a-z0-9.+/-]*;base64,", re.IGNORECASE)


def _b64decode(text: str) -> bytes:
    """Strict base64 (alphabet and padding checked); ASCII whitespace and a data-URL prefix are tolerated."""
    if text[:5].lower() == "data:" and (match := _DATA_URL.match(text)):
        text = text[match.end():]
    raw = text.encode("ascii")  # UnicodeEncodeError (a ValueError) for anything outside ASCII
    try:
        return base64.b64decode(raw, validate=True)
    except binascii.Error:
        stripped = _WHITESPACE.sub(b"", raw)
        if len(stripped) == len(raw):
            raise
        return base64.b64decode(stripped, validate=True)


# =====================================================================================
# session.config
# =====================================================================================
@dataclass(frozen=True)
class ChatConfig:
    """A validated `session.config` (aliases resolved, unknown keys dropped)."""

    model: str = ""
    modalities: tuple[str, ...] = ("text",)
    max_frames: int = 64  # retained frames kept (ring buffer)
    num_sample_frames: int = 16  # frames a query sees at most
    evs_enabled: bool = True
    evs_threshold: float = 0.95
    system_prompt: str | None = None
    use_audio_in_video: bool = False  # upstream's: the clip's audio goes with its frames (ours always does)
    # Ours, opt-in: a newer `video.query` ends the running answer (the seed answers each in full, in order).
    replace_running_answer: bool = False

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["modalities"] = list(self.modalities)
        return out


# field -> accepted Python types, in the order vLLM-Omni checks them (first failure wins)
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "modalities": (list,),
    "max_frames": (int,),
    "num_sample_frames": (int,),
    "evs_enabled": (bool,),
    "evs_threshold": (int, float),
    "system_prompt": (str, type(None)),
    "use_audio_in_video": (bool,),
    "replace_running_answer": (bool,),
}
ALIASES: dict[str, str] = {  # alias -> canonical field
    "num_frames": "num_sample_frames",
    "enable_frame_filter": "evs_enabled",
    "frame_filter_threshold": "evs_threshold",
}
_CANONICAL_ALIAS = {canonical: alias for alias, canonical in ALIASES.items()}


def invalid_type(field: str, accepted: tuple[type, ...], value: Any) -> ProtocolError:
    names = "/".join(t.__name__ for t in accepted)
    return ProtocolError(
        f"Invalid type for '{field}': expected {names}, got {_type_name(value)}", INVALID_REQUEST, close_code=CLOSE_POLICY
    )


def invalid_value(field: str, expected: str, value: Any) -> ProtocolError:
    try:
        shown = short(json.dumps(value), 100)
    except (TypeError, ValueError):
        shown = short(repr(value), 100)
    return ProtocolError(f"Invalid value for '{field}': expected {expected}, got {shown}", INVALID_REQUEST, close_code=CLOSE_POLICY)


def _is_instance(value: Any, accepted: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # JSON true/false is not a number here (it is in vLLM-Omni's check)
        return bool in accepted
    return isinstance(value, accepted)


def parse_session_config(raw: str | bytes) -> ChatConfig:
    """The first message of a session; every failure ends the session (`close_code` set)."""
    if byte_length(raw) > CONFIG_MESSAGE_MAX_BYTES:
        raise ProtocolError(CONFIG_TOO_LARGE_MESSAGE, MESSAGE_TOO_LARGE, close_code=CLOSE_TOO_BIG)
    try:
        message = loads(raw)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ProtocolError(CONFIG_INVALID_JSON_MESSAGE, INVALID_JSON, close_code=CLOSE_POLICY) from None
    if not isinstance(message, dict) or message.get("type") != "session.config":
        got = message.get("type") if isinstance(message, dict) else _type_name(message)
        raise ProtocolError(f"Expected session.config, got: {short(got)}", INVALID_REQUEST, close_code=CLOSE_POLICY)

    values: dict[str, Any] = {}  # canonical field -> value
    names: dict[str, str] = {}  # canonical field -> the key the client used (named in errors)
    for field in _FIELD_TYPES:
        alias = _CANONICAL_ALIAS.get(field)
        if field in message:
            values[field], names[field] = message[field], field
        elif alias is not None and alias in message:
            values[field], names[field] = message[alias], alias

    for field, accepted in _FIELD_TYPES.items():
        if field in values and not _is_instance(values[field], accepted):
            raise invalid_type(names[field], accepted, values[field])

    modalities = values.get("modalities", ["text"])
    for i, item in enumerate(modalities):
        if not isinstance(item, str):
            raise invalid_type(f"{names['modalities']}[{i}]", (str,), item)
    if not modalities or any(item not in MODALITIES for item in modalities):
        raise invalid_value(names.get("modalities", "modalities"), 'a non-empty list of "text" and "audio"', modalities)
    for field in ("max_frames", "num_sample_frames"):
        if field in values and not 1 <= values[field] <= MAX_FRAMES_LIMIT:
            raise invalid_value(names[field], f"an integer from 1 to {MAX_FRAMES_LIMIT}", values[field])
    if "evs_threshold" in values:
        threshold = values["evs_threshold"]
        if not (0 <= threshold <= 1) or (isinstance(threshold, float) and math.isnan(threshold)):  # 1e999 parses as inf
            raise invalid_value(names["evs_threshold"], "a number from 0 to 1", threshold)
        values["evs_threshold"] = float(threshold)
    values["modalities"] = tuple(dict.fromkeys(modalities))
    return ChatConfig(**values)


def check_model(config: ChatConfig, served_names: Sequence[str]) -> None:
    """Refuse a `model` the server does not serve; "" (the default) means the served one. Ends the session."""
    if not config.model or not served_names or config.model in served_names:
        return
    raise ProtocolError(f"The model `{short(config.model)}` does not exist.", MODEL_MISMATCH, close_code=CLOSE_POLICY)


# =====================================================================================
# Messages after session.config: a bad one gets an error, the session goes on
# =====================================================================================
@dataclass(frozen=True, eq=False)
class FrameMessage:
    data: bytes  # the encoded JPEG/PNG, base64-decoded, at most MAX_FRAME_BYTES
    frame_id: str | int | None = None  # echoed in video.frame.ack; None: no ack
    pts_ms: int | float | None = None


@dataclass(frozen=True, eq=False)
class AudioMessage:
    pcm: bytes  # PCM16 LE, 16 kHz, mono; an even number of bytes (may be empty)


@dataclass(frozen=True)
class QueryMessage:
    text: str
    audio: bytes | None = None  # vLLM-Omni's optional `audio_data`: PCM16 added to the buffer first


@dataclass(frozen=True)
class DoneMessage:
    pass


@dataclass(frozen=True)
class PingMessage:
    pass


ChatMessage = FrameMessage | AudioMessage | QueryMessage | DoneMessage | PingMessage


def parse_chat_message(raw: str | bytes) -> ChatMessage:
    """One message after `session.config`; raises ProtocolError (never session-ending) with the text to send."""
    size = byte_length(raw)
    if size > CHAT_MESSAGE_MAX_BYTES:
        raise ProtocolError(f"Message too large: {size} bytes (limit {CHAT_MESSAGE_MAX_BYTES})", MESSAGE_TOO_LARGE)
    try:
        message = loads(raw)
    except ValueError:
        raise ProtocolError(INVALID_JSON_MESSAGE, INVALID_JSON) from None
    if not isinstance(message, dict):
        raise ProtocolError(NOT_AN_OBJECT_MESSAGE, INVALID_REQUEST)
    kind = message.get("type")
    if kind == "video.frame":
        return parse_frame(message)
    if kind == "audio.chunk":
        return AudioMessage(_pcm(message.get("data"), AUDIO_BASE64_MESSAGE, AUDIO_DATA_MESSAGE, "audio.chunk data"))
    if kind == "video.query":
        text = message.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ProtocolError(QUERY_TEXT_MESSAGE, INVALID_REQUEST)
        audio = message.get("audio_data")
        if audio is not None and audio != "":
            audio = _pcm(audio, QUERY_AUDIO_BASE64_MESSAGE, QUERY_AUDIO_BASE64_MESSAGE, "video.query audio_data")
        return QueryMessage(text=text, audio=audio or None)
    if kind == "video.done":
        return DoneMessage()
    if kind == "ping":
        return PingMessage()
    raise ProtocolError(f"Unknown message type: {short(kind)}", UNKNOWN_TYPE)


def parse_frame(message: dict) -> FrameMessage:
    """`video.frame`: `data` base64-decoded and size-checked; errors carry the frame's `frame_id` when it has one."""
    frame_id = message.get("frame_id")
    if isinstance(frame_id, bool) or not isinstance(frame_id, (str, int)) or frame_id == "":
        frame_id = None  # like vLLM-Omni: no usable id, no ack
    elif isinstance(frame_id, str) and len(frame_id) > FRAME_ID_MAX_CHARS:
        raise ProtocolError(f"video.frame frame_id must be at most {FRAME_ID_MAX_CHARS} characters", INVALID_REQUEST)
    pts_ms = message.get("pts_ms")
    if isinstance(pts_ms, bool) or not isinstance(pts_ms, (int, float)) or not math.isfinite(pts_ms):
        pts_ms = None

    data = message.get("data")
    if data is None or data == "":
        raise ProtocolError(FRAME_DATA_MESSAGE, INVALID_REQUEST, frame_id=frame_id)
    if not isinstance(data, str):
        raise ProtocolError(FRAME_BASE64_MESSAGE, INVALID_BASE64, frame_id=frame_id)
    try:
        decoded = _b64decode(data)
    except ValueError:  # binascii.Error and UnicodeEncodeError
        raise ProtocolError(FRAME_BASE64_MESSAGE, INVALID_BASE64, frame_id=frame_id) from None
    if len(decoded) > MAX_FRAME_BYTES:
        raise ProtocolError(
            f"Frame too large: {len(decoded)} bytes (limit {MAX_FRAME_BYTES})", FRAME_TOO_LARGE, frame_id=frame_id
        )
    return FrameMessage(data=decoded, frame_id=frame_id, pts_ms=pts_ms)


def _pcm(data: Any, base64_message: str, missing_message: str, what: str) -> bytes:
    if data is None:
        raise ProtocolError(missing_message, INVALID_REQUEST)
    if not isinstance(data, str):
        raise ProtocolError(base64_message, INVALID_BASE64)
    try:
        pcm = _b64decode(data)
    except ValueError:
        raise ProtocolError(base64_message, INVALID_BASE64) from None
    if len(pcm) % 2:
        raise ProtocolError(
            f"{what} must be whole 16-bit PCM samples: got {len(pcm)} bytes, an odd count", INVALID_AUDIO
        )
    return pcm


# =====================================================================================
# Errors other layers raise, so their codes and texts stay in one place
# =====================================================================================
def config_timeout() -> ProtocolError:
    """No session.config within CONFIG_TIMEOUT_S: the session ends."""
    return ProtocolError(CONFIG_TIMEOUT_MESSAGE, TIMEOUT, close_code=CLOSE_POLICY)


def idle_timeout() -> ProtocolError:
    """No message for IDLE_TIMEOUT_S: the session ends."""
    return ProtocolError(IDLE_TIMEOUT_MESSAGE, IDLE_TIMEOUT, close_code=CLOSE_POLICY)


def no_frames() -> ProtocolError:
    """A query with an empty frame buffer; the session goes on (no response.start is sent)."""
    return ProtocolError(NO_FRAMES_MESSAGE, NO_FRAMES)


def query_failed() -> ProtocolError:
    """The model failed mid-answer; sent after response.start and before response.text.done. The session goes on."""
    return ProtocolError(QUERY_FAILED_MESSAGE, QUERY_FAILED)


def invalid_image(reason: str, frame_id: str | int | None = None) -> ProtocolError:
    """A frame that is not a decodable JPEG/PNG within the limits: an error for that frame only."""
    return ProtocolError(f"Invalid image in video.frame: {reason}", INVALID_IMAGE, frame_id=frame_id)


def audio_buffer_full(max_seconds: float) -> ProtocolError:
    """More audio than the buffer holds arrived before a query: the oldest was dropped. Sent once per query."""
    return ProtocolError(
        f"Audio buffer full: only the latest {max_seconds:g} s are kept until the next video.query; older audio was dropped",
        AUDIO_BUFFER_FULL,
    )


# =====================================================================================
# Server -> client
# =====================================================================================
def new_response_id() -> str:
    return "video-" + uuid.uuid4().hex


def response_start(response_id: str | None = None, **extra: Any) -> dict:
    """`{"type": "response.start"}` (all vLLM-Omni sends); `response_id` and `extra` are additive."""
    return server_messages.ResponseStart(response_id=response_id, **extra).wire()


def text_delta(delta: str, **extra: Any) -> dict:
    return server_messages.TextDelta(delta=delta, **extra).wire()


def text_done(text: str, **extra: Any) -> dict:
    return server_messages.TextDone(text=text, **extra).wire()


def evs_stats(retained: int, dropped: int, total: int) -> dict:
    return server_messages.EvsStats(
        retained_count=retained, dropped_count=dropped, total_count=total, drop_rate=dropped / total if total else 0.0
    ).wire()


def session_done(**extra: Any) -> dict:
    return server_messages.ChatSessionDone(**extra).wire()


def frame_ack(
    frame_id: str | int,
    accepted: bool,
    buffered_frames: int,
    reason: str | None = None,
    *,
    pts_ms: float | None = None,
    dropped_frame_id: str | int | None = None,
    **extra: Any,
) -> dict:
    return server_messages.FrameAck(
        frame_id=frame_id, pts_ms=pts_ms, accepted=accepted, buffered_frames=buffered_frames, reason=reason,
        dropped_frame_id=dropped_frame_id, **extra,
    ).wire()


def error(message: str, code: str | None = None, **extra: Any) -> dict:
    """`{"type": "error", "message": ...}` plus `code` and extras when known (errors.error_message)."""
    return error_message(message, code, **extra)


def pong() -> dict:
    return server_messages.ChatPong().wire()
