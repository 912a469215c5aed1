"""A replica with `compile_transformer: true`: its warm-up compiles every shape a session meets, so
sessions (alone and denoised together) compile nothing and stream as an eager replica's do."""

import asyncio
import json

import pytest
from conftest import app_args, deployed, wait_for

pytestmark = pytest.mark.timeout(600)

APP, PREFIX = "compiled", "/compiled"
PROMPTS = ["a canyon at noon", "a harbour at dusk", "a forest in fog"]
FRAMES = 9 + 12 * 7  # eight blocks: past the block whose attention context is first full


@pytest.fixture(scope="module")
def handle(serve_address, world_model_dir):
    from ray import serve

    with deployed(APP, PREFIX, app_args(world_model_dir, compile_transformer=True, max_sessions_per_replica=2)):
        yield serve.get_deployment_handle("WorldModel", app_name=APP)


def test_the_warm_up_compiles_what_sessions_alone_and_together_need(handle, serve_address, world_model_dir):
    from wsclient import Transcript, connect, run_to_end

    from deployments.generation.geometry import read_geometry

    g = read_geometry(world_model_dir)
    context_lengths = g.first_full_context_block + 1  # 0, one block, ... a full context

    def warmed_up():
        stats = handle.stats.remote().result(timeout_s=60)
        return stats if stats["warm_up"]["seconds"] is not None else None

    warmed = wait_for(warmed_up, timeout=400, interval=1.0)
    assert warmed is not None, "the replica did not end its warm-up"
    assert warmed["warm_up"]["error"] is None
    # Every context length alone, then again as a batch of two (the replica has two slots).
    assert warmed["warm_up"]["blocks"] == 2 * context_lengths
    graphs = [rank["compiled_graphs"] for rank in warmed["ranks"]]
    assert all(g > 0 for g in graphs)
    assert all(rank["engine_sessions"] == 0 for rank in warmed["ranks"])

    async def session(seed: int) -> Transcript:
        ws = await connect(serve_address, PREFIX + "/v1/realtime/video")
        await ws.send(json.dumps({"type": "session.start", "prompt": PROMPTS[seed], "num_frames": FRAMES, "seed": seed}))
        return await run_to_end(ws, Transcript())

    async def sessions():
        alone = await session(0)
        return [alone, *await asyncio.gather(session(1), session(2))]

    for transcript in asyncio.run(sessions()):
        assert transcript.done is not None and not transcript.errors and not transcript.order_errors
        assert [meta["num_frames"] for meta, _ in transcript.media if meta["kind"] == "media"] == [9] + [12] * 7
    after = handle.stats.remote().result(timeout_s=60)
    assert [rank["compiled_graphs"] for rank in after["ranks"]] == graphs, "a session compiled after the warm-up"
