"""One job's session on the WorldModel replicas: wait for a slot, stream its fMP4 to a file, keep its lease.

A job is an ordinary session (same router, same slots as a WebSocket viewer),
but where a viewer gets `over_capacity` a job waits its turn: jobs open in
the order they came, retrying with backoff until a replica has a free slot.
Cancelling `run` cancels the stream, which frees the slot on the replica.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ray.exceptions import RayActorError

from deployments.jobs.records import JobSpec
from deployments.protocol.errors import OVER_CAPACITY, REPLICA_LOST
from deployments.sessions.opening import keep_lease, open_session
from deployments.world_model.messages import (
    InteractionFailed,
    MediaChunk,
    Playback,
    SessionAccepted,
    SessionEnded,
    Trailer,
)

logger = logging.getLogger("ray.serve")

FIRST_WAIT_S = 0.1
LONGEST_WAIT_S = 1.0  # a refusal costs one small call: poll often, a slot may free any moment


class JobFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class RunResult:
    blocks: int
    frames: int


class SessionRunner:
    def __init__(self, world, lease_timeout_s: float) -> None:
        self.world = world
        self.lease_timeout_s = lease_timeout_s
        self._turn = asyncio.Lock()  # FIFO: the job that came first gets the next free slot

    async def run(
        self,
        spec: JobSpec,
        out: Path,
        started: Callable[[int], None],
        block_done: Callable[[int], None],
    ) -> RunResult:
        """Write the session's fMP4 to `out`; `started(seed)` once a replica took it, `block_done(n)` per block."""
        stream, accepted = await self._open(spec)
        sid = accepted.session_id
        lease = asyncio.create_task(keep_lease(accepted.mailbox, sid, self.lease_timeout_s))
        try:
            started(accepted.seed)
            stored_frames = 0
            with open(out, "wb") as sink:
                async for item in stream:
                    if isinstance(item, MediaChunk):
                        sink.write(item.data)
                        stored_frames += item.num_frames
                        # Stored counts as consumed: the replica's flow control (flow.py) then never holds a
                        # job back to real time the way it holds a live viewer.
                        await accepted.mailbox.post.remote(sid, Playback(stored_frames / spec.request.fps))
                        block_done(item.block_index + 1)
                    elif isinstance(item, Trailer):
                        sink.write(item.data)
                    elif isinstance(item, InteractionFailed):
                        raise JobFailed("interaction_failed", f"The actions could not be applied: {item.reason}")
                    elif isinstance(item, SessionEnded):
                        if item.reason != "complete":
                            raise JobFailed("session_ended", f"The session ended early on the server ({item.reason})")
                        return RunResult(item.blocks, item.frames)
            raise JobFailed("session_aborted", "The session ended on the server before the video was finished")
        except RayActorError as exc:
            logger.warning("job session %s: replica lost: %s", sid, exc)
            raise JobFailed(REPLICA_LOST, "The generation replica was lost while rendering") from None
        finally:
            lease.cancel()
            stream.cancel()

    async def _open(self, spec: JobSpec):
        async with self._turn:
            wait = FIRST_WAIT_S
            request = spec.session_spec()
            while True:
                opened = await open_session(self.world, "run_session", request, SessionAccepted)
                if opened.stream is not None:
                    return opened.stream, opened.first
                refusal = opened.first
                if refusal is not None and refusal.code != OVER_CAPACITY:
                    raise JobFailed(refusal.code, refusal.message)
                await asyncio.sleep(wait)
                wait = min(2 * wait, LONGEST_WAIT_S)
