"""An imported checkpoint through the served path: the same stream as the model it was exported from.

The tiny world model's transformer, written in the original Wan naming and
wrapped as Self-Forcing ships it, is imported against a stock base; the
imported folder and the native one are served side by side, and one session
on each, with the same prompt, seed and keys, must deliver the same frames.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch
from conftest import app_args, deployed
from safetensors.torch import load_file
from wan_layout import make_stock_base, to_original_wan
from wsclient import Transcript, connect, decode_frames, run_to_end

pytestmark = pytest.mark.timeout(300)

BLOCKS = 3


@pytest.fixture(scope="module")
def addresses(serve_address, world_model_dir, tmp_path_factory):
    from deployments.models.wan_import import ImportRequest, import_checkpoint

    work = tmp_path_factory.mktemp("import")
    native = load_file(world_model_dir / "transformer" / "diffusion_pytorch_model.safetensors")
    weights = work / "self_forcing_dmd.pt"
    torch.save({"generator_ema": {f"model.{k}": v for k, v in to_original_wan(native).items()}}, weights)
    imported = work / "imported"
    import_checkpoint(ImportRequest(weights=weights, base=make_stock_base(world_model_dir, work / "base"), output=imported,
                                    frames_per_block=3, sink_size=3, window_frames=12, dtype=torch.float32,
                                    camera_adapter=world_model_dir / "camera_adapter"))
    with deployed("native-world", "/native", app_args(world_model_dir)), deployed("imported-world", "/imported", app_args(imported)):
        yield serve_address


async def _session(address: str, prefix: str) -> Transcript:
    ws = await connect(address, prefix + "/v1/realtime/video")
    async with ws:
        await ws.send(json.dumps({"type": "session.start", "prompt": "a red fox in snow", "num_frames": 9 + 12 * (BLOCKS - 1), "seed": 5}))
        actions = [["w"], ["l"], ["a"]] * BLOCKS
        await ws.send(json.dumps({"type": "session.interaction", "interaction": {"event_id": "keys", "event": {"multi_modal_data": {"actions": actions}}}}))
        return await run_to_end(ws, Transcript())


def test_the_imported_model_streams_what_the_native_one_streams(addresses) -> None:
    async def both():
        return await asyncio.gather(_session(addresses, "/native"), _session(addresses, "/imported"))

    native, imported = asyncio.run(both())
    for transcript in (native, imported):
        assert transcript.done is not None and not transcript.errors, transcript.errors
    a, b = np.stack(decode_frames(native.stream)), np.stack(decode_frames(imported.stream))
    assert a.shape == b.shape and a.shape[0] == 9 + 12 * (BLOCKS - 1)
    np.testing.assert_array_equal(a, b)
