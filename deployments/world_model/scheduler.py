"""The replica's block loop: which sessions' blocks run, which decodes go beside them, and what is sent.

Two lanes feed the engine. Whatever block requests are waiting when the engine
comes free go to it as one call, and it denoises those whose shapes match as
one batch (continuous batching: nobody waits for a batch to fill, a lone
session runs alone at once); the decode lane does the same for the frames of
the blocks just made, beside the next blocks' denoising. Each session's step
(`Scheduler.run`) reads its mailbox (read ahead: sessions/inbox.py) at the
block boundary, starts its next block before sending the last one, and ends
with the reason the boundary gives. The session's own coroutine (the replica's `run_session`) only takes a
slot, opens the session and passes on what this yields.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from deployments.contract.session_spec import SessionSpec
from deployments.generation.interactions import InteractionRefused
from deployments.sessions.inbox import Inbox
from deployments.world_model.flow import ClientWindow, FlowSettings
from deployments.world_model.messages import Interact, InteractionFailed, MediaChunk, Playback, SessionEnded, Stop, Trailer
from deployments.world_model.pacing import MediaClock

logger = logging.getLogger("ray.serve")

# Block k+1 starts before chunk k is sent, so an interaction sent on
# receiving chunk k first shapes block k+2: the client sees a one-block pipeline.
PIPELINE_DEPTH = 1
FLOW_POLL_S = 0.25  # how often a session held back by flow control looks for the client's reports


class Lane:
    """Per-session requests, served together: each call carries every request waiting when the last one ended."""

    def __init__(self, call: Callable[[list[str]], Awaitable[dict]], max_batch: int) -> None:
        self.call = call  # session ids -> {id: result or exception}
        self.max_batch = max_batch
        self._pending: dict[str, asyncio.Future] = {}
        self._wakeup = asyncio.Event()
        self._runner: asyncio.Task | None = None
        self.calls = 0  # for stats: how many calls, and how many session requests they carried
        self.requests = 0

    def request(self, session_id: str) -> asyncio.Future:
        """Queue this session's request now (one per session at a time); the future gets its result or exception."""
        if session_id in self._pending:
            raise RuntimeError(f"session {session_id} already has a request pending")
        future = asyncio.get_running_loop().create_future()
        self._pending[session_id] = future
        self._wakeup.set()
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run())
        return future

    async def submit(self, session_id: str):
        """This session's result (or its exception)."""
        # Shielded: the call carries this session either way, and its outcome must still be collected.
        return await asyncio.shield(self.request(session_id))

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                ids = list(self._pending)[: self.max_batch]
                futures = {sid: self._pending.pop(sid) for sid in ids}
                try:
                    outcomes = await self.call(ids)
                except Exception as exc:  # the whole call failed: every session in it hears why
                    outcomes = {sid: exc for sid in ids}
                self.calls += 1
                self.requests += len(ids)
                for sid, future in futures.items():
                    outcome = outcomes.get(sid, RuntimeError(f"no result came back for session {sid}"))
                    if future.done():
                        continue
                    if isinstance(outcome, BaseException):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)

    def stats(self) -> dict:
        return {"calls": self.calls, "requests": self.requests, "pending": len(self._pending)}


@dataclass
class Boundary:
    """What a session's block boundary decided: the next block running, or why the session ends."""

    block: asyncio.Future | None
    failures: list[InteractionFailed]
    reason: str = "complete"
    playback: float | None = None  # the client's latest reported playback position


@dataclass
class SessionRun:
    """One session's loop state on the replica."""

    sid: str
    spec: SessionSpec
    inbox: Inbox  # its mailbox, read ahead
    window: ClientWindow
    clock: MediaClock | None
    deadline: float  # time.monotonic() past which the session ends with max_length
    began: float  # time.monotonic() when the replica took it
    encoder: object = None  # AsyncFragmentEncoder, made when the loop starts
    blocks: int = 0  # made
    frames: int = 0  # generated (the seed's count)
    sent_frames: int = 0  # muxed and sent
    generating: asyncio.Future | None = None
    decoding: asyncio.Future | None = None
    preparing: asyncio.Future | None = None  # the last block's chunk, decoding or encoding

    @property
    def sent_seconds(self) -> float:
        return self.sent_frames / self.spec.fps


@dataclass(frozen=True)
class SchedulerSettings:
    max_batch_sessions: int
    overlap_decode: bool  # decode beside the next blocks (a GPU's own stream) or inside the block
    max_session_seconds: float
    flow: FlowSettings
    mailbox_poll_s: float = 1.0  # how soon an expired lease is noticed (interactions arrive at once)


class Scheduler:
    def __init__(self, host, mailbox, metrics, settings: SchedulerSettings) -> None:
        self.host, self.mailbox, self.metrics, self.settings = host, mailbox, metrics, settings
        self.blocks = Lane(lambda ids: host.generate_many(ids, decode=not settings.overlap_decode), settings.max_batch_sessions)
        self.decodes = Lane(host.decode_many, settings.max_batch_sessions)

    def new_run(self, spec: SessionSpec) -> SessionRun:
        now = time.monotonic()
        return SessionRun(spec.session_id, spec, Inbox(self.mailbox, spec.session_id, self.settings.mailbox_poll_s),
                          ClientWindow(self.settings.flow),
                          MediaClock(spec.pacing) if spec.pacing is not None else None,
                          deadline=now + self.settings.max_session_seconds, began=now)

    async def run(self, run: SessionRun) -> AsyncIterator[object]:
        """The session's messages from its first block to its end: the step, one block a turn."""
        from deployments.media.fmp4 import AsyncFragmentEncoder

        run.encoder = AsyncFragmentEncoder(run.spec.width, run.spec.height, run.spec.fps, options=dict(run.spec.codec_options))
        run.inbox.start()
        boundary = await self.boundary(run)
        while boundary.block is not None:
            for failure in boundary.failures:
                yield failure
            # Shielded: a cancelled stream must not orphan the engine thread that holds the session.
            block, block_done_at = await asyncio.shield(boundary.block)
            run.blocks += 1
            run.frames += block.metadata.num_frames
            # The chunk is made (decoded where decodes overlap, encoded) from the moment the block is done,
            # beside the next block on a GPU. Block 0's is made before block 1 starts, so the first frame
            # shares the device with nothing; so is every block's where decodes stay inside the block (a
            # CPU), as the next block would take the cores its encode needs.
            run.preparing = asyncio.ensure_future(self.prepare(run, block, block_done_at))
            if run.blocks == 1 or not self.settings.overlap_decode:
                await asyncio.shield(run.preparing)
            boundary = await self.boundary(run)
            yield await self.send(run, block, boundary.playback, await asyncio.shield(run.preparing))
        for failure in boundary.failures:
            yield failure
        async for message in self.end(run, boundary.reason):
            yield message

    async def boundary(self, run: SessionRun) -> Boundary:
        """Apply the mailbox at this boundary, then start the next block (or say why not).

        Flow control counts media already sent: a block just made is sent right after, whatever the client
        does. While the client is too far behind (flow.py), wait here for its playback reports instead.
        """
        failures: list[InteractionFailed] = []
        if run.spec.num_blocks is not None and run.blocks >= run.spec.num_blocks:
            return Boundary(None, failures, "complete")
        playback = None
        wait_s = 0.0
        while True:
            delivery = await run.inbox.wait_take(wait_s) if wait_s else run.inbox.take()
            stop = False
            for message in delivery.messages:
                if isinstance(message, Stop):
                    stop = True
                elif isinstance(message, Playback):
                    playback = message.position_seconds
                    run.window.observe_playback(playback)
                elif isinstance(message, Interact):
                    failures.extend(await self.apply(run.sid, (message.interaction,)))
            if stop:
                return Boundary(None, failures, "stopped", playback)
            if delivery.lease_expired:
                logger.warning("session %s: lease expired, dropping it", run.sid)
                return Boundary(None, failures, "lease_expired")
            if time.monotonic() > run.deadline:
                return Boundary(None, failures, "max_length")
            if run.window.may_generate(run.sent_seconds):
                # Kept on the run at once: teardown stops and waits for a block still running.
                run.generating = asyncio.ensure_future(self._timed_block(self.blocks.request(run.sid)))
                return Boundary(run.generating, failures, playback=playback)
            if run.window.too_slow():
                logger.warning("session %s: the client stopped taking chunks, dropping it", run.sid)
                return Boundary(None, failures, "client_too_slow", playback)
            wait_s = FLOW_POLL_S

    async def apply(self, sid: str, interactions) -> list[InteractionFailed]:
        """Submit interactions to the session's engine; the refused ones, as failures to send."""
        failures = []
        for interaction in interactions:
            try:
                await self.host.submit(sid, interaction)
                self.metrics.interaction("applied")
            except InteractionRefused as exc:
                self.metrics.interaction("failed")
                failures.append(InteractionFailed(interaction.event_id, str(exc)))
        return failures

    async def _timed_block(self, requested: asyncio.Future) -> tuple[object, float]:
        """The block, and when it came back from the engine (time.time())."""
        began = time.perf_counter()
        block = await asyncio.shield(requested)
        done_at = time.time()
        self.metrics.block(time.perf_counter() - began, block.metadata.num_frames)
        return block, done_at

    async def prepare(self, run: SessionRun, block, block_done_at: float) -> tuple[object, float]:
        """The block's fMP4 piece and when its frames were ready (time.time(): the start of the serving
        overhead a client measures). Frames come from the decode lane when decodes overlap the next blocks,
        else with the block itself."""
        if self.settings.overlap_decode:
            # Shielded like the block, so a cancelled stream never closes a session mid-decode.
            run.decoding = asyncio.ensure_future(self.decodes.submit(run.sid))
            frames = await asyncio.shield(run.decoding)
            frames_ready_at = time.time()
        else:
            frames, frames_ready_at = block.frames, block_done_at
        return await run.encoder.encode(frames), frames_ready_at

    async def send(self, run: SessionRun, block, playback: float | None, prepared: tuple[object, float]) -> MediaChunk:
        """The block's prepared piece, paced, as a chunk."""
        piece, frames_ready_at = prepared
        if run.clock is not None:
            if playback is not None:
                run.clock.observe_playback(playback)
            await asyncio.sleep(run.clock.delay(run.sent_seconds))
        run.sent_frames += piece.num_frames
        meta = block.metadata
        if meta.block_index == 0:
            self.metrics.first_chunk(time.monotonic() - run.began)
        run.window.chunk_sent()
        return MediaChunk(piece.data, piece.num_frames, meta.block_index, meta.num_frames, meta.started_event_ids,
                          meta.active_event_ids, meta.completed_event_ids, frames_ready_at, time.time())

    async def end(self, run: SessionRun, reason: str) -> AsyncIterator[object]:
        """The session's last messages: the trailer and `SessionEnded`, as far as `reason` allows."""
        logger.info("session %s ended: %s after %d blocks", run.sid, reason, run.blocks)
        if reason == "lease_expired":
            return  # nobody is listening
        if reason != "client_too_slow":  # it would not take the trailer either
            tail = await run.encoder.close()
            yield Trailer(tail.data, tail.num_frames)
        yield SessionEnded(stopped=reason == "stopped", reason=reason, blocks=run.blocks, frames=run.frames)

    async def release(self, run: SessionRun) -> None:
        """Stop what still runs for the session and wait for it (the engine still holds its tensors)."""
        if run.generating is not None and not run.generating.done():
            self.host.cancel(run.sid)  # the engine stops the block at its next step
            await asyncio.wait([run.generating])
            run.generating.exception()  # retrieved: SessionCancelled is the expected outcome
        for task in (run.decoding, run.preparing):
            if task is not None and not task.done():
                await asyncio.wait([task])
                task.exception()
        await run.inbox.close()
        if run.encoder is not None:
            run.encoder.shutdown()

    def stats(self) -> dict:
        return {"blocks": self.blocks.stats(), "decodes": self.decodes.stats()}
