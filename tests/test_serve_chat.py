"""`/v1/video/chat/stream` end to end: a real `serve.run`, the tiny Qwen2.5-Omni thinker, real sockets."""

import asyncio
import base64
import json
import time

import pytest
import websockets
import chatclient
from chatclient import Chat, answers, frames, tone
from conftest import app_args

pytestmark = pytest.mark.timeout(240)

APP, PREFIX = "video-chat", "/chat"
PATH = PREFIX + "/v1/video/chat/stream"


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


async def open_chat(address, **config):
    return await chatclient.open_chat(address, PATH, **config)


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


def test_frames_keep_arriving_during_an_answer_and_the_next_query_waits_its_turn(address):
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
    assert len(done) == 2  # answered in order, each in full (`answers` checks the pairing)
    assert all("interrupted" not in d[2] and d[2]["text"] for d in done)
    acks = {a["frame_id"]: a for a in chat.of("video.frame.ack")}
    assert acks["f4"]["buffered_frames"] == 4 and acks["f4"]["dropped_frame_id"] == "f0"  # ring of max_frames
    assert done[1][0]["frames"] == 4


async def _two_queries_at_once(address, **config):
    chat = await open_chat(address, **config)
    async with chat.ws:
        await frames(chat, 3)
        await chat.send({"type": "video.query", "text": "first question"})
        await chat.send({"type": "video.query", "text": "second question"})
        while len(chat.of("response.text.done")) < 2:
            await chat.until(lambda m: m["type"] == "response.text.done")
        await chat.send({"type": "video.done"})
        await chat.to_end()
    return chat


def test_queries_sent_together_are_answered_in_order_each_in_full(address):
    """The seed's rule: a newer query never cuts the running answer short."""
    chat = run(_two_queries_at_once(address))
    done = answers(chat)
    assert not chat.of("error") and len(done) == 2
    assert [d[2].get("interrupted", False) for d in done] == [False, False]
    assert all(d[2]["text"] and d[1] for d in done)
    assert all(d[0]["modalities"] == ["text"] for d in done)  # the answer says what it carries


def test_replace_running_answer_is_opt_in(address):
    chat = run(_two_queries_at_once(address, replace_running_answer=True))
    done = answers(chat)
    assert not chat.of("error") and len(done) == 2
    assert done[0][2]["interrupted"] is True and "interrupted" not in done[1][2] and done[1][2]["text"]


def test_a_live_session_answers_over_video_prefilled_before_the_question(address, omni_dir):
    """Questions that see every frame: the replica prefills the video as it arrives; same answer as a re-read."""
    from ray import serve

    from deployments.media.frames import decode_image
    from deployments.understanding.engine import UnderstandingEngine

    async def contexts():
        return (await serve.get_deployment_handle("Understanding", app_name=APP).stats.remote())["contexts"]

    async def go():
        chat = await open_chat(address, max_frames=8, num_sample_frames=8, evs_enabled=False)
        async with chat.ws:
            await frames(chat, 12)
            await chat.until(lambda m: m["type"] == "video.frame.ack" and m["frame_id"] == "f11")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                [state] = (await contexts()).values()
                if state["context_first_frame"] is not None and state["context_first_frame"] + state["context_frames"] == 12:
                    break
                await asyncio.sleep(0.1)
            await chat.send({"type": "video.query", "text": "What moves?"})
            await chat.until(lambda m: m["type"] == "response.text.done")
            await chat.send({"type": "video.done"})
            await chat.to_end()
        return chat, state, await contexts()

    chat, state, after = run(go())
    assert not chat.of("error")
    # Every frame up to the newest prefilled before the question. The context is a clip from a pair
    # boundary at or before the ring's oldest frame (frames 4-11 when they all came before the first
    # prefill step, frames 0-11 when prefill kept up: under chat_context_rebuild_frames, 8, further back).
    first = state["context_first_frame"]
    assert state["frames"] == 8 and state["live"] and not state["rebuilding"] and state["context_bytes"] > 0
    assert first in range(0, 5, 2)
    [(start, deltas, done)] = answers(chat)
    assert start["frames"] == 12 - first
    engine = UnderstandingEngine.from_pretrained(omni_dir)
    images = [decode_image(base64.b64decode(chatclient.jpeg(i)), 448) for i in range(first, 12)]
    expected = engine.answer(images, None, "What moves?", fps=2.0, max_new_tokens=24, min_new_tokens=8)
    assert done["text"] == expected and "".join(deltas) == expected
    assert after == {}  # the session's cache went with it


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


@pytest.mark.timeout(180)
def test_the_readme_python_client_examples_run_against_the_server(address, tmp_path, monkeypatch):
    """Both examples of the README's "Python client", as printed there, against this server."""
    import contextlib
    import io
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Python client", 1)[1].split("\n## ", 1)[0]
    video_example, chat_example = re.findall(r"```python\n(.*?)```", section, re.S)
    monkeypatch.chdir(tmp_path)
    printed = {}
    endpoints = {"video": f"ws://{address}{PREFIX}/v1/realtime/video", "chat": f"ws://{address}{PATH}"}  # this app sits under a prefix
    for name, code in (("video", video_example), ("chat", chat_example)):
        code = code.replace('"ws://127.0.0.1:8000"', f'"{endpoints[name]}"')
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"README {name} example", "exec"), {"__name__": "readme_example"})
        printed[name] = out.getvalue()
    assert re.findall(r"block (\d+) (\d+) frames", printed["video"]) == [("0", "9"), ("1", "12"), ("2", "12")]
    mp4 = (tmp_path / "meadow.mp4").read_bytes()
    assert mp4[4:8] == b"ftyp" and len(mp4) > 1000
    answer, evs = printed["chat"].rsplit("\nEVS:", 1)
    assert answer.strip() and "kept" in evs
