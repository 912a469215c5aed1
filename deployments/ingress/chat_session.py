"""One `/v1/video/chat/stream` connection, from `session.config` to `session.done`.

The reader decodes frames (off the event loop), filters near-duplicates (EVS),
keeps the retained ones in a ring (their numbers; the images go on to the
session's Understanding replica as they arrive, which keeps the same ring) and
buffers audio; a question takes the numbers of a sample of the ring and the
audio to the replica. The pump
turns the replica's answer stream into `response.*` messages; the watchdog
keeps the idle clock and renews the replica's lease. Frames keep arriving while
an answer streams; questions are answered in order, each in full (as in the
seed), unless the session opted into `replace_running_answer`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import WebSocket
from ray.serve.handle import DeploymentHandle

from deployments.config import AppConfig
from deployments.ingress.limits import TokenBucket
from deployments.ingress.readiness import ModelNotReady
from deployments.ingress.websocket_session import SessionFault, WebSocketSession
from deployments.media.frames import (
    AudioBuffer,
    FrameBuffer,
    FrameError,
    FrameFilter,
    decode_image,
    frame_rate,
    frame_thumbnail,
)
from deployments.protocol import chat, errors
from deployments.protocol.errors import ProtocolError
from deployments.understanding.messages import (
    ChatAccepted,
    ChatEnded,
    ChatRequest,
    EndChat,
    FrameIn,
    Query,
    QueryFinished,
    QueryStarted,
    TextDelta,
)


@dataclass(frozen=True)
class _Frame:
    seq: int  # retained frames are numbered in order; the replica keeps the same ring by these numbers
    frame_id: str | int | None
    pts_ms: float | None


class ChatSession(WebSocketSession):
    endpoint = "chat"

    def __init__(
        self,
        websocket: WebSocket,
        config: AppConfig,
        understanding: DeploymentHandle,
        model_info: Callable[[], Awaitable[dict]],
        metrics=None,
        subprotocol: str | None = None,
    ) -> None:
        super().__init__(websocket, metrics, subprotocol=subprotocol, max_messages_per_second=config.max_messages_per_second)
        self.config = config
        self.understanding = understanding
        self._model_info = model_info  # waits (boundedly) for a loaded replica: the handshake never does
        self.model_info: dict = {}
        self._last_message = time.monotonic()
        self._accepted: ChatAccepted | None = None
        self._settings: chat.ChatConfig | None = None
        self._filter: FrameFilter | None = None
        self._frames: FrameBuffer[_Frame] | None = None
        self._audio = AudioBuffer()
        self._audio_warned = False  # audio_buffer_full is said once between queries
        self._frame_rate = TokenBucket(config.max_frames_per_second_in)
        self._retained = 0  # the next retained frame's number

    async def serve(self) -> None:
        try:
            raw = await asyncio.wait_for(self.receive_raw(), self.config.chat_config_timeout_s)
        except asyncio.TimeoutError:
            await self.fail(chat.config_timeout())
            return
        try:
            settings = chat.parse_session_config(raw)
            chat.check_model(settings, [self.config.understanding_name])
            self.model_info = await self._model_info()
        except ProtocolError as exc:
            await self.fail(exc)
            return
        except ModelNotReady as exc:
            await self.fail(errors.model_not_ready(exc.waited_s, self.config.retry_after_s))
            return
        request = ChatRequest(
            session_id=uuid.uuid4().hex,
            system_prompt=settings.system_prompt,
            max_frames=settings.max_frames,
            # Questions that see every retained frame can have them prefilled as they arrive.
            live_context=settings.num_sample_frames >= settings.max_frames,
            replace_running_answer=settings.replace_running_answer,
        )
        first = await self.open_stream(self.understanding, "run_chat", request, ChatAccepted, self.config.retry_after_s)
        if not isinstance(first, ChatAccepted):
            await self.fail(self.refusal_error(first, self.config.retry_after_s, ""))
            return
        self._accepted = first
        self._settings = settings
        self._filter = FrameFilter(settings.evs_threshold, settings.evs_enabled)
        self._frames = FrameBuffer(settings.max_frames)
        self._last_message = time.monotonic()
        await self.supervise(self._pump(), self._read(), self._watch())

    # -- client -> replica -----------------------------------------------------------
    async def _read(self) -> int | None:
        mailbox, sid = self._accepted.mailbox, self._accepted.session_id
        while True:
            raw = await self.receive_limited()
            self._last_message = time.monotonic()
            try:
                message = chat.parse_chat_message(raw)
            except ProtocolError as exc:
                await self.fail(exc)
                if exc.close_code:
                    return exc.close_code
                continue
            if isinstance(message, chat.FrameMessage):
                await self._take_frame(message)
            elif isinstance(message, chat.AudioMessage):
                await self._take_audio(message.pcm)
            elif isinstance(message, chat.QueryMessage):
                if message.audio:
                    await self._take_audio(message.audio)
                self._audio_warned = False
                if not len(self._frames):
                    await self.fail(chat.no_frames())
                    continue
                await mailbox.post.remote(sid, self._query(message.text))
            elif isinstance(message, chat.DoneMessage):
                await mailbox.post.remote(sid, EndChat())
            elif isinstance(message, chat.PingMessage):
                await self.send_json(chat.pong())

    async def _take_audio(self, pcm: bytes) -> None:
        if self._audio.append(pcm) and not self._audio_warned:
            self._audio_warned = True
            await self.fail(chat.audio_buffer_full(self._audio.max_samples / self._audio.sample_rate))

    async def _take_frame(self, message: chat.FrameMessage) -> None:
        if not self._frame_rate.take():
            # Dropped like a filtered frame, never an `error`: upstream clients quit on the first one, and an
            # unpaced client sending a recorded clip is not misbehaving.
            if message.frame_id not in (None, ""):
                await self.send_json(chat.frame_ack(message.frame_id, False, len(self._frames), chat.ACK_RATE_LIMITED, pts_ms=message.pts_ms))
            return
        try:
            retained, evicted = await asyncio.to_thread(self._filter_and_keep, message)
        except FrameError as exc:
            await self.fail(chat.invalid_image(str(exc), message.frame_id))
            if message.frame_id not in (None, ""):
                await self.send_json(chat.frame_ack(message.frame_id, False, len(self._frames), chat.ACK_INVALID_IMAGE, pts_ms=message.pts_ms))
            return
        kept = retained is not None
        if kept:
            # Awaited before the next message is read: the replica gets frames and questions in order.
            await self._accepted.mailbox.post.remote(self._accepted.session_id, retained)
        if message.frame_id not in (None, ""):
            await self.send_json(
                chat.frame_ack(
                    message.frame_id,
                    kept,
                    len(self._frames),
                    None if kept else chat.ACK_FILTERED,
                    pts_ms=message.pts_ms,
                    dropped_frame_id=evicted.frame_id if evicted is not None else None,
                )
            )

    def _filter_and_keep(self, message: chat.FrameMessage) -> tuple[FrameIn | None, _Frame | None]:
        """The frame for the replica when kept (None when filtered), and the one it evicted from the ring.

        Thumbnail first: a dropped near-duplicate never pays for the full decode.
        """
        thumbnail = frame_thumbnail(message.data)
        kept = self._filter.check(thumbnail)
        if self.metrics is not None:
            self.metrics.evs(kept)
        if not kept:
            return None, None
        image = decode_image(message.data, self.config.chat_frame_max_side)
        seq, self._retained = self._retained, self._retained + 1
        evicted = self._frames.append(_Frame(seq, message.frame_id, message.pts_ms))
        return FrameIn(seq, image, message.pts_ms), evicted

    def _query(self, text: str) -> Query:
        sampled = self._frames.sample(self._settings.num_sample_frames)
        audio = self._audio.take()  # the buffer clears at every query
        return Query(
            query_id=chat.new_response_id(),
            text=text,
            frame_seqs=tuple(f.seq for f in sampled),
            fps=frame_rate([f.pts_ms for f in sampled]),
            audio=audio if self.model_info["takes_audio"] and audio.size else None,
        )

    # -- replica -> client -----------------------------------------------------------
    async def _pump(self) -> int:
        async for item in self.stream:
            if isinstance(item, QueryStarted):
                # The answer is text whatever `modalities` asked for: say so, as upstream's newest server does.
                await self.send_json(chat.response_start(item.query_id, frames=item.frames, audio_seconds=item.audio_seconds,
                                                         modalities=["text"]))
            elif isinstance(item, TextDelta):
                await self.send_json(chat.text_delta(item.delta))
            elif isinstance(item, QueryFinished):
                if item.error is not None:
                    await self.fail(chat.query_failed())
                # Additive: a client that opted into replacement learns which answer was cut short.
                await self.send_json(chat.text_done(item.text, **({"interrupted": True} if item.interrupted else {})))
            elif isinstance(item, ChatEnded):
                if self._settings.evs_enabled:
                    f = self._filter
                    await self.send_json(chat.evs_stats(f.retained, f.dropped, f.total))
                await self.send_json(chat.session_done())
                return 1000
        await self.send_error("The session ended on the server", errors.SESSION_ABORTED)
        return 1011

    async def _watch(self) -> int | None:
        mailbox, sid = self._accepted.mailbox, self._accepted.session_id
        interval = min(self.config.lease_timeout_s / 3, 1.0)
        while True:
            await asyncio.sleep(interval)
            await mailbox.renew.remote(sid)
            if time.monotonic() - self._last_message > self.config.chat_idle_timeout_s:
                raise SessionFault(chat.idle_timeout())

