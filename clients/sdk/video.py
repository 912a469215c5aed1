"""An asyncio client for `WS /v1/realtime/video` (PROTOCOL.md section 1), on the `websockets` package.

Reusable by the CLI (`rtv generate`, `rtv rollout --url`), by tests, and by
later tools (web tests, load benchmarks). No numpy, no PyAV, no torch here.

    async with VideoStreamClient("ws://127.0.0.1:8000") as client:
        start = await client.start("a red room", blocks=3, seed=1)
        async for event in client.events():
            if isinstance(event, VideoChunk) and event.generation_chunk_index == 0:
                await client.interact(prompt="a snowy forest", transition_chunks=1)
        result = client.result()          # SessionResult: every chunk, queued ack, error, done

or, all at once, `await stream_session(url, "a red room", blocks=3)`.

Wire rules the client enforces (each violation raises `ClientProtocolError`):
a binary frame must come right after its `video.chunk_metadata` (no binary
without metadata, no text message in between), and its length must equal the
metadata's `byte_length`.

Times (`received_at`) are seconds since `session.start` was sent, from
`time.perf_counter()`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from clients.sdk.connection import WebSocketClient, as_the_server_reads_it, connect_kwargs, endpoint_url, open_websocket, short
from clients.sdk.errors import ClientConnectionError, ClientError, ClientInputError, ClientProtocolError, ServerError, SessionEndedError, server_error
from deployments.contract import images
from deployments.protocol import server_messages as wire
from deployments.contract.timeline import (
    FRAMES_PER_BLOCK,
    TEMPORAL_FACTOR,
    frames_for_blocks,
    frames_in_block,
)

PATH = "/v1/realtime/video"
FORMAT = "m4s"


# =====================================================================================
# What the server sends, typed
# =====================================================================================
@dataclass(frozen=True)
class VideoStart:
    request_id: str
    format: str
    config: dict
    received_at: float
    replica_id: str | None = None  # extension fields our server adds
    session_id: str | None = None
    seed: int | None = None
    frames_per_block: int = FRAMES_PER_BLOCK  # from video.start when it carries them, else the defaults
    temporal_factor: int = TEMPORAL_FACTOR
    geometry_from_server: bool = False
    # Blocks the server has already started when it sends a chunk: an interaction meant for block k
    # must leave once chunk k - 1 - pipeline_depth has arrived.
    pipeline_depth: int = 0
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    def frames_for_blocks(self, blocks: int) -> int:
        return frames_for_blocks(blocks, self.frames_per_block, self.temporal_factor)

    def frames_in_block(self, index: int) -> int:
        return frames_in_block(index, self.frames_per_block, self.temporal_factor)


@dataclass(frozen=True)
class ChunkMetadata:
    request_id: str
    kind: str  # "media" or "trailer"
    num_frames: int  # frames the block generated (0 on the trailer), as the seed counts them
    byte_length: int
    transport_chunk_index: int
    generation_chunk_index: int | None
    started_event_ids: tuple[str, ...] = ()
    active_event_ids: tuple[str, ...] = ()
    completed_event_ids: tuple[str, ...] = ()
    raw: dict = field(default_factory=dict, repr=False, compare=False)
    # Frames this binary frame completes (our additive `fragment_frames`; a server without it: `num_frames`).
    fragment_frames: int = 0
    frames_ready_at: float | None = None  # ours: Unix seconds when the replica had the block's frames
    replica_sent_at: float | None = None  # ours: ... when the replica sent the encoded chunk
    ingress_received_at: float | None = None  # ours: ... when the ingress had it from the replica


@dataclass(frozen=True)
class VideoChunk:
    """One binary frame of fragmented MP4 and the `video.chunk_metadata` sent right before it."""

    metadata: ChunkMetadata
    data: bytes = field(repr=False)
    received_at: float  # when the binary frame arrived
    latency_seconds: float  # since the previous binary frame (the first: since session.start was sent)
    received_wall: float | None = None  # the same arrival in Unix seconds (time.time())

    @property
    def serving_overhead(self) -> float | None:
        """Seconds from the replica having the block's frames to their fragment reaching this client:
        encode, Ray, ingress and WebSocket. Meaningful on the server's host (one clock); None when the
        server sends no `frames_ready_at`."""
        ready = self.metadata.frames_ready_at
        return None if ready is None or self.received_wall is None else self.received_wall - ready

    @property
    def serving_stages(self) -> dict[str, float] | None:
        """`serving_overhead` split on the same clock: `replica` (encode, pacing), `to_ingress` (Ray's hop) and
        `to_client` (the ingress, Serve's proxy, the socket); None when the server sends no stage stamps."""
        m = self.metadata
        stamps = (m.frames_ready_at, m.replica_sent_at, m.ingress_received_at, self.received_wall)
        if any(stamp is None for stamp in stamps):
            return None
        return {stage: later - earlier for stage, earlier, later in zip(("replica", "to_ingress", "to_client"), stamps, stamps[1:])}

    @property
    def kind(self) -> str:
        return self.metadata.kind

    @property
    def is_trailer(self) -> bool:
        return self.metadata.kind == "trailer"

    @property
    def num_frames(self) -> int:
        return self.metadata.num_frames

    @property
    def fragment_frames(self) -> int:
        return self.metadata.fragment_frames

    @property
    def generation_chunk_index(self) -> int | None:
        return self.metadata.generation_chunk_index

    @property
    def transport_chunk_index(self) -> int:
        return self.metadata.transport_chunk_index

    def summary(self) -> dict:
        """JSON-ready description (no bytes)."""
        m = self.metadata
        return {
            "transport_chunk_index": m.transport_chunk_index,
            "generation_chunk_index": m.generation_chunk_index,
            "kind": m.kind,
            "num_frames": m.num_frames,
            "fragment_frames": m.fragment_frames,
            "byte_length": m.byte_length,
            "received_at_seconds": self.received_at,
            "latency_seconds": self.latency_seconds,
            "serving_overhead_seconds": self.serving_overhead,
            "serving_stages_seconds": self.serving_stages,
            "started_event_ids": list(m.started_event_ids),
            "active_event_ids": list(m.active_event_ids),
            "completed_event_ids": list(m.completed_event_ids),
        }


@dataclass(frozen=True)
class InteractionQueued:
    request_id: str | None
    event_id: str
    received_at: float


@dataclass(frozen=True)
class SessionDone:
    request_id: str | None
    chunks: int
    stopped: bool
    received_at: float


@dataclass(frozen=True)
class Pong:
    received_at: float


@dataclass(frozen=True)
class UnknownMessage:
    """A message type this client does not know (the contract lets servers add types; clients ignore them)."""

    type: str | None
    raw: dict
    received_at: float


Event = Union[VideoStart, VideoChunk, InteractionQueued, ServerError, SessionDone, Pong, UnknownMessage]


@dataclass
class SentInteraction:
    event_id: str
    message: dict
    sent_at: float


@dataclass
class SessionResult:
    """Everything one session produced, in arrival order within each list."""

    url: str
    start: VideoStart | None = None
    chunks: list[VideoChunk] = field(default_factory=list)
    queued: list[InteractionQueued] = field(default_factory=list)
    errors: list[ServerError] = field(default_factory=list)
    pongs: list[Pong] = field(default_factory=list)
    unknown: list[UnknownMessage] = field(default_factory=list)
    sent_interactions: list[SentInteraction] = field(default_factory=list)
    done: SessionDone | None = None
    close_code: int | None = None
    close_reason: str | None = None
    last_message: Event | None = None  # the last server message of the session
    started_at_wall: float | None = None  # time.time() when session.start was sent
    ended_at: float | None = None  # seconds since session.start, when the session ended on our side

    @property
    def request_id(self) -> str | None:
        return self.start.request_id if self.start else None

    @property
    def media_chunks(self) -> list[VideoChunk]:
        return [c for c in self.chunks if c.kind == "media"]

    @property
    def trailer(self) -> VideoChunk | None:
        return next((c for c in self.chunks if c.is_trailer), None)

    @property
    def media(self) -> bytes:
        """The concatenated fragmented MP4: init segment, fragments, trailer."""
        return b"".join(c.data for c in self.chunks)

    @property
    def num_frames(self) -> int:
        """Frames the server says it generated (sum of every chunk's num_frames)."""
        return sum(c.num_frames for c in self.chunks)

    @property
    def time_to_first_frame(self) -> float | None:
        """Seconds from sending session.start to the first binary frame that completes a frame."""
        return next((c.received_at for c in self.chunks if c.fragment_frames > 0), None)

    @property
    def ok(self) -> bool:
        """True when the session ended with `session.done` (errors along the way, such as a refused
        interaction, do not end a session)."""
        return self.done is not None

    @property
    def ended_with_error(self) -> bool:
        return self.done is None

    def failure(self) -> str | None:
        """One line saying why the session failed, or None when it ended with `session.done`."""
        if self.done is not None:
            return None
        code = ""
        if self.close_code is not None:
            code = f" (close code {self.close_code}{': ' + self.close_reason if self.close_reason else ''})"
        if self.errors:
            return f"session ended with server error: {self.errors[-1]}{code}"
        return f"connection closed before session.done{code}"

    def started_block(self, event_id: str) -> int | None:
        """The generation_chunk_index of the first media chunk whose metadata lists `event_id` as started."""
        for chunk in self.media_chunks:
            if event_id in chunk.metadata.started_event_ids:
                return chunk.generation_chunk_index
        return None

    def completed_block(self, event_id: str) -> int | None:
        for chunk in self.media_chunks:
            if event_id in chunk.metadata.completed_event_ids:
                return chunk.generation_chunk_index
        return None

    def summary(self) -> dict:
        """JSON-ready description of the session (no media bytes)."""
        start = self.start
        return {
            "url": self.url,
            "request_id": self.request_id,
            "replica_id": start.replica_id if start else None,
            "session_id": start.session_id if start else None,
            "seed": start.seed if start else None,
            "config": start.config if start else None,
            "chunks": [c.summary() for c in self.chunks],
            "num_chunks": len(self.chunks),
            "frames": self.num_frames,
            "bytes": sum(len(c.data) for c in self.chunks),
            "time_to_first_frame_seconds": self.time_to_first_frame,
            "total_seconds": self.ended_at,
            "interactions": [
                {
                    "event_id": s.event_id,
                    "sent_at_seconds": s.sent_at,
                    "queued": any(q.event_id == s.event_id for q in self.queued),
                    "started_block": self.started_block(s.event_id),
                    "completed_block": self.completed_block(s.event_id),
                }
                for s in self.sent_interactions
            ],
            "queued_event_ids": [q.event_id for q in self.queued],
            "errors": [e.summary() for e in self.errors],
            "done": None if self.done is None else {"chunks": self.done.chunks, "stopped": self.done.stopped},
            "close_code": self.close_code,
            "close_reason": self.close_reason or None,
            "ok": self.ok,
        }


# =====================================================================================
# Helpers (pure)
# =====================================================================================
def image_data_url(path: str | os.PathLike) -> str:
    """An image file as a `data:image/...;base64,` URL: PNG, JPEG and WebP as they are, anything else
    Pillow reads re-encoded as PNG; raises ClientInputError."""
    p = Path(path)
    if not p.is_file():
        raise ClientInputError(f"image file {p} does not exist")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ClientInputError(f"cannot read image {p}: {' '.join(str(exc).split())}") from None
    try:
        return image_bytes_data_url(data, source=str(p))
    except ClientInputError:
        pass
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            out = io.BytesIO()
            img.convert("RGB").save(out, format="PNG")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ClientInputError(f"cannot read image {p}: {' '.join(str(exc).split())}") from None
    return image_bytes_data_url(out.getvalue(), source=str(p))


def image_bytes_data_url(data: bytes, source: str = "image") -> str:
    """PNG, JPEG or WebP bytes as a data URL (the type is read off the bytes, not a file name)."""
    kind = images.media_type(data)
    if kind is None:
        raise ClientInputError(f"{source} is not a PNG, JPEG or WebP file")
    return images.data_url(data, kind)


def image_reference(path_or_url: str | os.PathLike) -> dict:
    """`{"image_url": data URL}` for session.start; a `data:` URL is passed through as is."""
    if isinstance(path_or_url, str) and path_or_url.startswith("data:"):
        return {"image_url": path_or_url}
    return {"image_url": image_data_url(path_or_url)}


def video_url(url: str) -> str:
    """`ws://host:port` (or http://, or a full endpoint URL) -> the `/v1/realtime/video` endpoint URL."""
    return endpoint_url(url, PATH)


def session_start_message(
    prompt: str,
    *,
    image: str | os.PathLike | None = None,
    image_reference_url: str | None = None,
    num_frames: int | None = None,
    blocks: int | None = None,
    seed: int | None = None,
    size: str | None = None,
    width: int | None = None,
    height: int | None = None,
    frames_per_block: int = FRAMES_PER_BLOCK,
    temporal_factor: int = TEMPORAL_FACTOR,
    extra: dict | None = None,
) -> dict:
    """Build a `session.start` message; only the fields given are set (the server's defaults apply to the rest).

    `blocks` is turned into `num_frames` with the given geometry. `image` is a
    PNG/JPEG file path (or a data URL); `extra` adds any other fields
    (`fps`, `num_inference_steps`, `extra_params`, ...) and wins over the rest.
    Raises ClientInputError.
    """
    message: dict[str, Any] = {"type": "session.start", "prompt": prompt}
    if num_frames is not None and blocks is not None:
        raise ClientInputError("give num_frames or blocks, not both")
    if blocks is not None:
        if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
            raise ClientInputError(f"blocks must be a positive integer, got {blocks!r}")
        num_frames = frames_for_blocks(blocks, frames_per_block, temporal_factor)
    if (width is None) != (height is None):
        raise ClientInputError("width and height must be given together")
    if image is not None and image_reference_url is not None:
        raise ClientInputError("give image or image_reference_url, not both")
    fields = {"num_frames": num_frames, "seed": seed, "size": size, "width": width, "height": height}
    message.update({name: value for name, value in fields.items() if value is not None})
    if image is not None:
        message["image_reference"] = image_reference(image)
    elif image_reference_url is not None:
        message["image_reference"] = {"image_url": image_reference_url}
    if extra:
        message.update({k: v for k, v in extra.items() if k != "type"})
    from deployments.protocol.video import parse_session_start  # on use: it imports numpy

    return as_the_server_reads_it(message, parse_session_start)


def interaction_message(
    *,
    event_id: str | None = None,
    prompt: str | None = None,
    transition_chunks: int | None = None,
    camera: dict | None = None,
    actions: Sequence[Sequence[str]] | None = None,
) -> dict:
    """Build a `session.interaction`. A missing `event_id` gets a fresh uuid4 hex here (so the
    caller knows it). `camera` is `{"mode": "target"|"velocity", "data": {"translation": [...], "rotation": [...]}}`;
    `actions` one list of keys per latent frame. Raises ClientInputError."""
    if prompt is None and camera is None and actions is None:
        raise ClientInputError("an interaction needs a prompt, a camera command or actions")
    event: dict[str, Any] = {} if prompt is None else {"prompt": prompt}
    media = {name: value for name, value in (("camera", camera), ("actions", actions)) if value is not None}
    if actions is not None and not isinstance(actions, (str, bytes)) and isinstance(actions, Sequence):
        media["actions"] = [list(frame) if isinstance(frame, (list, tuple)) else frame for frame in actions]
    if media:
        event["multi_modal_data"] = media
    body: dict[str, Any] = {"event_id": uuid.uuid4().hex if event_id is None else event_id, "event": event}
    if transition_chunks is not None:
        body["transition_chunks"] = transition_chunks
    from deployments.protocol.video import parse_control_message

    return as_the_server_reads_it({"type": "session.interaction", "interaction": body}, parse_control_message)


def read(data: dict) -> wire.ServerMessage | None:
    """A received JSON object as the contract's model (None for a type the video contract does not name)."""
    try:
        return wire.read_message(data, wire.VIDEO_MESSAGES)
    except wire.MalformedMessage as exc:
        raise ClientProtocolError(str(exc)) from None


def video_start(message: wire.VideoStart, received_at: float, raw: dict) -> VideoStart:
    """Geometry (latent frames per block, temporal factor, pipeline depth) is read from the `generation`
    object our server adds; other servers get the defaults."""
    generation = message.generation or wire.GenerationInfo()
    fpb, tf = generation.frames_per_block, generation.scale_factor_temporal
    return VideoStart(
        request_id=message.request_id,
        format=message.format,
        config=message.config,
        received_at=received_at,
        replica_id=message.replica_id,
        session_id=message.session_id,
        seed=message.seed,
        frames_per_block=fpb or FRAMES_PER_BLOCK,
        temporal_factor=tf or TEMPORAL_FACTOR,
        geometry_from_server=bool(fpb and tf),
        pipeline_depth=generation.pipeline_depth,
        raw=raw,
    )


def chunk_metadata(message: wire.ChunkMetadata, raw: dict) -> ChunkMetadata:
    return ChunkMetadata(
        request_id=message.request_id,
        kind=message.kind,
        num_frames=message.num_frames,
        byte_length=message.byte_length,
        transport_chunk_index=message.transport_chunk_index,
        generation_chunk_index=message.generation_chunk_index,
        started_event_ids=tuple(message.started_event_ids),
        active_event_ids=tuple(message.active_event_ids),
        completed_event_ids=tuple(message.completed_event_ids),
        raw=raw,
        fragment_frames=message.num_frames if message.fragment_frames is None else message.fragment_frames,
        frames_ready_at=message.frames_ready_at,
        replica_sent_at=message.replica_sent_at,
        ingress_received_at=message.ingress_received_at,
    )


# =====================================================================================
# The client
# =====================================================================================
class VideoStreamClient(WebSocketClient):
    """One WebSocket session of `/v1/realtime/video`.

    Lifecycle: `connect()` (or `async with`), `start(...)` -> VideoStart, then
    iterate `events()` until it ends (after `session.done`, or when the server
    closes). Send `interact(...)`, `stop()`, `ping()`, `playback(...)` at any
    time, from the consuming loop or another task. Everything received is also
    collected in `result()`.

    `url` may be `ws://HOST:PORT` (the endpoint path is added) or the full
    endpoint URL.
    """

    def __init__(
        self,
        url: str,
        *,
        open_timeout: float = 10.0,
        max_size: int | None = None,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 60.0,
        close_timeout: float = 5.0,
        additional_headers: dict | None = None,
    ) -> None:
        options = connect_kwargs(open_timeout, max_size, ping_interval, ping_timeout, close_timeout, additional_headers)
        super().__init__(video_url(url), open_timeout, options, SessionResult(url=video_url(url)))
        self._last_binary_at: float | None = None
        self._pending: ChunkMetadata | None = None  # metadata waiting for its binary frame

    # -- connection ---------------------------------------------------------------
    async def connect(self) -> "VideoStreamClient":
        self._ws = await open_websocket(self.url, self.open_timeout, self._connect_kwargs, ClientInputError, ClientConnectionError)
        return self

    async def close(self) -> None:
        await self._close_socket()

    def result(self) -> SessionResult:
        return self._result

    # -- sending ---------------------------------------------------------------------
    async def start(
        self,
        prompt: str | None = None,
        *,
        message: dict | None = None,
        wait: bool = True,
        **fields: Any,
    ) -> VideoStart | None:
        """Send `session.start` (built by `session_start_message(prompt, **fields)`, or `message` as is)
        and, when `wait`, read up to `video.start`.

        Raises SessionEndedError when the server answers with an error / closes instead.
        Messages other than `video.start` that arrive first are collected in the result.
        """
        if message is None:
            message = session_start_message(prompt, **fields)
        elif prompt is not None or fields:
            raise ClientInputError("give either message or prompt/fields")
        if self._ws is None:
            await self.connect()
        self._t0 = time.perf_counter()
        self._result.started_at_wall = time.time()
        await self.send_json(message)
        if not wait:
            return None
        while (event := await self.next_event()) is not None:
            if isinstance(event, VideoStart):
                return event
        # events() ended without video.start
        error = self._result.errors[-1] if self._result.errors else None
        if error is not None:
            raise SessionEndedError(f"server refused the session: {error}", error, self._result.close_code)
        code = self._result.close_code
        raise SessionEndedError(f"server closed the connection before video.start (close code {code})", None, code)

    async def interact(
        self,
        *,
        event_id: str | None = None,
        prompt: str | None = None,
        transition_chunks: int | None = None,
        camera: dict | None = None,
        actions: Sequence[Sequence[str]] | None = None,
    ) -> str:
        """Send a `session.interaction`; returns its event_id (generated here when not given)."""
        message = interaction_message(
            event_id=event_id, prompt=prompt, transition_chunks=transition_chunks, camera=camera, actions=actions
        )
        await self.send_interaction_message(message)
        return message["interaction"]["event_id"]

    async def send_interaction_message(self, message: dict) -> None:
        body = message.get("interaction") if isinstance(message.get("interaction"), dict) else {}
        event_id = body.get("event_id") if isinstance(body.get("event_id"), str) else ""
        self._result.sent_interactions.append(SentInteraction(event_id, message, self.elapsed()))
        await self.send_json(message)

    async def stop(self) -> None:
        await self.send_json({"type": "session.stop"})

    async def ping(self) -> None:
        await self.send_json({"type": "session.ping"})

    async def playback(self, position_seconds: float) -> None:
        await self.send_json({"type": "session.playback", "position_seconds": position_seconds})

    # -- receiving ----------------------------------------------------------------------
    async def events(self, timeout: float | None = None) -> AsyncIterator[Event]:
        """Server messages as typed events, until `session.done` (yielded last) or the connection closes.

        A binary frame is yielded as the VideoChunk of the metadata before it.
        `timeout` bounds the wait for each message (TimeoutError when it passes).
        Raises ClientProtocolError on a wire-contract violation. Breaking out and
        calling it again later loses nothing.
        """
        while True:
            event = await self.next_event(timeout)
            if event is None:
                return
            yield event

    async def next_event(self, timeout: float | None = None) -> Event | None:
        """The next server message as a typed event; None once the session is over
        (after `session.done`, or the connection closed)."""
        from websockets.exceptions import ConnectionClosed

        if self._ws is None:
            raise ClientError("not connected")
        while not self._finished:
            try:
                if timeout is None:
                    raw = await self._ws.recv()
                else:
                    raw = await asyncio.wait_for(self._ws.recv(), timeout)
            except ConnectionClosed:
                self._finish()
                pending, self._pending = self._pending, None
                if pending is not None:
                    raise ClientProtocolError(
                        f"connection closed after video.chunk_metadata (transport_chunk_index {pending.transport_chunk_index}) "
                        "but before its binary frame"
                    ) from None
                return None
            now = self.elapsed()
            if isinstance(raw, (bytes, bytearray, memoryview)):
                return self._on_binary(bytes(raw), now)
            try:
                data = json.loads(raw)
            except ValueError:
                raise ClientProtocolError(f"server sent a text message that is not JSON: {short(raw)}") from None
            if not isinstance(data, dict):
                raise ClientProtocolError(f"server sent a JSON {type(data).__name__}, not an object: {short(raw)}")
            kind = data.get("type")
            if self._pending is not None:
                raise ClientProtocolError(
                    f"video.chunk_metadata (transport_chunk_index {self._pending.transport_chunk_index}) was followed by "
                    f"a {short(str(kind), 60)!r} message instead of its binary frame"
                )
            message = read(data)
            if isinstance(message, wire.ChunkMetadata):
                metadata = chunk_metadata(message, data)
                expected = len(self._result.chunks)
                if metadata.transport_chunk_index != expected:
                    raise ClientProtocolError(
                        f"video.chunk_metadata transport_chunk_index {metadata.transport_chunk_index}, expected {expected} "
                        "(the count of binary frames sent before it)"
                    )
                self._pending = metadata
                continue
            event = self._typed(message, data, now)
            self._result.last_message = event
            if isinstance(event, SessionDone):
                self._finish()
            return event
        return None

    def _on_binary(self, data: bytes, now: float) -> VideoChunk:
        pending, self._pending = self._pending, None
        if pending is None:
            raise ClientProtocolError(f"binary frame of {len(data)} bytes arrived without a video.chunk_metadata right before it")
        if len(data) != pending.byte_length:
            raise ClientProtocolError(
                f"binary frame of transport chunk {pending.transport_chunk_index} has {len(data)} bytes, "
                f"but its video.chunk_metadata says byte_length {pending.byte_length}"
            )
        previous = self._last_binary_at if self._last_binary_at is not None else 0.0
        self._last_binary_at = now
        chunk = VideoChunk(pending, data, now, now - previous, time.time())
        self._result.chunks.append(chunk)
        self._result.last_message = chunk
        return chunk

    def _typed(self, message: wire.ServerMessage | None, data: dict, now: float) -> Event:
        r = self._result
        if isinstance(message, wire.VideoStart):
            start = video_start(message, now, data)
            r.start = start
            return start
        if isinstance(message, wire.InteractionQueued):
            event = InteractionQueued(message.request_id, message.event_id, now)
            r.queued.append(event)
            return event
        if isinstance(message, wire.ErrorMessage):
            error = server_error(message, now, data)
            r.errors.append(error)
            return error
        if isinstance(message, wire.VideoSessionDone):
            done = SessionDone(message.request_id, message.chunks, message.stopped, now)
            r.done = done
            return done
        if isinstance(message, wire.VideoPong):
            pong = Pong(now)
            r.pongs.append(pong)
            return pong
        kind = data.get("type")
        unknown = UnknownMessage(kind if isinstance(kind, str) else None, data, now)
        r.unknown.append(unknown)
        return unknown

    def _finish(self) -> None:
        self._finished = True
        self._result.ended_at = self.elapsed()
        if self._ws is not None:
            self._note_close(self._ws)

    async def wait_closed(self, timeout: float = 5.0) -> None:
        """After session.done: wait for the server's close frame, noting its code."""
        if self._ws is None:
            return
        try:
            await asyncio.wait_for(self._ws.wait_closed(), timeout)
        except (TimeoutError, asyncio.TimeoutError):
            pass
        self._note_close(self._ws)


async def stream_session(
    url: str,
    prompt: str | None = None,
    *,
    message: dict | None = None,
    on_event: Callable[[VideoStreamClient, Event], Awaitable[None] | None] | None = None,
    open_timeout: float = 10.0,
    event_timeout: float | None = None,
    **fields: Any,
) -> SessionResult:
    """Run one whole session and return its SessionResult.

    `on_event(client, event)` (sync or async) sees every event, `video.start`
    included, and may send interactions / stop through `client`. A refused
    session (error before `video.start`) raises SessionEndedError; a session
    that fails later is returned with `result.ok` False.
    """
    async with VideoStreamClient(url, open_timeout=open_timeout) as client:
        start = await client.start(prompt, message=message, **fields)
        if on_event is not None:
            out = on_event(client, start)
            if asyncio.iscoroutine(out):
                await out
        async for event in client.events(timeout=event_timeout):
            if on_event is not None:
                out = on_event(client, event)
                if asyncio.iscoroutine(out):
                    await out
        if client.result().done is not None:
            await client.wait_closed(2.0)
    return client.result()
