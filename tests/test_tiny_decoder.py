"""The tiny streaming video decoder: block-wise streaming is the whole-clip decode, the published layout loads,
and the engine decodes with it when asked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deployments.contract.session_spec import SessionSpec
from deployments.generation.tiny_decoder import (
    TinyDecoderConfig,
    TinyStreamingDecoder,
    TinyVideoDecoder,
    _MemoryBlock,
    _TimeGrow,
    decode_tiny_together,
)

SMALL = TinyDecoderConfig.for_vae(16, spatial=4, temporal=4, widths=(16, 12, 8, 8))


def test_the_decoder_for_a_vae_undoes_its_factors_in_its_last_stages() -> None:
    wan = TinyDecoderConfig.for_vae(16, spatial=8, temporal=4, widths=(256, 128, 64, 64))
    assert wan == TinyDecoderConfig()  # the published taew2_1 shape
    assert (SMALL.space_upscale, SMALL.time_upscale) == ((False, True, True), (False, True, True))
    assert TinyDecoderConfig.for_vae(4, spatial=1, temporal=2, widths=(8, 8, 8, 8)).space_upscale == (False, False, False)
    for spatial in (3, 16, 0):
        with pytest.raises(ValueError, match=f"spatial factor is {spatial}"):
            TinyDecoderConfig.for_vae(16, spatial=spatial, temporal=4, widths=(8, 8, 8, 8))


@pytest.fixture(scope="module")
def model() -> TinyVideoDecoder:
    torch.manual_seed(0)
    return TinyVideoDecoder(SMALL).eval()


def frame_by_frame(model: TinyVideoDecoder, latents: torch.Tensor) -> torch.Tensor:
    """The decoder's meaning, one frame at a time: a memory block mixes a frame with its own input one frame
    earlier (zeros before the first); a time grow turns a frame into `stride` frames, fed on in order."""
    layers = list(model.decoder)
    memory: dict[int, torch.Tensor] = {}
    out: list[torch.Tensor] = []

    def feed(start: int, x: torch.Tensor) -> None:
        for i in range(start, len(layers)):
            layer = layers[i]
            if isinstance(layer, _MemoryBlock):
                past = memory.get(i, torch.zeros_like(x))
                memory[i] = x
                x = layer(x, past)
            elif isinstance(layer, _TimeGrow):
                grown = layer.conv(x)
                for k in range(layer.stride):
                    feed(i + 1, grown[:, k * x.shape[1] : (k + 1) * x.shape[1]])
                return
            else:
                x = layer(x)
        out.append(x.clamp(0, 1) * 2 - 1)

    with torch.no_grad():
        for f in range(latents.shape[2]):
            feed(0, latents[:, :, f])
    return torch.stack(out, 2)[:, :, model.frames_to_trim :]


def test_streaming_in_blocks_is_the_whole_clip_decode_and_the_frame_by_frame_one(model) -> None:
    z = torch.randn(2, 16, 7, 4, 5)
    whole = model.decode_video(z)
    assert whole.shape == (2, 3, 1 + 4 * 6, 16, 20)  # a causal VAE's count: 1, then 4 per latent frame
    torch.testing.assert_close(whole, frame_by_frame(model, z), atol=1e-5, rtol=1e-5)
    streams = [TinyStreamingDecoder(model), TinyStreamingDecoder(model)]
    pieces = []
    for a, b in [(0, 3), (3, 6), (6, 7)]:  # two sessions decoded together, block by block
        pieces.append(torch.cat(decode_tiny_together(streams, [z[:1, :, a:b], z[1:, :, a:b]])))
    assert [p.shape[2] for p in pieces] == [9, 12, 4]
    torch.testing.assert_close(torch.cat(pieces, 2), whole, atol=1e-6, rtol=1e-6)
    assert streams[0].nbytes > 0
    streams[0].close()
    assert streams[0].nbytes == 0 and not streams[0].started


def test_streams_at_different_points_do_not_batch(model) -> None:
    fresh, going = TinyStreamingDecoder(model), TinyStreamingDecoder(model)
    going.decode(torch.randn(1, 16, 3, 4, 5))
    with pytest.raises(ValueError, match="same point"):
        decode_tiny_together([fresh, going], [torch.randn(1, 16, 3, 4, 5)] * 2)


def published_layout(config: TinyDecoderConfig, seed: int = 1) -> dict[str, torch.Tensor]:
    """A state dict laid out as the published TAEHV files are, written here from that layout's description
    (not from our module): encoder tensors too, and every time grow stored with two timesteps of rows."""
    g = torch.Generator().manual_seed(seed)
    w, z = config.widths, config.latent_channels

    def t(*shape):
        return torch.randn(*shape, generator=g)

    sd = {"encoder.0.weight": t(64, 3, 3, 3), "encoder.0.bias": t(64)}
    sd |= {"decoder.1.weight": t(w[0], z, 3, 3), "decoder.1.bias": t(w[0])}
    index = 3
    for stage in range(3):
        for _ in range(3):
            for k in (0, 2, 4):
                sd[f"decoder.{index}.conv.{k}.weight"] = t(w[stage], w[stage] * (2 if k == 0 else 1), 3, 3)
                sd[f"decoder.{index}.conv.{k}.bias"] = t(w[stage])
            index += 1
        index += 1  # upsample
        sd[f"decoder.{index}.conv.weight"] = t(w[stage] * 2, w[stage], 1, 1)
        index += 1
        sd[f"decoder.{index}.weight"] = t(w[stage + 1], w[stage], 3, 3)
        index += 1
    sd[f"decoder.{index + 1}.weight"] = t(3, w[3], 3, 3)
    sd[f"decoder.{index + 1}.bias"] = t(3)
    return sd


def test_a_published_layout_loads_and_a_broken_one_is_refused_by_name() -> None:
    model = TinyVideoDecoder(SMALL)
    sd = published_layout(SMALL)
    model.load_published(sd)
    # decoder.7 is stage 0's time grow, stride 1 here: the file's last timestep rows are kept.
    torch.testing.assert_close(model.decoder[7].conv.weight, sd["decoder.7.conv.weight"][SMALL.widths[0]:])
    torch.testing.assert_close(model.decoder[13].conv.weight, sd["decoder.13.conv.weight"])
    torch.testing.assert_close(model.decoder[3].conv[0].weight, sd["decoder.3.conv.0.weight"])
    bad = dict(sd, **{"decoder.8.weight": torch.zeros(5, 5, 3, 3)})
    with pytest.raises(ValueError, match=r"decoder\.8\.weight: shape \(5, 5, 3, 3\)"):
        TinyVideoDecoder(SMALL).load_published(bad)
    missing = {k: v for k, v in sd.items() if k != "decoder.22.bias"}
    with pytest.raises(ValueError, match=r"missing: \['decoder\.22\.bias'\]"):
        TinyVideoDecoder(SMALL).load_published(missing)


def test_save_and_load_keep_every_weight(tmp_path, model) -> None:
    model.save_pretrained(tmp_path / "tiny_decoder")
    again = TinyVideoDecoder.from_pretrained(tmp_path / "tiny_decoder")
    assert again.config == SMALL
    z = torch.randn(1, 16, 2, 4, 5)
    torch.testing.assert_close(again.decode_video(z), model.decode_video(z))


# -- in the engine -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_engine(world_model_dir):
    from deployments.generation.engine import WorldModelEngine

    return WorldModelEngine.from_pretrained(world_model_dir, video_decoder="tiny")


def test_the_engine_decodes_with_the_tiny_decoder_when_asked(tiny_engine, engine) -> None:
    spec = SessionSpec(prompt="a red room", height=64, width=64, seed=3)
    tiny, vae = tiny_engine.open_session(spec), engine.open_session(spec)
    try:
        blocks = [tiny_engine.generate_block(tiny) for _ in range(2)]
        assert [b.frames.shape for b in blocks] == [(9, 64, 64, 3), (12, 64, 64, 3)]
        assert isinstance(tiny.decoder, TinyStreamingDecoder)
        reference = engine.generate_block(vae)  # the VAE path: same latents, other pixels
        assert reference.frames.shape == blocks[0].frames.shape and not np.array_equal(reference.frames, blocks[0].frames)
        assert 0 < tiny.decoder.nbytes < vae.decoder.nbytes  # one feature map per memory block, against the VAE's caches
    finally:
        tiny.close()
        vae.close()


def test_deferred_decodes_batch_across_sessions_as_if_alone(tiny_engine) -> None:
    specs = [SessionSpec(prompt="a red room", height=64, width=64, seed=s) for s in (1, 2)]
    together = [tiny_engine.open_session(s) for s in specs]
    alone = [tiny_engine.open_session(s) for s in specs]
    try:
        for _ in range(2):
            tiny_engine.generate_blocks(together, decode=False)
            batched = tiny_engine.decode_many(together)
            single = [tiny_engine.generate_blocks([s])[0].frames for s in alone]
            for a, b in zip(batched, single):
                np.testing.assert_array_equal(a, b)
    finally:
        for s in together + alone:
            s.close()


def test_a_model_without_a_tiny_decoder_is_refused_naming_the_folder(tmp_path) -> None:
    from deployments.generation.checkpoint import CheckpointError
    from deployments.generation.engine import WorldModelEngine
    from deployments.models.tiny_world_model import WorldModelSpec, make_world_model

    folder = make_world_model(tmp_path / "no-tiny", WorldModelSpec(tiny_decoder_widths=None))
    with pytest.raises(CheckpointError, match="has no tiny_decoder/"):
        WorldModelEngine.from_pretrained(folder, video_decoder="tiny")


def test_auto_picks_a_tiny_decoder_only_when_it_was_trained_for_the_model(tmp_path, world_model_dir) -> None:
    import json
    import shutil

    from deployments.generation.checkpoint import resolve_video_decoder

    assert resolve_video_decoder(world_model_dir, "auto") == "vae"  # random weights, for timing: not picked
    assert resolve_video_decoder(world_model_dir, "tiny") == "tiny"
    trained = tmp_path / "trained"
    shutil.copytree(world_model_dir / "tiny_decoder", trained / "tiny_decoder")
    config = json.loads((trained / "tiny_decoder" / "config.json").read_text())
    (trained / "tiny_decoder" / "config.json").write_text(json.dumps(config | {"trained": True}))
    assert resolve_video_decoder(trained, "auto") == "tiny" and resolve_video_decoder(trained, "vae") == "vae"
