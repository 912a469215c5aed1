"""`rtv rollout`: drive one world-model session block by block, in-process, and save what it makes.

Inputs are checked before the model is loaded wherever the checkpoint's
configs allow it (geometry, image conditioning and the camera adapter are read
off the folder cheaply). Any bad input ends the command with one line on
stderr and a non-zero exit code, never a traceback.

Output folder:
    chunk_NNN.npy   uint8 [T, H, W, 3] frames of block NNN (np.save)
    chunk_NNN.json  the block's metadata + latency_seconds
    summary.json    the whole rollout (see `run_rollout`)
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable

from clients.sdk.connection import one_line as _one_line
from deployments.contract.actions import Actions

DEFAULT_HEIGHT = 64
DEFAULT_WIDTH = 64
DEFAULT_NUM_BLOCKS = 4
DEFAULT_SEED = 0



class RolloutInputError(ValueError):
    """A bad input; its message is the one line the user sees."""




# -- input validation (no model load) -------------------------------------------


def load_action_script(path: str | os.PathLike, frames_per_block: int) -> list[Actions]:
    """Read an action script: a JSON list with one entry per block, each a list of
    exactly `frames_per_block` per-latent-frame lists of key strings (w a s d i j k l),
    checked by the server's own parser (`deployments.contract.actions`).

    Returns one tuple of per-latent-frame key tuples per block; raises RolloutInputError.
    """
    from deployments.contract.actions import by_block, parse_action_script

    p = Path(path)
    if not p.is_file():
        raise RolloutInputError(f"action script {p} does not exist")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise RolloutInputError(f"action script {p} is not UTF-8 text: {_one_line(exc)}") from None
    except json.JSONDecodeError as exc:
        raise RolloutInputError(f"action script {p} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    try:
        return by_block(parse_action_script(data, frames_per_block, name=f"action script {p}"), frames_per_block)
    except ValueError as exc:
        raise RolloutInputError(str(exc)) from None


def load_image(path: str | os.PathLike):
    """An image file as uint8 (H, W, 3) RGB; raises RolloutInputError."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    p = Path(path)
    if not p.is_file():
        raise RolloutInputError(f"image file {p} does not exist")
    try:
        with Image.open(p) as img:
            return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise RolloutInputError(f"cannot read image {p}: {_one_line(exc)}") from None


@dataclass
class RolloutPlan:
    """Everything a rollout needs, checked."""

    model: Path
    prompt: str
    output_dir: Path
    height: int
    width: int
    seed: int | None
    num_blocks: int
    geometry: object  # deployments.generation.geometry.ARGeometry
    image: object | None = None  # uint8 (H, W, 3) ndarray
    image_path: Path | None = None
    actions: list[Actions] | None = None
    action_script: Path | None = None
    request_id: str | None = None  # default: "rollout-" + a fresh uuid
    device: str = "cpu"
    dtype: str = "float32"  # the transformer's and text encoder's; the VAE stays float32
    tensor_parallel_size: int = 1  # ranks the transformer's heads are split over (one process each)
    gpu_memory_fraction: float | None = None  # the share of each GPU this process may allocate (None: no cap)
    enforce_eager: bool = False  # the seed's flag: no compiled forwards (on a GPU they are compiled by default)


def check_session_inputs(prompt: str, seed: int | None, output_dir: str | os.PathLike) -> Path:
    """The checks a rollout makes of its session with or without the model at hand; the output folder."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise RolloutInputError("prompt must be a non-blank string")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise RolloutInputError(f"seed must be a non-negative integer, got {seed!r}")
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise RolloutInputError(f"output path {out} exists and is not a folder")
    return out


def session_blocks(actions: list[Actions] | None, num_blocks: int | None) -> int:
    """The blocks a rollout runs: the action script's, else --num-blocks, else the default; they must agree."""
    if num_blocks is not None and (isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1):
        raise RolloutInputError(f"--num-blocks must be a positive integer, got {num_blocks!r}")
    if actions is None:
        return num_blocks if num_blocks is not None else DEFAULT_NUM_BLOCKS
    if num_blocks is not None and num_blocks != len(actions):
        raise RolloutInputError(
            f"--num-blocks {num_blocks} disagrees with the action script, which has {len(actions)} blocks (give one or make them match)"
        )
    return len(actions)


def prepare_rollout(
    model: str | os.PathLike,
    prompt: str,
    output_dir: str | os.PathLike,
    *,
    image: str | os.PathLike | None = None,
    action_script: str | os.PathLike | None = None,
    num_blocks: int | None = None,
    height: int = DEFAULT_HEIGHT,
    width: int = DEFAULT_WIDTH,
    seed: int | None = DEFAULT_SEED,
    request_id: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    tensor_parallel_size: int = 1,
    gpu_memory_fraction: float | None = None,
    enforce_eager: bool = False,
) -> RolloutPlan:
    """Check every input that can be checked without loading the model; raises RolloutInputError."""
    from deployments.generation.geometry import (
        CheckpointError,
        read_geometry,
        read_traits,
    )

    from deployments.models.locate import locate_model

    try:
        model_dir = locate_model(model)  # a folder, or a hub id found in (or fetched to) the hub's cache
    except CheckpointError as exc:
        raise RolloutInputError(_one_line(exc)) from None
    if not model_dir.is_dir():
        raise RolloutInputError(f"model path {model_dir} is not a folder")
    try:
        geometry = read_geometry(model_dir)
    except CheckpointError as exc:
        raise RolloutInputError(_one_line(exc)) from None

    out = check_session_inputs(prompt, seed, output_dir)
    try:
        geometry.check_size(height, width)
    except ValueError as exc:
        raise RolloutInputError(_one_line(exc)) from None

    try:
        traits = read_traits(model_dir)
    except CheckpointError as exc:
        raise RolloutInputError(_one_line(exc)) from None
    image_conditioned, has_camera = traits.image_conditioned, traits.camera_adapter
    image_array = None
    if image is not None:
        if image_conditioned is False:
            raise RolloutInputError(f"model {model_dir} is text-to-video: it takes no --image")
        image_array = load_image(image)
    elif image_conditioned:
        raise RolloutInputError(f"model {model_dir} is image-to-video: pass a start image with --image")

    actions = None
    if action_script is not None:
        actions = load_action_script(action_script, geometry.num_frames_per_block)
        if not has_camera:
            raise RolloutInputError(f"model {model_dir} has no camera adapter: it takes no keyboard actions (drop --action-script)")

    blocks = session_blocks(actions, num_blocks)
    if request_id is not None and (not isinstance(request_id, str) or not request_id.strip()):
        raise RolloutInputError("--request-id must be a non-blank string")
    device, dtype = _device_and_dtype(device, dtype)
    _check_parallel(model_dir, device, tensor_parallel_size, gpu_memory_fraction)
    return RolloutPlan(
        model=model_dir,
        prompt=prompt,
        output_dir=out,
        height=height,
        width=width,
        seed=seed,
        num_blocks=blocks,
        geometry=geometry,
        image=image_array,
        image_path=Path(image) if image is not None else None,
        actions=actions,
        action_script=Path(action_script) if action_script is not None else None,
        request_id=request_id,
        device=device,
        dtype=dtype,
        tensor_parallel_size=tensor_parallel_size,
        gpu_memory_fraction=gpu_memory_fraction,
        enforce_eager=bool(enforce_eager),
    )


DTYPE_NAMES = ("bfloat16", "float16", "float32")


def _device_and_dtype(device: str | None, dtype: str | None) -> tuple[str, str]:
    """The seed's defaults: a GPU when there is one (bfloat16 there), else the CPU in float32."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise RolloutInputError(f"--device must be cpu or cuda (or cuda:N), got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RolloutInputError(f"--device {device}: no CUDA device is visible to this process")
    if dtype is None:
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    if dtype not in DTYPE_NAMES:
        raise RolloutInputError(f"--dtype must be one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")
    return device, dtype


def _check_parallel(model_dir: Path, device: str, size: int, fraction: float | None) -> None:
    """--tensor-parallel-size and --gpu-memory-fraction, checked against the device and the transformer's config."""
    import torch

    from deployments.generation.geometry import CheckpointError
    from deployments.generation.tensor_parallel import check_shardable

    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise RolloutInputError(f"--tensor-parallel-size must be a positive integer, got {size!r}")
    if size > 1:
        if device.startswith("cuda:"):
            raise RolloutInputError("--tensor-parallel-size over 1 places rank r on cuda:r: give --device cuda, not one GPU")
        if device == "cuda" and size > torch.cuda.device_count():
            raise RolloutInputError(f"--tensor-parallel-size {size} needs {size} GPUs; {torch.cuda.device_count()} are visible")
        try:
            check_shardable(json.loads((model_dir / "transformer" / "config.json").read_text()), size)
        except (CheckpointError, OSError, ValueError) as exc:
            raise RolloutInputError(_one_line(exc)) from None
    if fraction is not None:
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise RolloutInputError(f"--gpu-memory-fraction must be a number in (0, 1], got {fraction!r}")
        if not device.startswith("cuda"):
            raise RolloutInputError("--gpu-memory-fraction caps GPU memory: it needs --device cuda")


# -- running -----------------------------------------------------------------------


def quiet_libraries() -> None:
    """Silence diffusers / transformers / hub warnings and progress bars (cheap; call before loading)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    try:
        from diffusers.utils import logging as dlog

        dlog.set_verbosity_error()
        dlog.disable_progress_bar()
    except Exception:  # pragma: no cover - a missing/changed library only costs some noise
        pass
    try:
        from transformers.utils import logging as tlog

        tlog.set_verbosity_error()
        tlog.disable_progress_bar()
    except Exception:  # pragma: no cover
        pass
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except Exception:  # pragma: no cover
        pass


def run_rollout(plan: RolloutPlan, log: Callable[[str], None] | None = None, engine=None) -> dict:
    """Load the model (unless `engine` is given), run `plan.num_blocks` blocks, write the outputs; returns the summary.

    Block k of the action script is submitted as Interaction(event_id="actions-kkk")
    just before block k is generated, so it applies at that block.
    Raises RolloutInputError for inputs only the loaded engine can refuse.
    """
    log = log or (lambda line: None)
    t_start = time.perf_counter()
    followers = None
    if engine is None:
        followers = _Followers(plan)
        try:
            engine = load_engine(plan, rank=0, init_method=followers.init_method)
        except BaseException:
            followers.stop(finished=False)
            raise
    finished = False
    try:
        summary = _lead(plan, engine, log, t_start)
        finished = True
        return summary
    finally:
        if followers is not None:
            followers.stop(finished)


def _lead(plan: RolloutPlan, engine, log: Callable[[str], None], t_start: float) -> dict:
    """Rank 0's rollout: every block timed, saved and logged, then the summary."""
    import numpy as np

    geometry = engine.geometry
    if plan.actions is not None and not engine.accepts_camera:
        raise RolloutInputError(f"model {plan.model} has no camera adapter: it takes no keyboard actions (drop --action-script)")
    session = _open(engine, plan)
    t_ready = time.perf_counter()
    load_seconds = t_ready - t_start

    plan.output_dir.mkdir(parents=True, exist_ok=True)
    chunks: list[dict] = []
    time_to_first_frame = None
    try:
        t0 = time.perf_counter()
        for k, block in _blocks(engine, session, plan):
            t1 = time.perf_counter()
            latency = t1 - t0
            if k == 0:
                time_to_first_frame = t1 - t_ready
            frames = np.ascontiguousarray(block.frames, dtype=np.uint8)
            chunks.append(save_chunk(plan.output_dir, k, frames, block.metadata.to_dict(), latency))
            log(chunk_line(k, latency, frames.shape[0], frames.shape[1:]))
            t0 = time.perf_counter()
    finally:
        session.close()
    total = time.perf_counter() - t_start

    frames_delivered = sum(c["num_frames"] for c in chunks)
    frames_expected = geometry.frames_for_blocks(plan.num_blocks)
    matches = (
        len(chunks) == plan.num_blocks
        and frames_delivered == frames_expected
        and all(c["num_frames"] == geometry.frames_in_block(c["index"]) for c in chunks)
    )
    summary = {
        "request_id": plan.request_id or "rollout-" + uuid.uuid4().hex,
        "model": str(plan.model),
        "prompt": plan.prompt,
        "seed": session.seed,
        "height": plan.height,
        "width": plan.width,
        "image": str(plan.image_path) if plan.image_path is not None else None,
        "action_script": str(plan.action_script) if plan.action_script is not None else None,
        "device": plan.device,
        "dtype": plan.dtype,
        "tensor_parallel_size": plan.tensor_parallel_size,
        "gpu_memory_fraction": plan.gpu_memory_fraction,
        "enforce_eager": plan.enforce_eager,
        "chunks_delivered": len(chunks),
        "chunks_expected": plan.num_blocks,
        "frames_delivered": frames_delivered,
        "frames_expected": frames_expected,
        "matches_offline_frame_timeline": matches,
        "time_to_first_frame_seconds": time_to_first_frame,
        "total_seconds": total,
        "load_seconds": load_seconds,
        "chunks": chunks,
    }
    (plan.output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def load_engine(plan: RolloutPlan, rank: int = 0, init_method: str | None = None):
    """The plan's engine on this rank (rank r of a tensor-parallel rollout sits on cuda:r, or the CPU with gloo; the
    ranks meet at `init_method`)."""
    import torch

    from deployments.generation.engine import WorldModelEngine
    from deployments.generation.geometry import CheckpointError

    quiet_libraries()
    device = plan.device
    tp = None
    if plan.tensor_parallel_size > 1:
        from deployments.generation.tensor_parallel import TensorParallel

        kind = "cuda" if device.startswith("cuda") else "cpu"
        if kind == "cuda":
            device = f"cuda:{rank}"
            torch.cuda.set_device(device)
        tp = TensorParallel.initialize(rank, plan.tensor_parallel_size, init_method, device_type=kind, timeout=TP_TIMEOUT)
    if plan.gpu_memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(plan.gpu_memory_fraction, torch.device(device))
    try:
        # Compiling pays on a GPU; on a CPU it costs more than a short rollout saves.
        compile_blocks = device.startswith("cuda") and not plan.enforce_eager
        return WorldModelEngine.from_pretrained(plan.model, device=device, dtype=getattr(torch, plan.dtype), tensor_parallel=tp,
                                                compile_blocks=compile_blocks)
    except (CheckpointError, ValueError, OSError) as exc:
        raise RolloutInputError(f"cannot load model {plan.model}: {_one_line(exc)}") from None


def _open(engine, plan: RolloutPlan):
    from deployments.contract.session_spec import SessionSpec

    try:
        return engine.open_session(SessionSpec(prompt=plan.prompt, height=plan.height, width=plan.width, seed=plan.seed, image=plan.image))
    except ValueError as exc:
        raise RolloutInputError(_one_line(exc)) from None


def _blocks(engine, session, plan: RolloutPlan):
    """(k, block) for each block; block k's actions are submitted just before it (every rank does the same)."""
    from deployments.contract.events import Interaction
    from deployments.generation.interactions import InteractionRefused

    for k in range(plan.num_blocks):
        if plan.actions is not None:
            try:
                session.submit(Interaction(event_id=f"actions-{k:03d}", actions=plan.actions[k]))
            except InteractionRefused as exc:
                raise RolloutInputError(f"action script block {k} refused: {_one_line(exc)}") from None
        yield k, engine.generate_block(session)


TP_TIMEOUT = timedelta(seconds=300)  # a rank that died leaves the others in a collective: give up after this


class _Followers:
    """Ranks 1..N-1 of a tensor-parallel rollout: processes that run the same session and write nothing."""

    def __init__(self, plan: RolloutPlan) -> None:
        import tempfile

        import torch.multiprocessing as mp

        self._dir = tempfile.TemporaryDirectory(prefix="rtv-rollout-tp-")
        self.init_method = f"file://{self._dir.name}/store"
        context = mp.get_context("spawn")
        self.processes = [context.Process(target=_follow, args=(plan, rank, self.init_method), daemon=True)
                          for rank in range(1, plan.tensor_parallel_size)]
        for process in self.processes:
            process.start()

    def stop(self, finished: bool) -> None:
        """Wait for the ranks to finish the session with rank 0 or, when rank 0 gave up, end them at once."""
        for process in self.processes:
            process.join(timeout=30 if finished else 0)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
        self._dir.cleanup()


def _follow(plan: RolloutPlan, rank: int, init_method: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // plan.tensor_parallel_size))
    engine = load_engine(plan, rank, init_method)
    session = _open(engine, plan)
    try:
        for _ in _blocks(engine, session, plan):
            pass
    finally:
        session.close()
        dist.destroy_process_group()


def save_chunk(out_dir: Path, k: int, frames: "np.ndarray", metadata: dict, latency: float, transport: dict | None = None) -> dict:
    """Write block k's frames (`chunk_k.npy`) and metadata (`chunk_k.json`); its entry in the summary, under the
    seed's names (`chunk_index`, `chunk_latency_seconds`, `frames`, `frame_shape`) and ours."""
    import numpy as np

    np.save(out_dir / f"chunk_{k:03d}.npy", frames)
    (out_dir / f"chunk_{k:03d}.json").write_text(json.dumps({**metadata, "latency_seconds": latency, **(transport or {})}, indent=2) + "\n")
    n = int(frames.shape[0])
    entry = {
        "chunk_index": k,
        "chunk_latency_seconds": latency,
        "frames": n,
        "frame_shape": list(frames.shape[1:]),
        "index": k,
        "latency_seconds": latency,
        "num_frames": n,
        "shape": list(frames.shape),
        "metadata": metadata,
    }
    return entry | ({"transport": transport} if transport is not None else {})


def chunk_line(k: int, latency: float, frames: int, frame_shape) -> str:
    """The line printed for each block as it arrives (one JSON object per line on stdout, as the seed prints)."""
    return json.dumps({"chunk_index": k, "chunk_latency_seconds": round(latency, 4), "frames": int(frames), "frame_shape": [int(x) for x in frame_shape]})


# -- command line ----------------------------------------------------------------------


def add_arguments(parser) -> None:
    """Arguments of `rtv rollout` (argparse only: no heavy imports here)."""
    parser.add_argument(
        "--model",
        metavar="DIR",
        help="causal world-model checkpoint folder (diffusers layout), e.g. from `rtv make-models`; required unless --url is given",
    )
    parser.add_argument("--prompt", required=True, metavar="TEXT", help="text prompt for the whole rollout")
    parser.add_argument("--image", metavar="PNG", help="start image; required by image-to-video models, refused by text-to-video ones")
    parser.add_argument(
        "--action-script",
        metavar="JSON",
        help="keyboard actions: a JSON list, one entry per block, each a list of num_frames_per_block "
        "per-latent-frame lists of keys (w a s d move, i j k l look); sets the number of blocks",
    )
    parser.add_argument("--num-blocks", type=int, metavar="N", help=f"blocks to generate (default: the action script's length, else {DEFAULT_NUM_BLOCKS})")
    parser.add_argument("--output-dir", required=True, metavar="OUT", help="where chunk_NNN.npy / chunk_NNN.json / summary.json go (created if missing)")
    parser.add_argument("--height", type=int, default=DEFAULT_HEIGHT, help=f"frame height, a multiple of the model's size multiple (default: {DEFAULT_HEIGHT}, sized for the tiny models; real Wan checkpoints use 480)")
    parser.add_argument("--width", type=int, default=DEFAULT_WIDTH, help=f"frame width (default: {DEFAULT_WIDTH}; real Wan checkpoints use 832)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"noise seed, a non-negative integer (default: {DEFAULT_SEED})")
    parser.add_argument("--request-id", metavar="ID", help="the id written into summary.json (default: rollout- and a fresh uuid)")
    parser.add_argument("--device", metavar="DEV", help="cpu, cuda or cuda:N (default: cuda when a GPU is visible, else cpu)")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, help="transformer and text-encoder dtype (default: bfloat16 on a GPU, float32 on the CPU)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                        help="split the transformer's heads over N ranks, one process each (rank r on cuda:r; gloo on the CPU); default: 1")
    parser.add_argument("--gpu-memory-fraction", type=float, metavar="F", help="cap each rank's GPU memory at this share of the device (0 < F <= 1)")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="no compiled forwards (the seed's flag); by default a rollout on a GPU compiles the transformer's blocks")


def main(args) -> int:
    """Run `rtv rollout` from parsed arguments (in-process; `--url` goes to `remote_rollout`); returns the exit code."""
    if args.model is None:
        print("rtv rollout: error: --model is required (or --url ws://HOST:PORT to drive a server)", file=sys.stderr)
        return 2
    try:
        plan = prepare_rollout(
            args.model,
            args.prompt,
            args.output_dir,
            image=args.image,
            action_script=args.action_script,
            num_blocks=args.num_blocks,
            height=args.height,
            width=args.width,
            seed=args.seed,
            request_id=args.request_id,
            device=args.device,
            dtype=args.dtype,
            tensor_parallel_size=args.tensor_parallel_size,
            gpu_memory_fraction=args.gpu_memory_fraction,
            enforce_eager=args.enforce_eager,
        )
        summary = run_rollout(plan, log=lambda line: print(line, flush=True))
    except RolloutInputError as exc:
        print(f"rtv rollout: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rtv rollout: interrupted", file=sys.stderr)
        return 130
    summary_path = plan.output_dir / "summary.json"
    print(f"summary: {summary_path}")
    print(
        f"{summary['chunks_delivered']}/{summary['chunks_expected']} blocks, "
        f"{summary['frames_delivered']}/{summary['frames_expected']} frames at {plan.height}x{plan.width}, "
        f"first frame after {summary['time_to_first_frame_seconds']:.2f}s, total {summary['total_seconds']:.2f}s "
        f"(load {summary['load_seconds']:.2f}s), "
        f"timeline {'matches' if summary['matches_offline_frame_timeline'] else 'DOES NOT match'} offline"
    )
    return 0 if summary["matches_offline_frame_timeline"] else 1
