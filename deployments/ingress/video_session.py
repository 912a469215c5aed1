"""One `/v1/realtime/video` connection, from `session.start` to `session.done`.

Three tasks run side by side: the pump (the replica's stream -> the client),
the reader (the client's control messages -> the replica's mailbox) and the
watchdog (stall clock and lease renewals). Whichever ends first decides how the
session ends; the others are cancelled, and the stream is always cancelled so
the replica frees the slot.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from fastapi import WebSocket
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle
from starlette.websockets import WebSocketDisconnect, WebSocketState

from deployments.config import AppConfig
from deployments.protocol import errors, video
from deployments.protocol.errors import ProtocolError
from deployments.world_model.messages import (
    Interact,
    InteractionFailed,
    MediaChunk,
    Playback,
    SessionAccepted,
    SessionEnded,
    SessionRefused,
    SessionRequest,
    Stop,
    Trailer,
)

logger = logging.getLogger("ray.serve")

OPEN_ATTEMPTS = 3


class _Disconnected(Exception):
    pass


class VideoSession:
    def __init__(self, websocket: WebSocket, config: AppConfig, world: DeploymentHandle, model_info: dict) -> None:
        self.ws = websocket
        self.model_info = model_info
        self.config = config
        self.world = world
        self.request_id = video.new_request_id()
        self._send_lock = asyncio.Lock()
        self._last_progress = time.monotonic()
        self._chunks_sent = 0
        self._event_ids: set[str] = set()
        self._accepted: SessionAccepted | None = None
        self._stream = None

    # -- sending ---------------------------------------------------------------
    async def _send_json(self, message: dict) -> None:
        async with self._send_lock:
            await self.ws.send_json(message)

    async def _send_media(self, metadata: dict, data: bytes) -> None:
        # Metadata and its binary frame go out back to back: nothing may come between them.
        async with self._send_lock:
            await self.ws.send_json(metadata)
            await self.ws.send_bytes(data)
        self._chunks_sent += 1

    async def _error(self, message: str, code: str | None = None, **extra: Any) -> None:
        await self._send_json(errors.error_message(message, code=code, request_id=self.request_id if self._accepted else None, **extra))

    async def _fail(self, error: ProtocolError) -> None:
        """Send a protocol error; close when it ends the session."""
        await self._send_json(error.to_message(self.request_id if self._accepted else None))
        if error.close_code:
            await self._close(error.close_code)

    async def _close(self, code: int = 1000) -> None:
        if self.ws.client_state == WebSocketState.CONNECTED:
            try:
                await self.ws.close(code)
            except RuntimeError:
                pass

    async def _receive_raw(self) -> str | bytes:
        message = await self.ws.receive()
        if message["type"] == "websocket.disconnect":
            raise _Disconnected
        text = message.get("text")
        return text if text is not None else message.get("bytes") or b""

    # -- the session -------------------------------------------------------------
    async def run(self) -> None:
        await self.ws.accept()
        try:
            await self._run()
        except (_Disconnected, WebSocketDisconnect):
            pass
        finally:
            if self._stream is not None:
                self._stream.cancel()

    async def _run(self) -> None:
        try:
            raw = await asyncio.wait_for(self._receive_raw(), self.config.start_timeout_s)
        except asyncio.TimeoutError:
            await self._fail(errors.start_timeout())
            return
        try:
            start = video.parse_session_start(raw)
            video.check_model(start, [self.config.model_name])
            resolved = video.resolve_generation(start, self._defaults())
        except ProtocolError as exc:
            await self._fail(exc)
            return

        request = SessionRequest(
            session_id=uuid.uuid4().hex,
            prompt=resolved.prompt,
            height=resolved.height,
            width=resolved.width,
            fps=resolved.fps,
            seed=resolved.seed,
            num_blocks=resolved.num_blocks,
            num_inference_steps=resolved.num_inference_steps,
            flow_shift=resolved.flow_shift,
            image=resolved.image,
        )
        first = await self._open(request)
        if isinstance(first, SessionRefused):
            if first.code == errors.OVER_CAPACITY:
                await self._fail(errors.over_capacity(first.retry_after_s or self.config.retry_after_s))
            else:
                await self._fail(ProtocolError(f"Invalid session.start: {first.message}", first.code, close_code=errors.CLOSE_POLICY))
            return
        self._accepted = first
        await self._send_json(
            video.video_start(
                self.request_id,
                resolved.echo_config,
                replica_id=first.replica_id,
                session_id=first.session_id,
                seed=first.seed,
                generation=self._generation_info(resolved),
            )
        )
        self._last_progress = time.monotonic()
        await self._supervise()

    def _defaults(self) -> video.GenerationDefaults:
        info = self.model_info
        return video.GenerationDefaults(
            width=self.config.width,
            height=self.config.height,
            fps=self.config.fps,
            num_inference_steps=self.config.num_inference_steps,
            max_session_seconds=self.config.max_session_seconds,
            frames_per_block=info["frames_per_block"],
            temporal_factor=info["temporal_factor"],
            size_multiple=info["size_multiple"],
            image_conditioned=info["image_conditioned"],
        )

    def _generation_info(self, resolved: "video.ResolvedStart") -> dict:
        """What the session runs with, defaults included (additive to the contract): clients need the geometry."""
        info = self.model_info
        return {
            "width": resolved.width,
            "height": resolved.height,
            "fps": resolved.fps,
            "num_frames": resolved.num_frames,
            "num_blocks": resolved.num_blocks,
            "frames_per_block": info["frames_per_block"],
            "scale_factor_temporal": info["temporal_factor"],
            "pipeline_depth": info["pipeline_depth"],
            "accepts_camera": info["accepts_camera"],
        }

    async def _open(self, request: SessionRequest) -> SessionAccepted | SessionRefused:
        """Start the session's stream; a full replica refuses at once, so try another."""
        refusal = SessionRefused("over_capacity", "no free session slot", self.config.retry_after_s)
        for attempt in range(OPEN_ATTEMPTS):
            stream = self.world.options(stream=True, method_name="run_session").remote(request)
            try:
                first = await stream.__anext__()
            except StopAsyncIteration:
                continue
            if isinstance(first, SessionAccepted):
                self._stream = stream
                return first
            refusal = first
            if first.code != "over_capacity":
                break
            await asyncio.sleep(0.05 * (attempt + 1))
        return refusal

    async def _supervise(self) -> None:
        pump = asyncio.create_task(self._pump(), name="pump")
        reader = asyncio.create_task(self._read_controls(), name="reader")
        watchdog = asyncio.create_task(self._watch(), name="watchdog")
        tasks = {pump, reader, watchdog}
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finished = done.pop()
            outcome = finished.exception()
            if outcome is None:
                close_code = finished.result()
            elif isinstance(outcome, (_Disconnected, WebSocketDisconnect)):
                close_code = None
            elif isinstance(outcome, RayActorError):
                logger.warning("session %s: replica lost: %s", self.request_id, outcome)
                close_code = await self._safe_fail(errors.replica_lost())
            else:
                logger.error("session %s failed", self.request_id, exc_info=outcome)
                close_code = await self._safe_fail(errors.internal_error())
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._stream is not None:
            self._stream.cancel()
        if close_code is not None:
            await self._close(close_code)

    async def _safe_fail(self, error: ProtocolError) -> int | None:
        """Tell the client, if it is still there; the caller closes with the returned code."""
        try:
            await self._send_json(error.to_message(self.request_id))
        except Exception:  # the client may be gone too
            pass
        return error.close_code

    async def _pump(self) -> int:
        """The replica's stream -> the client. Returns the close code."""
        async for item in self._stream:
            self._last_progress = time.monotonic()
            if isinstance(item, MediaChunk):
                await self._send_media(
                    video.chunk_metadata(
                        self.request_id,
                        kind="media",
                        num_frames=item.num_frames,
                        byte_length=len(item.data),
                        transport_chunk_index=self._chunks_sent,
                        generation_chunk_index=item.block_index,
                        started=list(item.started_event_ids),
                        active=list(item.active_event_ids),
                        completed=list(item.completed_event_ids),
                        block_num_frames=item.block_frames,
                    ),
                    item.data,
                )
            elif isinstance(item, Trailer):
                await self._send_media(
                    video.chunk_metadata(
                        self.request_id,
                        kind="trailer",
                        num_frames=item.num_frames,
                        byte_length=len(item.data),
                        transport_chunk_index=self._chunks_sent,
                        generation_chunk_index=None,
                        started=[],
                        active=[],
                        completed=[],
                    ),
                    item.data,
                )
            elif isinstance(item, InteractionFailed):
                self._event_ids.discard(item.event_id)  # a refused id may be used again
                failure = errors.interaction_failed(item.event_id)
                await self._error(failure.message, failure.code, event_id=item.event_id, reason=item.reason)
            elif isinstance(item, SessionEnded):
                await self._send_json(video.session_done(self.request_id, self._chunks_sent, item.stopped))
                return 1000
        # The stream ended without SessionEnded: the replica dropped the session (lease expired).
        await self._error("The session ended on the server", "session_aborted")
        return 1011

    async def _read_controls(self) -> int:
        mailbox = self._accepted.mailbox
        sid = self._accepted.session_id
        while True:
            raw = await self._receive_raw()
            try:
                message = video.parse_control_message(raw)
            except ProtocolError as exc:
                await self._fail(exc)
                if exc.close_code:
                    return exc.close_code
                continue
            if isinstance(message, video.PingMessage):
                self._last_progress = time.monotonic()
                await self._send_json(video.pong())
            elif isinstance(message, video.StopMessage):
                await mailbox.post.remote(sid, Stop())
            elif isinstance(message, video.PlaybackMessage):
                await mailbox.post.remote(sid, Playback(message.position_seconds))
            elif isinstance(message, video.InteractionMessage):
                event_id = message.event_id
                if event_id in self._event_ids:
                    await self._fail(errors.event_id_conflict(event_id))
                    continue
                self._event_ids.add(event_id)
                if await mailbox.post.remote(sid, Interact(message.interaction)):
                    await self._send_json(video.interaction_queued(self.request_id, event_id))

    async def _watch(self) -> int:
        """Renew the replica's lease on this session and enforce the stall clock."""
        mailbox = self._accepted.mailbox
        sid = self._accepted.session_id
        interval = min(self.config.lease_timeout_s / 3, 1.0)
        while True:
            await asyncio.sleep(interval)
            await mailbox.renew.remote(sid)
            if time.monotonic() - self._last_progress > self.config.stall_timeout_s:
                stall = errors.stall_timeout()
                await self._error(stall.message, stall.code)
                try:
                    await mailbox.post.remote(sid, Stop())
                except RayActorError:
                    pass
                return stall.close_code
