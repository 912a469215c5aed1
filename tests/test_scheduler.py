"""The replica's block loop (deployments/world_model/scheduler.py) on a real engine, outside Ray.

The engine host is the replica's own (`EngineHost` over the local executor, the
tiny model); a thin recorder around it notes when each engine call starts and
ends, which is what the scheduler's decisions are about: which blocks run
together, which decode goes beside which block, and when a chunk leaves.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from deployments.contract.events import Interaction
from deployments.contract.session_spec import SessionSpec
from deployments.sessions.mailbox import Mailbox
from deployments.world_model.engine_host import EngineHost, EngineLoad, LocalExecutor
from deployments.world_model.flow import FlowSettings
from deployments.world_model.messages import Interact, InteractionFailed, MediaChunk, SessionEnded, Stop, Trailer
from deployments.world_model.scheduler import Scheduler, SchedulerSettings
from local_actor import LocalActor


pytestmark = pytest.mark.timeout(300)


class Recorder:
    """The host's engine calls as (what, session ids, start, end), on the perf_counter clock."""

    def __init__(self, host: EngineHost) -> None:
        self.host = host
        self.calls: list[tuple[str, tuple[str, ...], float, float]] = []

    def __getattr__(self, name):
        return getattr(self.host, name)

    async def _timed(self, what: str, ids: list[str], call):
        began = time.perf_counter()
        try:
            return await call
        finally:
            self.calls.append((what, tuple(ids), began, time.perf_counter()))

    async def generate_many(self, ids, decode=True):
        return await self._timed("generate", ids, self.host.generate_many(ids, decode=decode))

    async def decode_many(self, ids):
        return await self._timed("decode", ids, self.host.decode_many(ids))

    def of(self, what: str, sid: str) -> list[tuple[float, float]]:
        return [(start, end) for kind, ids, start, end in self.calls if kind == what and sid in ids]


class Metrics:
    def __getattr__(self, name):
        return lambda *args: None


class RemoteMailbox(LocalActor):
    """The plain mailbox behind the `.remote(...)` calls the scheduler makes of the replica's actor."""

    def __init__(self) -> None:
        super().__init__(Mailbox())
        self.box = self.target


@pytest.fixture(scope="module")
def host(world_model_dir):
    host = EngineHost(LocalExecutor(EngineLoad(world_model_dir, "cpu", "float32", "float32")))
    host.start()
    return host


def make(host, overlap: bool, max_batch: int = 4) -> tuple[Scheduler, Recorder, RemoteMailbox]:
    recorder, mailbox = Recorder(host), RemoteMailbox()
    settings = SchedulerSettings(max_batch, overlap, max_session_seconds=600, flow=FlowSettings())
    return Scheduler(recorder, mailbox, Metrics(), settings), recorder, mailbox


async def session(scheduler: Scheduler, mailbox: RemoteMailbox, spec: SessionSpec, on_message=None) -> list:
    """One session through the scheduler as the replica runs it: open, run, release, close."""
    mailbox.box.open(spec.session_id, 60)
    await scheduler.host.open(spec, spec.session_id)
    run = scheduler.new_run(spec)
    out = []
    try:
        async for message in scheduler.run(run):
            out.append((message, time.perf_counter()))
            if on_message is not None:
                on_message(message)
    finally:
        await scheduler.release(run)
        await scheduler.host.close(spec.session_id)
    return out


def spec(blocks: int | None, seed: int = 0, prompt: str = "a red room") -> SessionSpec:
    return SessionSpec(prompt=prompt, height=32, width=32, seed=seed, num_blocks=blocks)


def test_the_next_block_starts_before_a_chunk_leaves_and_block_zero_decodes_alone(host) -> None:
    scheduler, recorder, mailbox = make(host, overlap=True)
    requested = []
    request_block = scheduler.blocks.request

    def spy(sid):
        requested.append(time.perf_counter())
        return request_block(sid)

    scheduler.blocks.request = spy
    request = spec(4)
    out = asyncio.run(session(scheduler, mailbox, request))
    chunks = [(m, at) for m, at in out if isinstance(m, MediaChunk)]
    assert [m.block_index for m, _ in chunks] == [0, 1, 2, 3]
    assert isinstance(out[-2][0], Trailer) and out[-1][0] == SessionEnded(False, "complete", 4, out[-1][0].frames)
    generated, decoded = recorder.of("generate", request.session_id), recorder.of("decode", request.session_id)
    assert len(requested) == len(generated) == len(decoded) == 4
    # The pipeline the client is told of (depth 1): block k+1 is asked of the engine before chunk k leaves.
    for k, (_, sent_at) in enumerate(chunks[:-1]):
        assert requested[k + 1] < sent_at
    # The first frame shares the engine with nothing: block 0 is decoded before block 1 starts...
    assert decoded[0][1] <= generated[1][0]
    # ...and later blocks decode beside the next block's denoising.
    for k in (1, 2):
        assert decoded[k][0] < generated[k + 1][1]


def test_waiting_sessions_share_engine_calls_and_decodes_stay_in_the_block_without_overlap(host) -> None:
    scheduler, recorder, mailbox = make(host, overlap=False)
    requests = [spec(3, seed) for seed in range(3)]

    async def together():
        return await asyncio.gather(*(session(scheduler, mailbox, r) for r in requests))

    outs = asyncio.run(together())
    for out in outs:
        assert [m.block_index for m, _ in out if isinstance(m, MediaChunk)] == [0, 1, 2]
    assert not recorder.of("decode", requests[0].session_id)
    stats = scheduler.stats()["blocks"]
    assert stats["requests"] == 9 and stats["calls"] < 9  # continuous batching: fewer calls than blocks
    assert any(len(ids) > 1 for kind, ids, _, _ in recorder.calls if kind == "generate")


def test_the_mailbox_steers_and_stops_a_session_at_block_boundaries(host) -> None:
    scheduler, recorder, mailbox = make(host, overlap=False)
    request = spec(None)
    posted = []

    def steer(message) -> None:
        if isinstance(message, MediaChunk) and message.block_index == 0:
            posted.append(mailbox.box.post(request.session_id, Interact(Interaction(event_id="snow", prompt="a snowy field"))))
            # The engine refuses what the ingress would (here a negative transition), with the reason.
            posted.append(mailbox.box.post(request.session_id, Interact(Interaction(event_id="bad", transition_chunks=-1, prompt="x"))))
        if isinstance(message, MediaChunk) and message.block_index == 2:
            posted.append(mailbox.box.post(request.session_id, Stop()))

    out = [m for m, _ in asyncio.run(session(scheduler, mailbox, request, steer))]
    assert all(posted)
    failures = [m for m in out if isinstance(m, InteractionFailed)]
    assert [f.event_id for f in failures] == ["bad"] and "transition" in failures[0].reason
    chunks = [m for m in out if isinstance(m, MediaChunk)]
    # Posted on receiving chunk 0, the prompt starts at block 2: block 1 was already running (depth 1).
    assert [c.block_index for c in chunks if "snow" in c.started_event_ids] == [2]
    # The stop posted on chunk 2 is read at the next boundary: block 3 was already running and is sent.
    assert [c.block_index for c in chunks] == [0, 1, 2, 3]
    assert isinstance(out[-1], SessionEnded) and out[-1].stopped and out[-1].reason == "stopped" and out[-1].blocks == 4
    assert isinstance(out[-2], Trailer)
