"""What every benchmark shares: statistics, targets, the machine, and the command line.

Each benchmark is a module with `add_arguments(parser)` and `run(args) -> dict`;
`main(module)` turns it into `python -m bench.NAME [--out FILE]`, which prints
one JSON document on stdout (and writes it to FILE). Timings on a shared
machine drift by tens of percent from minute to minute, so every benchmark
measures the two things it compares side by side, interleaved, in one run,
and its targets are ratios or differences of those.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

DEFAULT_MODELS = "models"


# -- statistics ----------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    data = sorted(values)
    if not data:
        return None
    pos = (len(data) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50)


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def ms_stats(seconds: Sequence[float]) -> dict:
    """p50 / p99 / mean / n of durations given in seconds, reported in milliseconds."""
    return {
        "p50_ms": ms(percentile(seconds, 50)),
        "p99_ms": ms(percentile(seconds, 99)),
        "mean_ms": ms(sum(seconds) / len(seconds)) if seconds else None,
        "n": len(seconds),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 4)


# -- targets -------------------------------------------------------------------
def target(name: str, value: float | None, limit: float, *, at_most: bool = True, unit: str = "", note: str = "") -> dict:
    """One of the issue's targets: `value` against `limit` (an upper bound unless `at_most` is False).

    `miss_by` says how far off a missed target is, in the target's own unit;
    `miss_factor` how many times too large (or too small) the value is.
    """
    met = value is not None and (value <= limit if at_most else value >= limit)
    out = {"name": name, "value": None if value is None else round(value, 4), "limit": limit,
           "bound": "<=" if at_most else ">=", "unit": unit, "met": met}
    if value is not None and not met:
        out["miss_by"] = round(value - limit if at_most else limit - value, 4)
        if at_most:
            out["miss_factor"] = round(value / limit, 3) if limit else None
        else:
            out["miss_factor"] = round(limit / value, 3) if value else None
    if note:
        out["note"] = note
    return out


# -- the machine and the process -------------------------------------------------
def machine() -> dict:
    """What a reader needs to judge the numbers: CPU, cores, memory, load, versions."""
    import psutil

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    for name in ("torch", "ray", "av", "PIL", "transformers", "diffusers"):
        try:
            module = __import__(name)
            info[name] = getattr(module, "__version__", "?")
        except ImportError:
            info[name] = None
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def rss_mib() -> float:
    """This process's resident memory after a full garbage collection, in MiB."""
    import psutil

    gc.collect()
    return round(psutil.Process().memory_info().rss / 2**20, 2)


def set_torch_threads(threads: int | None) -> int:
    """Pin torch's intra-op threads (the served replica gets the same number, so both sides compare)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def default_threads() -> int:
    # One intra-op thread: what a served replica gets by default (Ray sets OMP_NUM_THREADS to its
    # num_cpus), and on a small shared machine the only stable choice. With 2 threads on 2 busy
    # cores, every parallel region waits for a descheduled thread: blocks measured 5-15x slower.
    return 1


def model_dir(root: str, name: str) -> Path:
    """A tiny built-in model under `root`, built on first use (as `serve run` does)."""
    from deployments.models.ensure import ensure_tiny_models

    return ensure_tiny_models(Path(root).expanduser().resolve() / name)


# -- the command line --------------------------------------------------------------
def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=DEFAULT_MODELS, help="folder of the tiny models (built there when absent)")
    parser.add_argument("--torch-threads", type=int, default=default_threads(), help="torch intra-op threads, both sides")
    parser.add_argument("--out", help="also write the JSON here")


def module_name(module: ModuleType) -> str:
    """`bench.serving` also when the module runs as `python -m bench.serving` (then its __name__ is __main__)."""
    spec = getattr(module, "__spec__", None)
    return spec.name if spec is not None else module.__name__


def parse_size(text: str) -> tuple[int, int]:
    """"WxH" -> (width, height)."""
    width, sep, height = text.lower().partition("x")
    if not sep:
        raise argparse.ArgumentTypeError(f"size must look like 640x480, got {text!r}")
    return int(width), int(height)


def parser_for(module: ModuleType) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {module_name(module)}", description=(module.__doc__ or "").split("\n")[0])
    add_common_arguments(parser)
    module.add_arguments(parser)
    return parser


def run_module(module: ModuleType, argv: Sequence[str] | None = None) -> dict:
    """Parse `argv` for `module`, run it, and wrap its result with the bench name, parameters and duration."""
    args = parser_for(module).parse_args(argv)
    params = {k: v for k, v in vars(args).items() if k != "out"}
    began = time.perf_counter()
    result = module.run(args)
    return {"bench": module_name(module).rsplit(".", 1)[-1], "params": params, **result,
            "seconds": round(time.perf_counter() - began, 2)}


def emit(result: dict, out: str | None) -> None:
    text = json.dumps(result, indent=2, default=str)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
    print(text, flush=True)


def main(module: ModuleType, argv: Sequence[str] | None = None) -> int:
    args = parser_for(module).parse_args(argv)
    # Ray's driver prints its workers' task failures at teardown to sys.stdout: while the bench runs,
    # whatever anyone prints goes to stderr, so stdout carries the JSON alone.
    with contextlib.redirect_stdout(sys.stderr):
        result = run_module(module, argv)
    emit(result, args.out)
    return 0


def interleaved(rounds: int, *sides: Callable[[int], None]) -> None:
    """Run each side once per round, rotating who goes first, so drift in the machine's load hits all sides alike."""
    for r in range(rounds):
        order = sides[r % len(sides):] + sides[: r % len(sides)]
        for side in order:
            side(r)


def log(*parts: object) -> None:
    """Progress for people, on stderr (stdout carries only the JSON)."""
    print("[bench]", *parts, file=sys.stderr, flush=True)
