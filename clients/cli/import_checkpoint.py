"""`rtv import-checkpoint`: a published causal Wan transformer plus a stock Wan base -> a world-model folder.

Argument parsing only at import time; `main` loads torch and diffusers.
"""

from __future__ import annotations

import sys

EPILOG = """\
examples (the README lists each family's file and geometry):
  rtv import-checkpoint --weights self_forcing_dmd.pt --base Wan2.1-T2V-1.3B-Diffusers \\
      --output models/self-forcing --frames-per-block 3 --sink-size 0 --window-frames 21 \\
      --shift 5.0 --denoising-steps 1000,750,500,250

The transformer is found under generator_ema, then generator, then the top
level (--key picks another); model./module./_orig_mod. prefixes are dropped;
the original Wan naming is converted by diffusers' single-file converter.
Every tensor is checked against the base's transformer config; on any
mismatch nothing is written. Bad input: one line on stderr, exit 2.
"""


def _steps(text: str) -> tuple[float, ...]:
    import argparse

    try:
        return tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated timesteps such as 1000,750,500,250, got {text!r}") from None


def add_arguments(parser) -> None:
    parser.add_argument("--weights", required=True, metavar="FILE", help="the transformer's weights: .safetensors, or a torch pickle (.pt/.pth, loaded with weights_only=True)")
    parser.add_argument("--base", required=True, metavar="DIR", help="the stock Wan2.1 diffusers folder the checkpoint was trained from (text encoder, tokenizer, VAE, scheduler, transformer/config.json)")
    parser.add_argument("--output", required=True, metavar="DIR", help="the world-model folder to write (must not exist)")
    parser.add_argument("--frames-per-block", type=int, metavar="N", help="latent frames per block (required when the base's config lacks num_frames_per_block)")
    parser.add_argument("--sink-size", type=int, metavar="N", help="latent frames kept from the start of a session (attention sink)")
    parser.add_argument("--window-frames", type=int, metavar="N", help="latent frames of the rolling attention window besides the sink")
    parser.add_argument("--key", metavar="NAME", help="the entry of the weights file that holds the transformer (default: generator_ema, then generator, then the top level)")
    parser.add_argument("--camera-adapter", metavar="DIR", help="a CameraAdapter folder to add (without one, camera and key interactions are refused)")
    from clients.cli.rollout import DTYPE_NAMES  # argparse only

    parser.add_argument("--dtype", choices=DTYPE_NAMES, default="bfloat16", help="dtype of the written transformer (default: bfloat16)")
    parser.add_argument("--shift", type=float, metavar="S", help="flow shift of the distilled schedule, written into scheduler/scheduler_config.json (default: the base's)")
    parser.add_argument("--denoising-steps", type=_steps, metavar="T,T,...", help="the distilled model's timesteps, e.g. 1000,750,500,250 (default: the base's list, or 4 uniform steps)")


def main(args) -> int:
    from pathlib import Path

    from clients.sdk.connection import one_line
    from clients.cli.rollout import quiet_libraries

    quiet_libraries()
    from deployments.generation.geometry import CheckpointError
    from deployments.models.wan_import import DTYPES, ImportRequest, import_checkpoint

    request = ImportRequest(
        weights=Path(args.weights),
        base=Path(args.base),
        output=Path(args.output),
        frames_per_block=args.frames_per_block,
        sink_size=args.sink_size,
        window_frames=args.window_frames,
        key=args.key,
        camera_adapter=Path(args.camera_adapter) if args.camera_adapter else None,
        dtype=DTYPES[args.dtype],
        shift=args.shift,
        denoising_steps=args.denoising_steps,
    )
    try:
        report = import_checkpoint(request)
    except CheckpointError as exc:
        print(f"rtv import-checkpoint: error: {one_line(exc)}", file=sys.stderr)
        return 2
    where = f"'{report.source_key}'" if report.source_key else "the top level"
    print(f"{report.output}: {report.tensors} tensors from {where} of {request.weights}"
          f"{' (original Wan naming, converted)' if report.converted else ''}; geometry {report.geometry}")
    return 0
