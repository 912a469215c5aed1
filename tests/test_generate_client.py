"""`clients.sdk.video`, `rtv generate` and `rtv rollout --url` against a real Serve app on the tiny world model.

One Ray instance and one app per module (the app is served at "/" on a free
port). Sessions are short (3-4 blocks of 64x64 or 96x64) so the module runs in
about a minute on two CPU cores.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import asyncio
import io
import json
import pathlib
import re
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
from conftest import app_args

from clients import cli
from clients.cli.generate import Progress, parse_interact
from clients.media.stream import FRAME_COUNTING_RULE, split_blocks
from clients.sdk.errors import ClientInputError, ClientProtocolError, SessionEndedError
from clients.sdk.video import (
    VideoChunk,
    VideoStart,
    VideoStreamClient,
    image_bytes_data_url,
    interaction_message,
    session_start_message,
    stream_session,
    video_url,
)
from deployments.contract.timeline import frames_for_blocks

REPO = pathlib.Path(__file__).resolve().parents[1]
APP_NAME = "generate-client-tests"

# Four blocks of keyboard actions (3 latent frames per block).
ACTIONS = [
    [["w"], ["w"], ["w"]],
    [["a"], [], []],
    [[], ["l"], ["l"]],
    [["s"], [], ["d"]],
]


_RAY_LOG = re.compile(r"^(\x1b\[[0-9;]*m)?\((raylet|pid=|[A-Za-z]+(:[^ )]*)? pid=)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# =====================================================================================
# The server
# =====================================================================================
@pytest.fixture(scope="module")
def server(serve_address: str, world_model_dir) -> dict:
    """A real Serve app on the tiny world model (camera adapter included); yields its URL and model folder."""
    from ray import serve

    from deployments.app import build_app

    serve.run(build_app(app_args(world_model_dir)), name=APP_NAME, route_prefix="/")
    yield {"url": f"ws://{serve_address}", "model": world_model_dir}
    serve.delete(APP_NAME)


def _run_cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """`rtv ...` in this process: (exit code, stdout, stderr); argparse's exits are caught."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    # Lines Ray forwards from its workers ("(ServeReplica ...) INFO ...", "(raylet) ...") are not ours.
    err = "".join(line for line in err.splitlines(keepends=True) if not _RAY_LOG.match(line))
    return code, out, err


def _decode(path: pathlib.Path) -> np.ndarray:
    import av

    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


# =====================================================================================
# rtv generate: one plain session, shared by the MP4 checks
# =====================================================================================
@pytest.fixture(scope="module")
def generated(server: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("generate")
    mp4, summary = out / "room.mp4", out / "room.json"
    argv = [
        "generate", "--url", server["url"], "--prompt", "a red room", "--blocks", "3", "--seed", "7",
        "--width", "96", "--height", "64", "-o", str(mp4), "--summary", str(summary),
    ]
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # pragma: no cover - argparse
        code = exc.code
    return {"code": code, "mp4": mp4, "summary": summary}


@pytest.mark.timeout(180)
def test_generate_writes_playable_mp4(generated: dict) -> None:
    assert generated["code"] == 0
    frames = _decode(generated["mp4"])
    assert frames.shape == (9 + 12 + 12, 64, 96, 3)
    data = generated["mp4"].read_bytes()
    assert data.index(b"moov") < data.index(b"mdat"), "progressive MP4: moov first"
    assert frames.std() > 1.0, "frames are not blank"


@pytest.mark.timeout(180)
def test_generate_summary_lists_chunks(generated: dict) -> None:
    summary = json.loads(generated["summary"].read_text())
    assert summary["request_id"].startswith("video_stream-")
    assert summary["replica_id"]
    assert summary["seed"] == 7
    assert summary["ok"] is True and summary["failure"] is None and summary["errors"] == []
    assert summary["frames"] == summary["mp4_frames"] == summary["frames_expected"] == 33
    assert (summary["width"], summary["height"]) == (96, 64)
    chunks = summary["chunks"]
    assert [c["kind"] for c in chunks] == ["media", "media", "media", "trailer"]
    assert [c["num_frames"] for c in chunks] == [9, 12, 12, 0]  # what each block generated, as the seed counts
    assert [c["fragment_frames"] for c in chunks] == [8, 12, 12, 1]  # each block's last frame leaves with the next chunk
    assert [c["generation_chunk_index"] for c in chunks] == [0, 1, 2, None]
    assert [c["transport_chunk_index"] for c in chunks] == [0, 1, 2, 3]
    for chunk in chunks:
        assert chunk["latency_seconds"] >= 0 and chunk["byte_length"] > 0
        assert chunk["started_event_ids"] == [] and chunk["active_event_ids"] == [] and chunk["completed_event_ids"] == []
    arrivals = [c["received_at_seconds"] for c in chunks]
    assert arrivals == sorted(arrivals)
    assert 0 < summary["time_to_first_frame_seconds"] == arrivals[0] <= summary["total_seconds"]
    assert summary["done"] == {"chunks": 4, "stopped": False}
    assert summary["close_code"] == 1000


@pytest.mark.timeout(180)
def test_ffprobe_counts_the_same_frames(generated: dict) -> None:
    ffprobe = shutil.which("ffprobe")
    if ffprobe is None:
        pytest.skip("ffprobe is not installed")
    proc = subprocess.run(
        [ffprobe, "-v", "error", "-count_frames", "-select_streams", "v:0",
         "-show_entries", "stream=nb_read_frames,width,height,codec_name,pix_fmt", "-of", "json", str(generated["mp4"])],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    stream = json.loads(proc.stdout)["streams"][0]
    assert int(stream["nb_read_frames"]) == 33
    assert (stream["width"], stream["height"]) == (96, 64)
    assert (stream["codec_name"], stream["pix_fmt"]) == ("h264", "yuv420p")


# =====================================================================================
# rtv generate with --actions and --interact
# =====================================================================================
@pytest.fixture(scope="module")
def interactive(server: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("interactive")
    actions = out / "actions.json"
    actions.write_text(json.dumps(ACTIONS))
    mp4, summary = out / "walk.mp4", out / "walk.json"
    code = cli.main([
        "generate", "--url", server["url"], "--prompt", "a red room", "--actions", str(actions),
        "--interact", "2:a snowy forest", "--seed", "1", "-o", str(mp4), "--summary", str(summary),
    ])
    return {"code": code, "mp4": mp4, "summary": json.loads(summary.read_text())}


@pytest.mark.timeout(180)
def test_actions_and_interact_are_queued_and_reported(interactive: dict) -> None:
    """Every scripted event is acknowledged, then shows up in the metadata of a later chunk, started once.

    The server states a pipeline depth d (1) in video.start: block k's entry goes
    out right after chunk k-1-d arrives (blocks up to d right after video.start).
    An event starts at block k, or k+1 on a loaded machine, never before block k
    and never in a chunk that arrived before the event was sent.
    """
    assert interactive["code"] == 0
    summary = interactive["summary"]
    assert summary["blocks_expected"] == len(ACTIONS)  # --actions sets the number of blocks
    assert _decode(interactive["mp4"]).shape[0] == frames_for_blocks(len(ACTIONS))
    expected = [f"actions-{k:03d}" for k in range(len(ACTIONS))] + ["prompt-002"]
    assert sorted(summary["queued_event_ids"]) == sorted(expected)
    media = [c for c in summary["chunks"] if c["kind"] == "media"]
    by_id = {i["event_id"]: i for i in summary["interactions"]}
    assert sorted(by_id) == sorted(expected)
    for event_id, item in by_id.items():
        target = item["target_block"]
        assert item["queued"] is True and item["error"] is None
        assert item["sent_after_chunk"] == (None if target <= 1 else target - 2)
        starts = [c for c in media if event_id in c["started_event_ids"]]
        if not starts and target == len(media) - 1:
            # Scripted for the last block, sent after the second-to-last chunk: the server had already
            # started the last block, so the event was queued but the session ended before it could start.
            assert item["started_block"] is None
            continue
        assert len(starts) == 1, f"{event_id} must start exactly once: {summary['chunks']}"
        started = starts[0]
        assert started["generation_chunk_index"] == item["started_block"]
        assert target <= item["started_block"] <= target + 1, f"{event_id} scripted for block {target} started at {item['started_block']}"
        assert started["received_at_seconds"] > item["sent_at_seconds"], "an event shows up only in chunks after it was sent"
        assert event_id in started["active_event_ids"]
        assert item["completed_block"] is not None and item["completed_block"] >= item["started_block"]
    assert by_id["prompt-002"]["target_block"] == 2 and by_id["prompt-002"]["sent_after_chunk"] == 0
    assert by_id["actions-000"]["sent_after_chunk"] is None  # right after video.start


@pytest.mark.timeout(180)
def test_interactions_start_on_their_scripted_block(interactive: dict) -> None:
    # Sent pipeline_depth chunks early, each lands on its block. Block 0 starts the moment the replica takes
    # the session, so a first event can miss it; queued actions then play one block late, never more.
    starts = {i["event_id"]: (i["target_block"], i["started_block"]) for i in interactive["summary"]["interactions"]}
    assert all(started is None or started in (target, target + 1) for target, started in starts.values()), starts
    assert sum(started is not None for _, started in starts.values()) >= len(starts) - 1, starts


@pytest.mark.timeout(180)
def test_an_action_script_plays_from_block_0_as_the_in_process_rollout_does(server: dict, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    """--action-script goes with session.start: every entry shapes its own block, block 0 included, so the served
    video is the in-process rollout of the same script and seed (through the same encoder)."""
    script = tmp_path / "actions.json"
    script.write_text(json.dumps(ACTIONS))
    mp4, summary_path = tmp_path / "scripted.mp4", tmp_path / "scripted.json"
    code, _, err = _run_cli(["generate", "--url", server["url"], "--prompt", "a red room", "--action-script", str(script), "--seed", "1",
                             "-o", str(mp4), "--summary", str(summary_path)], capsys)
    assert code == 0, err
    summary = json.loads(summary_path.read_text())
    assert summary["blocks_expected"] == len(ACTIONS) and summary["interactions"] == [] and summary["queued_event_ids"] == []
    media = [c for c in summary["chunks"] if c["kind"] == "media"]
    assert "camera_action_script" in media[0]["started_event_ids"], media[0]

    offline = tmp_path / "offline"
    code, _, err = _run_cli(["rollout", "--model", str(server["model"]), "--prompt", "a red room", "--action-script", str(script), "--seed", "1",
                             "--output-dir", str(offline)], capsys)
    assert code == 0, err
    from deployments.media.fmp4 import FragmentedMP4Encoder

    encoder = FragmentedMP4Encoder(64, 64, 16)
    stream = b"".join(encoder.encode(np.load(offline / f"chunk_{k:03d}.npy")).data for k in range(len(ACTIONS))) + encoder.close().data
    reference = _decode_bytes(stream)
    served = _decode(mp4)
    assert served.shape == reference.shape == (frames_for_blocks(len(ACTIONS)), 64, 64, 3)
    diff = np.abs(served.astype(np.int16) - reference.astype(np.int16)).reshape(len(served), -1).mean(axis=1)
    assert diff.max() < 2.0, f"the served frames differ from the in-process rollout by up to {diff.max():.2f} on average"


def _decode_bytes(data: bytes) -> np.ndarray:
    import av

    with av.open(io.BytesIO(data)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


# =====================================================================================
# rtv rollout --url
# =====================================================================================
@pytest.mark.timeout(180)
def test_rollout_url_matches_offline_timeline(server: dict, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    remote, offline = tmp_path / "remote", tmp_path / "offline"
    code, out, err = _run_cli(["rollout", "--url", server["url"], "--prompt", "a red room", "--num-blocks", "3", "--output-dir", str(remote)], capsys)
    assert code == 0, err
    assert "timeline matches offline" in out
    summary = json.loads((remote / "summary.json").read_text())
    assert summary["matches_offline_frame_timeline"] is True
    assert (summary["chunks_delivered"], summary["chunks_expected"]) == (3, 3)
    assert summary["frames_delivered"] == summary["frames_expected"] == 33
    assert summary["request_id"].startswith("video_stream-") and summary["seed"] == 0
    assert summary["frame_counting_rule"] == FRAME_COUNTING_RULE
    assert [t["decoded_frames"] for t in summary["transport_chunks"]] == [8, 12, 12, 1]
    for k, n in enumerate([9, 12, 12]):
        frames = np.load(remote / f"chunk_{k:03d}.npy")
        assert frames.shape == (n, 64, 64, 3) and frames.dtype == np.uint8
        meta = json.loads((remote / f"chunk_{k:03d}.json").read_text())
        assert meta["block_index"] == k and meta["num_frames"] == n and meta["latency_seconds"] >= 0

    # The same rollout in-process: same summary fields, and the same frames once they went through the same encoder.
    code, _, err = _run_cli(["rollout", "--model", str(server["model"]), "--prompt", "a red room", "--num-blocks", "3", "--output-dir", str(offline)], capsys)
    assert code == 0, err
    offline_summary = json.loads((offline / "summary.json").read_text())
    assert set(offline_summary) <= set(summary)
    assert set(offline_summary["chunks"][0]) <= set(summary["chunks"][0])
    assert set(json.loads((offline / "chunk_000.json").read_text())) <= set(json.loads((remote / "chunk_000.json").read_text()))

    from deployments.media.fmp4 import FragmentedMP4Encoder

    encoder = FragmentedMP4Encoder(64, 64, 16)
    stream = b"".join(encoder.encode(np.load(offline / f"chunk_{k:03d}.npy")).data for k in range(3)) + encoder.close().data
    import av

    with av.open(io.BytesIO(stream)) as container:
        reference = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    blocks = [reference[0:9], reference[9:21], reference[21:33]]
    for k in range(3):
        got = np.load(remote / f"chunk_{k:03d}.npy").astype(np.int16)
        diff = np.abs(got - np.stack(blocks[k]).astype(np.int16)).mean()
        assert diff < 2.0, f"block {k} differs from the offline rollout by {diff:.2f} on average"


@pytest.mark.timeout(180)
def test_rollout_url_with_action_script(server: dict, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    script = tmp_path / "actions.json"
    script.write_text(json.dumps(ACTIONS[:3]))
    argv = ["rollout", "--url", server["url"], "--prompt", "a red room", "--action-script", str(script), "--output-dir", str(tmp_path / "out")]
    code, out, err = _run_cli(argv + ["--model", str(server["model"])], capsys)  # --model with --url: only checks the inputs
    assert code == 0, err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["model"] == str(server["model"])
    assert summary["matches_offline_frame_timeline"] is True and summary["chunks_delivered"] == 3
    started = [i for c in summary["chunks"] for i in c["metadata"]["started_event_ids"]]
    assert set(started) <= {"actions-000", "actions-001", "actions-002"} and "actions-000" in started
    assert all(i["queued"] for i in summary["interactions"])


# =====================================================================================
# Bad inputs: one line, non-zero
# =====================================================================================
def _bad_case(name: str, server: dict, tmp: pathlib.Path) -> tuple[list[str], str]:
    bad_script = tmp / "bad.json"
    bad_script.write_text('[[["w"], ["q"], []]]')
    not_json = tmp / "not.json"
    not_json.write_text("[[")
    good_script = tmp / "good.json"
    good_script.write_text(json.dumps(ACTIONS))
    png = tmp / "start.png"
    from PIL import Image

    Image.new("RGB", (64, 64), (200, 30, 30)).save(png)
    dead = f"ws://127.0.0.1:{_free_port()}"
    url = server["url"]
    out = str(tmp / "out.mp4")
    gen = ["generate", "--prompt", "a red room", "-o", out]
    cases = {
        "missing-image": (gen + ["--url", url, "--image", str(tmp / "missing.png")], "image file"),
        "unknown-key": (gen + ["--url", url, "--actions", str(bad_script)], "unknown key 'q'"),
        "script-not-json": (gen + ["--url", url, "--actions", str(not_json)], "not valid JSON"),
        "action-script-unknown-key": (gen + ["--url", url, "--action-script", str(bad_script)], "unknown key 'q'"),
        "action-script-and-actions": (gen + ["--url", url, "--action-script", str(not_json), "--actions", str(not_json)], "not allowed with argument"),
        "action-script-extra-params": (gen + ["--url", url, "--action-script", str(good_script), "--param", "extra_params=5"],
                                       "--param extra_params must be a JSON object"),
        "action-script-given-twice": (gen + ["--url", url, "--action-script", str(good_script), "--param",
                                             'extra_params={"camera_action_script": []}'], "give the action script once"),
        "interact-syntax": (gen + ["--url", url, "--interact", "three:snow"], "BLOCK:PROMPT"),
        "interact-blank": (gen + ["--url", url, "--interact", "2:  "], "blank"),
        "interact-past-end": (gen + ["--url", url, "--blocks", "2", "--interact", "5:snow"], "past the last block"),
        "unreachable": (gen + ["--url", dead], "cannot connect"),
        "no-scheme": (gen + ["--url", "127.0.0.1:1"], "no scheme"),
        "server-refuses-size": (gen + ["--url", url, "--width", "50", "--height", "64"], "Invalid session.start: width"),
        "server-refuses-image": (gen + ["--url", url, "--image", str(png)], "text-to-video"),
        "rollout-unreachable": (["rollout", "--url", dead, "--prompt", "x", "--output-dir", str(tmp / "ro")], "cannot connect"),
        "rollout-bad-script": (["rollout", "--url", url, "--prompt", "x", "--action-script", str(bad_script), "--output-dir", str(tmp / "ro")], "unknown key"),
        "rollout-no-model-no-url": (["rollout", "--prompt", "x", "--output-dir", str(tmp / "ro")], "--model is required"),
        "rollout-url-tensor-parallel": (["rollout", "--url", url, "--prompt", "x", "--tensor-parallel-size", "2", "--output-dir", str(tmp / "ro")],
                                        "--tensor-parallel-size applies to an in-process rollout"),
    }
    return cases[name]


BAD_CASES = [
    "missing-image", "unknown-key", "script-not-json", "action-script-unknown-key", "action-script-and-actions",
    "action-script-extra-params", "action-script-given-twice", "interact-syntax", "interact-blank", "interact-past-end",
    "unreachable", "no-scheme", "server-refuses-size", "server-refuses-image",
    "rollout-unreachable", "rollout-bad-script", "rollout-no-model-no-url", "rollout-url-tensor-parallel",
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", BAD_CASES)
def test_bad_input_fails_with_one_line(name: str, server: dict, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    argv, needle = _bad_case(name, server, tmp_path)
    code, out, err = _run_cli(argv, capsys)
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert needle in lines[0] and lines[0].startswith(("rtv generate: error:", "rtv rollout: error:")), lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "out.mp4").exists()


@pytest.mark.timeout(180)
def test_unreachable_url_in_a_subprocess(tmp_path: pathlib.Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "clients.cli", "generate", "--url", f"ws://127.0.0.1:{_free_port()}", "--prompt", "x", "-o", str(tmp_path / "o.mp4")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "cannot connect" in proc.stderr and "connection refused" in proc.stderr


# =====================================================================================
# The client library against the real server
# =====================================================================================
@pytest.mark.timeout(180)
def test_client_ping_interactions_errors_and_stop(server: dict) -> None:
    """An unbounded session: pong, queued acks, a refused interaction (the session goes on), then stop."""

    async def scenario() -> tuple:
        async with VideoStreamClient(server["url"]) as client:
            start = await client.start("a red room", seed=3, extra={"fps": 8})
            assert isinstance(start, VideoStart) and start.config["fps"] == 8 and start.seed == 3
            await client.ping()
            event_id = await client.interact(prompt="a snowy forest", transition_chunks=2)
            await client.interact(event_id="cam", camera={"mode": "velocity", "data": {"translation": [0, 0, 0.1]}})
            await client.interact(event_id="cam", actions=[["w"]])  # the id is taken: event_id_conflict
            await client.send_json({"type": "session.interaction", "interaction": {"event": {"prompt": "x"}, "transition_chunks": -1}})
            stopped = False
            async for event in client.events(timeout=60):
                if isinstance(event, VideoChunk) and event.kind == "media" and event.generation_chunk_index >= 2 and not stopped:
                    await client.stop()
                    stopped = True
            await client.wait_closed()
            return client.result(), event_id

    result, event_id = asyncio.run(scenario())
    assert result.ok and result.done is not None and result.done.stopped is True
    assert result.done.chunks == len(result.chunks) and result.chunks[-1].is_trailer
    assert len(result.pongs) == 1
    assert {q.event_id for q in result.queued} == {event_id, "cam"}
    messages = [(e.code, e.message) for e in result.errors]
    assert ("event_id_conflict", "event_id_conflict") in messages
    assert ("invalid_request", "session.interaction transition_chunks must be >= 0") in messages
    assert result.started_block(event_id) is not None and result.started_block("cam") is not None
    assert result.close_code == 1000
    assert result.num_frames == frames_for_blocks(len(result.media_chunks))


@pytest.mark.timeout(180)
def test_stream_session_refused_start_raises(server: dict) -> None:
    with pytest.raises(SessionEndedError, match="Invalid session.start: num_frames"):
        asyncio.run(stream_session(server["url"], message={"type": "session.start", "prompt": "x", "num_frames": 0}))


# =====================================================================================
# The client library against a fake server that breaks the contract (no Ray)
# =====================================================================================
def _fake_server_run(script) -> object:
    """Serve one connection with `script(ws)` after reading session.start; return what the client raised or got."""
    from websockets.asyncio.server import serve as ws_serve

    async def handler(ws) -> None:
        await ws.recv()
        await ws.send(json.dumps({"type": "video.start", "request_id": "video_stream-x", "format": "m4s", "config": {}}))
        await script(ws)

    async def main() -> object:
        async with ws_serve(handler, "127.0.0.1", 0) as srv:
            port = srv.sockets[0].getsockname()[1]
            try:
                return await stream_session(f"ws://127.0.0.1:{port}", "x", event_timeout=10)
            except Exception as exc:  # noqa: BLE001 - the test inspects it
                return exc

    return asyncio.run(main())


def _meta(n: int, index: int = 0) -> str:
    return json.dumps({"type": "video.chunk_metadata", "request_id": "video_stream-x", "kind": "media", "num_frames": 1,
                       "byte_length": n, "transport_chunk_index": index, "generation_chunk_index": index,
                       "started_event_ids": [], "active_event_ids": [], "completed_event_ids": []})


@pytest.mark.timeout(60)
def test_client_refuses_binary_without_metadata() -> None:
    async def script(ws):
        await ws.send(b"\x00" * 10)

    got = _fake_server_run(script)
    assert isinstance(got, ClientProtocolError) and "without a video.chunk_metadata" in str(got)


@pytest.mark.timeout(60)
def test_client_refuses_wrong_byte_length() -> None:
    async def script(ws):
        await ws.send(_meta(12))
        await ws.send(b"\x00" * 10)

    got = _fake_server_run(script)
    assert isinstance(got, ClientProtocolError) and "10 bytes" in str(got) and "byte_length 12" in str(got)


@pytest.mark.timeout(60)
def test_client_refuses_metadata_that_breaks_the_contract_naming_the_field() -> None:
    async def script(ws):
        bad = json.loads(_meta(4)) | {"num_frames": True}
        await ws.send(json.dumps(bad))
        await ws.send(b"abcd")

    got = _fake_server_run(script)
    assert isinstance(got, ClientProtocolError) and "video.chunk_metadata breaks the contract (num_frames" in str(got)


@pytest.mark.timeout(60)
def test_client_refuses_text_between_metadata_and_binary() -> None:
    async def script(ws):
        await ws.send(_meta(4))
        await ws.send(json.dumps({"type": "session.pong"}))
        await ws.send(b"abcd")

    got = _fake_server_run(script)
    assert isinstance(got, ClientProtocolError) and "instead of its binary frame" in str(got)


@pytest.mark.timeout(60)
def test_client_pairs_chunks_and_reports_unclean_end() -> None:
    async def script(ws):
        await ws.send(_meta(4, 0))
        await ws.send(b"abcd")
        await ws.send(json.dumps({"type": "error", "message": "Stall timeout: no generation progress", "code": "stall_timeout"}))
        await ws.close(1011)

    got = _fake_server_run(script)
    assert not isinstance(got, Exception), got
    assert [c.data for c in got.chunks] == [b"abcd"] and got.done is None and not got.ok
    assert got.failure().startswith("session ended with server error: Stall timeout") and "1011" in got.failure()


# =====================================================================================
# Pure helpers
# =====================================================================================
@pytest.mark.timeout(60)
def test_message_builders(tmp_path: pathlib.Path) -> None:
    assert video_url("ws://h:1") == "ws://h:1/v1/realtime/video"
    assert video_url("http://h:1/") == "ws://h:1/v1/realtime/video"
    assert video_url("wss://h/custom") == "wss://h/custom"
    with pytest.raises(ClientInputError):
        video_url("ftp://h")
    start = session_start_message("p", blocks=3, seed=1, width=96, height=64, extra={"fps": 8})
    assert start == {"type": "session.start", "prompt": "p", "num_frames": 33, "seed": 1, "width": 96, "height": 64, "fps": 8}
    with pytest.raises(ClientInputError, match="non-blank"):
        session_start_message("  ")
    with pytest.raises(ClientInputError, match="does not exist"):
        session_start_message("p", image=tmp_path / "none.png")
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8
    assert image_bytes_data_url(png).startswith("data:image/png;base64,")
    assert image_bytes_data_url(b"\xff\xd8\xff\xe0rest").startswith("data:image/jpeg;base64,")
    with pytest.raises(ClientInputError, match="not a PNG, JPEG or WebP"):
        image_bytes_data_url(b"GIF89a")
    message = interaction_message(event_id="e", prompt="q", transition_chunks=2, actions=[["w"], []])
    assert message == {"type": "session.interaction", "interaction": {
        "event_id": "e", "event": {"prompt": "q", "multi_modal_data": {"actions": [["w"], []]}}, "transition_chunks": 2}}
    assert len(interaction_message(prompt="q")["interaction"]["event_id"]) == 32
    with pytest.raises(ClientInputError, match="unknown key"):
        interaction_message(actions=[["x"]])
    assert parse_interact("3:a snowy forest").block == 3 and parse_interact("3: a: b ").prompt == "a: b"


@pytest.mark.timeout(60)
def test_split_blocks_follows_the_hold_back_rule() -> None:
    frames = list(range(33))
    blocks = split_blocks(frames, [8, 12, 12])
    assert [len(b) for b in blocks] == [9, 12, 12] and blocks[1][0] == 9 and blocks[2][-1] == 32


@pytest.mark.timeout(60)
def test_progress_line_in_place_on_a_tty_and_one_per_block_otherwise() -> None:
    from clients.sdk.video import ChunkMetadata, SessionResult

    result = SessionResult(url="ws://x")
    result.chunks.append(VideoChunk(ChunkMetadata("r", "media", 9, 1, 0, 0, fragment_frames=8), b"x", 0.5, 0.5))
    tty, plain = io.StringIO(), io.StringIO()
    for stream, is_tty in ((tty, True), (plain, False)):
        progress = Progress(3, 33, stream=stream, tty=is_tty)
        progress.update(result, 0.5)
        progress.update(result, 1.0)
        progress.message("server error: x")
        progress.finish()
    assert plain.getvalue().count("\n") == 3 and "\r" not in plain.getvalue()
    assert "block 1/3  frames 9/33" in plain.getvalue() and "first frame 0.50s" in plain.getvalue()
    assert tty.getvalue().startswith("\rblock 1/3") and tty.getvalue().count("\n") == 1
