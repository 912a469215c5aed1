"""`rtv train-omni`: train the built-in understanding model on the procedural world (see deployments/training/)."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_OUT = "deployments/models/weights/omni"
EPILOG = """\
Clips are rendered once into WORK/clips.pt; WORK/checkpoint.pt lets a stopped
run resume; WORK/train.log has the losses and the held-out accuracy per
question kind (biome, motion, tone, change, count), which OUT/eval.json keeps with
the weights. --smoke runs a few steps on a few clips (what CI checks).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT", nargs="?", default=DEFAULT_OUT, help=f"folder for the trained weights (default: {DEFAULT_OUT})")
    parser.add_argument("--work", default="out/train-omni", help="folder for clips, checkpoints and train.log (default: out/train-omni)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and of training (default: 0)")
    parser.add_argument("--steps", type=int, help="optimizer steps (default: 3500)")
    parser.add_argument("--lr", type=float, help="peak learning rate (default: 0.001)")
    parser.add_argument("--clips", type=int, help="clips to render and train on (default: 1600)")
    parser.add_argument("--eval-clips", type=int, help="held-out clips each evaluation asks every question about (default: 60)")
    parser.add_argument("--init-from", metavar="DIR", help="go on from shipped weights (e.g. deployments/models/weights/omni)")
    parser.add_argument("--motion-sensor", action="store_true",
                        help="give the thinker the hand-made motion sensor (deployments/training/omni_motion.py): set into the "
                             "weights unless --init-from ones hold it, and kept fixed while the rest trains")
    parser.add_argument("--kind-weights", type=float, nargs=5, metavar=("BIOME", "MOTION", "TONE", "CHANGE", "COUNT"),
                        help="how often each question kind is asked (default: 1 2 1 1 0.5)")
    parser.add_argument("--world-clips", type=int, metavar="N",
                        help="also train on N clips the built-in world model makes (WORK/world_clips.pt, grown when a later run asks for more), and report the held-out "
                             "accuracy on its clips (default: 0, the renderer's clips only)")
    parser.add_argument("--world-share", type=float, help="share of the examples drawn from the world model's clips (default: 0.4)")
    parser.add_argument("--world-change-weight", type=int, metavar="N",
                        help="draw a world-model clip with a prompt switch N times as often as one holding its prompt (default: 1)")
    parser.add_argument("--short-share", type=float,
                        help="share of the place and tone questions asked of only 1 to 3 of a clip's frames, as a frame filter may keep (default: 0)")
    parser.add_argument("--workers", type=int, help="rendering processes (default: 2)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    parser.add_argument("--smoke", action="store_true", help="a few steps on a few clips")


def main(args: argparse.Namespace) -> int:
    import sys
    from dataclasses import replace

    from clients.cli.rollout import quiet_libraries

    quiet_libraries()
    import torch

    from deployments.models.builtin_omni_model import save_shipped, weights_available
    from deployments.training.logs import jsonl_logger
    from deployments.training.omni_training import OmniTraining, train_omni

    config = OmniTraining().smoke() if args.smoke else OmniTraining()
    for flag, name, value in (("--steps", "steps", args.steps), ("--clips", "clips", args.clips), ("--eval-clips", "eval_clips", args.eval_clips),
                              ("--workers", "workers", args.workers), ("--world-clips", "world_clips", args.world_clips),
                              ("--world-change-weight", "world_change_weight", args.world_change_weight)):
        if value is not None:
            if value < 1:
                print(f"rtv train-omni: {flag} must be at least 1, not {value}", file=sys.stderr)
                return 2
            config = replace(config, **{name: value})
    if args.lr is not None:
        if not 0 < args.lr < 1:
            print(f"rtv train-omni: --lr must be between 0 and 1, not {args.lr}", file=sys.stderr)
            return 2
        config = replace(config, lr=args.lr, min_lr=min(config.min_lr, args.lr / 10))
    for flag, name, value in (("--world-share", "world_share", args.world_share), ("--short-share", "short_share", args.short_share)):
        if value is not None:
            if not 0 <= value <= 1:
                print(f"rtv train-omni: {flag} must be between 0 and 1, not {value}", file=sys.stderr)
                return 2
            config = replace(config, **{name: value})
    if args.kind_weights is not None:
        if min(args.kind_weights) < 0 or sum(args.kind_weights) <= 0:
            print(f"rtv train-omni: --kind-weights must be non-negative with a positive sum, not {args.kind_weights}", file=sys.stderr)
            return 2
        config = replace(config, kind_weights=tuple(args.kind_weights))
    config = replace(config, motion_sensor=args.motion_sensor)
    if args.init_from is not None and not weights_available(args.init_from):
        print(f"rtv train-omni: --init-from {args.init_from} holds no shipped thinker (thinker.safetensors)", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, args.threads))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model, _, report = train_omni(work, config, seed=args.seed, init=None if args.init_from is None else Path(args.init_from),
                                  log=jsonl_logger(work / "train.log"))
    save_shipped(model.state_dict(), report, args.out)
    print(f"rtv train-omni: weights in {args.out}; held-out accuracy {report['accuracy']}")
    return 0
