"""Import a published-style checkpoint with `rtv import-checkpoint` and roll it out with `rtv rollout`, beside the native model.

Shows, on the model class the GPU bench times (Wan2.1-1.3B architecture, random weights), that a causal
Wan transformer shipped the way Self-Forcing / CausVid ship theirs - original Wan key names, wrapped as
`{"generator_ema": {"model.<key>": tensor}}` in a torch pickle - comes out of the importer as the same
model: the imported transformer's tensors equal the native ones, and `rtv rollout` on both, same prompt,
seed and keys, gives the same frames.

Stages (each timed, each under a limit; a failing one is recorded under `errors` and the next runs where it
can; the partial JSON is rewritten to `--out` after every stage):

- build: the native world model (bench.gpu_bench's builder), or `--checkpoint DIR --reuse`.
- publish: its transformer in the original Wan layout, wrapped as published (`published/generator_ema.pt`),
  and a stock base: the model without AR keys, VAE scale factors or transformer weights. Both are made by
  `tests/wan_layout.py`, written from Wan's own module names and not derived from the importer.
- import: `python -m clients.cli import-checkpoint` as a user runs it, the geometry read off the native model.
- weights: the imported transformer tensor by tensor against the native one.
- rollout_native, rollout_imported: `python -m clients.cli rollout` on each (subprocesses, so each loads
  the model as a user's run does); the rollout's own summary numbers.
- compare: chunk_NNN.npy of both, frame by frame. Only when they differ, the native rollout again, so a
  nondeterministic kernel is told apart from a different model.

    python -m bench.import_rollout --out out/import_rollout.json       # on a GPU machine: 832x480, bfloat16
    python -m bench.import_rollout --spec small --size 64x64 --device cpu --dtype float32 --out out/ir.json
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import common
from bench.gpu_bench import Report, build, gpu_info

REPO = Path(__file__).resolve().parent.parent
PUBLISHED_NAME = "generator_ema.pt"  # as Self-Forcing's checkpoints are saved
KEY_CYCLE = (("w",), ("w", "l"), (), ("a",), ("a", "i"), ("s",), ("d", "j"), ("k",))


def add_arguments(parser) -> None:
    parser.add_argument("--spec", default="wan-1.3b", choices=("wan-1.3b", "small"), help="model sizes")
    parser.add_argument("--size", type=common.parse_size, default=(832, 480), help="WxH")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when there is one)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                        help="dtype of the built and the imported transformer, and of both rollouts")
    parser.add_argument("--blocks", type=int, default=3, help="blocks per rollout")
    parser.add_argument("--prompt", default="a lighthouse on a cliff at dawn")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--work", default="/tmp/rtv-import-rollout", help="scratch folder (emptied first, except a reused checkpoint)")
    parser.add_argument("--checkpoint", default=None, help="the native model's folder (default: WORK/native)")
    parser.add_argument("--reuse", action="store_true", help="use --checkpoint as it is when it exists instead of rebuilding it")
    parser.add_argument("--timeout", type=int, default=300, help="seconds each stage (and each subprocess) may take")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="rollouts without compiled forwards (on a GPU they compile by default; the compiling is timed by gpu_bench)")


# -- stages ---------------------------------------------------------------------------
def prepare_work(args) -> Path:
    """Empty the scratch folder, keeping a checkpoint that is to be reused from inside it."""
    work = Path(args.work).resolve()
    keep = Path(args.checkpoint).resolve() if args.reuse else None
    if work.exists():
        for child in work.iterdir():
            if keep is not None and child == keep:
                continue
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    work.mkdir(parents=True, exist_ok=True)
    return work


def native_model(args, device: str, report: Report) -> Path:
    path = Path(args.checkpoint)
    if args.reuse and (path / "transformer" / "config.json").exists():
        config = json.loads((path / "transformer" / "config.json").read_text())
        report.data["build"] = {"reused": str(path), "transformer_config": config}
        return path
    return build(args, device, report)


def _wan_layout():
    # The tests' helper, imported as the tests import it (tests/ is not a package, and a `tests` package
    # from some site-packages must not shadow it).
    tests = str(REPO / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import wan_layout

    return wan_layout


def publish(native: Path, work: Path, report: Report) -> tuple[Path, Path]:
    """The native transformer as a published project ships it, and the stock base it was 'trained from'."""
    import torch
    from safetensors.torch import load_file

    layout = _wan_layout()
    original = layout.to_original_wan(load_file(native / "transformer" / "diffusion_pytorch_model.safetensors"))
    weights = work / "published" / PUBLISHED_NAME
    weights.parent.mkdir(parents=True)
    torch.save({"generator_ema": {"model." + k: v for k, v in original.items()}}, weights)
    base = layout.make_stock_base(native, work / "base" / "Wan2.1-Diffusers")
    report.data["publish"] = {
        "weights": str(weights),
        "weights_gib": round(weights.stat().st_size / 2**30, 3),
        "tensors": len(original),
        "wrapping": "generator_ema -> model.<original Wan key>",
        "sample_keys": sorted(original)[:4],
        "base": str(base),
    }
    return weights, base


def import_command(args, native: Path, weights: Path, base: Path, output: Path) -> list[str]:
    from deployments.generation.geometry import read_geometry

    geometry = read_geometry(native)
    cmd = [sys.executable, "-m", "clients.cli", "import-checkpoint", "--weights", str(weights), "--base", str(base),
           "--output", str(output), "--frames-per-block", str(geometry.num_frames_per_block),
           "--sink-size", str(geometry.sink_size), "--window-frames", str(geometry.sliding_window_num_frames),
           "--dtype", args.dtype]
    if (native / "camera_adapter").is_dir():
        # A published causal distill has no adapter; adding the native one makes the two models whole alike.
        cmd += ["--camera-adapter", str(native / "camera_adapter")]
    return cmd


def compare_weights(native: Path, imported: Path) -> dict:
    from safetensors.torch import load_file

    name = "transformer/diffusion_pytorch_model.safetensors"
    a, b = load_file(native / name), load_file(imported / name)
    differing = [k for k in a if k in b and (a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not a[k].equal(b[k]))]
    return {"tensors": len(a), "missing": sorted(set(a) - set(b)), "extra": sorted(set(b) - set(a)),
            "differing": differing[:10], "identical": set(a) == set(b) and not differing}


def action_script(native: Path, blocks: int, path: Path) -> Path | None:
    """Keys for every block, so the camera adapter is part of what is compared; None for a model without one."""
    from deployments.generation.geometry import read_geometry

    if not (native / "camera_adapter").is_dir():
        return None
    per_block = read_geometry(native).num_frames_per_block
    keys = [[list(KEY_CYCLE[(k * per_block + f) % len(KEY_CYCLE)]) for f in range(per_block)] for k in range(blocks)]
    path.write_text(json.dumps(keys) + "\n")
    return path


def rollout_command(args, device: str, model: Path, out_dir: Path, actions: Path | None) -> list[str]:
    width, height = args.size
    cmd = [sys.executable, "-m", "clients.cli", "rollout", "--model", str(model), "--prompt", args.prompt,
           "--num-blocks", str(args.blocks), "--output-dir", str(out_dir), "--height", str(height), "--width", str(width),
           "--seed", str(args.seed), "--device", device, "--dtype", args.dtype, "--request-id", out_dir.name]
    return cmd + (["--action-script", str(actions)] if actions else []) + (["--enforce-eager"] if args.enforce_eager else [])


def rollout_numbers(out_dir: Path, wall_s: float) -> dict:
    """The rollout's own summary.json, less its per-chunk entries (their latencies are kept as a list)."""
    summary = json.loads((out_dir / "summary.json").read_text())
    keep = ("chunks_delivered", "chunks_expected", "frames_delivered", "frames_expected", "matches_offline_frame_timeline",
            "time_to_first_frame_seconds", "total_seconds", "load_seconds", "device", "dtype", "height", "width", "seed")
    latencies = [c["chunk_latency_seconds"] for c in summary["chunks"]]
    return {"subprocess_wall_s": round(wall_s, 2), **{k: summary.get(k) for k in keep},
            "chunk_latency_seconds": [round(x, 4) for x in latencies],
            "chunk_latency": common.ms_stats(latencies), "output_dir": str(out_dir)}


def compare_frames(a_dir: Path, b_dir: Path) -> dict:
    """chunk_NNN.npy of two rollouts, frame by frame: the largest absolute pixel difference and which frames differ."""
    import numpy as np

    a_chunks, b_chunks = sorted(a_dir.glob("chunk_*.npy")), sorted(b_dir.glob("chunk_*.npy"))
    out = {"chunks": [len(a_chunks), len(b_chunks)], "frames": 0, "differing_frames": [], "max_abs_diff": 0}
    if [p.name for p in a_chunks] != [p.name for p in b_chunks] or not a_chunks:
        out["identical"] = False
        return out
    for pa, pb in zip(a_chunks, b_chunks):
        a, b = np.load(pa), np.load(pb)
        if a.shape != b.shape:
            out["differing_frames"].append({"chunk": pa.stem, "shapes": [list(a.shape), list(b.shape)]})
            continue
        diff = np.abs(a.astype(np.int16) - b.astype(np.int16)).reshape(a.shape[0], -1).max(axis=1)
        out["frames"] += int(a.shape[0])
        out["max_abs_diff"] = max(out["max_abs_diff"], int(diff.max()))
        out["differing_frames"] += [{"chunk": pa.stem, "frame": int(i), "max_abs_diff": int(d)} for i, d in enumerate(diff) if d]
    out["frame_shape"] = list(a.shape[1:])
    out["identical"] = not out["differing_frames"]
    out["differing_frames"] = out["differing_frames"][:20]
    return out


# -- plumbing -------------------------------------------------------------------------
def run_cli(cmd: list[str], log_path: Path, timeout: int) -> float:
    """Run one `clients.cli` command as a user would, its output to `log_path`; seconds taken, or raise with the log's tail."""
    env = dict(os.environ)
    # The child must import this checkout whatever the caller's directory; keep what PYTHONPATH already has (the GPU
    # machine's extra site-packages).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    common.log(" ".join(cmd))
    began = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    seconds = time.perf_counter() - began
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
        raise RuntimeError(f"exit {proc.returncode} after {seconds:.1f} s: " + " | ".join(tail))
    return seconds


def _log_tail(path: Path, lines: int = 3) -> list[str]:
    return path.read_text(errors="replace").strip().splitlines()[-lines:] if path.exists() else []


def rollout_stage(args, device: str, name: str, model: Path, work: Path, actions: Path | None, report: Report) -> Path:
    out_dir = work / name
    wall = run_cli(rollout_command(args, device, model, out_dir, actions), work / f"{name}.log", args.timeout)
    report.data[name] = rollout_numbers(out_dir, wall)
    return out_dir


def run(args) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.checkpoint = args.checkpoint or str(Path(args.work) / "native")
    report = Report(args.out)
    report.data["machine"] = common.machine()
    report.data["gpu"] = gpu_info(device)
    report.save()
    work = prepare_work(args)
    limit = args.timeout + 30  # the stage's own alarm only backs up the subprocess's timeout

    native = weights = base = actions = None
    imported = work / "imported"
    with report.stage("build", limit):
        native = native_model(args, device, report)
    if native is None:
        return report.data
    with report.stage("publish", limit):
        weights, base = publish(native, work, report)
    if weights is not None:
        with report.stage("import", limit):
            wall = run_cli(import_command(args, native, weights, base, imported), work / "import.log", args.timeout)
            report.data["import"] = {"subprocess_wall_s": round(wall, 2), "output": str(imported), "log": _log_tail(work / "import.log")}
    with report.stage("weights", limit):
        report.data["weights"] = compare_weights(native, imported)
    with report.stage("actions", 30):
        actions = action_script(native, args.blocks, work / "actions.json")
        report.data["action_script"] = str(actions) if actions else None
    with report.stage("rollout_native", limit):
        rollout_stage(args, device, "rollout_native", native, work, actions, report)
    with report.stage("rollout_imported", limit):
        rollout_stage(args, device, "rollout_imported", imported, work, actions, report)
    with report.stage("compare", limit):
        report.data["compare"] = compare_frames(work / "rollout_native", work / "rollout_imported")
    compared = report.data.get("compare", {})
    if compared.get("frames") and not compared["identical"]:  # both rolled out, and differ
        with report.stage("rollout_native_again", limit):
            rollout_stage(args, device, "rollout_native_again", native, work, actions, report)
            report.data["native_vs_native"] = compare_frames(work / "rollout_native", work / "rollout_native_again")
    report.data["verdict"] = {
        "weights_identical": report.data.get("weights", {}).get("identical"),
        "frames_identical": report.data.get("compare", {}).get("identical"),
        "max_abs_pixel_diff": report.data.get("compare", {}).get("max_abs_diff"),
        "stages_failed": [e["stage"] for e in report.data["errors"]],
    }
    return report.data


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
