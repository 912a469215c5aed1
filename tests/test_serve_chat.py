"""`/v1/video/chat/stream` end to end: a real `serve.run`, the tiny Qwen2.5-Omni thinker, real sockets."""

import asyncio
import base64
import io
import json
import time

import numpy as np
import pytest
import websockets
from conftest import app_args
from PIL import Image

pytestmark = pytest.mark.timeout(240)

APP, PREFIX = "video-chat", "/chat"
PATH = PREFIX + "/v1/video/chat/stream"


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
    from deployments.models.tiny_vlm import make_tiny_vlm

    return make_tiny_vlm(tmp_path_factory.mktemp("models") / "omni")


@pytest.fixture(scope="module")
def address(serve_address, world_model_dir, omni_dir):
    from ray import serve

    from deployments.app import build_app

    config = app_args(
        world_model_dir,
        understanding_model=str(omni_dir),
        chat_min_new_tokens=8,
        chat_max_new_tokens=24,
        chat_config_timeout_s=2.0,
        chat_idle_timeout_s=3.0,
    )
    serve.run(build_app(config), name=APP, route_prefix=PREFIX)
    yield serve_address
    serve.delete(APP)


def run(coro):
    return asyncio.run(coro)


def jpeg(step: int, moving: bool = True) -> str:
    """A moving scene changes a lot between frames (blocks of new colours); a static one not at all."""
    blocks = np.random.default_rng(step if moving else 0).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    frame = np.kron(blocks, np.ones((20, 20, 1), np.uint8))
    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="JPEG", quality=90)
    return base64.b64encode(buffer.getvalue()).decode()


def tone(seconds: float, hz: float) -> str:
    t = np.arange(int(16000 * seconds)) / 16000
    return base64.b64encode((np.sin(2 * np.pi * hz * t) * 12000).astype("<i2").tobytes()).decode()


class Chat:
    """A raw client: sends what it is told, records every message in order."""

    def __init__(self, ws):
        self.ws = ws
        self.messages: list[dict] = []
        self.close_code = None

    async def send(self, message):
        await self.ws.send(message if isinstance(message, str) else json.dumps(message))

    async def until(self, predicate, timeout=60.0):
        while True:
            try:
                raw = await asyncio.wait_for(self.ws.recv(), timeout)
            except websockets.ConnectionClosed as exc:
                self.close_code = exc.rcvd.code if exc.rcvd else None
                return None
            message = json.loads(raw)
            self.messages.append(message)
            if predicate(message):
                return message

    async def to_end(self):
        return await self.until(lambda m: False)

    def of(self, kind):
        return [m for m in self.messages if m["type"] == kind]


async def open_chat(address, **config):
    ws = await websockets.connect(f"ws://{address}{PATH}", max_size=None, open_timeout=30)
    chat = Chat(ws)
    await chat.send({"type": "session.config", **config})
    return chat


async def frames(chat, count, moving=True, start=0, ids=True):
    for i in range(start, start + count):
        await chat.send({"type": "video.frame", "data": jpeg(i, moving), **({"frame_id": f"f{i}"} if ids else {}), "pts_ms": i * 500})


def answers(chat):
    """(response.start, [deltas], response.text.done) per answer, in order; checks the pairing."""
    out, current = [], None
    for m in chat.messages:
        if m["type"] == "response.start":
            assert current is None, "response.start before the previous answer's response.text.done"
            current = (m, [])
        elif m["type"] == "response.text.delta":
            current[1].append(m["delta"])
        elif m["type"] == "response.text.done":
            out.append((current[0], current[1], m))
            current = None
    assert current is None, "an answer without response.text.done"
    return out


# -- the whole path ---------------------------------------------------------------
def test_frames_query_streamed_answer_and_done_with_stats(address):
    async def go():
        chat = await open_chat(address, system_prompt="Answer briefly.")
        async with chat.ws:
            await frames(chat, 6)
            await chat.send({"type": "audio.chunk", "data": tone(1.0, 440)})
            await chat.send({"type": "video.query", "text": "What moves?"})
            await chat.until(lambda m: m["type"] == "response.text.done")
            await chat.send({"type": "video.done"})
            await chat.to_end()
        return chat

    chat = run(go())
    assert not chat.of("error")
    [(start, deltas, done)] = answers(chat)
    assert len(deltas) >= 2 and "".join(deltas) == done["text"] and done["text"]
    assert start["frames"] == 6 and start["audio_seconds"] == pytest.approx(1.0, abs=0.01)
    acks = chat.of("video.frame.ack")
    assert [a["frame_id"] for a in acks] == [f"f{i}" for i in range(6)]
    assert all(a["accepted"] for a in acks) and [a["buffered_frames"] for a in acks] == [1, 2, 3, 4, 5, 6]
    tail = [m["type"] for m in chat.messages[-2:]]
    assert tail == ["response.evs_stats", "session.done"] and chat.close_code == 1000
    assert chat.of("response.evs_stats")[0] == {"type": "response.evs_stats", "retained_count": 6, "dropped_count": 0, "total_count": 6, "drop_rate": 0.0}


def test_audio_reaches_the_model(address):
    async def answer(with_audio):
        chat = await open_chat(address)
        async with chat.ws:
            await frames(chat, 4, ids=False)
            if with_audio:
                await chat.send({"type": "audio.chunk", "data": tone(2.0, 300)})
            await chat.send({"type": "video.query", "text": "What do you hear?"})
            await chat.until(lambda m: m["type"] == "response.text.done")
            # Audio is cleared at every query: a second question hears nothing.
            await chat.send({"type": "video.query", "text": "And now?"})
            await chat.until(lambda m: m["type"] == "response.text.done")
        return answers(chat)

    heard, silent = run(answer(True)), run(answer(False))
    assert heard[0][0]["audio_seconds"] == pytest.approx(2.0, abs=0.01) and heard[1][0]["audio_seconds"] == 0
    assert silent[0][0]["audio_seconds"] == 0
    # Greedy decoding: the same frames and question give another answer only because the audio differs.
    assert heard[0][2]["text"] != silent[0][2]["text"]
    assert heard[1][2]["text"] == silent[1][2]["text"]


def test_frame_filter_drops_a_static_clip_and_keeps_a_moving_one(address):
    async def stats(moving):
        chat = await open_chat(address, evs_threshold=0.95)
        async with chat.ws:
            await frames(chat, 8, moving=moving)
            await chat.send({"type": "video.done"})
            await chat.to_end()
        return chat

    static, moving = run(stats(False)), run(stats(True))
    assert static.of("response.evs_stats")[0]["dropped_count"] == 7 and static.of("response.evs_stats")[0]["retained_count"] == 1
    assert [a["accepted"] for a in static.of("video.frame.ack")] == [True] + [False] * 7
    assert static.of("video.frame.ack")[1]["reason"] == "filtered"
    assert moving.of("response.evs_stats")[0]["dropped_count"] == 0


def test_frames_keep_arriving_during_an_answer_and_a_new_query_replaces_the_old(address):
    async def go():
        chat = await open_chat(address, max_frames=4)
        async with chat.ws:
            await frames(chat, 3)
            await chat.send({"type": "video.query", "text": "first question"})
            await chat.until(lambda m: m["type"] == "response.start")
            await frames(chat, 3, start=3)  # while the answer streams
            await chat.send({"type": "video.query", "text": "second question"})
            await chat.until(lambda m: m["type"] == "video.frame.ack" and m["frame_id"] == "f5")
            while len(chat.of("response.text.done")) < 2:
                await chat.until(lambda m: m["type"] == "response.text.done")
            await chat.send({"type": "video.done"})
            await chat.to_end()
        return chat

    chat = run(go())
    assert not chat.of("error")
    done = answers(chat)
    assert len(done) == 2  # the first answer ends cleanly (its text.done still sent), then the second
    acks = {a["frame_id"]: a for a in chat.of("video.frame.ack")}
    assert acks["f4"]["buffered_frames"] == 4 and acks["f4"]["dropped_frame_id"] == "f0"  # ring of max_frames
    assert done[1][0]["frames"] == 4


# -- bad input --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "config, text",
    [
        ("{oops", "Invalid JSON in session.config"),
        ({"type": "video.frame"}, "Expected session.config, got: video.frame"),
        ({"type": "session.config", "max_frames": "many"}, "Invalid type for 'max_frames': expected int, got str"),
        ({"type": "session.config", "evs_enabled": 1}, "Invalid type for 'evs_enabled': expected bool, got int"),
    ],
)
def test_bad_config_ends_the_session_with_its_error(address, config, text):
    async def go():
        ws = await websockets.connect(f"ws://{address}{PATH}", open_timeout=30)
        chat = Chat(ws)
        async with ws:
            await chat.send(config)
            await chat.to_end()
        return chat

    chat = run(go())
    assert [e["message"] for e in chat.of("error")] == [text] and chat.close_code == 1008


def test_every_bad_message_gets_its_error_and_the_session_goes_on(address):
    huge = base64.b64encode(b"\xff" * (10 * 1024 * 1024 + 1)).decode()
    bad = [
        ("{nope", "Invalid JSON"),
        ("[1]", "Messages must be JSON objects"),
        ({"type": "video.query", "text": "too early"}, "No frames available. Send video.frame before video.query."),
        ({"type": "video.frame", "data": "***"}, "Invalid base64 in video.frame"),
        ({"type": "video.frame", "data": huge}, "Frame too large: 10485761 bytes (limit 10485760)"),
        ({"type": "video.frame", "data": base64.b64encode(b"not an image").decode(), "frame_id": "junk"}, "Invalid image in video.frame: "),
        ({"type": "audio.chunk", "data": "@@@"}, "Invalid base64 in audio.chunk"),
        ({"type": "video.query", "text": ""}, "video.query requires a non-empty 'text' field"),
        ({"type": "video.dance"}, "Unknown message type: video.dance"),
    ]

    async def go():
        chat = await open_chat(address)
        async with chat.ws:
            for message, _ in bad:
                await chat.send(message)
            await frames(chat, 2)
            await chat.send({"type": "video.query", "text": "still there?"})
            await chat.until(lambda m: m["type"] == "response.text.done")
            await chat.send({"type": "video.done"})
            await chat.to_end()
        return chat

    chat = run(go())
    errors = [e["message"] for e in chat.of("error")]
    assert len(errors) == len(bad)
    for got, (_, want) in zip(errors, bad):
        assert got.startswith(want), (got, want)
    junk_ack = next(a for a in chat.of("video.frame.ack") if a["frame_id"] == "junk")
    assert junk_ack["accepted"] is False
    assert len(answers(chat)) == 1 and chat.messages[-1]["type"] == "session.done"


def test_config_and_idle_timeouts(address):
    async def silent(send_config):
        ws = await websockets.connect(f"ws://{address}{PATH}", open_timeout=30)
        chat = Chat(ws)
        began = time.monotonic()
        async with ws:
            if send_config:
                await chat.send({"type": "session.config"})
            await chat.to_end()
        return chat, time.monotonic() - began

    chat, took = run(silent(False))
    assert [e["message"] for e in chat.of("error")] == ["Timeout waiting for session.config"] and 1.5 < took < 10
    chat, took = run(silent(True))
    assert [e["message"] for e in chat.of("error")] == ["Idle timeout: no message received"] and 2.5 < took < 15
    assert chat.close_code is not None


def test_rtv_chat_plays_a_video_file_and_prints_the_streamed_answers(address, tmp_path, capfd):
    from clients import cli
    from deployments.media.testclips import make_test_clip

    clip = make_test_clip(tmp_path / "clip.mp4", seconds=2.0, fps=10, moving=True, tone_hz=440.0)
    summary = tmp_path / "chat.json"
    code = cli.main([
        "chat", "--url", f"ws://{address}{PATH}", "--video", str(clip), "--fps", "4", "--with-audio",
        "--no-realtime", "--query", "What is moving?", "--query", "What do you hear?", "--json", str(summary),
    ])
    out, err = capfd.readouterr()
    assert code == 0, err
    result = json.loads(summary.read_text())
    texts = [a["text"] for a in result["answers"]]
    assert len(texts) == 2 and all(texts)
    assert all(text in out for text in texts)  # streamed to stdout as they arrived
    assert result["evs_stats"]["total_count"] == 8
