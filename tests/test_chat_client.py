"""`rtv chat`, `clients.sdk.chat` and `deployments.media.testclips`.

The end-to-end tests run the client against the real server (a `serve.run`
of the tiny thinker) through `relay.Relay`, which passes every message on
unchanged and notes when each went by: what the client sends, in which
order, when, and what it prints, on real sessions. A scripted server stands
in only for the two failures the real one cannot be made to show on demand
(a fault mid-session, every frame refused), and a raw one for a message that
breaks the contract.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import pathlib
import select
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from clients import cli
from clients.media.video_file import PcmTimeline, decode_audio_pcm16, iter_audio_pcm16, iter_frames, pick_frame_times, probe_video
from clients.sdk.chat import ChatStreamClient, chat_url, session_config_message
from clients.sdk.errors import ClientInputError, ClientProtocolError
from deployments.media.testclips import make_test_clip
from conftest import chat_app_args, deployed
from relay import Relay

REPO = pathlib.Path(__file__).resolve().parents[1]
SECONDS, FPS = 3.0, 10


# =====================================================================================
# Clips
# =====================================================================================
@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    d = tmp_path_factory.mktemp("clips")
    return {
        "av16": make_test_clip(d / "av16.mp4", seconds=SECONDS, fps=FPS, tone_hz=440.0, sample_rate=16000),
        "av44": make_test_clip(d / "av44.mp4", seconds=SECONDS, fps=FPS, tone_hz=440.0, sample_rate=44100),
        "silent": make_test_clip(d / "silent.mp4", seconds=2.0, fps=FPS, moving=False, tone_hz=None),
    }


def _small(rgb: np.ndarray) -> np.ndarray:
    """The EVS view of a frame: 64x64 RGB, bilinear, aspect ignored."""
    from PIL import Image

    return np.asarray(Image.fromarray(rgb).convert("RGB").resize((64, 64), Image.BILINEAR), np.float32)


def _similarity(a: np.ndarray, b: np.ndarray) -> float:
    return 1.0 - float(np.mean((a - b) ** 2)) / 255.0**2


def _decode_video(path: pathlib.Path) -> tuple[list[float], list[np.ndarray]]:
    import av

    with av.open(str(path)) as container:
        frames = list(container.decode(video=0))
        return [f.time for f in frames], [f.to_ndarray(format="rgb24") for f in frames]


# =====================================================================================
# The real server, and a scripted one for faults it cannot be made to show
# =====================================================================================
APP, PREFIX = "chat-client", "/chatclient"


@pytest.fixture(scope="module")
def server(serve_address, world_model_dir, omni_dir) -> str:
    """`ws://HOST:PORT` of the real server with the tiny thinker under PREFIX (answers of 8 to 16 tokens)."""
    with deployed(APP, PREFIX, chat_app_args(world_model_dir, omni_dir, chat_min_new_tokens=8, chat_max_new_tokens=16)):
        yield f"ws://{serve_address}"


def _endpoint(relay: Relay) -> str:
    return relay.url + PREFIX + "/v1/video/chat/stream"


class ScriptedServer:
    """Only for the client's failure paths the real server cannot be made to show on demand: a server
    fault after `crash_after_frames` frames (error, then close 1011), or every frame refused (so every
    query is refused). Each message it sends is one the real server sends in that case."""

    def __init__(self, *, crash_after_frames: int | None = None) -> None:
        self.crash_after_frames = crash_after_frames
        self.received: list[dict] = []
        self.port: int | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def __enter__(self) -> "ScriptedServer":
        self._thread.start()
        assert self._ready.wait(10), "scripted server did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _main(self) -> None:
        from websockets.asyncio.server import serve

        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with serve(self._session, "127.0.0.1", 0) as srv:
            self.port = srv.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop.wait()

    async def _session(self, ws) -> None:
        frames = 0
        async for raw in ws:
            message = json.loads(raw)
            self.received.append(message)
            kind = message["type"]
            if kind == "video.frame":
                frames += 1
                if self.crash_after_frames is not None and frames > self.crash_after_frames:
                    await ws.send(json.dumps({"type": "error", "message": "Internal fault", "code": "server_fault"}))
                    await ws.close(1011, "server fault")
                    return
                await ws.send(json.dumps({"type": "video.frame.ack", "frame_id": message["frame_id"], "accepted": False,
                                          "buffered_frames": 0, "reason": "filtered"}))
            elif kind == "video.query":
                await ws.send(json.dumps({"type": "error", "message": "No frames available. Send video.frame before video.query.",
                                          "code": "no_frames"}))
            elif kind == "video.done":
                await ws.send(json.dumps({"type": "response.evs_stats", "retained_count": 0, "dropped_count": frames,
                                          "total_count": frames, "drop_rate": 1.0}))
                await ws.send(json.dumps({"type": "session.done"}))
                await ws.close(1000)
                return


def _run_cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """`rtv ...` in this process: (exit code, stdout, stderr); argparse's exits are caught."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err



# =====================================================================================
# Test clips
# =====================================================================================
@pytest.mark.timeout(60)
@pytest.mark.parametrize("name,rate", [("av16", 16000), ("av44", 44100)])
def test_test_clip_is_a_valid_mp4(clips, name: str, rate: int) -> None:
    import av

    path = clips[name]
    with av.open(str(path)) as container:
        assert container.format.name.startswith("mov,mp4")
        video, audio = container.streams.video[0], container.streams.audio[0]
        assert video.codec_context.name == "h264" and (video.codec_context.width, video.codec_context.height) == (160, 120)
        assert audio.codec_context.name == "aac" and audio.sample_rate == rate and audio.channels == 1
        assert float(audio.duration * audio.time_base) == pytest.approx(SECONDS, abs=1e-3)
    times, frames = _decode_video(path)
    assert len(frames) == round(SECONDS * FPS)
    assert times == pytest.approx([i / FPS for i in range(len(frames))], abs=1e-3)
    assert frames[0].shape == (120, 160, 3)
    with av.open(str(path)) as container:
        samples = sum(f.samples for f in container.decode(audio=0))
    assert abs(samples - SECONDS * rate) <= 1024  # one AAC frame of encoder padding at most
    info = probe_video(path)
    assert info.has_audio and info.duration == pytest.approx(SECONDS, abs=1e-3) and info.audio_sample_rate == rate


@pytest.mark.timeout(60)
def test_test_clip_moves_or_stands_still(clips) -> None:
    import av

    with av.open(str(clips["silent"])) as container:
        assert not container.streams.audio
    _, still = _decode_video(clips["silent"])
    assert len(still) == 20
    assert min(_similarity(_small(still[0]), _small(f)) for f in still) > 0.99  # EVS keeps only the first
    _, moving = _decode_video(clips["av16"])
    half_second = [_similarity(_small(moving[i]), _small(moving[i + 5])) for i in range(0, len(moving) - 5, 5)]
    assert max(half_second) < 0.9  # 2 fps sampling: every frame differs well past the default threshold
    with pytest.raises(ValueError):
        make_test_clip(pathlib.Path("/tmp/never.mp4"), size=(161, 120))


# =====================================================================================
# Frame picking and audio
# =====================================================================================
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "fps,expected",
    [
        (2.0, [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]),
        (3.0, [0.0, 0.3, 0.6, 1.0, 1.3, 1.6, 2.0, 2.3, 2.6]),
        (1.0, [0.0, 1.0, 2.0]),
        (0.4, [0.0, 2.5]),
        (10.0, [i / 10 for i in range(30)]),
        (25.0, [i / 10 for i in range(30)]),  # above the source rate: every frame, once
    ],
)
def test_pick_frame_times(fps: float, expected: list[float]) -> None:
    times = [i / 10 for i in range(30)]
    assert pick_frame_times(times, fps, end=3.0) == pytest.approx(expected)
    # Without the clip's end, the last frame lasts one frame interval: same picks.
    assert pick_frame_times(times, fps) == pytest.approx(expected)


@pytest.mark.timeout(60)
def test_pick_frame_times_irregular() -> None:
    # A variable-rate source with a gap and a repeated timestamp: the latest frame at or before each tick.
    times = [0.04, 0.2, 0.2, 0.45, 1.7, 1.75]
    assert pick_frame_times(times, 2.0, end=2.0) == pytest.approx([0.04, 0.45])  # ticks 0, 0.5, 1, 1.5
    assert pick_frame_times(times, 2.0, end=2.5) == pytest.approx([0.04, 0.45, 1.75])  # and 2.0
    assert pick_frame_times([], 2.0) == []
    with pytest.raises(ValueError):
        pick_frame_times(times, 0.0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fps,count", [(2.0, 6), (3.0, 9), (20.0, 30)])
def test_iter_frames_from_the_clip(clips, fps: float, count: int) -> None:
    from PIL import Image

    frames = list(iter_frames(clips["av16"], fps))
    assert len(frames) == count
    expected = pick_frame_times([i / 10 for i in range(30)], fps, end=3.0)
    assert [f.pts_ms for f in frames] == [round(t * 1000) for t in expected]
    assert [f.index for f in frames] == list(range(count))
    with Image.open(io.BytesIO(frames[-1].jpeg)) as img:
        assert img.format == "JPEG" and img.size == (160, 120)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["av16", "av44"])
def test_audio_resampled_to_16k_mono_pcm16(clips, name: str) -> None:
    pcm = decode_audio_pcm16(clips[name])
    assert len(pcm) % 2 == 0
    samples = np.frombuffer(pcm, "<i2").astype(np.float64)
    assert abs(len(samples) - SECONDS * 16000) <= 1024
    # The tone is still 440 Hz: FFT peak of a steady middle second, within one bin (1 Hz).
    middle = samples[8000:24000]
    spectrum = np.abs(np.fft.rfft(middle * np.hanning(len(middle))))
    peak = np.fft.rfftfreq(len(middle), 1 / 16000)[int(np.argmax(spectrum))]
    assert abs(peak - 440.0) <= 1.0
    assert 0.3 < np.max(np.abs(middle)) / 32768 < 0.7  # amplitude 0.5 survives (no clipping, no silence)
    # Cut into chunks on the clip's timeline, nothing is lost or doubled.
    timeline = PcmTimeline(iter_audio_pcm16(clips[name]))
    pieces = [timeline.take_until(t / 2) for t in range(7)]
    assert [len(p) for p in pieces[:6]] == [0] + [16000] * 5
    assert b"".join(pieces) + timeline.take_rest() == pcm


@pytest.mark.timeout(60)
def test_pcm_timeline_offsets() -> None:
    one_second = np.arange(16000, dtype="<i2").tobytes()
    late = PcmTimeline([one_second[:10000], one_second[10000:]], offset=0.5)
    head = late.take_until(0.75)
    assert len(head) == 0.75 * 32000 and head[:16000] == bytes(16000) and head[16000:] == one_second[:8000]
    early = PcmTimeline([one_second], offset=-0.25)
    assert early.take_until(0.25) == one_second[8000:16000]
    assert early.take_rest() == one_second[16000:]


# =====================================================================================
# The CLI: bad input, help
# =====================================================================================
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "extra,expected",
    [
        (["--video", "{missing}"], "does not exist"),
        (["--video", "{notvideo}"], "cannot read video"),
        (["--video", "{av16}", "--fps", "0"], "--fps must be a positive number, got 0"),
        (["--video", "{av16}", "--fps", "-2"], "--fps must be a positive number"),
        (["--video", "{av16}", "--fps", "nan"], "--fps must be a positive number"),
        (["--video", "{av16}", "--fps", "two"], "invalid float value"),
        (["--video", "{av16}", "--query-at", "1"], "got 1 --query-at for 2 --query"),
        (["--video", "{av16}", "--query-at", "2", "--query-at", "1"], "must not decrease"),
        (["--video", "{av16}", "--query-at", "1", "--query-at", "9"], "past the end of the clip"),
        (["--video", "{silent}", "--with-audio"], "has no audio stream; drop --with-audio"),
        (["--video", "{av16}", "--no-evs", "--evs-threshold", "0.9"], "--evs-threshold has no effect with --no-evs"),
        (["--video", "{av16}", "--evs-threshold", "1.5"], "--evs-threshold must be"),
        (["--video", "{av16}", "--max-frames", "0"], "--max-frames must be a positive integer"),
        (["--video", "{av16}", "--url", "http//nope"], "has no scheme"),
    ],
    ids=lambda v: "_".join(v) if isinstance(v, list) else None,
)
def test_cli_bad_input_exits_2_with_one_line(clips, tmp_path, capsys, extra: list[str], expected: str) -> None:
    (tmp_path / "not-a-video.mp4").write_text("this is not a video")
    names = {"missing": str(tmp_path / "nope.mp4"), "notvideo": str(tmp_path / "not-a-video.mp4")}
    names |= {k: str(v) for k, v in clips.items()}
    argv = ["chat", "--url", "ws://127.0.0.1:9", "--query", "what?", "--query", "and now?"]
    argv += [a.format(**names) for a in extra]
    code, out, err = _run_cli(argv, capsys)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert expected in lines[0] and lines[0].startswith("rtv chat")


@pytest.mark.timeout(60)
def test_cli_blank_query_and_missing_query(clips, capsys) -> None:
    code, _, err = _run_cli(["chat", "--url", "ws://127.0.0.1:9", "--video", str(clips["av16"]), "--query", "  "], capsys)
    assert code == 2 and err.strip().splitlines() == ["rtv chat: error: --query 1 is blank"]
    code, _, err = _run_cli(["chat", "--url", "ws://127.0.0.1:9", "--video", str(clips["av16"])], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--query" in err


@pytest.mark.timeout(60)
def test_help_lists_chat_and_imports_nothing_heavy() -> None:
    code = (
        "import sys; from clients import cli; cli.build_parser(); import clients.cli.chat, clients.sdk.chat, clients.media.video_file; "
        "print(sorted(m for m in ('torch', 'numpy', 'av', 'PIL', 'websockets') if m in sys.modules))"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    proc = subprocess.run([sys.executable, "-m", "clients.cli", "--help"], cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "chat" in proc.stdout


@pytest.mark.timeout(60)
def test_messages_and_url() -> None:
    assert chat_url("ws://h:8000") == "ws://h:8000/v1/video/chat/stream"
    assert chat_url("http://h:8000/") == "ws://h:8000/v1/video/chat/stream"
    assert chat_url("wss://h/custom/path") == "wss://h/custom/path"
    with pytest.raises(ClientInputError):
        chat_url("ftp://h")
    assert session_config_message() == {"type": "session.config"}
    assert session_config_message(num_sample_frames=4, evs_enabled=False, evs_threshold=0.9, system_prompt="be brief") == {
        "type": "session.config", "num_sample_frames": 4, "evs_enabled": False, "evs_threshold": 0.9, "system_prompt": "be brief",
    }
    with pytest.raises(ClientInputError):
        session_config_message(max_frames=0)


# =====================================================================================
# End to end against the real server, through the recording relay
# =====================================================================================
def _texts(relay: Relay) -> list[str]:
    return [m["text"] for _, m in relay.sent("response.text.done")]


@pytest.mark.timeout(240)
def test_chat_no_realtime_end_to_end(server, clips, tmp_path, capsys) -> None:
    summary_path = tmp_path / "chat.json"
    queries = ["What is moving?", "What colour is the square?"]
    with Relay(server) as relay:
        argv = [
            "chat", "--url", _endpoint(relay), "--video", str(clips["av16"]), "--fps", "2", "--with-audio",
            "--query", queries[0], "--query", queries[1], "--sample-frames", "4", "--max-frames", "32",
            "--system-prompt", "Be brief.", "--no-realtime", "--json", str(summary_path),
        ]
        code, out, err = _run_cli(argv, capsys)
        log = list(relay.log)
    assert code == 0, err
    inbound = [m for _, d, m in log if d == "in"]
    kinds = [m["type"] for m in inbound]
    # Order: config, then frames (with their audio), then the queries, then video.done.
    assert kinds[0] == "session.config" and kinds[-1] == "video.done"
    config = inbound[0]
    assert config["modalities"] == ["text"] and config["num_sample_frames"] == 4 and config["max_frames"] == 32
    assert config["system_prompt"] == "Be brief." and "evs_enabled" not in config
    frames = [(t, m) for t, d, m in log if d == "in" and m["type"] == "video.frame"]
    assert [f["pts_ms"] for _, f in frames] == [0, 500, 1000, 1500, 2000, 2500]
    assert [f["frame_id"] for _, f in frames] == [f"frame-{i:06d}" for i in range(6)]
    assert frames[-1][0] - frames[0][0] < 2.5  # not paced on the clip's clock
    first_query = kinds.index("video.query")
    assert kinds[first_query:] == ["video.query", "video.query", "video.done"]
    # Audio: 16 kHz mono PCM16, cut at the frames' times; the rest after the last frame.
    audio_before, total = [], 0
    for m in inbound:
        if m["type"] == "audio.chunk":
            total += m["nbytes"]
        elif m["type"] == "video.frame":
            audio_before.append(total)
    assert audio_before == [pts * 32 for pts in (0, 500, 1000, 1500, 2000, 2500)]
    assert total == SECONDS * 32000
    # As fast as the acks allow: each frame left only after the previous frame's ack reached the client.
    acks = {m["frame_id"]: t for t, d, m in log if d == "out" and m["type"] == "video.frame.ack"}
    for (_, previous), (t, _) in zip(frames, frames[1:]):
        assert t > acks[previous["frame_id"]]
    # One query at a time: the second left after the first answer's response.text.done.
    query_times = [t for t, d, m in log if d == "in" and m["type"] == "video.query"]
    done_times = [t for t, d, m in log if d == "out" and m["type"] == "response.text.done"]
    assert done_times[0] < query_times[1] and done_times[1] < [t for t, d, m in log if d == "in" and m["type"] == "video.done"][0]
    # The server's own accounting: the first query got the clip's 3 s of audio, the second none.
    starts = [m for _, d, m in log if d == "out" and m["type"] == "response.start"]
    assert [s["audio_seconds"] for s in starts] == pytest.approx([SECONDS, 0.0], abs=0.01)
    # stdout: each answer as the server streamed it, one after the other, each ended by a newline.
    texts = [m["text"] for _, d, m in log if d == "out" and m["type"] == "response.text.done"]
    assert len(texts) == 2 and all(texts) and out == "".join(text + "\n" for text in texts)
    [evs] = [m for _, d, m in log if d == "out" and m["type"] == "response.evs_stats"]
    kept, dropped = evs["retained_count"], evs["dropped_count"]
    assert kept + dropped == 6 and kept >= 1
    err_lines = err.strip().splitlines()
    assert any(line.startswith(f"rtv chat: EVS: kept {kept} of 6 frames, dropped {dropped}") for line in err_lines), err
    assert "rtv chat: query 1/2" in err and "error" not in err
    summary = json.loads(summary_path.read_text())
    accepted = sum(1 for _, d, m in log if d == "out" and m["type"] == "video.frame.ack" and m["accepted"])
    assert summary["frames_sent"] == 6 and summary["frames_accepted"] == accepted == kept and summary["session_done"]
    assert summary["evs_stats"] == {k: v for k, v in evs.items() if k != "type"}
    assert [a["text"] for a in summary["answers"]] == texts
    deltas = [m["delta"] for _, d, m in log if d == "out" and m["type"] == "response.text.delta"]
    assert [a["num_deltas"] for a in summary["answers"]] and sum(a["num_deltas"] for a in summary["answers"]) == len(deltas)
    assert all(a["streamed_text"] == a["text"] for a in summary["answers"])
    assert summary["audio_bytes_sent"] == SECONDS * 32000 and summary["failure"] is None
    assert [f["time_seconds"] for f in summary["picked_frames"]] == pytest.approx([0, 0.5, 1, 1.5, 2, 2.5])


@pytest.mark.timeout(240)
def test_chat_realtime_pacing_and_query_at(server, clips, capsys) -> None:
    queries = ["What now?", "And at the end?"]
    with Relay(server) as relay:
        argv = [
            "chat", "--url", _endpoint(relay), "--video", str(clips["av44"]), "--fps", "2", "--with-audio",
            "--query", queries[0], "--query-at", "1.2", "--query", queries[1], "--query-at", "2.5",
        ]
        code, out, err = _run_cli(argv, capsys)
        log = list(relay.log)
    assert code == 0, err
    inbound = [(t, m) for t, d, m in log if d == "in"]
    frames = [(t, m) for t, m in inbound if m["type"] == "video.frame"]
    assert [m["pts_ms"] for _, m in frames] == [0, 500, 1000, 1500, 2000, 2500]
    start = frames[0][0]
    for t, m in frames:  # on the clip's clock: never early, at most a little late
        assert -0.03 <= (t - start) - m["pts_ms"] / 1000 <= 0.3, (m["pts_ms"], t - start)
    queries_in = [(t, m) for t, m in inbound if m["type"] == "video.query"]
    assert [m["text"] for _, m in queries_in] == queries
    q1 = queries_in[0][0]
    assert q1 - start >= 1.2 - 0.03
    order = [m.get("pts_ms", m["type"]) for _, m in inbound if m["type"] in ("video.frame", "video.query")]
    assert order == [0, 500, 1000, "video.query", 1500, 2000, 2500, "video.query"]
    # The first answer heard the audio up to 1.2 s of the clip, the second the audio between the two queries.
    audio_before_q1 = sum(m["nbytes"] for t, m in inbound if m["type"] == "audio.chunk" and t < q1)
    assert audio_before_q1 == 1.2 * 32000
    starts = [m for _, d, m in log if d == "out" and m["type"] == "response.start"]
    assert [s["audio_seconds"] for s in starts] == pytest.approx([1.2, 1.3], abs=0.01)
    texts = [m["text"] for _, d, m in log if d == "out" and m["type"] == "response.text.done"]
    assert out == "".join(text + "\n" for text in texts) and len(texts) == 2
    assert inbound[-1][1]["type"] == "video.done"
    assert inbound[-1][0] - start >= 2.5  # the clip took its time


@pytest.mark.timeout(240)
def test_chat_prints_deltas_as_they_arrive(server, clips) -> None:
    """The relay holds the answer after its first delta until the test has read that delta from the
    client's stdout: only a client that flushes each delta gets past it."""
    with Relay(server) as relay:
        relay.hold(lambda m: m.get("type") == "response.text.delta")
        env = dict(os.environ, PYTHONPATH=str(REPO))
        argv = [sys.executable, "-m", "clients.cli", "chat", "--url", _endpoint(relay), "--video", str(clips["av16"]),
                "--fps", "2", "--no-realtime", "--query", "Hello?"]
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        seen = b""
        try:
            assert relay.wait_held(120), "the server sent no delta"
            first = relay.sent("response.text.delta")[0][1]["delta"].encode()
            deadline = time.monotonic() + 30
            while first not in seen and time.monotonic() < deadline:
                ready, _, _ = select.select([proc.stdout], [], [], 0.2)
                if ready:
                    chunk = os.read(proc.stdout.fileno(), 4096)
                    if not chunk:
                        break
                    seen += chunk
            first_delta_seen = first in seen
            forwarded = len(relay.sent("response.text.delta"))
        finally:
            relay.release()
        rest, err = proc.communicate(timeout=60)
        texts = _texts(relay)
    assert first_delta_seen, f"the first delta {first!r} never reached stdout while the answer was held (got {seen!r})"
    assert forwarded == 1  # nothing more had reached the client when its delta was read
    assert proc.returncode == 0, err.decode()
    assert (seen + rest).decode() == texts[0] + "\n"


@pytest.mark.timeout(60)
def test_chat_session_failure_exits_1(clips, capsys) -> None:
    with ScriptedServer(crash_after_frames=2) as scripted:
        argv = ["chat", "--url", scripted.url, "--video", str(clips["av16"]), "--no-realtime", "--query", "What?"]
        code, out, err = _run_cli(argv, capsys)
    assert code == 1
    lines = err.strip().splitlines()
    assert "rtv chat: server error: Internal fault [server_fault]" in lines
    assert lines[-1] == "rtv chat: error: session ended with server error: Internal fault [server_fault] (close code 1011: server fault)"
    # Nothing listens here: connection refused, one line, exit 1.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = _run_cli(["chat", "--url", f"ws://127.0.0.1:{port}", "--video", str(clips["av16"]), "--query", "What?"], capsys)
    assert code == 1 and err.strip().splitlines() == [
        f"rtv chat: error: cannot connect to ws://127.0.0.1:{port}/v1/video/chat/stream: connection refused (is the server running?)"
    ]


@pytest.mark.timeout(60)
def test_chat_refused_query_exits_1_after_a_clean_session(clips, capsys) -> None:
    with ScriptedServer() as scripted:  # refuses every frame, so every query
        argv = ["chat", "--url", scripted.url, "--video", str(clips["av16"]), "--no-realtime", "--query", "What?", "--query", "Now?"]
        code, out, err = _run_cli(argv, capsys)
        kinds = [m["type"] for m in scripted.received]
    assert code == 1
    assert out == ""
    assert kinds[-3:] == ["video.query", "video.query", "video.done"]  # both asked; the session ended cleanly
    lines = err.strip().splitlines()
    assert lines.count("rtv chat: server error: No frames available. Send video.frame before video.query. [no_frames]") == 2
    assert "rtv chat: EVS: kept 0 of 6 frames, dropped 6 (100.0%)" in lines
    assert lines[-1].startswith("rtv chat: error: 2 of 2 queries got no answer (query 1 failed: No frames available.")


# =====================================================================================
# ChatStreamClient on its own, against the real server
# =====================================================================================
@pytest.mark.timeout(240)
def test_chat_stream_client_api(server, clips) -> None:
    _, decoded = _decode_video(clips["av16"])
    frames = list(iter_frames(clips["av16"], 2.0))

    async def session(url: str):
        async with ChatStreamClient(url) as client:
            await client.configure(evs_enabled=False, num_sample_frames=2)
            refused = await client.ask("Anything yet?", timeout=30)  # no frames: the server refuses it
            first = await client.send_frame(decoded[0], pts_ms=0)  # ndarray -> JPEG here
            assert (await client.wait_ack(first.frame_id, timeout=30)).accepted
            for frame in frames[1:]:
                await client.send_frame(frame.jpeg, pts_ms=frame.pts_ms)
            bad = await client.send_frame(b"not an image", pts_ms=9999)
            await client.send_audio(np.zeros(1600, "<i2").tobytes())
            await client.wait_acks(0, timeout=30)
            stream = await client.query("What is moving?", timeout=60)
            deltas = [d async for d in stream]
            answer = await stream.wait()
            with pytest.raises(ClientInputError):
                await client.send_audio(b"\x00")
            with pytest.raises(ClientInputError):
                await client.query("   ")
            stats = await client.done(timeout=60)
        return client.result(), refused, bad, deltas, answer, stats

    with Relay(server) as relay:
        result, refused, bad, deltas, answer, stats = asyncio.run(session(_endpoint(relay)))
        [start] = [m for _, m in relay.sent("response.start")]
        texts = _texts(relay)
    assert refused.error is not None and refused.error.message.startswith("No frames available") and refused.ended_by == "error"
    assert not refused.ok and refused.failure().startswith("query 1 failed: No frames available")
    assert bad.frame_id in result.frame_errors and result.frame_errors[bad.frame_id].message.startswith("Invalid image in video.frame")
    assert answer.ok and answer.index == 1 and answer.text == "".join(d.delta for d in deltas) == answer.streamed_text == texts[0]
    assert start["frames"] == 2 and start["audio_seconds"] == pytest.approx(0.1)  # what the model got: num_sample_frames of the 6
    assert len(deltas) >= 2 and answer.time_to_first_delta is not None
    assert answer.started_at <= deltas[0].received_at <= answer.done_at
    assert stats is None and result.evs_stats is None  # EVS off: no response.evs_stats
    assert result.ok and result.failure() is None and result.close_code == 1000
    assert result.accepted_frames == 6 and len(result.frames) == 7 and not result.pending_frames
    assert [a.seconds for a in result.audio] == [0.1]
    assert [e.message.split(":")[0] for e in result.errors] == [
        "No frames available. Send video.frame before video.query.", "Invalid image in video.frame",
    ]
    kinds = [type(e).__name__ for e in result.events]
    assert kinds[0] == "ServerError" and kinds[-1] == "SessionDone"


@pytest.mark.timeout(60)
def test_a_server_message_that_breaks_the_contract_ends_the_session_as_a_protocol_error() -> None:
    from websockets.asyncio.server import serve

    async def handler(ws) -> None:
        await ws.recv()  # session.config
        await ws.send(json.dumps({"type": "response.text.delta", "delta": 5}))
        await ws.wait_closed()

    async def main():
        async with serve(handler, "127.0.0.1", 0) as srv:
            url = f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
            async with ChatStreamClient(url) as client:
                await client.configure()
                with pytest.raises(ClientProtocolError, match=r"response.text.delta breaks the contract \(delta"):
                    await client.done(timeout=10)
            return client.result()

    result = asyncio.run(main())
    assert result.protocol_error.startswith("response.text.delta breaks the contract") and result.close_code == 1002
