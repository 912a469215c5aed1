"""An asyncio client for `WS /v1/video/chat/stream` (PROTOCOL.md section 2), on the `websockets` package.

Reusable by `rtv chat`, by tests and by benchmarks. No numpy, PyAV or torch at
import time (an ndarray frame is JPEG-encoded with Pillow, imported on use).

    async with ChatStreamClient("ws://127.0.0.1:8000") as client:
        await client.configure(num_sample_frames=8)          # session.config (only the fields given)
        sent = await client.send_frame(jpeg_bytes, pts_ms=0)  # video.frame; frame_id "frame-000000"
        ack = await client.wait_ack(sent.frame_id)            # FrameAck(accepted, buffered_frames, reason)
        await client.send_audio(pcm16_bytes)                  # audio.chunk (PCM16 LE, 16 kHz, mono)
        stream = await client.query("What is moving?")        # video.query
        async for delta in stream:                            # TextDelta, as they arrive
            print(delta.delta, end="", flush=True)
        answer = await stream.wait()                          # Answer: text, deltas, times, error
        stats = await client.done()                           # video.done -> EvsStats | None, after session.done
    result = client.result()                                  # ChatResult: everything sent and received

or `answer = await client.ask("What is moving?")` for query + wait.

A background task reads every server message as soon as it arrives (acks,
deltas, errors), so frames can be sent while an answer streams. Queries are
answered one at a time: `query()` first waits for the previous answer's
`response.text.done` (the protocol's deltas carry no query id, and a server
may cancel an answer when a new query comes).

Which answer a server `error` belongs to: an error that arrives while a query
waits for its `response.start` ends that query (the server refused it: "No
frames available...", "video.query requires..."), unless it is about a frame
or an audio chunk (it names a frame, an image or audio, or carries a
`frame_id`). An error after `response.start` is kept with the answer when it
is about the query ("Query processing failed"), and the answer still ends
with its `response.text.done`.

Times (`sent_at`, `received_at`) are seconds since the connection opened,
from `time.perf_counter()`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union

from clients.sdk.connection import WebSocketClient, as_the_server_reads_it, connect_kwargs, endpoint_url, open_websocket, short
from clients.sdk.errors import ClientConnectionError, ClientError, ClientInputError, ClientProtocolError, ClientTimeoutError, ServerError, SessionEndedError, server_error
from deployments.protocol import server_messages as wire
from clients.sdk.connection import one_line as _one_line

PATH = "/v1/video/chat/stream"
MAX_FRAME_BYTES = 10 * 1024 * 1024  # the server's decoded size limit of a frame
AUDIO_SAMPLE_RATE = 16000  # audio.chunk: PCM16 LE, 16 kHz, mono
DEFAULT_JPEG_QUALITY = 85

_AUTO = object()  # send_frame: number frame ids automatically

_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")


# =====================================================================================
# What the server sends, typed
# =====================================================================================
@dataclass(frozen=True)
class FrameAck:
    frame_id: Any
    accepted: bool
    buffered_frames: int | None
    reason: str | None
    received_at: float
    raw: dict = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class ResponseStart:
    received_at: float
    raw: dict = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class TextDelta:
    delta: str
    received_at: float


@dataclass(frozen=True)
class TextDone:
    text: str
    received_at: float
    raw: dict = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class EvsStats:
    retained_count: int | None
    dropped_count: int | None
    total_count: int | None
    drop_rate: float | None
    received_at: float
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    def summary(self) -> dict:
        return {
            "retained_count": self.retained_count,
            "dropped_count": self.dropped_count,
            "total_count": self.total_count,
            "drop_rate": self.drop_rate,
        }

    def __str__(self) -> str:
        rate = f" ({self.drop_rate:.1%})" if isinstance(self.drop_rate, (int, float)) else ""
        return f"kept {self.retained_count} of {self.total_count} frames, dropped {self.dropped_count}{rate}"


@dataclass(frozen=True)
class SessionDone:
    received_at: float
    raw: dict = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class BinaryMessage:
    """A binary frame (servers that also answer in audio send some); kept as its size only."""

    size: int
    received_at: float


@dataclass(frozen=True)
class UnknownMessage:
    """A message type this client does not know (servers may add types; clients ignore them)."""

    type: str | None
    raw: dict
    received_at: float


Event = Union[FrameAck, ResponseStart, TextDelta, TextDone, EvsStats, ServerError, SessionDone, BinaryMessage, UnknownMessage]


# =====================================================================================
# What this client sent, and the answers
# =====================================================================================
@dataclass(frozen=True)
class SentFrame:
    frame_id: Any  # None: sent without frame_id (no ack comes)
    pts_ms: int | None
    nbytes: int  # image bytes (before base64)
    sent_at: float


@dataclass(frozen=True)
class SentAudio:
    nbytes: int
    sent_at: float

    @property
    def samples(self) -> int:
        return self.nbytes // 2

    @property
    def seconds(self) -> float:
        return self.samples / AUDIO_SAMPLE_RATE


@dataclass
class Answer:
    """One `video.query` and what came back for it."""

    index: int  # 0, 1, ... in the order sent
    query: str
    sent_at: float
    started_at: float | None = None  # response.start
    deltas: list[TextDelta] = field(default_factory=list)
    text: str | None = None  # response.text.done's text
    done_at: float | None = None  # response.text.done, or when it ended otherwise
    error: ServerError | None = None
    ended_by: str | None = None  # None while open; "done" | "error" | "closed"

    @property
    def finished(self) -> bool:
        return self.ended_by is not None

    @property
    def streamed_text(self) -> str:
        """The deltas joined (equals `text` from a well-behaved server)."""
        return "".join(d.delta for d in self.deltas)

    @property
    def ok(self) -> bool:
        return self.ended_by == "done" and self.error is None

    @property
    def time_to_first_delta(self) -> float | None:
        return self.deltas[0].received_at - self.sent_at if self.deltas else None

    @property
    def latency(self) -> float | None:
        """Seconds from sending the query to its end."""
        return None if self.done_at is None else self.done_at - self.sent_at

    def failure(self) -> str | None:
        """One line saying why this query got no proper answer; None when it did."""
        if self.error is not None:
            return f"query {self.index + 1} failed: {self.error}"
        if self.ended_by == "closed":
            return f"query {self.index + 1}: the connection closed before its response.text.done"
        if self.ended_by is None:
            return f"query {self.index + 1}: no response.text.done yet"
        return None

    def summary(self) -> dict:
        return {
            "index": self.index,
            "query": self.query,
            "sent_at_seconds": self.sent_at,
            "started_at_seconds": self.started_at,
            "time_to_first_delta_seconds": self.time_to_first_delta,
            "done_at_seconds": self.done_at,
            "latency_seconds": self.latency,
            "num_deltas": len(self.deltas),
            "text": self.text,
            "streamed_text": self.streamed_text,
            "error": None if self.error is None else self.error.summary(),
            "ended_by": self.ended_by,
        }


@dataclass
class ChatResult:
    """Everything one session sent and received, in order within each list."""

    url: str
    config: dict | None = None  # the session.config sent
    frames: list[SentFrame] = field(default_factory=list)
    audio: list[SentAudio] = field(default_factory=list)
    acks: dict[Any, FrameAck] = field(default_factory=dict)  # by frame_id
    frame_errors: dict[Any, ServerError] = field(default_factory=dict)  # errors naming a frame_id
    answers: list[Answer] = field(default_factory=list)
    errors: list[ServerError] = field(default_factory=list)
    stray: list[Event] = field(default_factory=list)  # response.* with no query waiting for it
    unknown: list[UnknownMessage] = field(default_factory=list)
    binary: list[BinaryMessage] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)  # every server message, in arrival order
    evs_stats: EvsStats | None = None
    done: SessionDone | None = None
    protocol_error: str | None = None
    close_code: int | None = None
    close_reason: str | None = None
    done_sent_at: float | None = None  # when video.done left
    ended_at: float | None = None  # when the session ended on our side

    @property
    def ok(self) -> bool:
        """True when the session ended with `session.done`."""
        return self.done is not None

    @property
    def accepted_frames(self) -> int:
        return sum(1 for a in self.acks.values() if a.accepted)

    @property
    def rejected_frames(self) -> int:
        return sum(1 for a in self.acks.values() if not a.accepted)

    @property
    def pending_frames(self) -> list[SentFrame]:
        """Frames sent with a frame_id and neither acked nor named by an error yet."""
        return [f for f in self.frames if f.frame_id is not None and f.frame_id not in self.acks and f.frame_id not in self.frame_errors]

    @property
    def audio_seconds(self) -> float:
        return sum(a.seconds for a in self.audio)

    def failure(self) -> str | None:
        """One line saying why the session failed; None when it ended with `session.done`."""
        if self.protocol_error is not None:
            return f"protocol error: {self.protocol_error}"
        if self.done is not None:
            return None
        code = ""
        if self.close_code is not None:
            code = f" (close code {self.close_code}{': ' + self.close_reason if self.close_reason else ''})"
        if self.errors:
            return f"session ended with server error: {self.errors[-1]}{code}"
        return f"connection closed before session.done{code}"

    def summary(self) -> dict:
        """JSON-ready description (no image or audio bytes)."""
        return {
            "url": self.url,
            "config": self.config,
            "frames_sent": len(self.frames),
            "frames_accepted": self.accepted_frames,
            "frames_rejected": self.rejected_frames,
            "frames": [
                {
                    "frame_id": f.frame_id,
                    "pts_ms": f.pts_ms,
                    "bytes": f.nbytes,
                    "sent_at_seconds": f.sent_at,
                    "ack": None
                    if f.frame_id not in self.acks
                    else {
                        "accepted": self.acks[f.frame_id].accepted,
                        "buffered_frames": self.acks[f.frame_id].buffered_frames,
                        "reason": self.acks[f.frame_id].reason,
                        "received_at_seconds": self.acks[f.frame_id].received_at,
                    },
                }
                for f in self.frames
            ],
            "audio_chunks_sent": len(self.audio),
            "audio_bytes_sent": sum(a.nbytes for a in self.audio),
            "audio_seconds_sent": self.audio_seconds,
            "answers": [a.summary() for a in self.answers],
            "evs_stats": None if self.evs_stats is None else self.evs_stats.summary(),
            "errors": [e.summary() for e in self.errors],
            "session_done": self.done is not None,
            "close_code": self.close_code,
            "failure": self.failure(),
            "ended_at_seconds": self.ended_at,
        }


# =====================================================================================
# Messages
# =====================================================================================
def chat_url(url: str) -> str:
    """`ws://host:port` (or http://, or a full endpoint URL) -> the `/v1/video/chat/stream` endpoint URL."""
    return endpoint_url(url, PATH)


def session_config_message(
    *,
    model: str | None = None,
    modalities: list[str] | None = None,
    max_frames: int | None = None,
    num_sample_frames: int | None = None,
    evs_enabled: bool | None = None,
    evs_threshold: float | None = None,
    system_prompt: str | None = None,
    extra: dict | None = None,
) -> dict:
    """Build a `session.config`; only the fields given are set (the server's defaults apply to the rest).
    `extra` adds any other fields and wins over the rest. Raises ClientInputError with the server's own words."""
    from deployments.protocol.chat import parse_session_config

    fields = {"model": model, "modalities": list(modalities) if isinstance(modalities, tuple) else modalities,
              "max_frames": max_frames, "num_sample_frames": num_sample_frames, "evs_enabled": evs_enabled,
              "evs_threshold": evs_threshold, "system_prompt": system_prompt}
    message = {"type": "session.config", **{k: v for k, v in fields.items() if v is not None}}
    message.update({k: v for k, v in (extra or {}).items() if k != "type"})
    return as_the_server_reads_it(message, parse_session_config)


def encode_jpeg(image: Any, quality: int = DEFAULT_JPEG_QUALITY) -> bytes:
    """An RGB uint8 ndarray [H, W, 3] (or [H, W]) or a PIL image -> JPEG bytes."""
    import io

    from PIL import Image

    if not isinstance(image, Image.Image):
        try:
            image = Image.fromarray(image)
        except Exception as exc:
            raise ClientInputError(f"cannot make an image of {type(image).__name__}: {_one_line(exc)}") from None
    if image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def _query_error(error: ServerError) -> bool | None:
    """True: about a query; False: about a frame or audio chunk; None: cannot tell."""
    text = error.message.lower()
    code = (error.code or "").lower()
    if "query" in text or "query" in code or text.startswith("no frames available"):
        return True
    if "frame_id" in error.raw or any(word in text or word in code for word in ("frame", "image", "audio", "base64")):
        return False
    return None


# =====================================================================================
# One answer as it streams
# =====================================================================================
_END = object()


class AnswerStream:
    """The answer to one `video.query`: async-iterate for its TextDeltas as they arrive,
    `await wait()` for the finished Answer. `answer` is the live Answer object."""

    def __init__(self, answer: Answer, timeout: float | None) -> None:
        self.answer = answer
        self.timeout = timeout
        self._queue: asyncio.Queue = asyncio.Queue()
        self._ended = asyncio.Event()
        self._drained = False

    # called by the client's reader
    def _push(self, delta: TextDelta) -> None:
        self._queue.put_nowait(delta)

    def _end(self, how: str, now: float) -> None:
        if self.answer.ended_by is None:
            self.answer.ended_by = how
            self.answer.done_at = now
            self._queue.put_nowait(_END)
            self._ended.set()

    @property
    def finished(self) -> bool:
        return self.answer.finished

    def __aiter__(self) -> "AnswerStream":
        return self

    async def __anext__(self) -> TextDelta:
        if self._drained:
            raise StopAsyncIteration
        try:
            item = await asyncio.wait_for(self._queue.get(), self.timeout)
        except (TimeoutError, asyncio.TimeoutError):
            raise ClientTimeoutError(
                f"query {self.answer.index + 1}: nothing from the server for {self.timeout:g}s"
            ) from None
        if item is _END:
            self._drained = True
            raise StopAsyncIteration
        return item

    async def wait(self) -> Answer:
        """Read the rest of the answer; returns it (see `Answer.ok` / `failure()`).
        Raises ClientTimeoutError when the server goes quiet for `timeout` seconds."""
        async for _ in self:
            pass
        return self.answer

    async def wait_ended(self, timeout: float | None = None) -> Answer:
        """Wait for the end without consuming the deltas (another task may be iterating)."""
        try:
            await asyncio.wait_for(self._ended.wait(), timeout)
        except (TimeoutError, asyncio.TimeoutError):
            raise ClientTimeoutError(f"query {self.answer.index + 1} did not end within {timeout:g}s") from None
        return self.answer


# =====================================================================================
# The client
# =====================================================================================
class ChatStreamClient(WebSocketClient):
    """One WebSocket session of `/v1/video/chat/stream`.

    `connect()` (or `async with`), `configure(...)` first, then `send_frame`,
    `send_audio`, `query`/`ask` in any order, and `done()` at the end.
    `on_event(event)` (sync) sees every server message as it arrives.
    `url` may be `ws://HOST:PORT` (the endpoint path is added) or the full URL.
    """

    def __init__(
        self,
        url: str,
        *,
        open_timeout: float = 10.0,
        max_size: int | None = 16 * 1024 * 1024,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 60.0,
        close_timeout: float = 5.0,
        additional_headers: dict | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        options = connect_kwargs(open_timeout, max_size, ping_interval, ping_timeout, close_timeout, additional_headers)
        super().__init__(chat_url(url), open_timeout, options, ChatResult(url=chat_url(url)))
        self.on_event = on_event
        self._reader: asyncio.Task | None = None
        self._changed: asyncio.Condition | None = None
        self._query_lock: asyncio.Lock | None = None
        self._active: AnswerStream | None = None  # the query waiting for / streaming its answer
        self._next_frame = 0

    # -- connection ---------------------------------------------------------------
    async def connect(self) -> "ChatStreamClient":

        self._changed = asyncio.Condition()
        self._query_lock = asyncio.Lock()
        self._ws = await open_websocket(self.url, self.open_timeout, self._connect_kwargs, ClientInputError, ClientConnectionError)
        self._t0 = time.perf_counter()
        self._reader = asyncio.create_task(self._read_loop(), name="chat-client-reader")
        return self

    async def close(self) -> None:
        await self._close_socket()
        if self._reader is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._reader), 5.0)
            except BaseException:  # timed out, or cancelled with us
                self._reader.cancel()
        await self._finish()

    def result(self) -> ChatResult:
        return self._result

    # -- sending ---------------------------------------------------------------------
    async def configure(self, *, message: dict | None = None, **fields: Any) -> dict:
        """Send `session.config` (built by `session_config_message(**fields)`, or `message` as is);
        returns the message sent. No reply comes for it."""
        if message is None:
            message = session_config_message(**fields)
        elif fields:
            raise ClientInputError("give either message or fields")
        self._result.config = message
        await self.send_json(message)
        return message

    async def send_frame(
        self,
        image: Any,
        *,
        frame_id: Any = _AUTO,
        pts_ms: int | float | None = None,
        quality: int = DEFAULT_JPEG_QUALITY,
        extra: dict | None = None,
    ) -> SentFrame:
        """Send a `video.frame`. `image`: JPEG or PNG bytes (sent as they are), or an RGB uint8
        ndarray / PIL image (JPEG-encoded here at `quality`). `frame_id`: by default
        "frame-000000", "frame-000001"... (the server acks frames that carry one); None sends
        none. `pts_ms` is sent as an integer when given."""
        if isinstance(image, (bytes, bytearray, memoryview)):
            data = bytes(image)
            if not data:
                raise ClientInputError("the frame is empty")
        else:
            data = encode_jpeg(image, quality)
        if frame_id is _AUTO:
            frame_id = f"frame-{self._next_frame:06d}"
        self._next_frame += 1
        message: dict[str, Any] = {"type": "video.frame", "data": base64.b64encode(data).decode("ascii")}
        if frame_id is not None:
            message["frame_id"] = frame_id
        if pts_ms is not None:
            if isinstance(pts_ms, bool) or not isinstance(pts_ms, (int, float)) or not math.isfinite(pts_ms):
                raise ClientInputError(f"pts_ms must be a finite number, got {pts_ms!r}")
            pts_ms = int(round(pts_ms))
            message["pts_ms"] = pts_ms
        if extra:
            message.update({k: v for k, v in extra.items() if k != "type"})
        sent = SentFrame(frame_id, pts_ms, len(data), self.elapsed())
        self._result.frames.append(sent)
        await self.send_json(message)
        return sent

    async def send_audio(self, pcm16: bytes) -> SentAudio:
        """Send an `audio.chunk` of PCM16 LE, 16 kHz, mono samples (an even, non-zero number of bytes)."""
        data = bytes(pcm16)
        if not data or len(data) % 2:
            raise ClientInputError(f"PCM16 audio must be a non-empty, even number of bytes, got {len(data)}")
        sent = SentAudio(len(data), self.elapsed())
        self._result.audio.append(sent)
        await self.send_json({"type": "audio.chunk", "data": base64.b64encode(data).decode("ascii")})
        return sent

    async def query(self, text: str, *, timeout: float | None = None) -> AnswerStream:
        """Send a `video.query` once the previous answer has ended; returns its AnswerStream.

        `timeout` bounds the wait for the previous answer and, on the stream, each
        wait for the next message of this answer (ClientTimeoutError)."""
        if not isinstance(text, str) or not text.strip():
            raise ClientInputError("the query must be a non-blank string")
        if self._query_lock is None:
            raise ClientError("not connected")
        async with self._query_lock:
            previous = self._active
            if previous is not None and not previous.finished:
                await previous.wait_ended(timeout)
            if self._finished:
                raise SessionEndedError(self._result.failure() or "the session is over")
            answer = Answer(index=len(self._result.answers), query=text, sent_at=self.elapsed())
            stream = AnswerStream(answer, timeout)
            self._result.answers.append(answer)
            self._active = stream
            await self.send_json({"type": "video.query", "text": text})
            return stream

    async def ask(self, text: str, *, timeout: float | None = None) -> Answer:
        """`query` and wait for the whole answer."""
        return await (await self.query(text, timeout=timeout)).wait()

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Wait until no answer is in progress."""
        active = self._active
        if active is not None and not active.finished:
            await active.wait_ended(timeout)

    async def wait_ack(self, frame_id: Any, timeout: float | None = None) -> FrameAck:
        """The `video.frame.ack` of `frame_id` (waits for it). Raises SessionEndedError when the
        session ends first, ClientError when an error names the frame instead."""
        await self._wait_for(
            lambda: frame_id in self._result.acks or frame_id in self._result.frame_errors,
            timeout,
            f"no video.frame.ack for frame {frame_id!r}",
        )
        if frame_id in self._result.acks:
            return self._result.acks[frame_id]
        raise ClientError(f"frame {frame_id!r} refused: {self._result.frame_errors[frame_id]}")

    async def wait_acks(self, max_pending: int = 0, timeout: float | None = None) -> None:
        """Wait until at most `max_pending` frames sent with a frame_id have no ack (or error) yet."""
        await self._wait_for(
            lambda: len(self._result.pending_frames) <= max_pending,
            timeout,
            "frames not acked",
            detail=lambda: f"{len(self._result.pending_frames)} frames still without video.frame.ack",
        )

    async def done(self, timeout: float | None = 60.0) -> EvsStats | None:
        """Wait for the answer in progress, send `video.done`, wait for `session.done`;
        returns the `response.evs_stats` (None when the server sent none: EVS off).
        Raises SessionEndedError when the session ends without session.done."""
        await self.wait_idle(timeout)
        self._result.done_sent_at = self.elapsed()
        await self.send_json({"type": "video.done"})
        await self._wait_for(lambda: self._result.done is not None, timeout, "no session.done after video.done")
        return self._result.evs_stats

    async def wait_closed(self, timeout: float = 5.0) -> None:
        """After session.done: wait for the server's close frame, noting its code."""
        if self._reader is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._reader), timeout)
        except (TimeoutError, asyncio.TimeoutError):
            pass

    async def _wait_for(
        self, predicate: Callable[[], bool], timeout: float | None, what: str, detail: Callable[[], str] | None = None
    ) -> None:
        if self._changed is None:
            raise ClientError("not connected")

        async def wait() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: predicate() or self._finished)

        try:
            await asyncio.wait_for(wait(), timeout)
        except (TimeoutError, asyncio.TimeoutError):
            extra = f" ({detail()})" if detail else ""
            raise ClientTimeoutError(f"{what} within {timeout:g}s{extra}") from None
        if not predicate():
            if self._result.protocol_error is not None:
                raise ClientProtocolError(self._result.protocol_error)
            raise SessionEndedError(f"{what}: {self._result.failure() or 'the session ended'}")

    # -- receiving ----------------------------------------------------------------------
    async def _read_loop(self) -> None:
        from websockets.exceptions import ConnectionClosed

        ws = self._ws
        try:
            while True:
                try:
                    raw = await ws.recv()
                except ConnectionClosed:
                    break
                now = self.elapsed()
                if isinstance(raw, (bytes, bytearray, memoryview)):
                    event: Event = BinaryMessage(len(raw), now)
                    self._result.binary.append(event)
                else:
                    try:
                        data = json.loads(raw)
                    except ValueError:
                        data = None
                    if not isinstance(data, dict):
                        self._result.protocol_error = f"server sent a text message that is not a JSON object: {short(raw)}"
                        await ws.close(1002)
                        break
                    try:
                        event = self._dispatch(data, now)
                    except wire.MalformedMessage as exc:
                        self._result.protocol_error = str(exc)
                        await ws.close(1002)
                        break
                self._result.events.append(event)
                if self.on_event is not None:
                    try:
                        self.on_event(event)
                    except Exception:  # a callback's bug must not kill the session
                        pass
                async with self._changed:
                    self._changed.notify_all()
                if isinstance(event, SessionDone):
                    # The server closes after session.done: note its close code.
                    try:
                        await asyncio.wait_for(ws.wait_closed(), 5.0)
                    except (TimeoutError, asyncio.TimeoutError):
                        pass
                    break
        finally:
            self._note_close(ws)
            await self._finish()

    def _dispatch(self, data: dict, now: float) -> Event:
        """A received JSON object -> its event, read with the contract's models (MalformedMessage if it breaks them)."""
        r = self._result
        message = wire.read_message(data, wire.CHAT_MESSAGES)
        active = self._active if self._active is not None and not self._active.finished else None
        if isinstance(message, wire.FrameAck):
            ack = FrameAck(message.frame_id, message.accepted, message.buffered_frames, message.reason, now, data)
            r.acks[ack.frame_id] = ack
            return ack
        if isinstance(message, wire.ResponseStart):
            event: Event = ResponseStart(now, data)
            if active is not None and active.answer.started_at is None:
                active.answer.started_at = now
            else:
                r.stray.append(event)
            return event
        if isinstance(message, wire.TextDelta):
            event = TextDelta(message.delta, now)
            if active is not None:
                active.answer.deltas.append(event)
                active._push(event)
            else:
                r.stray.append(event)
            return event
        if isinstance(message, wire.TextDone):
            event = TextDone(message.text, now, data)
            if active is not None:
                active.answer.text = event.text
                active._end("done", now)
            else:
                r.stray.append(event)
            return event
        if isinstance(message, wire.EvsStats):
            stats = EvsStats(message.retained_count, message.dropped_count, message.total_count, float(message.drop_rate), now, data)
            r.evs_stats = stats
            return stats
        if isinstance(message, wire.ChatSessionDone):
            done = SessionDone(now, data)
            r.done = done
            return done
        if isinstance(message, wire.ErrorMessage):
            error = server_error(message, now, data)
            r.errors.append(error)
            if "frame_id" in data:
                r.frame_errors[data.get("frame_id")] = error
            if active is not None:
                about_query = _query_error(error)
                if active.answer.started_at is None and about_query is not False:
                    active.answer.error = error
                    active._end("error", now)
                elif active.answer.started_at is not None and about_query:
                    active.answer.error = error  # response.text.done still ends the answer
            return error
        kind = data.get("type")
        unknown = UnknownMessage(kind if isinstance(kind, str) else None, data, now)
        r.unknown.append(unknown)
        return unknown

    async def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._result.ended_at = self.elapsed()
        active = self._active
        if active is not None and not active.finished:
            active._end("closed", self.elapsed())
        if self._changed is not None:
            async with self._changed:
                self._changed.notify_all()
