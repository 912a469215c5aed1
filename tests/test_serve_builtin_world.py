"""The built-in world model through the served path: keys sent over the WebSocket move the view.

A real `serve.run` of the trained checkpoint, a real websockets client, keys
as `multi_modal_data.actions` (one interaction holding a key for every latent
frame), the fMP4 stream decoded with PyAV and measured block by block.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from conftest import app_args, deployed
from wsclient import Transcript, connect, decode_frames, run_to_end

from deployments.training import measures
from deployments.training.behaviour import LOWER_HALF, PAN_PROMPT, sign_agreement, split_blocks

pytestmark = pytest.mark.timeout(300)

from deployments.models.builtin_world_model import weights_available  # noqa: E402

if not weights_available():
    # They ship with the checkout (deployments/models/weights/world/); a checkout without them has nothing to test here.
    pytest.skip("the trained built-in world model's weights are not in deployments/models/weights/world/", allow_module_level=True)

APP, PREFIX = "builtin-world", "/builtin"
BLOCKS = 6


@pytest.fixture(scope="module")
def address(serve_address, tmp_path_factory):
    from deployments.models.builtin_world_model import install_builtin_world_models

    model = install_builtin_world_models(tmp_path_factory.mktemp("builtin"))["world-model"]
    with deployed(APP, PREFIX, app_args(model)):
        yield serve_address


async def _session(address: str, key: str) -> Transcript:
    ws = await connect(address, PREFIX + "/v1/realtime/video")
    async with ws:
        await ws.send(json.dumps({"type": "session.start", "prompt": PAN_PROMPT, "num_frames": 9 + 12 * (BLOCKS - 1), "seed": 0}))
        # Every latent frame of every block holds the key; actions queue and play frame by frame.
        actions = [[key]] * (3 * BLOCKS)
        await ws.send(json.dumps({"type": "session.interaction", "interaction": {"event_id": "hold", "event": {"multi_modal_data": {"actions": actions}}}}))
        return await run_to_end(ws, Transcript())


def _blocks(stream: bytes) -> list[np.ndarray]:
    return split_blocks(np.stack(decode_frames(stream)), BLOCKS)


def test_keys_sent_over_the_websocket_pan_the_served_view(address) -> None:
    async def both():
        return await asyncio.gather(_session(address, "l"), _session(address, "j"))

    right_turn, left_turn = asyncio.run(both())
    for transcript in (right_turn, left_turn):
        assert transcript.done is not None and not transcript.errors, transcript.errors
    # The interaction may land after block 0 started: judge the blocks after it.
    dx_l = [measures.block_motion(b, LOWER_HALF)[0] for b in _blocks(right_turn.stream)[1:]]
    dx_j = [measures.block_motion(b, LOWER_HALF)[0] for b in _blocks(left_turn.stream)[1:]]
    assert sign_agreement(dx_l, -1) >= 0.8, dx_l  # turning right moves the scene left
    assert sign_agreement(dx_j, 1) >= 0.8, dx_j
