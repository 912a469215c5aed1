"""Access and limits on a real `serve.run`: API keys three ways, origins, sessions per key, message and frame
rates, the audio bound, remote start images, and flow control against clients that fall behind."""

import asyncio
import base64
import json
import time
import urllib.error
import urllib.request

import pytest
import websockets
from chatclient import jpeg, open_chat
from conftest import chat_app_args, deployed
from wsclient import Transcript, receive, run_to_end, until

pytestmark = pytest.mark.timeout(240)

APP, PREFIX = "security", "/sec"
VIDEO = PREFIX + "/v1/realtime/video"
CHAT = PREFIX + "/v1/video/chat/stream"
KEY = "k-alpha"
BEARER = {"Authorization": f"Bearer {KEY}"}
AHEAD_S = 1.0


@pytest.fixture(scope="module")
def address(serve_address, world_model_dir, omni_dir):
    config = chat_app_args(
        world_model_dir,
        omni_dir,
        api_keys=[KEY],
        max_sessions_per_key=2,
        num_ingress_replicas=2,  # the count per key is one for both (the KeySessions ledger)
        allowed_origins=["https://ok.example"],
        max_messages_per_second=20,
        max_frames_per_second_in=4,
        max_media_ahead_s=AHEAD_S,
        client_stalled_timeout_s=2.0,
    )
    with deployed(APP, PREFIX, config):
        yield serve_address


def run(coro):
    return asyncio.run(coro)


async def connect(address, path=VIDEO, **kwargs):
    return await websockets.connect(f"ws://{address}{path}", max_size=None, open_timeout=30, **kwargs)


async def refused(address, **kwargs) -> tuple[dict, int]:
    """The error a refused handshake gets, and its close code."""
    ws = await connect(address, **kwargs)
    transcript = Transcript()
    message = await receive(ws, transcript, timeout=30)
    await run_to_end(ws, transcript, timeout=30)
    return message, transcript.close_code


async def short_session(ws, **fields) -> Transcript:
    transcript = Transcript()
    await ws.send(json.dumps({"type": "session.start", "prompt": "a quiet harbour", "num_frames": 9, **fields}))
    return await run_to_end(ws, transcript)


def media_seconds(transcript: Transcript, fps: int = 16) -> float:
    return sum(meta["num_frames"] for meta, _ in transcript.media) / fps


async def world_sessions_held() -> int:
    from ray import serve

    handle = serve.get_deployment_handle("WorldModel", app_name=APP)
    return len((await handle.stats.remote())["sessions"])


async def wait_for_free_slots(timeout=15.0) -> int:
    deadline = time.monotonic() + timeout
    while (held := await world_sessions_held()) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return held


# -- keys ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({}, "Missing API key"),
        ({"additional_headers": {"Authorization": "Bearer wrong"}}, "Invalid API key"),
        ({"subprotocols": ["realtime", "openai-insecure-api-key.wrong"]}, "Invalid API key"),
    ],
)
def test_without_a_valid_key_the_handshake_closes_with_1008(address, kwargs, text):
    message, code = run(refused(address, **kwargs))
    assert code == 1008
    assert message["type"] == "error" and message["code"] == "unauthorized" and text in message["message"]


def test_a_key_opens_a_session_from_header_subprotocol_or_query(address):
    async def go():
        out = []
        for kwargs, path in (
            ({"additional_headers": BEARER}, VIDEO),
            ({"subprotocols": ["realtime", f"openai-insecure-api-key.{KEY}"]}, VIDEO),
            ({}, f"{VIDEO}?api_key={KEY}"),
        ):
            ws = await connect(address, path, **kwargs)
            out.append((ws.subprotocol, await short_session(ws)))
        return out

    results = run(go())
    for _, transcript in results:
        assert transcript.done is not None and not transcript.errors and transcript.close_code == 1000
    assert results[1][0] == "realtime"  # the key itself is not echoed back


def test_sessions_per_key_are_limited_and_freed(address):
    async def go():
        await asyncio.sleep(1.0)  # sessions of earlier tests release their count as the server sees them end
        long = {"type": "session.start", "prompt": "a long road", "seconds": "60"}
        first, second = await connect(address, additional_headers=BEARER), await connect(address, additional_headers=BEARER)
        for ws in (first, second):
            await ws.send(json.dumps(long))
            assert (await receive(ws, Transcript()))["type"] == "video.start"
        try:
            over = await refused(address, additional_headers=BEARER)
            await first.close()
            deadline = time.monotonic() + 15
            while True:  # the count is freed when the server sees the first session end; until then, refusals
                ws = await connect(address, additional_headers=BEARER)
                try:
                    transcript = await short_session(ws)
                except websockets.exceptions.ConnectionClosed:
                    transcript = Transcript()
                if transcript.done is not None or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
        finally:  # a 60-second session left open would hold a slot through the next tests
            await first.close()
            await second.close()
        return over, transcript

    (message, code), after = run(go())
    assert code == 1008 and message["code"] == "too_many_sessions" and "limit is 2" in message["message"]
    assert after.done is not None


async def ingress_keyed_sessions() -> dict[int, int]:
    """Keyed sessions each ingress replica holds, by pid (handle calls land on either replica: ask until both answer)."""
    from ray import serve

    handle = serve.get_deployment_handle("VideoIngress", app_name=APP)
    seen: dict[int, int] = {}
    for _ in range(40):
        stats = await handle.stats.remote()
        seen[stats["pid"]] = stats["keyed_sessions"]
        if len(seen) == 2:
            break
    return seen


def test_the_limit_per_key_holds_across_ingress_replicas(address):
    """Two sessions of one key, one on each ingress replica, fill its limit of 2 for both replicas."""

    async def go():
        await asyncio.sleep(1.0)
        long = {"type": "session.start", "prompt": "a long road", "seconds": "60"}
        held = []
        try:
            for _ in range(8):  # the proxy sends a new socket to the less busy replica; retry until one is on each
                ws = await connect(address, additional_headers=BEARER)
                await ws.send(json.dumps(long))
                assert (await receive(ws, Transcript()))["type"] == "video.start"
                held.append(ws)
                if len(held) == 2:
                    spread = await ingress_keyed_sessions()
                    if sorted(spread.values()) == [1, 1]:
                        break
                    await held.pop().close()
                    await asyncio.sleep(0.5)
            spread = await ingress_keyed_sessions()
            refusals = [await refused(address, additional_headers=BEARER) for _ in range(4)]  # whichever replica each meets
        finally:
            for ws in held:
                await ws.close()
        return spread, refusals

    spread, refusals = run(go())
    assert sorted(spread.values()) == [1, 1], spread  # one session on each replica
    for message, code in refusals:
        assert code == 1008 and message["code"] == "too_many_sessions" and "limit is 2" in message["message"]


def test_browser_origins_must_be_allowed(address):
    message, code = run(refused(address, additional_headers=BEARER, origin="https://evil.example"))
    assert code == 1008 and message["code"] == "origin_not_allowed" and "evil.example" in message["message"]

    async def allowed():
        return await short_session(await connect(address, additional_headers=BEARER, origin="https://ok.example"))

    assert run(allowed()).done is not None


def test_http_routes_need_the_key_too(address):
    url = f"http://{address}{PREFIX}/v1/models"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url, timeout=30)
    assert info.value.code == 401
    with urllib.request.urlopen(urllib.request.Request(url, headers=BEARER), timeout=30) as response:
        assert json.loads(response.read())["object"] == "list"


def test_the_api_schema_and_docs_need_the_key_and_the_public_routes_say_nothing_private(address):
    base = f"http://{address}{PREFIX}"
    for path in ("/openapi.json", "/docs", "/redoc"):
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(base + path, timeout=30)
        assert info.value.code == (404 if path == "/redoc" else 401), path
    with urllib.request.urlopen(urllib.request.Request(base + "/openapi.json", headers=BEARER), timeout=30) as response:
        schema = json.loads(response.read())
    assert "/v1/videos" in schema["paths"] and "/docs" not in schema["paths"]
    with urllib.request.urlopen(f"{base}/docs?api_key={KEY}", timeout=30) as response:
        page = response.read().decode()
    assert f"openapi.json?api_key={KEY}" in page  # the page fetches the schema with the key it was given
    # Public by design: the pages and their scripts (no data in them; they take the key in their own URL), and health.
    for path in ("/", "/chat", "/static/player.js", "/healthz"):
        with urllib.request.urlopen(base + path, timeout=30) as response:
            body = response.read().decode()
        assert response.status == 200 and KEY not in body, path


def test_keys_never_reach_the_logs(address):
    """Keys sent every way (header, subprotocol, query string on HTTP and WebSocket routes) appear in no log file."""
    import pathlib

    import ray

    secret = {"Authorization": f"Bearer {KEY}"}
    for url in (f"http://{address}{PREFIX}/v1/models?api_key={KEY}", f"http://{address}{PREFIX}/docs?api_key={KEY}"):
        urllib.request.urlopen(url, timeout=30).read()
    urllib.request.urlopen(urllib.request.Request(f"http://{address}{PREFIX}/v1/models", headers=secret), timeout=30).read()

    async def sessions():
        for kwargs, path in (({}, VIDEO + f"?api_key={KEY}"), ({"subprotocols": ["realtime", f"openai-insecure-api-key.{KEY}"]}, VIDEO)):
            await short_session(await connect(address, path, **kwargs))
        await run_to_end(await connect(address, VIDEO + "?api_key=wrong-" + KEY), Transcript())  # refused keys neither

    run(sessions())
    time.sleep(2.0)  # let the replicas and the proxy flush their logs
    logs = pathlib.Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    files = [p for p in logs.rglob("*") if p.is_file()]
    assert any(b"/v1/models" in p.read_bytes() for p in files)  # the access logs are there, and were read
    leaked = [str(p) for p in files if KEY.encode() in p.read_bytes()]
    assert not leaked, leaked


# -- rates and bounds ------------------------------------------------------------------------
def test_a_message_flood_is_rate_limited_and_the_session_goes_on(address):
    async def go():
        ws = await connect(address, additional_headers=BEARER)
        transcript = Transcript()
        await ws.send(json.dumps({"type": "session.start", "prompt": "rain", "seconds": "30"}))
        await until(ws, transcript, lambda m: m["type"] == "video.start")
        for _ in range(120):
            await ws.send(json.dumps({"type": "session.ping"}))
        await asyncio.sleep(1.5)  # let the bucket refill so stop gets through
        await ws.send(json.dumps({"type": "session.stop"}))
        return await run_to_end(ws, transcript)

    transcript = run(go())
    limited = [e for e in transcript.errors if e.get("code") == "rate_limited"]
    pongs = transcript.of_type("session.pong")
    assert limited and pongs and len(limited) + len(pongs) == 120  # every ping got a pong or an error
    assert "limit is 20 per second" in limited[0]["message"]
    assert transcript.done is not None and transcript.close_code == 1000


def test_frames_over_the_rate_are_dropped_with_an_ack_not_an_error_and_queries_still_work(address):
    async def go():
        chat = await open_chat(address, CHAT, headers=BEARER, evs_enabled=False)
        async with chat.ws:
            for i in range(16):
                await chat.send({"type": "video.frame", "data": jpeg(i), "frame_id": f"f{i}"})
            acks = []
            while len(acks) < 16:
                message = await chat.until(lambda m: m["type"] in ("video.frame.ack", "error"))
                if message["type"] == "video.frame.ack":
                    acks.append(message)
            await chat.send({"type": "video.query", "text": "what is there?"})
            await chat.until(lambda m: m["type"] == "response.text.done")
            await chat.send({"type": "video.done"})
            await chat.to_end()
        return chat, acks

    chat, acks = run(go())
    kept = [a for a in acks if a["accepted"]]
    limited = [a for a in acks if a.get("reason") == "rate_limited"]
    assert kept and limited and len(kept) + len(limited) == 16
    assert len(kept) <= 10  # a burst of 8 plus what 4 per second refills while they arrive
    assert chat.of("error") == []  # over-rate frames are acked, not errors: upstream clients quit on an error
    assert chat.of("response.text.done") and chat.of("session.done")


def test_audio_over_the_buffer_is_reported_once_per_query(address):
    seventeen_seconds = base64.b64encode(b"\0\1" * 16000 * 17).decode()

    async def go():
        chat = await open_chat(address, CHAT, headers=BEARER)
        async with chat.ws:
            for _ in range(3):  # 51 s of audio into a 30 s buffer
                await chat.send({"type": "audio.chunk", "data": seventeen_seconds})
            await chat.send({"type": "ping"})
            await chat.until(lambda m: m["type"] == "pong")
            await chat.send({"type": "video.done"})
            await chat.to_end()
        return chat

    chat = run(go())
    full = [e for e in chat.of("error") if e.get("code") == "audio_buffer_full"]
    assert len(full) == 1 and "latest 30 s" in full[0]["message"]
    assert chat.of("session.done")


def test_remote_start_images_are_refused_without_an_allow_list(address):
    async def go():
        ws = await connect(address, additional_headers=BEARER)
        return await short_session(ws, image_reference={"image_url": "http://169.254.169.254/latest/image.png"})

    transcript = run(go())
    assert transcript.close_code == 1008
    assert "remote URLs are not fetched by this server" in transcript.errors[0]["message"]


# -- flow control -------------------------------------------------------------------------------------
def test_a_client_that_never_reports_is_held_near_real_time(address):
    async def go():
        ws = await connect(address, additional_headers=BEARER)
        transcript = Transcript()
        await ws.send(json.dumps({"type": "session.start", "prompt": "a fast river", "seconds": "60"}))
        await until(ws, transcript, lambda m: m["type"] == "video.start")
        await until(ws, transcript, lambda m: m["type"] == "video.chunk_metadata")
        began = time.monotonic()
        while time.monotonic() - began < 4.0:
            await receive(ws, transcript)
        elapsed = time.monotonic() - began
        await ws.close()
        return transcript, elapsed

    transcript, elapsed = run(go())
    block_s = 12 / 16
    # unheld, the tiny model makes several seconds of media per second
    assert media_seconds(transcript) <= elapsed + AHEAD_S + 2 * block_s + 0.5
    assert len(transcript.media) >= 3


def test_a_client_that_stops_taking_chunks_is_ended_as_too_slow(address):
    async def go():
        ws = await connect(address, additional_headers=BEARER, max_queue=1)
        transcript = Transcript()
        await ws.send(json.dumps({"type": "session.start", "prompt": "a slow tide", "seconds": "120"}))
        await until(ws, transcript, lambda m: m["type"] == "video.chunk_metadata")
        await ws.send(json.dumps({"type": "session.playback", "position_seconds": 0.0}))
        await asyncio.sleep(6.0)  # reads nothing and reports nothing
        await run_to_end(ws, transcript, timeout=30)
        return transcript, await wait_for_free_slots()

    transcript, held = run(go())
    slow = [e for e in transcript.errors if e.get("code") == "client_too_slow"]
    assert slow and transcript.close_code == 1008
    # generation stopped about AHEAD_S plus the report grace beyond the last confirmed position
    assert media_seconds(transcript) <= AHEAD_S + 2.0 + 2 * 12 / 16
    assert held == 0
