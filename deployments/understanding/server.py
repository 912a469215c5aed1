"""The Understanding replica: a vision-language model and the chat sessions pinned to it.

A chat session is one streaming call (`run_chat`), like a world-model session:
its first item carries the replica's mailbox, the retained frames and the
questions arrive there, and the answers stream back as items. The session's
frames live here (`SessionFrames`); a live session's video is prefilled into
its own KV cache between questions, one pair of frames per engine turn.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator

from deployments.config import AppConfig
from deployments.observability.metrics import ReplicaMetrics
from deployments.sessions.slots import SessionSlots
from deployments.understanding.messages import (
    ChatAccepted,
    ChatEnded,
    ChatRefused,
    ChatRequest,
    EndChat,
    FrameIn,
    Query,
    QueryFinished,
    QueryStarted,
    TextDelta,
)
from deployments.understanding.session_frames import SessionFrames

logger = logging.getLogger("ray.serve")

# While an answer streams, collect what arrives this often (a newer query replaces it where the session asked).
CHECK_INTERVAL_S = 0.05


class UnderstandingServer:
    def __init__(self, config: AppConfig) -> None:
        import torch
        from ray import serve

        from deployments.models.ensure import ensure_tiny_models
        from deployments.sessions.mailbox import MailboxActor
        from deployments.understanding.engine import UnderstandingEngine

        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        self.config = config
        path = config.understanding_path
        if config.build_tiny_models:
            ensure_tiny_models(path)
        device = "cuda" if torch.cuda.is_available() and config.accelerator != "cpu" else "cpu"
        self.engine = UnderstandingEngine.from_pretrained(path, device=device, dtype=config.torch_dtype)
        self.metrics = ReplicaMetrics("chat")
        self.slots = SessionSlots(config.max_chat_sessions_per_replica, on_change=self.metrics.slots)
        self.mailbox = MailboxActor.remote()
        # The engine answers one question at a time. Sessions wait for their turn here, in the event loop:
        # waiting inside worker threads would fill the default thread pool, and the session holding the
        # engine would then find no thread to stream its own answer (every chat stuck behind one).
        self._engine_turn = asyncio.Lock()
        self._sessions: dict[str, SessionFrames] = {}
        try:
            self.replica_id = serve.get_replica_context().replica_id.unique_id
        except Exception:  # outside Serve
            self.replica_id = "local"
        logger.info("understanding model %s ready: %d chat slots", path, self.slots.capacity)

    def record_routing_stats(self) -> dict:
        return self.slots.routing_stats()

    def record_autoscaling_stats(self) -> dict:
        return self.slots.autoscaling_stats()

    def model_info(self) -> dict:
        return {"takes_audio": self.engine.takes_audio, "model_name": self.config.understanding_name}

    async def stats(self) -> dict:
        return {
            "replica_id": self.replica_id,
            "pid": os.getpid(),
            "sessions": self.slots.held,
            "mailbox_sessions": await self.mailbox.sessions.remote(),
            "context_bytes": sum(f.nbytes() for f in self._sessions.values()),
            "contexts": {sid: f.describe() for sid, f in self._sessions.items()},
        }

    async def run_chat(self, request: ChatRequest) -> AsyncIterator[object]:
        sid = request.session_id
        if not self.slots.try_take(sid):
            self.metrics.session_start("over_capacity")
            yield ChatRefused("over_capacity", "no free chat slot on this replica", self.config.retry_after_s)
            return
        frames = SessionFrames(
            self.engine,
            request.system_prompt,
            request.max_frames,
            live=request.live_context and self.config.chat_live_context,
            rebuild_after_frames=self.config.chat_context_rebuild_frames,
        )
        self._sessions[sid] = frames
        try:
            await self.mailbox.open.remote(sid, self.config.lease_timeout_s)
            self.metrics.session_start("accepted")
            yield ChatAccepted(sid, self.replica_id, self.engine.takes_audio, self.mailbox)
            inbox: list[object] = []
            while True:
                if not inbox:
                    # With prefill to do, only look at the mailbox between steps.
                    delivery = await self.mailbox.wait_take.remote(sid, 0.0 if frames.has_work() else 1.0)
                    if delivery.lease_expired:
                        logger.warning("chat %s: lease expired, dropping it", sid)
                        return
                    inbox.extend(delivery.messages)
                    if not inbox:
                        if frames.has_work():
                            async with self._engine_turn:
                                await asyncio.to_thread(frames.step)
                        continue
                # In order: a question sees exactly the frames that came before it.
                message = inbox.pop(0)
                if isinstance(message, FrameIn):
                    frames.add(message)
                elif isinstance(message, Query):
                    if request.replace_running_answer and any(isinstance(m, Query) for m in inbox):
                        # Only the newest question is worth answering; one it replaced ends at once.
                        yield QueryStarted(message.query_id)
                        yield QueryFinished(message.query_id, "", interrupted=True)
                        continue
                    async for item in self._answer(sid, frames, message, inbox, request.replace_running_answer):
                        yield item
                elif isinstance(message, EndChat):
                    yield ChatEnded()
                    return
        finally:
            self._sessions.pop(sid, None)
            frames.close()
            self.slots.release(sid)
            try:
                self.mailbox.close.remote(sid)
            except Exception:  # the replica is going down; the mailbox goes with it
                pass

    async def _answer(self, sid: str, frames: SessionFrames, query: Query, inbox: list, replaceable: bool) -> AsyncIterator[object]:
        """Stream one answer; what arrives meanwhile waits in `inbox` (a newer query stops it if `replaceable`)."""
        audio_seconds = 0.0 if query.audio is None or not self.engine.takes_audio else len(query.audio) / self.engine.sampling_rate
        stop = threading.Event()
        try:
            answer = frames.answer(query, self.config.chat_max_new_tokens, self.config.chat_min_new_tokens, stop)
        except ValueError as exc:  # the question names frames this replica never got: say so, go on
            logger.warning("chat %s: query %s refused: %s", sid, query.query_id, exc)
            yield QueryStarted(query.query_id)
            yield QueryFinished(query.query_id, "", error=f"ValueError: {exc}")
            return
        yield QueryStarted(query.query_id, answer.frames, round(audio_seconds, 3))
        async with self._engine_turn:
            async for item in self._stream(sid, query, answer.deltas, stop, inbox, replaceable):
                yield item

    async def _stream(self, sid: str, query: Query, deltas, stop: threading.Event, inbox: list, replaceable: bool) -> AsyncIterator[object]:
        text, error, interrupted = "", None, False
        began = time.monotonic()
        next_check = began + CHECK_INTERVAL_S
        try:
            while True:
                delta = await asyncio.to_thread(next, deltas, None)
                if delta is None:
                    break
                if not text:
                    self.metrics.first_chunk(time.monotonic() - began)  # time to first token
                text += delta
                yield TextDelta(query.query_id, delta)
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + CHECK_INTERVAL_S
                    delivery = await self.mailbox.take.remote(sid)
                    inbox.extend(delivery.messages)
                    if replaceable and any(isinstance(m, Query) for m in inbox):
                        interrupted = True
                        break
        except Exception as exc:  # the model failed on this query; the session goes on
            logger.exception("chat %s: query %s failed", sid, query.query_id)
            error = f"{type(exc).__name__}: {exc}"
        finally:
            stop.set()
            await asyncio.to_thread(deltas.close)  # joins the generate thread
        yield QueryFinished(query.query_id, text, interrupted=interrupted, error=error)
