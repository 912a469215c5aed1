"""`rtv train-world`: train the built-in world model on the procedural world (see deployments/training/)."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_OUT = "deployments/models/weights/world"
EPILOG = """\
stages (each skips what WORK already holds, so a stopped run resumes):
  render  trajectories of the procedural world   WORK/data/
  vae     the video VAE (AutoencoderKLWan)        WORK/vae/
  encode  trajectories to latents                 WORK/latents.pt
  decoder the tiny streaming decoder              WORK/tiny_decoder/
  world   transformer + camera adapter + text     WORK/transformer/
  export  fp16 weights as shipped                 OUT/ (--export-step: a kept snapshot)

The shipped weights were made by `rtv train-world` with the defaults (seed 0)
on a 2-core CPU. --smoke runs a few steps of every stage (what CI checks).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT", nargs="?", default=DEFAULT_OUT, help=f"folder for the trained weights (default: {DEFAULT_OUT})")
    parser.add_argument("--work", default="out/train-world", help="folder for data, checkpoints and train.log (default: out/train-world)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and of training (default: 0)")
    parser.add_argument("--trajectories", type=int, help="trajectories to render (default: 640; the VAE trains on the first 320)")
    parser.add_argument("--vae-steps", type=int, help="VAE training steps of each phase (default: 600 on short clips, 1000 mid-stream, 150 decoder-only)")
    parser.add_argument("--steps", type=int, help="transformer training steps (default: 2000)")
    parser.add_argument("--motion-steps", type=int, help="of those, the first ones on image-to-video samples without prompt transitions (default: 1250)")
    parser.add_argument("--context-blur", type=float, metavar="FRACTION", help="share of samples whose context is blurred, targets kept sharp (default: 0.5)")
    parser.add_argument("--own-context", type=float, metavar="FRACTION", help="share of samples whose context is the model's own one-step guess of each block, targets kept true (default: 0)")
    parser.add_argument("--first-block-weight", type=float, metavar="W", help="loss weight of a text-to-video sample's first block (default: 1)")
    parser.add_argument("--first-blocks", type=int, metavar="N", help="lone text-to-video first blocks added to every step, half on the prompts the README names (default: 0)")
    parser.add_argument("--transitions", type=float, metavar="FRACTION", help="share of samples drawn to end inside a prompt transition (default: 0, as they come)")
    parser.add_argument("--transition-tail", type=int, metavar="N", help="those samples may also end up to N blocks after a transition has ended (default: 0)")
    parser.add_argument("--switch-weight", type=float, metavar="W", help="loss weight of blocks inside a prompt transition, after the motion steps (default: 0.3)")
    parser.add_argument("--decoder-steps", type=int, help="tiny streaming decoder training steps (default: 1500)")
    parser.add_argument("--export-step", type=int, metavar="STEP", help="export the weights as they were at STEP (a kept snapshot: every 250 steps and the last) instead of the last checkpoint")
    parser.add_argument("--init-from", metavar="DIR", help="go on from shipped weights (e.g. deployments/models/weights/world): their VAE and tiny decoder are kept, training starts from their transformer")
    parser.add_argument("--camera-position-bands", type=int, metavar="N",
                        help="Fourier bands of the camera adapter's absolute position code (default: the start weights' own, 4 from scratch; "
                             "weights without one grow it from a zero start)")
    parser.add_argument("--workers", type=int, help="rendering processes (default: 2)")
    parser.add_argument("--threads", type=int, help="torch threads (default: 2)")
    parser.add_argument("--stages", help="comma-separated stages to run (default: all)")
    parser.add_argument("--smoke", action="store_true", help="a few steps of every stage, on a small data set")


def main(args: argparse.Namespace) -> int:
    import sys
    from dataclasses import replace

    from clients.cli.rollout import quiet_libraries

    quiet_libraries()
    from deployments.training.train_world import STAGES, MissingSnapshot, WorldTraining, run

    config = WorldTraining()
    if args.smoke:
        config = config.smoke()
    for name, value in (("trajectories", args.trajectories), ("workers", args.workers), ("threads", args.threads)):
        if value is not None:
            if value < 1:
                print(f"rtv train-world: --{name} must be at least 1", file=sys.stderr)
                return 2
            config = replace(config, **{name: value})
    if args.init_from is not None:
        from deployments.models.builtin_world_model import weights_available

        if not weights_available(args.init_from):
            print(f"rtv train-world: --init-from {args.init_from} holds no shipped weights (transformer, vae, text_encoder, camera_adapter .safetensors and spec.json)", file=sys.stderr)
            return 2
        config = replace(config, init_from=Path(args.init_from))
    if args.camera_position_bands is not None:
        if args.camera_position_bands < 0:
            print(f"rtv train-world: --camera-position-bands must be 0 or more, not {args.camera_position_bands}", file=sys.stderr)
            return 2
        config = replace(config, camera_position_bands=args.camera_position_bands)
    if args.decoder_steps is not None:
        if args.decoder_steps < 1:
            print("rtv train-world: --decoder-steps must be at least 1", file=sys.stderr)
            return 2
        config = replace(config, decoder=replace(config.decoder, steps=args.decoder_steps))
    if args.vae_steps is not None:
        config = replace(config, vae=config.vae.scaled(steps=args.vae_steps))
    for flag, value in (("--context-blur", args.context_blur), ("--own-context", args.own_context), ("--transitions", args.transitions),
                        ("--switch-weight", args.switch_weight)):
        if value is not None and not 0.0 <= value <= 1.0:
            print(f"rtv train-world: {flag} must be between 0 and 1, not {value}", file=sys.stderr)
            return 2
    if args.transition_tail is not None and args.transition_tail < 0:
        print(f"rtv train-world: --transition-tail must be 0 or more, not {args.transition_tail}", file=sys.stderr)
        return 2
    if args.first_blocks is not None and args.first_blocks < 0:
        print(f"rtv train-world: --first-blocks must be 0 or more, not {args.first_blocks}", file=sys.stderr)
        return 2
    if args.first_block_weight is not None and not args.first_block_weight > 0:
        print(f"rtv train-world: --first-block-weight must be above 0, not {args.first_block_weight}", file=sys.stderr)
        return 2
    recipe = (("steps", args.steps), ("motion_steps", args.motion_steps), ("context_blur_fraction", args.context_blur),
              ("own_context_fraction", args.own_context), ("switch_weight", args.switch_weight),
              ("first_block_weight", args.first_block_weight), ("first_blocks", args.first_blocks), ("transition_fraction", args.transitions), ("transition_tail", args.transition_tail))
    for name, value in recipe:
        if value is not None:
            config = replace(config, transformer=replace(config.transformer, **{name: value}))
    stages = None
    if args.stages:
        stages = tuple(s.strip() for s in args.stages.split(",") if s.strip())
        unknown = [s for s in stages if s not in STAGES]
        if unknown:
            print(f"rtv train-world: unknown stage {unknown[0]!r}; stages are {', '.join(STAGES)}", file=sys.stderr)
            return 2
    if args.export_step is not None and args.export_step < 1:
        print(f"rtv train-world: --export-step must be at least 1, not {args.export_step}", file=sys.stderr)
        return 2
    try:
        run(Path(args.work), Path(args.out), config, seed=args.seed, stages=stages, export_step=args.export_step)
    except MissingSnapshot as exc:
        print(f"rtv train-world: --export-step: {exc}", file=sys.stderr)
        return 2
    return 0
