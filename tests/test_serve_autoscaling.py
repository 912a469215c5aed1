"""Autoscaling on sessions with a real Serve controller: up when slots run out, running sessions untouched."""

import asyncio
import time

import pytest
from conftest import app_args
from ray import serve
from wsclient import run_to_end, send, start, until

pytestmark = pytest.mark.timeout(300)

APP, PREFIX = "video-autoscale", "/autoscale"
PATH = PREFIX + "/v1/realtime/video"


def running_replicas() -> int:
    status = serve.status().applications[APP].deployments["WorldModel"]
    return status.replica_states.get("RUNNING", 0)


def test_sessions_past_one_replica_bring_up_a_second_and_running_sessions_keep_running(serve_address, world_model_dir):
    from deployments.app import build_app

    config = app_args(
        world_model_dir,
        min_replicas=1,
        max_replicas=2,
        max_sessions_per_replica=2,
        autoscaling_downscale_delay_s=2.0,
        routing_stats_period_s=0.5,
    )
    serve.run(build_app(config), name=APP, route_prefix=PREFIX)
    try:
        assert running_replicas() == 1

        async def go():
            held = [await start(serve_address, PATH, prompt=f"held {i}") for i in range(2)]
            assert all(first["type"] == "video.start" for _, _, first in held)
            # Keep reading the held sessions: a client that stops reading stalls its own session.
            readers = [asyncio.create_task(run_to_end(ws_, t_)) for ws_, t_, _ in held]
            # The third viewer finds every slot taken; its refusals are demand the policy answers.
            deadline = time.monotonic() + 90
            attempts = 0
            while True:
                attempts += 1
                ws, t, first = await start(serve_address, PATH, prompt="the third")
                if first["type"] == "video.start":
                    break
                assert first["code"] == "over_capacity"
                await run_to_end(ws, t)
                assert time.monotonic() < deadline, "no second replica came up"
                await asyncio.sleep(1.0)
            third = (ws, t, first)
            replicas = {f["replica_id"] for _, _, f in held}
            assert len(replicas) == 1 and third[2]["replica_id"] not in replicas
            # The sessions that were running never noticed: they keep streaming, then end normally.
            before = [len(t_.media) for _, t_, _ in held]
            await until(third[0], third[1], lambda m: m["type"] == "video.chunk_metadata" and m["transport_chunk_index"] >= 2)
            await asyncio.sleep(1.0)
            assert all(len(t_.media) > n for (_, t_, _), n in zip(held, before))
            for ws_, _, _ in held + [third]:
                await send(ws_, {"type": "session.stop"})
            await run_to_end(third[0], third[1])
            await asyncio.gather(*readers)
            return held, third, attempts

        held, third, attempts = asyncio.run(go())
        assert attempts >= 2
        for _, t, _ in held + [third]:
            assert not t.errors and t.done["stopped"] is True
        # No sessions left: after the downscale delay the deployment drains back to one replica.
        deadline = time.monotonic() + 90
        while running_replicas() != 1:
            assert time.monotonic() < deadline, "did not scale back down"
            time.sleep(1.0)
    finally:
        serve.delete(APP)
