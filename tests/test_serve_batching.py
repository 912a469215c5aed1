"""Sessions of one replica are denoised (and decoded) together, and each still gets its own blocks.

Several sessions at once on one WorldModel replica: the replica's scheduler hands the engine every
block request waiting when it comes free, so the engine calls are fewer than the blocks; each
session's latents equal the same session run alone.
"""

import asyncio
import uuid

import numpy as np
import pytest
from conftest import app_args, deployed

from deployments.contract.session_spec import SessionSpec

pytestmark = pytest.mark.timeout(300)

APP, PREFIX = "batching", "/batching"
BLOCKS = 3


@pytest.fixture(scope="module")
def handle(serve_address, world_model_dir):
    from ray import serve

    # Decoding beside the next block is on by default only on GPUs: turned on here to run that path.
    with deployed(APP, PREFIX, app_args(world_model_dir, max_sessions_per_replica=4, decode_beside_next_block=True)):
        yield serve.get_deployment_handle("WorldModel", app_name=APP)


def request(seed: int, prompt: str) -> SessionSpec:
    return SessionSpec(session_id=uuid.uuid4().hex, prompt=prompt, height=64, width=96, fps=16, seed=seed)


PROMPTS = ["a canyon at noon", "a harbour at dusk", "a forest in fog", "a desert road"]


def test_concurrent_sessions_share_engine_calls_and_keep_their_own_blocks(handle):
    alone = [handle.rollout_latents.remote(request(seed, prompt), BLOCKS).result(timeout_s=120) for seed, prompt in enumerate(PROMPTS)]
    before = handle.stats.remote().result(timeout_s=60)["batching"]["blocks"]

    async def together():
        return await asyncio.gather(*(handle.rollout_latents.remote(request(seed, prompt), BLOCKS) for seed, prompt in enumerate(PROMPTS)))

    batched = asyncio.run(together())
    after = handle.stats.remote().result(timeout_s=60)["batching"]["blocks"]

    blocks, calls = after["requests"] - before["requests"], after["calls"] - before["calls"]
    assert blocks == len(PROMPTS) * BLOCKS
    assert calls < blocks  # some blocks shared an engine call
    for solo, shared in zip(alone, batched):
        assert len(shared) == BLOCKS
        assert max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(solo, shared)) <= 1e-4


def test_streamed_sessions_decode_beside_the_next_block_and_together(handle, serve_address):
    import json

    from wsclient import Transcript, connect, run_to_end

    before = handle.stats.remote().result(timeout_s=60)["batching"]["decodes"]

    async def session(seed: int) -> Transcript:
        ws = await connect(serve_address, PREFIX + "/v1/realtime/video")
        await ws.send(json.dumps({"type": "session.start", "prompt": PROMPTS[seed], "num_frames": 45, "seed": seed}))
        return await run_to_end(ws, Transcript())

    async def together():
        return await asyncio.gather(*(session(seed) for seed in range(3)))

    transcripts = asyncio.run(together())
    after = handle.stats.remote().result(timeout_s=60)["batching"]["decodes"]
    for transcript in transcripts:
        assert transcript.done is not None and not transcript.errors and not transcript.order_errors
        assert [meta["num_frames"] for meta, _ in transcript.media if meta["kind"] == "media"] == [9, 12, 12, 12]
    assert after["requests"] - before["requests"] == 3 * 4  # every block's frames came from the decode lane
