"""Tensor parallel through the served path: logical GPUs, gloo, rank workers in the replica's placement group."""

import asyncio
import os
import signal
import time
import uuid

import numpy as np
import pytest
from conftest import app_args
from ray import serve
from wsclient import run_to_end, start, until

pytestmark = pytest.mark.timeout(300)

TP1, TP2 = "video-tp1", "video-tp2"


@pytest.fixture(scope="module")
def apps(serve_address, world_model_dir):
    from deployments.app import build_app

    serve.run(build_app(app_args(world_model_dir)), name=TP1, route_prefix="/tp1")
    # accelerator auto on a cluster with (logical) GPUs: one GPU bundle per rank, STRICT_PACK.
    serve.run(build_app(app_args(world_model_dir, accelerator="auto", tensor_parallel_size=2)), name=TP2, route_prefix="/tp2")
    yield serve_address
    serve.delete(TP1)
    serve.delete(TP2)


def handle(app):
    return serve.get_deployment_handle("WorldModel", app_name=app)


def latents(app, seed, blocks=3):
    from deployments.contract.session_spec import SessionSpec

    request = SessionSpec(session_id=uuid.uuid4().hex, prompt="a canyon at noon", height=64, width=96, fps=16, seed=seed)
    return handle(app).rollout_latents.remote(request, blocks).result(timeout_s=120)


def test_tp2_makes_the_same_blocks_as_tp1(apps):
    one, two = latents(TP1, seed=3), latents(TP2, seed=3)
    assert len(one) == len(two) == 3
    assert max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(one, two)) <= 1e-4
    other = latents(TP2, seed=4, blocks=1)
    assert float(np.abs(np.asarray(other[0]) - np.asarray(two[0])).max()) > 1e-3  # the check can fail


def test_each_rank_has_its_own_gpu_on_the_replicas_node(apps):
    stats = handle(TP2).stats.remote().result(timeout_s=30)
    ranks = stats["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    gpu_ids = [tuple(r["gpu_ids"]) for r in ranks]
    assert all(len(ids) == 1 for ids in gpu_ids) and len(set(gpu_ids)) == 2
    assert {r["node_id"] for r in ranks} == {stats["node_id"]}
    assert len({r["pid"] for r in ranks} | {stats["pid"]}) == 3  # two worker processes beside the replica


def test_a_session_streams_over_the_wire_with_tp2(apps):
    async def go():
        ws, t, first = await start(apps, "/tp2/v1/realtime/video", prompt="a canyon", num_frames=21)
        async with ws:
            await run_to_end(ws, t)
        return first, t

    first, t = asyncio.run(go())
    assert first["generation"]["frames_per_block"] == 3 and not t.errors
    assert sum(meta["num_frames"] for meta, _ in t.media) == 21 and t.done["stopped"] is False


def test_a_dead_rank_takes_its_replica_down_cleanly(apps):
    async def go():
        ws, t, first = await start(apps, "/tp2/v1/realtime/video", prompt="doomed canyon")
        async with ws:
            await until(ws, t, lambda m: m["type"] == "video.chunk_metadata")
            ranks = (await asyncio.to_thread(lambda: handle(TP2).stats.remote().result(timeout_s=30)))["ranks"]
            os.kill(ranks[1]["pid"], signal.SIGKILL)
            killed = time.monotonic()
            await run_to_end(ws, t, timeout=15)
            return t, time.monotonic() - killed, first["replica_id"]

    t, took, old = asyncio.run(go())
    assert t.errors and t.errors[-1]["code"] == "replica_lost" and t.close_code == 1011
    assert took < 5
    # Serve replaces the replica; the new one serves with both ranks again.
    deadline = time.monotonic() + 120
    while True:
        try:
            stats = handle(TP2).stats.remote().result(timeout_s=30)
            if stats["replica_id"] != old and len(stats["ranks"]) == 2:
                break
        except Exception:
            pass
        assert time.monotonic() < deadline, "no replacement replica"
        time.sleep(2)
