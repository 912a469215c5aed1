"""GPU bench: a Wan2.1-1.3B-architecture causal world model (random weights), in-process and served.

Builds the checkpoint on the GPU (speed does not depend on weight values),
then, per tensor-parallel size:

- in-process (TP = 1): the engine alone. Time to first frame (open_session ->
  block 0's frames on the host) on the first session after loading (cold)
  and on a second one with a new prompt (warm); block times over a long
  session, steady state = blocks whose attention window is full; frames per
  second = frames per block / p50 block time; a breakdown of one steady
  block (each transformer forward, VAE decode, frames to host, fMP4 encode),
  the VAE decode again in bfloat16 and with cuDNN autotuning, and the top
  GPU kernels of one block from the torch profiler; peak GPU memory.
- served: `build_app` on a local Ray + Serve (as `serve run` does) and a
  WebSocket client: session.start sent -> first media chunk received, and
  the steady interval between chunks.

Every stage has a time limit and a failing stage is recorded under `errors`
while the next one runs. The partial JSON is rewritten to `--out` after each
stage, so a run cut short still reports what it measured. The published bar
for this model class (Self-Forcing, Wan2.1-1.3B, one H100): 17 frames/s and
0.69 s to the first frame.

    python -m bench.gpu_bench --out out/gpu.json                       # on a GPU machine
    python -m bench.gpu_bench --spec small --size 64x64 --device cpu --dtype float32   # the plumbing, on a CPU
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import signal
import subprocess
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

from bench import common

BAR_FPS = 17.0
BAR_TTFF_S = 0.69
BAR_SOURCE = "Self-Forcing (Wan2.1-1.3B, chunk-wise, 4 steps) on one H100: 17.0 frames/s, 0.69 s to the first frame"
PROMPTS = ("a lighthouse on a cliff at dawn", "a snowy forest at night, lanterns", "a busy market street in the rain")


def add_arguments(parser) -> None:
    parser.add_argument("--spec", default="wan-1.3b", choices=("wan-1.3b", "small"), help="model sizes")
    parser.add_argument("--size", type=common.parse_size, default=(832, 480), help="WxH")
    parser.add_argument("--fps", type=int, default=16)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when there is one)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"), help="transformer dtype")
    parser.add_argument("--vae-dtype", default=None, choices=("bfloat16", "float16", "float32"), help="VAE dtype (default: --dtype, as served)")
    parser.add_argument("--blocks", type=int, default=12, help="blocks of the long in-process session")
    parser.add_argument("--served-blocks", type=int, default=10, help="blocks per served session")
    parser.add_argument("--tp", default="1,2", help="tensor-parallel sizes to try (those above the GPU count are skipped)")
    parser.add_argument("--checkpoint", default="/tmp/rtv-wan-1.3b", help="where the random-weight checkpoint is built")
    parser.add_argument("--stage-timeout", type=int, default=300, help="seconds each stage may take")
    parser.add_argument("--skip-served", action="store_true")
    parser.add_argument("--served-ks", type=lambda t: [int(k) for k in t.split(",") if k], default=[2, 4],
                        help="served: K sessions at once after the single ones (comma-separated; empty for none)")
    parser.add_argument("--video-decoder", default="auto", choices=("auto", "vae", "tiny"), help="served: the replica's video_decoder")
    parser.add_argument("--skip-in-process", action="store_true", help="only the served stages (e.g. a second call on a warm machine)")
    parser.add_argument("--skip-profile", action="store_true")
    parser.add_argument("--compile", default="both", choices=("both", "eager", "compiled"),
                        help="in-process: measure the eager engine, the compiled one (regional torch.compile), or both; "
                             "served: compiled unless eager")


# -- plumbing -------------------------------------------------------------------------
class StageTimeout(Exception):
    pass


class Report:
    """The JSON document, rewritten to `out` after every stage."""

    def __init__(self, out: str | None) -> None:
        self.out = out
        self.data: dict = {"errors": [], "stage_seconds": {}}

    def save(self) -> None:
        if self.out:
            Path(self.out).parent.mkdir(parents=True, exist_ok=True)
            Path(self.out).write_text(json.dumps({**self.data, "partial": True}, indent=2, default=str) + "\n")

    @contextmanager
    def stage(self, name: str, timeout: int):
        """Run a stage under SIGALRM; record its failure (with the traceback's tail) and go on."""
        common.log(f"stage {name} (limit {timeout} s)")

        def on_alarm(signum, frame):
            raise StageTimeout(f"stage {name} took longer than {timeout} s")

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(timeout)
        began = time.perf_counter()
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - every failure is reported, the next stage still runs
            lines = traceback.format_exc().strip().splitlines()
            self.data["errors"].append({"stage": name, "error": f"{type(exc).__name__}: {exc}", "traceback": lines[-12:]})
            common.log(f"stage {name} FAILED: {type(exc).__name__}: {exc}\n" + "\n".join(lines[-20:]))
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
            self.data["stage_seconds"][name] = round(time.perf_counter() - began, 2)
            self.save()


def vae_dtype(args) -> str:
    return args.vae_dtype or args.dtype


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _gib(n: float) -> float:
    return round(n / 2**30, 3)


def _s(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def gpu_info(device: str) -> dict:
    import torch

    info = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        info |= {
            "gpu": torch.cuda.get_device_name(0),
            "gpu_count": torch.cuda.device_count(),
            "capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
            "memory_gib": _gib(props.total_memory),
            "cudnn": torch.backends.cudnn.version(),
        }
        info["nvidia_smi"] = _nvidia_smi("name,driver_version,clocks.max.sm,power.limit")
    return info


def _nvidia_smi(fields: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], check=False, capture_output=True, text=True, timeout=20)
        return out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unavailable: {exc}"


# -- build --------------------------------------------------------------------------
def build(args, device: str, report: Report) -> Path:
    import torch

    from deployments.models.wan_1_3b import SPECS, make_wan_world_model

    spec = SPECS[args.spec]
    path = Path(args.checkpoint)
    if path.exists():
        shutil.rmtree(path)
    began = time.perf_counter()
    counts = make_wan_world_model(path, spec, device=device, dtype=_torch_dtype(args.dtype))
    seconds = time.perf_counter() - began
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    report.data["build"] = {
        "spec": args.spec,
        "parameters": counts,
        "transformer_parameters_billion": round(counts["transformer"] / 1e9, 3),
        "checkpoint_gib": _gib(size),
        "build_and_save_s": round(seconds, 2),
        "architecture": {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec.__dict__.items()},
    }
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return path


# -- in-process -----------------------------------------------------------------------
def _session(engine, args, prompt: str, seed: int):
    from deployments.contract.session_spec import SessionSpec

    width, height = args.size
    return engine.open_session(SessionSpec(prompt=prompt, height=height, width=width, seed=seed))


@contextmanager
def _instrumented(engine, session, device: str, parts: dict):
    """Time the pieces of generate_block (synchronizing around each): forwards, camera, text, decode, to-host."""
    import deployments.generation.engine as engine_module

    def timed(name, fn):
        def wrapper(*a, **k):
            _sync(device)
            t0 = time.perf_counter()
            out = fn(*a, **k)
            _sync(device)
            parts.setdefault(name, []).append(time.perf_counter() - t0)
            return out

        return wrapper

    saved = {
        "forward": engine.forward,
        "_camera_tokens": engine._camera_tokens,
        "text_condition": engine.text_condition,
    }
    saved_decode = session.decoder.decode
    saved_to_uint8 = engine_module.to_uint8_frames
    engine.forward = timed("transformer_forward", saved["forward"])
    engine._camera_tokens = timed("camera_tokens", saved["_camera_tokens"])
    engine.text_condition = timed("text_condition", saved["text_condition"])
    session.decoder.decode = timed("vae_decode", saved_decode)
    engine_module.to_uint8_frames = timed("frames_to_host_uint8", saved_to_uint8)
    try:
        yield
    finally:
        for name in saved:
            delattr(engine, name)  # back to the class's methods
        del session.decoder.decode
        engine_module.to_uint8_frames = saved_to_uint8


def _profile_block(engine, session, device: str) -> dict:
    """Top kernels of one block by GPU time, and how busy the GPU was over the block's wall time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    _sync(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        engine.generate_block(session)
        _sync(device)
    wall = time.perf_counter() - t0
    events = prof.key_averages()

    def device_us(evt) -> float:
        for attr in ("self_device_time_total", "self_cuda_time_total"):
            value = getattr(evt, attr, None)
            if value is not None:
                return float(value)
        return 0.0

    # An operator (aten::mul) and the kernels it launches both carry the kernels' time: sum kernels only.
    kernels = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")]
    operators = [e for e in events if e not in kernels]
    kernel_us = sum(device_us(e) for e in kernels)

    def top(items, n=12):
        ranked = sorted((e for e in items if device_us(e) > 0), key=device_us, reverse=True)[:n]
        return [{"name": e.key[:100], "gpu_ms": round(device_us(e) / 1e3, 3), "calls": e.count} for e in ranked]

    return {
        "wall_s_under_profiler": round(wall, 4),
        "gpu_kernel_time_s": round(kernel_us / 1e6, 4),
        "gpu_busy_fraction": round(kernel_us / 1e6 / wall, 3) if wall else None,
        "top_operators_by_gpu_time": top(operators),
        "top_kernels_by_gpu_time": top(kernels),
        "kernel_launches": sum(e.count for e in kernels),
        "cuda_sync_calls": sum(e.count for e in events if e.key in ("cudaDeviceSynchronize", "cudaStreamSynchronize")),
        "memcpy_calls": sum(e.count for e in events if "memcpy" in e.key.lower()),
    }


def _decode_variants(engine, latents: list, device: str) -> dict:
    """Decode two consecutive blocks' latents with a fresh streaming decoder per VAE variant; time the second."""
    import torch
    from diffusers import AutoencoderKLWan

    from deployments.generation.tiny_decoder import TinyStreamingDecoder, TinyVideoDecoder
    from deployments.generation.vae_stream import StreamingDecoder

    def time_decode(vae, decoder=None) -> float:
        decoder = decoder or StreamingDecoder(vae)
        raw = [engine.normalizer.to_raw(x.to(device)).to(vae.dtype) for x in latents]
        decoder.decode(raw[0])
        _sync(device)
        t0 = time.perf_counter()
        decoder.decode(raw[1])
        _sync(device)
        decoder.close()
        return time.perf_counter() - t0

    out = {f"{str(engine.vae.dtype).removeprefix('torch.')} (served)": time_decode(engine.vae)}
    vae16 = AutoencoderKLWan.from_pretrained(engine.components.path, subfolder="vae", dtype=torch.bfloat16).to(device).eval()
    out["bfloat16"] = time_decode(vae16)
    if device.startswith("cuda"):
        saved = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True
        try:
            time_decode(vae16)  # autotune
            out["bfloat16 + cudnn.benchmark"] = time_decode(vae16)
            time_decode(engine.vae)
            out[f"{str(engine.vae.dtype).removeprefix('torch.')} (served) + cudnn.benchmark"] = time_decode(engine.vae)
        finally:
            torch.backends.cudnn.benchmark = saved
    tiny_folder = engine.components.path / "tiny_decoder"
    if tiny_folder.is_dir():  # random weights at the published taew2_1's sizes: its cost, not its pictures
        tiny = TinyVideoDecoder.from_pretrained(tiny_folder, dtype=torch.bfloat16).to(device)
        time_decode(vae16, TinyStreamingDecoder(tiny))  # warm
        out["tiny decoder bfloat16"] = time_decode(vae16, TinyStreamingDecoder(tiny))
    del vae16
    return {k: round(v, 4) for k, v in out.items()}


def in_process(args, path: Path, device: str, report: Report) -> None:
    import torch

    from deployments.generation.engine import WorldModelEngine
    from deployments.media.fmp4 import FragmentedMP4Encoder

    cuda = device.startswith("cuda")
    out = report.data.setdefault("tp", {}).setdefault("1", {}).setdefault("in_process", {})
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    engine = WorldModelEngine.from_pretrained(path, device=device, dtype=_torch_dtype(args.dtype), vae_dtype=_torch_dtype(vae_dtype(args)))
    _sync(device)
    out["load_s"] = round(time.perf_counter() - t0, 2)
    out["engine_dtype"] = str(engine.dtype).removeprefix("torch.")
    out["dtype"] = args.dtype
    out["vae_dtype"] = vae_dtype(args)
    if cuda:
        out["weights_gib"] = _gib(torch.cuda.memory_allocated())
    g = engine.geometry
    width, height = args.size
    lh, lw = g.latent_size(height, width)
    first_full = g.first_full_context_block
    out["geometry"] = {
        "size": f"{width}x{height}",
        "latent": f"{lw}x{lh}",
        "latent_frames_per_block": g.num_frames_per_block,
        "frames_per_block": g.frames_in_block(1),
        "frames_first_block": g.frames_in_block(0),
        "denoising_steps": len(engine.components.timesteps or []) or 4,
        "tokens_per_block": g.tokens_per_frame(height, width) * g.num_frames_per_block,
        "context_frames": g.context_frames,
        "first_full_context_block": first_full,
    }
    report.save()

    # Session A: the first one after loading (cold), then long enough for a full window.
    session, reference = _long_session(engine, args, out, "ttff_cold_s")
    latents = [b.latents for b in reference[-2:]]
    frames = [b.frames for b in reference[-2:]]
    out["kv_cache_mib_per_session"] = round(session.kv.nbytes / 2**20, 1)
    out["vae_cache_mib_per_session"] = round(session.decoder.nbytes / 2**20, 1)
    report.save()

    # One steady block in pieces.
    parts: dict = {}
    with _instrumented(engine, session, device, parts):
        t0 = time.perf_counter()
        block = engine.generate_block(session)
        total = time.perf_counter() - t0
    encoder = FragmentedMP4Encoder(width, height, args.fps)
    encoder.encode(frames[-1])
    t0 = time.perf_counter()
    piece = encoder.encode(block.frames)
    encode_s = time.perf_counter() - t0
    encoder.discard()
    forwards = parts.get("transformer_forward", [])
    named = {
        "text_condition_s": sum(parts.get("text_condition", [])),
        "camera_tokens_s": sum(parts.get("camera_tokens", [])),
        "denoise_forwards_s": sum(forwards[:-1]),
        "commit_forward_s": forwards[-1] if forwards else None,
        "vae_decode_s": sum(parts.get("vae_decode", [])),
        "frames_to_host_uint8_s": sum(parts.get("frames_to_host_uint8", [])),
    }
    accounted = sum(v for v in named.values() if v is not None)
    out["breakdown_one_steady_block"] = {
        **{k: _s(v) for k, v in named.items()},
        "each_forward_s": [round(x, 4) for x in forwards],
        "rest_s": round(total - accounted, 4),
        "block_total_s (synchronized per piece)": round(total, 4),
        "fmp4_encode_s (12 frames, one thread, overlapped with the next block when served)": round(encode_s, 4),
        "fmp4_bytes_per_block": piece.byte_length,
        "frames_mean_std": [round(float(block.frames.mean()), 2), round(float(block.frames.std()), 2)],
        "note": "random weights make noise-like frames: x264 works harder on them than on real video",
    }
    report.save()

    if cuda:
        out["vae_decode_12_frames_s"] = _decode_variants(engine, latents, device)
        report.save()
    if not args.skip_profile:
        try:
            out["profile_one_steady_block"] = _profile_block(engine, session, device)
        except Exception as exc:  # noqa: BLE001 - the profiler is a nicety
            out["profile_one_steady_block"] = {"error": f"{type(exc).__name__}: {exc}"}
        report.save()
    session.close()

    # Session B: warm, a new prompt (its text is encoded on the way).
    t0 = time.perf_counter()
    warm = _session(engine, args, PROMPTS[1], seed=1)
    engine.generate_block(warm)
    out["ttff_warm_s"] = round(time.perf_counter() - t0, 4)
    warm.close()
    if cuda:
        out["peak_gpu_memory_gib"] = _gib(torch.cuda.max_memory_allocated())
    del engine, session, warm
    _release(device)
    return reference


def _long_session(engine, args, out: dict, ttff_key: str):
    """Session A (the first prompt, seed 0), long enough for a full attention window and a few steady blocks
    after it: its time to the first frame under `ttff_key`, its block times and steady frame rate in `out`.
    Returns the open session and its blocks."""
    g = engine.geometry
    t0 = time.perf_counter()
    session = _session(engine, args, PROMPTS[0], seed=0)
    t_open = time.perf_counter() - t0
    blocks = [engine.generate_block(session)]
    out[ttff_key] = round(time.perf_counter() - t0, 4)
    out["open_session_s"] = round(t_open, 4)
    block_s = []
    for _ in range(1, max(args.blocks, g.first_full_context_block + 2)):
        t0 = time.perf_counter()
        blocks.append(engine.generate_block(session))
        block_s.append(time.perf_counter() - t0)
    p50 = common.median(steady := block_s[g.first_full_context_block - 1 :])
    out["block_s_by_index"] = [round(x, 4) for x in block_s]  # blocks 1, 2, ...
    out["steady_block"] = common.ms_stats(steady)
    out["steady_fps"] = round(g.frames_in_block(1) / p50, 2) if p50 else None
    return session, blocks


def _release(device: str) -> None:
    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def in_process_compiled(args, path: Path, device: str, report: Report, reference: list | None) -> None:
    """The engine with its transformer blocks compiled (regional torch.compile): the warm-up every replica
    runs (one session through every context length: the compiling), then session A again, as the eager
    engine ran it: its blocks' times, graphs made after the warm-up (recompiles, want 0) and agreement
    with the eager blocks (cosine of latents, largest frame difference)."""
    import numpy as np
    import torch

    from deployments.generation.engine import WorldModelEngine

    out = report.data.setdefault("tp", {}).setdefault("1", {}).setdefault("compiled", {})
    t0 = time.perf_counter()
    engine = WorldModelEngine.from_pretrained(path, device=device, dtype=_torch_dtype(args.dtype), vae_dtype=_torch_dtype(vae_dtype(args)),
                                              compile_blocks=True)
    _sync(device)
    out["load_s"] = round(time.perf_counter() - t0, 2)
    graphs_before = engine.compiled_graphs
    t0 = time.perf_counter()
    warm = _session(engine, args, PROMPTS[1], seed=1)
    for _ in range(engine.warm_up_blocks):
        engine.generate_block(warm)
    warm.close()
    out["warm_up"] = {"blocks": engine.warm_up_blocks, "seconds": round(time.perf_counter() - t0, 2), "graphs": engine.compiled_graphs - graphs_before}
    report.save()

    graphs_before = engine.compiled_graphs
    session, blocks = _long_session(engine, args, out, "ttff_warm_s")
    parts: dict = {}
    with _instrumented(engine, session, device, parts):
        engine.generate_block(session)
    forwards = parts.get("transformer_forward", [])
    out["each_forward_s"] = [round(x, 4) for x in forwards]
    out["vae_decode_s"] = _s(sum(parts.get("vae_decode", [])))
    out["recompiles_after_warm_up"] = engine.compiled_graphs - graphs_before
    session.close()
    if reference:
        pairs = list(zip(reference, blocks))
        out["agreement_with_eager"] = {
            "latent_cosine_min": round(min(float(torch.nn.functional.cosine_similarity(
                a.latents.flatten().double(), b.latents.flatten().double(), dim=0)) for a, b in pairs), 6),
            "max_frame_diff_by_block": [int(np.abs(a.frames.astype(np.int16) - b.frames.astype(np.int16)).max()) for a, b in pairs],
        }
    report.save()
    del engine, session
    _release(device)


# -- served -----------------------------------------------------------------------------
def served(args, path: Path, device: str, tp: int, report: Report) -> None:
    import ray
    from ray import serve

    from bench.batching import record
    from bench.served import stream_many, stream_timed
    from deployments.app import build_app
    from deployments.config import AppConfig
    from deployments.generation.geometry import read_geometry

    geometry = read_geometry(path)
    out = report.data.setdefault("tp", {}).setdefault(str(tp), {}).setdefault("served", {})
    width, height = args.size
    config = AppConfig.model_validate(
        {
            "model": str(path),
            "build_tiny_models": False,
            "accelerator": "gpu" if device.startswith("cuda") else "cpu",
            "dtype": args.dtype,
            "vae_dtype": vae_dtype(args),
            "height": height,
            "width": width,
            "fps": args.fps,
            "tensor_parallel_size": tp,
            "num_replicas": 1,
            "max_sessions_per_replica": max([2, *args.served_ks]),
            "understanding_model": None,
            "compile_transformer": args.compile != "eager",
            "video_decoder": args.video_decoder,
            "torch_threads": args.torch_threads,
            "replica_cpus": 1,
        }
    )
    t0 = time.perf_counter()
    if not ray.is_initialized():
        import torch

        # GPUs named, not detected: the replica must find them even where Ray's own probe would not.
        gpus = torch.cuda.device_count() if device.startswith("cuda") else (tp if tp > 1 else 0)
        ray.init(include_dashboard=False, log_to_driver=True, object_store_memory=2 * 2**30,
                 num_cpus=os.cpu_count() if device.startswith("cuda") else 4, num_gpus=gpus)
    out["ray_init_s"] = round(time.perf_counter() - t0, 2)
    out["cluster_resources"] = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
    port = _free_port()
    try:
        t0 = time.perf_counter()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(config), name="gpu-bench", route_prefix="/")
        out["deploy_s"] = round(time.perf_counter() - t0, 2)
        report.save()
        url = f"ws://127.0.0.1:{port}"
        first_full = geometry.first_full_context_block
        replica = serve.get_deployment_handle("WorldModel", app_name="gpu-bench")
        # The replica warms up (compiles, when compiled) after serve.run returns and answers sessions after
        # that: the first session is timed from a warm replica, as /healthz tells a client it is.
        while (before := replica.stats.remote().result(timeout_s=60))["warm_up"]["seconds"] is None:
            time.sleep(0.5)
        out["ready_s"] = round(time.perf_counter() - t0, 2)
        out["warm_up"] = before["warm_up"]
        sessions = {}
        for label, prompt, seed in (("cold", PROMPTS[0], 0), ("warm", PROMPTS[2], 2)):
            timed = asyncio.run(stream_timed(url, prompt, args.served_blocks, args.size, seed, args.fps))
            steady = timed.intervals_s[first_full - 1 :]
            p50 = common.median(steady)
            sessions[label] = {
                "ttff_s": _s(timed.first_chunk_s),
                "chunks": len(timed.chunk_at),
                "frames_per_chunk": timed.chunk_frames,
                "interval_s_by_chunk": [round(x, 4) for x in timed.intervals_s],
                "steady_interval": common.ms_stats(steady),
                "steady_fps": round(geometry.frames_in_block(1) / p50, 2) if p50 else None,
                # arrival at the client minus the replica's frames_ready_at stamp: what serving adds, one clock
                "serving_overhead": common.ms_stats(timed.overhead_s),
                "serving_stages": timed.stage_stats(),
                "error": timed.error,
            }
            out["sessions"] = sessions
            report.save()
        out["several_sessions"] = {}
        for k in args.served_ks:  # K sessions at once on the one replica, denoised and decoded together
            row = {"fps": [], "interval_s": [], "errors": []}
            record(row, stream_many(url, k, PROMPTS[1], args.served_blocks, args.size, args.fps, seed=10 * k))
            out["several_sessions"][str(k)] = {"aggregate_fps": round(row["fps"][0], 2), "per_session_fps": round(row["fps"][0] / k, 2),
                                               "session_interval": common.ms_stats(row["interval_s"]), "errors": row["errors"]}
            report.save()
        after = replica.stats.remote().result(timeout_s=60)
        out["compiled_graphs"] = {"after_warm_up": [r["compiled_graphs"] for r in before["ranks"]],
                                  "recompiles_in_sessions": [b["compiled_graphs"] - a["compiled_graphs"] for a, b in zip(before["ranks"], after["ranks"])]}
        if device.startswith("cuda"):
            out["nvidia_smi_memory_used"] = _nvidia_smi("memory.used")
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- targets and the whole run -----------------------------------------------------------
def _targets(data: dict) -> list[dict]:
    one = data.get("tp", {}).get("1", {})
    mine, srv = one.get("in_process", {}), one.get("served", {}).get("sessions", {})
    note = BAR_SOURCE
    out = [
        common.target("frames/s, in-process steady state", mine.get("steady_fps"), BAR_FPS, at_most=False, unit="frames/s", note=note),
        common.target("time to first frame, in-process, warm", mine.get("ttff_warm_s"), BAR_TTFF_S, unit="s", note=note),
    ]
    warm = srv.get("warm", {})
    out += [
        common.target("frames/s, served steady state", warm.get("steady_fps"), BAR_FPS, at_most=False, unit="frames/s", note=note),
        common.target("time to first frame, served (session.start -> first media chunk), warm", warm.get("ttff_s"), BAR_TTFF_S, unit="s", note=note),
    ]
    return out


def run(args) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    report = Report(args.out)
    report.data["machine"] = common.machine()
    report.data["gpu"] = gpu_info(device)
    report.save()
    common.set_torch_threads(args.torch_threads)  # torch's default numerics flags stay as the served replica has them

    path = None
    with report.stage("build", args.stage_timeout):
        path = build(args, device, report)
    if path is None:
        return report.data
    reference = None
    if args.compile != "compiled" and not args.skip_in_process:
        with report.stage("in_process_tp1", args.stage_timeout):
            reference = in_process(args, path, device, report)
    if args.compile != "eager" and not args.skip_in_process:
        with report.stage("in_process_compiled_tp1", args.stage_timeout):
            in_process_compiled(args, path, device, report, reference)
    gpus = torch.cuda.device_count() if device.startswith("cuda") else 0
    for tp in sorted({int(x) for x in args.tp.split(",") if x.strip()}):
        if args.skip_served:
            report.data.setdefault("tp", {}).setdefault(str(tp), {})["served"] = {"skipped": "--skip-served"}
            continue
        if device.startswith("cuda") and tp > gpus:
            report.data.setdefault("tp", {})[str(tp)] = {"skipped": f"needs {tp} GPUs, this machine has {gpus}"}
            continue
        if not device.startswith("cuda") and tp > 1:
            report.data.setdefault("tp", {})[str(tp)] = {"skipped": "tensor parallel is measured on GPUs only here"}
            continue
        with report.stage(f"served_tp{tp}", args.stage_timeout):
            served(args, path, device, tp, report)
    report.data["bar"] = {"fps": BAR_FPS, "ttff_s": BAR_TTFF_S, "source": BAR_SOURCE}
    report.data["targets"] = _targets(report.data)
    return report.data


if __name__ == "__main__":
    import sys

    sys.exit(common.main(sys.modules[__name__]))
