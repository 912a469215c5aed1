"""One `/v1/realtime/video` connection, from `session.start` to `session.done`.

The pump sends the replica's chunks (metadata, then its binary frame); the
reader turns control messages into mailbox posts; the watchdog keeps the stall
clock and renews the replica's lease on the session.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from fastapi import WebSocket
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle

from deployments.config import AppConfig
from deployments.contract.session_spec import SessionSpec
from deployments.generation.interactions import InteractionRefused, check_interaction
from deployments.ingress.image_fetch import FetchPolicy, fetch_image, is_remote_url
from deployments.ingress.readiness import ModelNotReady
from deployments.ingress.websocket_session import SessionFault, WebSocketSession
from deployments.protocol import errors, video
from deployments.protocol.errors import ProtocolError
from deployments.world_model.messages import (
    Interact,
    InteractionFailed,
    MediaChunk,
    Playback,
    SessionAccepted,
    SessionEnded,
    Stop,
    Trailer,
)
from deployments.world_model.requests import generation_defaults


class VideoSession(WebSocketSession):
    endpoint = "video"

    def __init__(
        self,
        websocket: WebSocket,
        config: AppConfig,
        world: DeploymentHandle,
        model_info: Callable[[], Awaitable[dict]],
        metrics=None,
        subprotocol: str | None = None,
    ) -> None:
        super().__init__(websocket, metrics, subprotocol=subprotocol, max_messages_per_second=config.max_messages_per_second)
        self._model_info = model_info  # waits (boundedly) for a loaded replica: the handshake never does
        self.model_info: dict = {}
        self.config = config
        self.world = world
        self._last_progress = time.monotonic()
        self._chunks_sent = 0
        self._event_ids: set[str] = set()
        self._accepted: SessionAccepted | None = None

    async def serve(self) -> None:
        try:
            raw = await asyncio.wait_for(self.receive_raw(), self.config.start_timeout_s)
        except asyncio.TimeoutError:
            await self.fail(errors.start_timeout())
            return
        try:
            start = video.parse_session_start(raw)
            video.check_model(start, [self.config.model_name])
            self.model_info = await self._model_info()
            remote_image = await self._fetch_start_image(start)
            spec = video.resolve_generation(start, self._defaults(), remote_image)
        except ProtocolError as exc:
            await self.fail(exc)
            return
        except ModelNotReady as exc:
            await self.fail(errors.model_not_ready(exc.waited_s, self.config.retry_after_s))
            return

        first = await self.open_stream(self.world, "run_session", spec, SessionAccepted, self.config.retry_after_s)
        if not isinstance(first, SessionAccepted):
            await self.fail(self.refusal_error(first, self.config.retry_after_s, "Invalid session.start: "))
            return
        self._accepted = first
        self.request_id = video.new_request_id()
        await self.send_json(
            video.video_start(
                self.request_id,
                spec.config,
                replica_id=first.replica_id,
                session_id=first.session_id,
                seed=first.seed,
                generation=self._generation_info(spec),
            )
        )
        self._last_progress = time.monotonic()
        await self.supervise(self._pump(), self._read_controls(), self._watch())

    async def _fetch_start_image(self, start: "video.SessionStartRequest") -> bytes | None:
        reference = start.image_reference
        if reference is None or not is_remote_url(reference.image_url):
            return None
        return await fetch_image(reference.image_url, FetchPolicy.from_config(self.config))

    def _defaults(self) -> video.GenerationDefaults:
        return generation_defaults(self.config, self.model_info)

    def _generation_info(self, spec: SessionSpec) -> dict:
        """What the session runs with, defaults included (additive to the contract): clients need the geometry."""
        info = self.model_info
        return {
            "width": spec.width,
            "height": spec.height,
            "fps": spec.fps,
            "num_frames": spec.num_frames,
            "num_blocks": spec.num_blocks,
            "frames_per_block": info["frames_per_block"],
            "scale_factor_temporal": info["temporal_factor"],
            "pipeline_depth": info["pipeline_depth"],
            "accepts_camera": info["accepts_camera"],
        }

    async def _send_chunk(self, metadata: dict, data: bytes) -> None:
        await self.send_pair(metadata, data)
        self._chunks_sent += 1

    async def _pump(self) -> int:
        """The replica's stream -> the client. Returns the close code."""
        async for item in self.stream:
            self._last_progress = time.monotonic()
            if isinstance(item, MediaChunk):
                received_at = time.time()
                await self._send_chunk(
                    video.chunk_metadata(
                        self.request_id,
                        kind="media",
                        num_frames=item.block_frames,
                        byte_length=len(item.data),
                        transport_chunk_index=self._chunks_sent,
                        generation_chunk_index=item.block_index,
                        started=list(item.started_event_ids),
                        active=list(item.active_event_ids),
                        completed=list(item.completed_event_ids),
                        fragment_frames=item.num_frames,
                        frames_ready_at=item.frames_ready_at,
                        replica_sent_at=item.sent_at,
                        ingress_received_at=received_at,
                    ),
                    item.data,
                )
            elif isinstance(item, Trailer):
                await self._send_chunk(
                    video.chunk_metadata(
                        self.request_id,
                        kind="trailer",
                        num_frames=0,
                        byte_length=len(item.data),
                        transport_chunk_index=self._chunks_sent,
                        generation_chunk_index=None,
                        started=[],
                        active=[],
                        completed=[],
                        fragment_frames=item.num_frames,
                    ),
                    item.data,
                )
            elif isinstance(item, InteractionFailed):
                self._event_ids.discard(item.event_id)  # a refused id may be used again
                failure = errors.interaction_failed(item.event_id)
                await self.send_error(failure.message, failure.code, event_id=item.event_id, reason=item.reason)
            elif isinstance(item, SessionEnded):
                if item.reason == "client_too_slow":
                    raise SessionFault(errors.client_too_slow(self.config.max_media_ahead_s))
                await self.send_json(video.session_done(self.request_id, self._chunks_sent, item.stopped))
                return 1000
        # The stream ended without SessionEnded: the replica dropped the session (lease expired).
        await self.send_error("The session ended on the server", errors.SESSION_ABORTED)
        return 1011

    async def _read_controls(self) -> int:
        mailbox = self._accepted.mailbox
        sid = self._accepted.session_id
        while True:
            raw = await self.receive_limited()
            try:
                message = video.parse_control_message(raw)
            except ProtocolError as exc:
                await self.fail(exc)
                if exc.close_code:
                    return exc.close_code
                continue
            if isinstance(message, video.PingMessage):
                self._last_progress = time.monotonic()
                await self.send_json(video.pong())
            elif isinstance(message, video.StopMessage):
                await mailbox.post.remote(sid, Stop())
            elif isinstance(message, video.PlaybackMessage):
                await mailbox.post.remote(sid, Playback(message.position_seconds))
            elif isinstance(message, video.InteractionMessage):
                event_id = message.event_id
                if event_id in self._event_ids:
                    await self.fail(errors.event_id_conflict(event_id))
                    continue
                try:
                    # Refused here, the client gets the error instead of `queued` (the seed's order).
                    check_interaction(message.interaction, self.model_info["accepts_camera"])
                except InteractionRefused as exc:
                    if self.metrics is not None:
                        self.metrics.interaction(self.endpoint, "failed")
                    failure = errors.interaction_failed(event_id)
                    await self.send_error(failure.message, failure.code, event_id=event_id, reason=str(exc))
                    continue
                self._event_ids.add(event_id)
                if await mailbox.post.remote(sid, Interact(message.interaction)):
                    if self.metrics is not None:
                        self.metrics.interaction(self.endpoint, "queued")
                    await self.send_json(video.interaction_queued(self.request_id, event_id))

    async def _watch(self) -> int:
        """Renew the replica's lease on this session and enforce the stall clock."""
        mailbox = self._accepted.mailbox
        sid = self._accepted.session_id
        interval = min(self.config.lease_timeout_s / 3, 1.0)
        while True:
            await asyncio.sleep(interval)
            await mailbox.renew.remote(sid)
            if time.monotonic() - self._last_progress > self.config.stall_timeout_s:
                try:
                    await mailbox.post.remote(sid, Stop())
                except RayActorError:
                    pass
                raise SessionFault(errors.stall_timeout())
