"""`rtv`: the project's command line.

Keep this module (and each command's `add_arguments`) free of heavy imports
(torch, diffusers, transformers, numpy): `rtv --help` must answer at once.
Each command's `run` imports what it needs.

Adding a command: write `add_arguments(parser)` and `run(args) -> int`, and
append a `Command` to COMMANDS.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable, Sequence


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr (exit 2), like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None
    epilog: str | None = None


# -- make-models -------------------------------------------------------------------


def _make_models_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="folder to write world-model/, world-model-i2v/ and omni/ into (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed of the random-weight models (default: 0)")
    parser.add_argument("--random", action="store_true", help="random-weight world models instead of the trained built-in ones")


def _make_models_run(args: argparse.Namespace) -> int:
    from clients.cli.rollout import quiet_libraries

    quiet_libraries()
    from deployments.models.tiny_world_model import make_models

    for name, path in make_models(args.dir, seed=args.seed, trained=not args.random).items():
        print(f"{name}: {path}")
    return 0


# -- rollout -----------------------------------------------------------------------


def _rollout_arguments(parser: argparse.ArgumentParser) -> None:
    # argparse only: neither module imports anything heavy at top level
    from clients.cli.remote_rollout import add_url_argument
    from clients.cli.rollout import add_arguments

    add_arguments(parser)
    add_url_argument(parser)


def _rollout_run(args: argparse.Namespace) -> int:
    """In this process, or (`--url`) against a running server."""
    if getattr(args, "url", None):
        from clients.cli.remote_rollout import main
    else:
        from clients.cli.rollout import main
    return main(args)


ROLLOUT_EPILOG = """\
action script example (a model with 3 latent frames per block; 2 blocks):
  [
    [["w"], ["w", "l"], []],
    [[], [], ["a", "i"]]
  ]
Block k is sent as interaction "actions-kkk" just before block k is generated.

writes OUT/chunk_NNN.npy (uint8 [T,H,W,3]), OUT/chunk_NNN.json (block metadata
+ latency_seconds) and OUT/summary.json. Bad input: one line on stderr, exit 2.
"""


def _module_command(name: str, module: str, help: str, description: str) -> Command:
    """A command whose module (`clients.cli.<module>`) holds `add_arguments`, `main` and `EPILOG`, imported only when
    the parser is built (the module's top level imports nothing heavy)."""

    def load():
        return __import__(f"clients.cli.{module}", fromlist=["add_arguments", "main", "EPILOG"])

    return Command(
        name=name,
        help=help,
        add_arguments=lambda parser: load().add_arguments(parser),
        run=lambda args: load().main(args),
        description=description,
        epilog=load().EPILOG,
    )


COMMANDS: list[Command] = [
    Command(
        name="make-models",
        help="write the built-in checkpoints (world-model, world-model-i2v, omni)",
        add_arguments=_make_models_arguments,
        run=_make_models_run,
        description="Write the built-in checkpoints the server serves by default: the trained world model "
        "(text- and image-to-video) and the tiny understanding model; --random for random-weight world models.",
    ),
    Command(
        name="rollout",
        help="generate a few blocks with a world model in-process and save them",
        add_arguments=_rollout_arguments,
        run=_rollout_run,
        description="Drive one world-model session block by block in this process (no server) and save every block.",
        epilog=ROLLOUT_EPILOG,
    ),
    _module_command(
        "import-checkpoint",
        "import_checkpoint",
        help="turn a published causal Wan checkpoint (Self-Forcing, CausVid, ...) and its Wan base into a world-model folder",
        description="Read a causal Wan transformer as its project ships it (original Wan naming, training wrappers), "
        "convert it with diffusers' single-file converter, check it against the base's config, and write a folder "
        "that `rtv rollout --model`, serve_config.yaml and KubeRay take.",
    ),
    _module_command(
        "train-world",
        "train_world",
        help="train the built-in world model on the procedural world (resumable; --smoke for a quick check)",
        description="Render the procedural world, train the VAE, then the causal transformer with its camera adapter, "
        "and write the weights in the layout `deployments/models/builtin_world_model.py` installs.",
    ),
    _module_command(
        "train-omni",
        "train_omni",
        help="train the built-in understanding model on the procedural world (resumable; --smoke for a quick check)",
        description="Render clips of the procedural world with tones, train the built-in Qwen2.5-Omni thinker to answer "
        "the fixed questions through the server's own input building, and write the weights that `rtv make-models` installs.",
    ),
    _module_command(
        "generate",
        "generate",
        help="stream one session from a running server into an MP4 (+ JSON summary)",
        description="Stream one /v1/realtime/video session: send session.start and scripted interactions, "
        "show live progress, write a playable MP4 and a JSON summary.",
    ),
    _module_command(
        "chat",
        "chat",
        help="stream a video file (and its audio) to a running server and print the answers to queries",
        description="Play a video file to /v1/video/chat/stream like a live camera (JPEG frames at --fps, "
        "16 kHz audio, real-time pacing), ask queries at given times and stream the answers to stdout.",
    ),
]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rtv", description="Realtime video on Ray Serve: tools.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    for command in COMMANDS:
        p = sub.add_parser(
            command.name,
            help=command.help,
            description=command.description or command.help,
            epilog=command.epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(p)
        p.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
