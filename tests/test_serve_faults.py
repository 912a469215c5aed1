"""Faults with real processes: refused interactions, stalls, a dead ingress, a dead replica, a downscale.

The tests on the module's shared app run twice: on an open server, and on one with API keys and
allowed origins configured (the client presenting its key from an allowed origin), so a guarded
server recovers from the same faults the same way.
"""

import asyncio
import json
import os
import signal
import threading
import time
import urllib.request

import pytest
from conftest import app_args, wait_for
from ray import serve
from wsclient import Access, run_to_end, send, start, until

pytestmark = pytest.mark.timeout(240)

APP, PREFIX = "video-faults", "/faults"
PATH = PREFIX + "/v1/realtime/video"


def faults_config(model_dir, **extra):
    return app_args(model_dir, **{"num_replicas": 1, "max_sessions_per_replica": 2, "lease_timeout_s": 2.0, "stall_timeout_s": 2.0, **extra})


GUARDED = Access(key="faults-key", origin="http://app.example")


@pytest.fixture(scope="module", params=["open", "guarded"])
def access(request) -> Access:
    return GUARDED if request.param == "guarded" else Access()


@pytest.fixture(scope="module")
def address(serve_address, plain_model_dir, access):
    from deployments.app import build_app

    guard = {"api_keys": [access.key], "allowed_origins": [access.origin]} if access.key else {}
    serve.run(build_app(faults_config(plain_model_dir, **guard)), name=APP, route_prefix=PREFIX)
    yield serve_address
    serve.delete(APP)


def run(coro):
    return asyncio.run(coro)


def world_stats(app: str = APP) -> dict:
    handle = serve.get_deployment_handle("WorldModel", app_name=app)
    return handle.stats.remote().result(timeout_s=30)


def test_interaction_the_model_cannot_take_is_refused_before_queued_and_its_id_can_be_reused(address, access):
    camera = {"multi_modal_data": {"camera": {"mode": "velocity", "data": {"translation": [0, 0, 1], "rotation": [0, 0, 0, 1]}}}}

    async def go():
        ws, t, first = await start(address, PATH, access, prompt="a cave")
        async with ws:
            await until(ws, t, lambda m: m["type"] == "video.chunk_metadata")
            await send(ws, {"type": "session.interaction", "interaction": {"event_id": "c1", "event": camera}})
            await until(ws, t, lambda m: m["type"] == "error")
            await send(ws, {"type": "session.interaction", "interaction": {"event_id": "c1", "event": {"prompt": "a river"}}})
            await until(ws, t, lambda m: m["type"] == "video.chunk_metadata" and "c1" in m["started_event_ids"])
            await send(ws, {"type": "session.stop"})
            await run_to_end(ws, t)
        return t

    t = run(go())
    failure = t.errors[0]
    assert (failure["message"], failure["code"], failure["event_id"]) == ("Failed to apply interaction", "interaction_failed", "c1")
    assert "camera adapter" in failure["reason"]
    assert len(t.errors) == 1 and t.done["stopped"] is True
    # As in the seed, the refused interaction gets the error instead of `queued`: only the retry is queued,
    # and the error comes before it.
    assert [q["event_id"] for q in t.of_type("session.interaction.queued")] == ["c1"]
    kinds = [m["type"] for m in t.messages if m["type"] in ("error", "session.interaction.queued")]
    assert kinds == ["error", "session.interaction.queued"]


def test_stall_timeout_aborts_the_session_and_frees_its_slot(address, access):
    async def go():
        # 512x512 on CPU takes several seconds a block: longer than the 2 s stall clock.
        ws, t, first = await start(address, PATH, access, prompt="slow", size="512x512")
        began = time.monotonic()
        async with ws:
            await run_to_end(ws, t, timeout=30)
        return first, t, time.monotonic() - began

    first, t, took = run(go())
    assert first["type"] == "video.start"
    assert t.errors[-1]["message"] == "Stall timeout: no generation progress" and t.errors[-1]["code"] == "stall_timeout"
    assert t.close_code == 1011 and took < 6
    assert wait_for(lambda: world_stats()["sessions"] == [], timeout=20)


def test_a_dead_ingress_lets_the_engine_drop_the_session_after_its_lease(address, access):
    async def open_and_kill():
        ws, t, first = await start(address, PATH, access, prompt="orphan")
        await until(ws, t, lambda m: m["type"] == "video.chunk_metadata")
        stats = await asyncio.to_thread(world_stats)
        assert stats["sessions"] == [first["session_id"]], (stats, first["replica_id"])
        health = json.loads(urllib.request.urlopen(f"http://{address}{PREFIX}/healthz", timeout=10).read())
        os.kill(health["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        await run_to_end(ws, t, timeout=10)
        return first, killed_at

    first, killed_at = run(open_and_kill())
    # The lease is 2 s; a block or two more may finish before the engine looks again.
    assert wait_for(lambda: world_stats()["sessions"] == [], timeout=10)
    assert time.monotonic() - killed_at < 10
    assert wait_for(lambda: world_stats()["mailbox_sessions"] == [], timeout=5)


def test_a_dead_replica_gives_replica_lost_within_5s(address, access):
    # Serve replaces the ingress killed above; wait until the app answers again.
    wait_for(lambda: _healthy(address), timeout=60)

    async def go():
        ws, t, first = await start(address, PATH, access, prompt="doomed")
        async with ws:
            await until(ws, t, lambda m: m["type"] == "video.chunk_metadata")
            os.kill((await asyncio.to_thread(world_stats))["pid"], signal.SIGKILL)
            killed = time.monotonic()
            await run_to_end(ws, t, timeout=10)
            return t, time.monotonic() - killed

    t, took = run(go())
    assert t.errors and t.errors[-1]["code"] == "replica_lost"
    assert t.close_code == 1011 and took < 5


def _healthy(address, prefix: str = PREFIX) -> bool:
    try:
        return urllib.request.urlopen(f"http://{address}{prefix}/healthz", timeout=5).status == 200
    except OSError:  # 503 (urllib raises HTTPError, an OSError) while a model loads
        return False


def test_a_session_never_waits_on_model_loading_past_its_bound(serve_address, plain_model_dir):
    """The handshake completes at once; a session.start that finds no loaded replica within `model_wait_s` is told to
    retry (here the bound is a microsecond, so the ingress's first ask of the model cannot have answered)."""
    from deployments.app import build_app

    app, prefix = "video-loading", "/loading"
    serve.run(build_app(faults_config(plain_model_dir, model_wait_s=1e-6)), name=app, route_prefix=prefix)
    try:
        _, t, first = run(start(serve_address, prefix + "/v1/realtime/video", prompt="too early"))
        assert first["type"] == "error" and first["code"] == "model_not_ready" and first["retry_after_s"] > 0
        assert "still loading" in first["message"]
        # Once the model has answered, /healthz says so and sessions start.
        assert wait_for(lambda: _healthy(serve_address, prefix), timeout=30)
        health = json.loads(urllib.request.urlopen(f"http://{serve_address}{prefix}/healthz", timeout=5).read())
        assert health["status"] == "ok"
        _, t, first = run(start(serve_address, prefix + "/v1/realtime/video", prompt="in time", num_frames=9))
        assert first["type"] == "video.start"
    finally:
        serve.delete(app)


def test_a_downscale_keeps_streaming_sessions_and_their_controls(serve_address, world_model_dir):
    from deployments.app import build_app

    app, prefix = "video-scale", "/scale"
    path = prefix + "/v1/realtime/video"
    config = faults_config(world_model_dir, num_replicas=2, max_sessions_per_replica=1, lease_timeout_s=15.0, stall_timeout_s=60.0)
    serve.run(build_app(config), name=app, route_prefix=prefix)
    try:
        async def go():
            opened = [await start(serve_address, path, prompt=f"keep {i}") for i in range(2)]
            assert len({first["replica_id"] for _, _, first in opened}) == 2
            for ws, t, _ in opened:
                await until(ws, t, lambda m: m["type"] == "video.chunk_metadata")
            # Scale to one replica while both stream: Serve stops routing to the replicas it retires and
            # lets them drain; their sessions and controls go on through the mailboxes.
            scaler = threading.Thread(target=serve.run, args=(build_app({**config, "num_replicas": 1}),), kwargs={"name": app, "route_prefix": prefix}, daemon=True)
            scaler.start()
            await asyncio.sleep(3.0)
            for i, (ws, t, _) in enumerate(opened):
                await send(ws, {"type": "session.interaction", "interaction": {"event_id": f"late-{i}", "event": {"prompt": "after the downscale"}}})
            for i, (ws, t, _) in enumerate(opened):
                await until(ws, t, lambda m, i=i: m["type"] == "video.chunk_metadata" and f"late-{i}" in m["started_event_ids"], timeout=30)
                await send(ws, {"type": "session.stop"})
            for ws, t, _ in opened:
                await run_to_end(ws, t)
            # With its sessions over the retired replica stops, and the redeploy finishes.
            await asyncio.to_thread(scaler.join, 90)
            assert not scaler.is_alive()
            return [t for _, t, _ in opened], {first["replica_id"] for _, _, first in opened}

        transcripts, original = run(go())
        for t in transcripts:
            assert not t.errors and t.done["stopped"] is True
        assert wait_for(lambda: _running_replicas(app) == 1, timeout=60)
    finally:
        serve.delete(app)


def _running_replicas(app: str) -> int:
    status = serve.status().applications[app].deployments["WorldModel"]
    return status.replica_states.get("RUNNING", 0)


def test_image_to_video_over_the_wire_and_the_session_length_limit(serve_address, i2v_model_dir):
    import base64
    import io

    import av
    from PIL import Image

    from deployments.app import build_app

    app, prefix = "video-i2v", "/i2v"
    path = prefix + "/v1/realtime/video"
    serve.run(build_app(faults_config(i2v_model_dir, max_session_seconds=1.5, stall_timeout_s=60.0)), name=app, route_prefix=prefix)
    try:
        def data_url(colour):
            buffer = io.BytesIO()
            Image.new("RGB", (80, 48), colour).save(buffer, format="PNG")
            return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()

        async def session(**fields):
            ws, t, first = await start(serve_address, path, **fields)
            async with ws:
                await run_to_end(ws, t)
            return first, t

        def frames(t):
            with av.open(io.BytesIO(t.stream)) as container:
                return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]

        red = data_url("red")
        first, a = run(session(prompt="a red room", num_frames=9, seed=1, image_reference={"image_url": red}))
        assert first["config"]["image_reference"]["image_url"].startswith("data:image/png;base64,<")  # echoed without the payload
        _, b = run(session(prompt="a red room", num_frames=9, seed=1, image_reference={"image_url": data_url("blue")}))
        assert not a.errors and len(frames(a)) == 9
        assert any((x != y).any() for x, y in zip(frames(a), frames(b)))  # the start image shapes the video

        _, missing = run(session(prompt="no image"))
        assert missing.errors[0]["message"].startswith("Invalid session.start: ") and missing.close_code == 1008

        # No length asked: the session runs until the server's limit, then ends normally.
        began = time.monotonic()
        _, long = run(session(prompt="a red room", image_reference={"image_url": red}))
        assert long.done == {"type": "session.done", "request_id": long.messages[0]["request_id"], "chunks": len(long.media), "stopped": False}
        assert 1.5 <= time.monotonic() - began < 30 and not long.errors
    finally:
        serve.delete(app)
