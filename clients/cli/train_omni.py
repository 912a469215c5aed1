"""`rtv train-omni`: train the built-in understanding model on the procedural world (see deployments/training/)."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_OUT = "deployments/models/weights/omni"
EPILOG = """\
Clips are rendered once into WORK/clips.pt; WORK/checkpoint.pt lets a stopped
run resume; WORK/train.log has the losses and the held-out accuracy per
question kind (biome, motion, tone, change, count), which OUT/eval.json keeps with
the weights. By default it runs the six phases of RECIPE
(deployments/training/omni_training.py) in two training processes;
--steps, --lr or --kind-weights run one phase instead. --smoke runs a few
steps on a few clips (what CI checks).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT", nargs="?", default=DEFAULT_OUT, help=f"folder for the trained weights (default: {DEFAULT_OUT})")
    parser.add_argument("--work", default="out/train-omni", help="folder for clips, checkpoints and train.log (default: out/train-omni)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and of training (default: 0)")
    parser.add_argument("--steps", type=int, help="optimizer steps of one phase, in place of the recipe's six (default: 3500 with --lr or --kind-weights)")
    parser.add_argument("--lr", type=float, help="peak learning rate of that one phase (default: 0.001)")
    parser.add_argument("--clips", type=int, help="clips to render and train on (default: 1600)")
    parser.add_argument("--eval-clips", type=int, help="held-out clips each evaluation asks every question about (default: 60)")
    parser.add_argument("--init-from", metavar="DIR", help="go on from shipped weights (e.g. deployments/models/weights/omni)")
    parser.add_argument("--motion-sensor", action=argparse.BooleanOptionalAction,
                        help="give the thinker the hand-made motion sensor (deployments/training/omni_motion.py): set into the "
                             "weights unless --init-from ones hold it, and kept fixed while the rest trains (default: on)")
    parser.add_argument("--kind-weights", type=float, nargs=5, metavar=("BIOME", "MOTION", "TONE", "CHANGE", "COUNT"),
                        help="how often each question kind is asked in that one phase (default: 1 2 1 1 0.5)")
    parser.add_argument("--world-clips", type=int, metavar="N",
                        help="also train on N clips the built-in world model makes (WORK/world_clips.pt, grown when a later run asks for more), and report the held-out "
                             "accuracy on its clips (default: 1000; 0: the renderer's clips only)")
    parser.add_argument("--world-share", type=float, help="share of the examples drawn from the world model's clips, in the phases that do not set their own (default: 0.45)")
    parser.add_argument("--world-change-weight", type=int, metavar="N",
                        help="draw a world-model clip with a prompt switch N times as often as one holding its prompt (default: 3)")
    parser.add_argument("--short-share", type=float,
                        help="share of the place and tone questions asked of only 1 to 3 of a clip's frames, as a frame filter may keep (default: 0.15)")
    parser.add_argument("--workers", type=int, help="processes rendering clips and making the world model's (default: 2)")
    parser.add_argument("--procs", type=int, help="training processes sharing each step's examples (default: 2; 1 with --smoke)")
    parser.add_argument("--threads", type=int, help="torch threads of each training process (default: 2 over --procs, at least 1)")
    parser.add_argument("--smoke", action="store_true", help="a few steps on a few clips")


def main(args: argparse.Namespace) -> int:
    import sys
    from dataclasses import replace

    from clients.cli.rollout import quiet_libraries

    quiet_libraries()
    import torch

    from deployments.models.builtin_omni_model import save_shipped, weights_available
    from deployments.training.logs import jsonl_logger
    from deployments.training.omni_training import OmniTraining, Phase, train_omni

    config = OmniTraining().smoke() if args.smoke else OmniTraining()
    for flag, name, value in (("--steps", "steps", args.steps), ("--clips", "clips", args.clips), ("--eval-clips", "eval_clips", args.eval_clips),
                              ("--workers", "workers", args.workers), ("--procs", "procs", args.procs), ("--threads", "threads", args.threads),
                              ("--world-change-weight", "world_change_weight", args.world_change_weight)):
        if value is not None and value < 1:
            print(f"rtv train-omni: {flag} must be at least 1, not {value}", file=sys.stderr)
            return 2
    if args.world_clips is not None and args.world_clips < 0:
        print(f"rtv train-omni: --world-clips must be at least 0, not {args.world_clips}", file=sys.stderr)
        return 2
    config = replace(config, procs=args.procs or (1 if args.smoke else 2))
    for name in ("clips", "eval_clips", "workers", "world_clips", "world_change_weight"):
        if getattr(args, name) is not None:
            config = replace(config, **{name: getattr(args, name)})
    if args.lr is not None and not 0 < args.lr < 1:
        print(f"rtv train-omni: --lr must be between 0 and 1, not {args.lr}", file=sys.stderr)
        return 2
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
    if args.smoke or (args.steps, args.lr, args.kind_weights) != (None, None, None):
        one = config.phases[0] if args.smoke else Phase(3500)
        config = replace(config, phases=(Phase(args.steps or one.steps, args.lr or one.lr, tuple(args.kind_weights or one.kind_weights)),),
                         motion_sensor_phase=0)
    if args.motion_sensor is not None:
        config = replace(config, motion_sensor=args.motion_sensor)
    if args.init_from is not None and not weights_available(args.init_from):
        print(f"rtv train-omni: --init-from {args.init_from} holds no shipped thinker (thinker.safetensors)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads or max(1, 2 // config.procs))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model, _, report = train_omni(work, config, seed=args.seed, init=None if args.init_from is None else Path(args.init_from),
                                  log=jsonl_logger(work / "train.log"))
    save_shipped(model.state_dict(), report, args.out)
    print(f"rtv train-omni: weights in {args.out}; held-out accuracy {report['accuracy']}")
    return 0
