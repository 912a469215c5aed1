"""`/v1/realtime/video` end to end: a real `serve.run`, real sockets, a real websockets client."""

import asyncio
import io
import json
import shutil
import subprocess
import time

import numpy as np
import pytest
from conftest import app_args
from wsclient import Transcript, connect, decode_frames, run_to_end, send, start, until

pytestmark = pytest.mark.timeout(240)

APP = "video-main"


@pytest.fixture(scope="module")
def address(serve_address, world_model_dir):
    from ray import serve

    from deployments.app import build_app

    config = app_args(world_model_dir, num_replicas=2, max_sessions_per_replica=2, start_timeout_s=2.0, routing_stats_period_s=0.5)
    serve.run(build_app(config), name=APP, route_prefix="/")
    yield serve_address
    serve.delete(APP)


def run(coro):
    return asyncio.run(coro)


async def full_session(address, **fields):
    ws, transcript, first = await start(address, **fields)
    async with ws:
        await run_to_end(ws, transcript)
    return first, transcript


# -- a whole session ---------------------------------------------------------------
def test_each_replica_warmed_up_before_it_answered_readiness_and_kept_nothing(address):
    """A throwaway session of two blocks (block 0, then a steady one: denoised, decoded, encoded) ran on
    every replica before its model_info answered; its state is gone and it took no slot."""
    from ray import serve

    handle = serve.get_deployment_handle("WorldModel", APP)
    seen = {}
    for _ in range(200):  # calls spread over the replicas: ask until both have ended their warm-up
        stats = handle.stats.remote().result(timeout_s=60)
        if stats["warm_up"]["seconds"] is not None:
            seen[stats["replica_id"]] = stats
        if len(seen) == 2:
            break
        time.sleep(0.1)
    assert len(seen) == 2
    for stats in seen.values():
        assert stats["warm_up"]["blocks"] == 2 and stats["warm_up"]["error"] is None and stats["warm_up"]["seconds"] > 0
        assert all(rank["engine_sessions"] == 0 and rank["session_bytes"] == 0 for rank in stats["ranks"])


def test_full_session_streams_a_playable_fmp4(address):
    began = time.time()
    first, t = run(full_session(address, prompt="a lighthouse", num_frames=33, seed=5))
    ended = time.time()
    assert first["type"] == "video.start" and first["format"] == "m4s"
    assert first["request_id"].startswith("video_stream-") and len(first["request_id"]) == len("video_stream-") + 32
    assert first["config"] == {"prompt": "a lighthouse", "num_frames": 33, "seed": 5}
    assert not t.errors and not t.order_errors
    kinds = [meta["kind"] for meta, _ in t.media]
    assert kinds == ["media", "media", "media", "trailer"]
    assert [meta["transport_chunk_index"] for meta, _ in t.media] == [0, 1, 2, 3]
    assert [meta["generation_chunk_index"] for meta, _ in t.media] == [0, 1, 2, None]
    assert [meta["num_frames"] for meta, _ in t.media] == [9, 12, 12, 0]  # what each block generated (the seed's count)
    assert [meta["fragment_frames"] for meta, _ in t.media] == [8, 12, 12, 1]  # what each binary frame completes
    # When the replica had each block's frames (one host, one clock): in order, within the session; none on the trailer.
    stamps = [meta.get("frames_ready_at") for meta, _ in t.media]
    assert stamps[-1] is None and began < stamps[0] <= stamps[1] <= stamps[2] < ended
    # Each chunk's way out on the same clock: frames ready, sent by the replica, received by the ingress.
    for meta, _ in t.media[:-1]:
        assert meta["frames_ready_at"] <= meta["replica_sent_at"] <= meta["ingress_received_at"] < ended
    assert "replica_sent_at" not in t.media[-1][0] and "ingress_received_at" not in t.media[-1][0]
    assert t.media[0][1][4:8] == b"ftyp"
    assert t.done == {"type": "session.done", "request_id": first["request_id"], "chunks": 4, "stopped": False}
    assert t.close_code == 1000
    frames = decode_frames(t.stream)
    assert len(frames) == 33 and frames[0].shape == (64, 64, 3)


@pytest.mark.skipif(shutil.which("ffprobe") is None, reason="ffprobe (Debian ffmpeg) is not installed")
def test_ffprobe_counts_every_generated_frame(address, tmp_path):
    _, t = run(full_session(address, prompt="a harbour", num_frames=21, size="96x64", fps=12))
    path = tmp_path / "stream.mp4"
    path.write_bytes(t.stream)
    probe = subprocess.run(
        ["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
         "stream=nb_read_frames,width,height,codec_name,pix_fmt,has_b_frames,r_frame_rate", "-of", "json", str(path)],
        capture_output=True, text=True, check=True,
    )
    stream = json.loads(probe.stdout)["streams"][0]
    assert stream["nb_read_frames"] == "21"
    assert (stream["width"], stream["height"], stream["codec_name"], stream["pix_fmt"]) == (96, 64, "h264", "yuv420p")
    assert stream["has_b_frames"] == 0 and stream["r_frame_rate"] == "12/1"


def test_num_frames_rounds_up_to_whole_blocks_and_seconds_use_fps(address):
    first, t = run(full_session(address, prompt="rain", num_frames=10))
    assert first["config"]["num_frames"] == 21 and len(decode_frames(t.stream)) == 21
    first, t = run(full_session(address, prompt="rain", seconds="1", fps=8))
    assert len(decode_frames(t.stream)) == 9


def test_same_seed_same_video(address):
    _, a = run(full_session(address, prompt="dunes", num_frames=21, seed=9))
    _, b = run(full_session(address, prompt="dunes", num_frames=21, seed=9))
    assert all((x == y).all() for x, y in zip(decode_frames(a.stream), decode_frames(b.stream)))


def test_sessions_spread_over_replicas_and_stay_pinned(address):
    # The router sees free slots as the replicas last reported them (every routing_stats_period_s, 0.5 s):
    # let a report come in after the previous tests' sessions freed theirs, or a replica may still look
    # busier than it is and both sessions go to the other.
    time.sleep(3 * 0.5)

    async def two():
        opened = [await start(address, prompt=f"scene {i}") for i in range(2)]
        replicas = [first["replica_id"] for _, _, first in opened]
        for ws, t, _ in opened:
            await until(ws, t, lambda m: m["type"] == "video.chunk_metadata" and m["generation_chunk_index"] == 2)
            await send(ws, {"type": "session.stop"})
        for ws, t, _ in opened:
            await run_to_end(ws, t)
            await ws.close()
        return replicas, [t for _, t, _ in opened]

    replicas, transcripts = run(two())
    assert replicas[0] != replicas[1]
    for t in transcripts:
        assert t.done["stopped"] is True and not t.errors and not t.order_errors
        assert [meta["kind"] for meta, _ in t.media][-1] == "trailer"
        assert len(decode_frames(t.stream)) == sum(meta["num_frames"] for meta, _ in t.media)


# -- controls ------------------------------------------------------------------------
def test_interactions_are_queued_then_reported_on_their_chunk(address):
    async def go():
        ws, t, first = await start(address, prompt="a meadow", num_frames=69)  # 6 blocks
        async with ws:
            await until(ws, t, lambda m: m["type"] == "video.chunk_metadata")
            await send(ws, {"type": "session.interaction", "interaction": {"event_id": "p1", "event": {"prompt": "a storm"}, "transition_chunks": 2}})
            await send(ws, {"type": "session.interaction", "interaction": {"event_id": "cam", "event": {"multi_modal_data": {"camera": {"mode": "velocity", "data": {"translation": [0, 0, 0.2], "rotation": [0, 0, 0, 1]}}}}}})
            await send(ws, {"type": "session.interaction", "interaction": {"event": {"multi_modal_data": {"actions": [["w"], ["w", "l"], []]}}}})
            await run_to_end(ws, t)
        return t

    t = run(go())
    assert not t.errors and not t.order_errors
    queued = t.of_type("session.interaction.queued")
    assert [q["event_id"] for q in queued][:2] == ["p1", "cam"] and len(queued) == 3
    generated = queued[2]["event_id"]
    assert len(generated) == 32
    media = [meta for meta, _ in t.media if meta["kind"] == "media"]
    started = {e: meta["generation_chunk_index"] for meta in media for e in meta["started_event_ids"]}
    completed = {e: meta["generation_chunk_index"] for meta in media for e in meta["completed_event_ids"]}
    assert set(started) == {"p1", "cam", generated}
    assert started["p1"] >= 1 and completed["p1"] == started["p1"] + 1  # blended over two blocks
    assert completed[generated] == started[generated]
    assert "cam" not in completed  # velocity lasts until replaced
    assert all("cam" in meta["active_event_ids"] for meta in media if meta["generation_chunk_index"] >= started["cam"])
    # Each queued ack comes before the chunk that starts its event.
    index = {id(m): i for i, m in enumerate(t.messages)}
    for q in queued:
        chunk = next(meta for meta in media if q["event_id"] in meta["started_event_ids"])
        assert index[id(q)] < index[id(chunk)]


def test_event_id_conflict_and_bad_controls_leave_the_session_running(address):
    bad = [
        ("{not json", "Invalid JSON message"),
        ("[1, 2]", "WebSocket messages must be JSON objects"),
        ({"type": "session.dance"}, "Unknown message type: session.dance"),
        ({"type": "session.interaction"}, "session.interaction requires an interaction object"),
        ({"type": "session.interaction", "interaction": {"event_id": "", "event": {"prompt": "x"}}}, "session.interaction event_id must be a non-empty string"),
        ({"type": "session.interaction", "interaction": {"event_id": "z"}}, "session.interaction requires event object"),
        ({"type": "session.interaction", "interaction": {"event": {"prompt": "x", "negative_prompt": "y"}}}, "session.interaction negative_prompt is not supported in this release"),
        ({"type": "session.interaction", "interaction": {"event": {"prompt": "x"}, "transition_chunks": "2"}}, "session.interaction transition_chunks must be an integer"),
        ({"type": "session.interaction", "interaction": {"event": {"prompt": "x"}, "transition_chunks": True}}, "session.interaction transition_chunks must be an integer"),
        ({"type": "session.interaction", "interaction": {"event": {"prompt": "x"}, "transition_chunks": -1}}, "session.interaction transition_chunks must be >= 0"),
        ("x" * (128 * 1024 + 1), "control message too large"),
    ]

    async def go():
        ws, t, first = await start(address, prompt="a lake")
        async with ws:
            await send(ws, {"type": "session.interaction", "interaction": {"event_id": "dup", "event": {"prompt": "one"}}})
            await send(ws, {"type": "session.interaction", "interaction": {"event_id": "dup", "event": {"prompt": "two"}}})
            for message, _ in bad:
                await send(ws, message)
            await send(ws, {"type": "session.interaction", "interaction": {"event_id": "ok", "event": {"prompt": "x"}, "transition_chunks": 2.0}})
            await send(ws, {"type": "session.ping"})
            # Controls are handled in order: the pong comes after every error above.
            await until(ws, t, lambda m: m["type"] == "session.pong")
            await until(ws, t, lambda m: m["type"] == "video.chunk_metadata")
            await send(ws, {"type": "session.stop"})
            await run_to_end(ws, t)
        return t

    t = run(go())
    messages = [e["message"] for e in t.errors]
    assert messages[0] == "event_id_conflict" and t.errors[0]["code"] == "event_id_conflict" and t.errors[0]["event_id"] == "dup"
    assert messages[1:] == [text for _, text in bad]
    assert [q["event_id"] for q in t.of_type("session.interaction.queued")] == ["dup", "ok"]
    assert t.of_type("session.pong") == [{"type": "session.pong"}]
    assert t.done["stopped"] is True and not t.order_errors


def test_stop_ends_with_trailer_and_done_stopped(address):
    async def go():
        ws, t, first = await start(address, prompt="endless road")  # no length: runs until stopped
        async with ws:
            await until(ws, t, lambda m: m["type"] == "video.chunk_metadata")
            await send(ws, {"type": "session.stop"})
            await run_to_end(ws, t)
        return t

    t = run(go())
    assert t.done["stopped"] is True and t.done["chunks"] == len(t.media)
    assert t.media[-1][0]["kind"] == "trailer" and t.close_code == 1000
    assert len(decode_frames(t.stream)) == sum(meta["num_frames"] for meta, _ in t.media)


# -- bad starts ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "payload, text, close",
    [
        ("{nope", "Invalid JSON in session.start", 1008),
        ("[]", "session.start must be a JSON object", 1008),
        ({"type": "session.ping"}, "Expected session.start, got: session.ping", 1008),
        ({"type": "session.start", "prompt": "x", "format": "mp4"}, "Invalid session.start format: expected 'm4s'.", 1008),
        ({"type": "session.start", "prompt": "  "}, "Invalid session.start: ", 1008),
        ({"type": "session.start", "prompt": "x", "size": "65x64"}, "Invalid session.start: ", 1008),
        ({"type": "session.start", "prompt": "x", "model": "other"}, "Model mismatch: request specifies 'other' but server is running 'world-model'.", 1008),
        ("x" * (4 * 1024 * 1024 + 1), "session.start message too large", 1009),
    ],
)
def test_bad_session_start_gets_its_error_and_close(address, payload, text, close):
    async def go():
        ws = await connect(address)
        t = Transcript()
        async with ws:
            await send(ws, payload)
            await run_to_end(ws, t)
        return t

    t = run(go())
    assert len(t.errors) == 1 and t.errors[0]["message"].startswith(text)
    assert t.close_code == close


def test_start_timeout(address):
    async def go():
        ws = await connect(address)
        t = Transcript()
        began = time.monotonic()
        async with ws:
            await run_to_end(ws, t)
        return t, time.monotonic() - began

    t, waited = run(go())
    assert t.errors[0]["message"] == "Timeout waiting for session.start" and t.close_code == 1008
    assert 1.5 < waited < 10


def test_image_reference_on_a_text_to_video_model_is_refused(address):
    png = io.BytesIO()
    from PIL import Image

    Image.new("RGB", (32, 32), "red").save(png, format="PNG")
    import base64

    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    _, t = run(full_session(address, prompt="x", image_reference={"image_url": url}))
    assert t.errors[0]["message"].startswith("Invalid session.start: ") and t.close_code == 1008


# -- capacity --------------------------------------------------------------------------
def test_over_capacity_then_a_disconnect_frees_a_slot(address):
    async def go():
        held = [await start(address, prompt=f"hold {i}") for i in range(4)]  # 2 replicas x 2 slots
        assert all(first["type"] == "video.start" for _, _, first in held)
        ws, t, first = await start(address, prompt="one too many")
        await run_to_end(ws, t)
        refused = (first, t)
        # Drop one client without a word: its slot must come back within 2 s.
        held[0][0].transport.abort()
        deadline = time.monotonic() + 2.0
        while True:
            ws2, t2, first2 = await start(address, prompt="after the disconnect")
            if first2["type"] == "video.start" or time.monotonic() > deadline:
                break
            await run_to_end(ws2, t2)
            await asyncio.sleep(0.2)
        for ws_, _, _ in held[1:] + [(ws2, t2, first2)]:
            await send(ws_, {"type": "session.stop"})
        for ws_, t_, _ in held[1:] + [(ws2, t2, first2)]:
            await run_to_end(ws_, t_)
        return refused, first2

    (first, t), after = run(go())
    assert first["type"] == "error" and first["code"] == "over_capacity" and first["retry_after_s"] > 0
    assert t.close_code == 1013
    assert after["type"] == "video.start"


# -- pacing (extension) ---------------------------------------------------------------
def test_paced_chunks_follow_the_media_timeline(address):
    async def go():
        ws, t, first = await start(address, prompt="paced", num_frames=45, fps=16, extra_params={"pace_to_media_time": True})
        arrivals = []
        async with ws:
            while True:
                message = await until(ws, t, lambda m: m["type"] in ("video.chunk_metadata", "session.done"))
                if message is None or message["type"] == "session.done":
                    break
                arrivals.append((time.monotonic(), message))
                if message.get("kind") == "trailer":
                    continue  # session.done and the server's close follow at once: nothing is left to pace
                await send(ws, {"type": "session.playback", "position_seconds": max(0.0, time.monotonic() - arrivals[0][0] - 0.1)})
            await run_to_end(ws, t)
        return t, arrivals

    t, arrivals = run(go())
    assert not t.errors and t.done["stopped"] is False
    media = [(at, m) for at, m in arrivals if m["kind"] == "media"]
    start_at, before = media[0][0], 0
    for at, meta in media:
        # A chunk leaves no earlier than its first frame's media time (a little slack for the socket).
        assert at - start_at >= before / 16 - 0.15, (before, at - start_at)
        before += meta["fragment_frames"]
    assert media[-1][0] - start_at >= (before - media[-1][1]["fragment_frames"]) / 16 - 0.15 >= 1.5


def test_bad_pacing_parameters_are_refused(address):
    _, t = run(full_session(address, prompt="x", extra_params={"pace_to_media_time": True, "pacing_lead_seconds": -1}))
    assert t.errors[0]["message"] == "Invalid session.start: extra_params.pacing_lead_seconds must be a finite number >= 0"
    assert t.close_code == 1008


# -- extra_params the seed's clients send ------------------------------------------------
def test_a_camera_action_script_in_extra_params_plays_from_block_zero(address):
    script = [[["l"], ["l"], ["l"]], [["w"], ["w"], []]]
    _, plain = run(full_session(address, prompt="a road", num_frames=33, seed=3))
    _, scripted = run(full_session(address, prompt="a road", num_frames=33, seed=3, extra_params={"camera_action_script": script}))
    assert not scripted.errors and scripted.done["stopped"] is False
    media = [meta for meta, _ in scripted.media if meta["kind"] == "media"]
    assert "camera_action_script" in media[0]["started_event_ids"] and "camera_action_script" in media[1]["completed_event_ids"]
    assert not scripted.of_type("session.interaction.queued")  # part of the start, not a control message
    plain_frames, scripted_frames = decode_frames(plain.stream), decode_frames(scripted.stream)
    # The camera moves from the first block on (same seed, same prompt, different frames in block 0).
    assert np.abs(plain_frames[0].astype(int) - scripted_frames[0].astype(int)).mean() > 0.5


def test_video_codec_options_apply_and_others_are_refused_by_name(address):
    import av

    _, t = run(full_session(address, prompt="a road", num_frames=9, extra_params={"video_codec_options": {"preset": "fast", "crf": 30}}))
    assert not t.errors
    with av.open(io.BytesIO(t.stream)) as container:
        assert container.streams.video[0].codec_context.profile == "High"  # ultrafast, our default, gives Constrained Baseline
    _, refused = run(full_session(address, prompt="a road", extra_params={"video_codec_options": {"x264-params": "bframes=3"}}))
    assert "'x264-params' is not an option this server lets a session set" in refused.errors[0]["message"]
    assert refused.close_code == 1008
