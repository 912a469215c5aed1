"""Sessions abandoned at random points leave nothing behind.

200 generation sessions (and some chat sessions) are opened and dropped at random moments: before
`session.start`, before `video.start`, mid-block, right after an interaction, during the trailer;
half of them close politely, half drop the TCP connection without a close frame. Afterwards the
replicas' slots, the engine's session tensors (KV cache, text K/V, VAE state), the mailboxes and the
ingress's sockets, per-key counts and asyncio tasks are back where they started.
"""

import asyncio
import json
import random
import time

import pytest
import websockets
from chatclient import jpeg
from conftest import chat_app_args, deployed
from wsclient import Transcript, receive

pytestmark = pytest.mark.timeout(900)

APP, PREFIX = "leaks", "/leaks"
VIDEO = PREFIX + "/v1/realtime/video"
CHAT = PREFIX + "/v1/video/chat/stream"
SESSIONS = 200
CHAT_SESSIONS = 24
CONCURRENCY = 6
POINTS = ("before_start", "before_accept", "mid_block", "mid_interaction", "during_trailer")


@pytest.fixture(scope="module")
def address(serve_address, world_model_dir, omni_dir):
    config = chat_app_args(
        world_model_dir,
        omni_dir,
        max_sessions_per_replica=8,
        api_keys=["leak-key"],
        max_sessions_per_key=64,
        lease_timeout_s=3.0,
    )
    with deployed(APP, PREFIX, config):
        yield serve_address


async def holdings() -> dict:
    from ray import serve

    world = await serve.get_deployment_handle("WorldModel", app_name=APP).stats.remote()
    chat = await serve.get_deployment_handle("Understanding", app_name=APP).stats.remote()
    ingress = await serve.get_deployment_handle("VideoIngress", app_name=APP).stats.remote()
    (rank,) = world["ranks"]
    return {
        "world_slots": len(world["sessions"]),
        "world_mailbox": len(world["mailbox_sessions"]),
        "engine_sessions": rank["engine_sessions"],
        "engine_bytes": rank["session_bytes"],
        "chat_slots": len(chat["sessions"]),
        "chat_mailbox": len(chat["mailbox_sessions"]),
        "open_sockets": ingress["open_sockets"],
        "keyed_sessions": ingress["keyed_sessions"],
        "tasks": ingress["tasks"],
    }


async def drop(ws, rng: random.Random) -> None:
    if rng.random() < 0.5:
        await ws.close()
    else:
        ws.transport.abort()  # no close frame: the server learns only from the socket


async def abandon_video(address: str, point: str, rng: random.Random) -> None:
    ws = await websockets.connect(f"ws://{address}{VIDEO}", additional_headers={"Authorization": "Bearer leak-key"}, max_size=None, open_timeout=60)
    transcript = Transcript()
    try:
        if point == "before_start":
            await asyncio.sleep(rng.random() * 0.2)
            return
        blocks = rng.randint(2, 5)
        await ws.send(json.dumps({"type": "session.start", "prompt": "a windy field", "num_frames": 9 + 12 * (blocks - 1), "seed": rng.randint(0, 9)}))
        if point == "before_accept":
            return
        if (await receive(ws, transcript))["type"] != "video.start":
            return  # refused (e.g. over capacity): abandoned all the same
        if point == "mid_block":
            for _ in range(rng.randint(0, blocks - 1)):
                await receive(ws, transcript)
            await asyncio.sleep(rng.random() * 0.1)
        elif point == "mid_interaction":
            await ws.send(json.dumps({"type": "session.interaction", "interaction": {"event_id": "e1", "event": {"prompt": "snow falls"}}}))
        elif point == "during_trailer":
            while True:
                message = await receive(ws, transcript)
                if message is None or (message["type"] == "video.chunk_metadata" and message.get("kind") == "trailer"):
                    return
    finally:
        await drop(ws, rng)


async def abandon_chat(address: str, rng: random.Random) -> None:
    ws = await websockets.connect(f"ws://{address}{CHAT}", additional_headers={"Authorization": "Bearer leak-key"}, max_size=None, open_timeout=60)
    try:
        await ws.send(json.dumps({"type": "session.config"}))
        for i in range(rng.randint(0, 3)):
            await ws.send(json.dumps({"type": "video.frame", "data": jpeg(i), "frame_id": f"f{i}"}))
        if rng.random() < 0.5:
            await ws.send(json.dumps({"type": "video.query", "text": "what is this?"}))
            await asyncio.sleep(rng.random() * 0.3)
    finally:
        await drop(ws, rng)


async def settle(baseline: dict, timeout: float = 60.0) -> dict:
    """Holdings once everything that should be freed is; the last reading if the time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        now = await holdings()
        if _back(now, baseline) or time.monotonic() > deadline:
            return now
        await asyncio.sleep(0.5)


def _back(now: dict, baseline: dict) -> bool:
    exact = all(now[k] == baseline[k] for k in now if k != "tasks")
    return exact and now["tasks"] <= baseline["tasks"] + TASK_SLACK


TASK_SLACK = 5  # Serve's own periodic tasks come and go; a leak of these sessions would be hundreds


def test_abandoned_sessions_leave_nothing_behind(address, report):
    rng = random.Random(7)

    async def go():
        # one finished session first, so lazily created state (model info, handles) is in the baseline
        ws = await websockets.connect(f"ws://{address}{VIDEO}", additional_headers={"Authorization": "Bearer leak-key"}, max_size=None)
        await ws.send(json.dumps({"type": "session.start", "prompt": "warm up", "num_frames": 9}))
        transcript = Transcript()
        while await receive(ws, transcript) is not None:
            pass
        # the warm-up's slot and mailbox are freed just after its socket closes: wait for a quiet replica
        quiet = {key: 0 for key in await holdings()} | {"tasks": 10**6}
        baseline = await settle(quiet, timeout=30)

        plan = [("video", POINTS[i % len(POINTS)]) for i in range(SESSIONS)] + [("chat", None)] * CHAT_SESSIONS
        rng.shuffle(plan)
        gate = asyncio.Semaphore(CONCURRENCY)
        outcomes: dict[str, int] = {}

        async def one(kind: str, point: str | None, seed: int) -> None:
            async with gate:
                own = random.Random(seed)
                try:
                    if kind == "video":
                        await abandon_video(address, point, own)
                    else:
                        await abandon_chat(address, own)
                    outcomes["ok"] = outcomes.get("ok", 0) + 1
                except (websockets.WebSocketException, OSError) as exc:
                    outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1

        await asyncio.gather(*(one(kind, point, rng.randrange(2**31)) for kind, point in plan))
        after = await settle(baseline)
        return baseline, after, outcomes

    baseline, after, outcomes = asyncio.run(go())
    report(f"leaks: abandoned {SESSIONS} video + {CHAT_SESSIONS} chat sessions: {outcomes}; baseline {baseline}; after {after}")
    assert outcomes.get("ok", 0) == SESSIONS + CHAT_SESSIONS, outcomes
    assert baseline["world_slots"] == baseline["engine_sessions"] == baseline["open_sockets"] == 0
    assert {k: after[k] for k in after if k != "tasks"} == {k: baseline[k] for k in baseline if k != "tasks"}
    assert after["tasks"] <= baseline["tasks"] + TASK_SLACK
