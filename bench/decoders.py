"""Bench, decoders: one block's decode through the model's Wan VAE against the tiny streaming decoder.

Both decode the same raw latents block by block, each through its own
per-session stream state (the way a session decodes), interleaved round by
round. The tiny decoder has the published taew2_1's widths by default and
random weights: its cost does not depend on what it learned. Blocks from the
second on count (the first is short).
"""

from __future__ import annotations

import time

import torch

from bench import common


def add_arguments(parser) -> None:
    parser.add_argument("--size", type=common.parse_size, default=(64, 64), help="WxH of the frames")
    parser.add_argument("--blocks", type=int, default=6, help="blocks per stream (>= 2)")
    parser.add_argument("--rounds", type=int, default=3, help="streams per decoder")
    parser.add_argument("--widths", default="256,128,64,64", help="tiny decoder widths per stage")
    parser.add_argument("--model", help="a world-model folder (default: the tiny built-in one under --models)")


def run(args) -> dict:
    from diffusers import AutoencoderKLWan

    from deployments.generation.tiny_decoder import TinyDecoderConfig, TinyStreamingDecoder, TinyVideoDecoder
    from deployments.generation.vae_stream import StreamingDecoder

    threads = common.set_torch_threads(args.torch_threads)
    folder = args.model or common.model_dir(args.models, "world-model")
    vae = AutoencoderKLWan.from_pretrained(folder, subfolder="vae").eval()
    space, time_factor = vae.config.scale_factor_spatial, vae.config.scale_factor_temporal
    widths = tuple(int(w) for w in args.widths.split(","))
    tiny = TinyVideoDecoder(TinyDecoderConfig.for_vae(vae.config.z_dim, space, time_factor, widths)).eval()
    width, height = args.size
    latents = torch.randn(1, vae.config.z_dim, 3, height // space, width // space)

    def stream(make) -> list[float]:
        decoder, seconds = make(), []
        with torch.no_grad():
            for _ in range(args.blocks):
                began = time.perf_counter()
                decoder.decode(latents)
                seconds.append(time.perf_counter() - began)
        return seconds[1:]

    timings: dict[str, list[float]] = {"vae": [], "tiny": []}
    common.log(f"decoders: {args.rounds} rounds x {args.blocks} blocks at {width}x{height}")
    common.interleaved(
        args.rounds,
        lambda r: timings["vae"].extend(stream(lambda: StreamingDecoder(vae))),
        lambda r: timings["tiny"].extend(stream(lambda: TinyStreamingDecoder(tiny))),
    )
    vae_ms, tiny_ms = common.ms_stats(timings["vae"]), common.ms_stats(timings["tiny"])
    return {
        "results": {
            "torch_threads": threads,
            "frames_per_block": 3 * time_factor,
            "vae_block": vae_ms,
            "tiny_block": tiny_ms,
            "tiny_parameters": sum(p.numel() for p in tiny.parameters()),
            "vae_decoder_parameters": sum(p.numel() for p in vae.decoder.parameters()),
            "tiny_over_vae": common.ratio(tiny_ms["p50_ms"], vae_ms["p50_ms"]),
        },
        "targets": [],
    }


if __name__ == "__main__":
    import sys

    raise SystemExit(common.main(sys.modules[__name__]))
