"""`rtv rollout --url`: the seed's offline rollout, driven against a running server over the WebSocket.

The session is streamed like `rtv generate` streams it; the fMP4 that comes
back is decoded and cut into its blocks (`clients/media/stream.py`), and the
outputs are the in-process rollout's: chunk_NNN.npy / chunk_NNN.json / summary.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from clients.cli.generate import (
    GenerateInputError,
    Scheduled,
    SessionFailed,
    build_schedule,
    drive_session,
    interaction_report,
    load_image_url,
)
from clients.media.stream import FRAME_COUNTING_RULE, decode_stream, split_blocks
from clients.sdk.connection import one_line as _one_line
from clients.sdk.errors import ClientConnectionError, ClientError, ClientInputError, ClientProtocolError, SessionEndedError
from clients.sdk.video import SessionResult, VideoChunk, VideoStart, session_start_message, video_url
from deployments.contract.timeline import FRAMES_PER_BLOCK, TEMPORAL_FACTOR, frames_for_blocks, frames_in_block

def add_url_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        metavar="ws://HOST:PORT",
        help="drive the session against this server instead of in-process (then --model is optional: "
        "it is only read to check the inputs; the geometry comes from video.start, else 3 latent frames per block, temporal factor 4)",
    )


# The engine's placement and numerics: the server's, not the client's.
IN_PROCESS_ONLY = {
    "--device": lambda args: getattr(args, "device", None) is not None,
    "--dtype": lambda args: getattr(args, "dtype", None) is not None,
    "--tensor-parallel-size": lambda args: getattr(args, "tensor_parallel_size", 1) != 1,
    "--gpu-memory-fraction": lambda args: getattr(args, "gpu_memory_fraction", None) is not None,
    "--enforce-eager": lambda args: bool(getattr(args, "enforce_eager", False)),
}


def _prepare_remote_rollout(args) -> tuple[dict, list[Scheduled], int, int, int, Any]:
    """(session.start, schedule, blocks, frames_per_block, temporal_factor, offline plan or None); raises GenerateInputError."""
    from clients.cli.rollout import (
        RolloutInputError,
        check_session_inputs,
        load_action_script,
        prepare_rollout,
        session_blocks,
    )

    try:
        video_url(args.url)
    except ClientInputError as exc:
        raise GenerateInputError(str(exc)) from None
    for flag, given in IN_PROCESS_ONLY.items():
        if given(args):
            raise GenerateInputError(f"{flag} applies to an in-process rollout; with --url the server's own settings apply")
    fpb, tf = FRAMES_PER_BLOCK, TEMPORAL_FACTOR
    plan = None
    try:
        if args.model is not None:
            # The checkpoint is at hand: the offline checks apply (geometry, image, camera adapter).
            plan = prepare_rollout(
                args.model, args.prompt, args.output_dir, image=args.image, action_script=args.action_script,
                num_blocks=args.num_blocks, height=args.height, width=args.width, seed=args.seed,
            )
            fpb, tf = plan.geometry.num_frames_per_block, plan.geometry.scale_factor_temporal
            actions, blocks = plan.actions, plan.num_blocks
        else:
            check_session_inputs(args.prompt, args.seed, args.output_dir)
            for name in ("height", "width"):  # the server checks the rest of the size
                if getattr(args, name) < 1:
                    raise RolloutInputError(f"{name} must be a positive integer, got {getattr(args, name)!r}")
            actions = load_action_script(args.action_script, fpb) if args.action_script is not None else None
            blocks = session_blocks(actions, args.num_blocks)
    except RolloutInputError as exc:
        raise GenerateInputError(str(exc)) from None
    image_url = load_image_url(args.image) if args.image else None
    start = session_start_message(
        args.prompt,
        image_reference_url=image_url,
        num_frames=frames_for_blocks(blocks, fpb, tf),
        seed=args.seed,
        width=args.width,
        height=args.height,
    )
    return start, build_schedule(actions, [], None), blocks, fpb, tf, plan


def main(args) -> int:
    """`rtv rollout --url`: the rollout against a server; same files and summary fields as in-process.

    Blocks' frames are decoded from the stream with PyAV and counted by FRAME_COUNTING_RULE.
    """
    import numpy as np

    from clients.cli.rollout import chunk_line, save_chunk

    name = "rtv rollout"
    try:
        start_message, schedule, blocks, fpb, tf, _ = _prepare_remote_rollout(args)
    except (GenerateInputError, ClientInputError) as exc:
        print(f"{name}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    out = Path(args.output_dir)
    t_start = time.perf_counter()

    def check_start(start: VideoStart) -> str | None:
        if start.geometry_from_server and (start.frames_per_block, start.temporal_factor) != (fpb, tf) and args.action_script:
            return (
                f"the server's model has {start.frames_per_block} latent frames per block, "
                f"but the action script was checked for {fpb}"
            )
        return None

    def on_chunk(result: SessionResult, chunk: VideoChunk) -> None:
        if chunk.kind == "media":
            shape = (args.height, args.width, 3)
            print(chunk_line(chunk.generation_chunk_index, chunk.latency_seconds, chunk.num_frames, shape), flush=True)

    try:
        outcome = asyncio.run(
            drive_session(
                video_url(args.url),
                start_message,
                schedule,
                check_start=check_start,
                on_chunk=on_chunk,
                on_error=lambda error: print(f"{name}: server error: {error}", file=sys.stderr, flush=True),
                on_note=lambda text: print(f"{name}: {text}", file=sys.stderr, flush=True),
            )
        )
    except SessionEndedError as exc:
        # The server refused the session.start: for a rollout that is bad input the server found.
        print(f"{name}: error: {_one_line(exc)}", file=sys.stderr)
        return 2 if exc.error is not None and exc.error.code == "invalid_request" else 1
    except (ClientConnectionError, ClientProtocolError, SessionFailed, ClientError) as exc:
        print(f"{name}: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    result = outcome.result
    start = result.start
    if start is not None and start.geometry_from_server:
        fpb, tf = start.frames_per_block, start.temporal_factor

    media = result.media_chunks
    problems: list[str] = []
    frames: list = []
    per_transport: list[int] = []
    if result.chunks:
        try:
            frames, per_transport = decode_stream(result.chunks)
        except Exception as exc:
            problems.append(f"cannot decode the stream: {_one_line(exc)}")
    for chunk, decoded in zip(result.chunks, per_transport):
        if decoded != chunk.fragment_frames:
            problems.append(
                f"transport chunk {chunk.transport_chunk_index} decodes to {decoded} frames, its metadata says {chunk.fragment_frames}"
            )
    if len(frames) != result.num_frames and not problems:
        problems.append(f"the stream decodes to {len(frames)} frames, the metadata adds up to {result.num_frames}")
    block_frames = split_blocks(frames, per_transport[: len(media)]) if frames else []

    out.mkdir(parents=True, exist_ok=True)
    chunks: list[dict] = []
    for k, (chunk, block) in enumerate(zip(media, block_frames)):
        array = np.stack(block).astype(np.uint8) if block else np.zeros((0, args.height, args.width, 3), np.uint8)
        m = chunk.metadata
        metadata = {
            "block_index": m.generation_chunk_index,
            "num_frames": int(array.shape[0]),
            "started_event_ids": list(m.started_event_ids),
            "active_event_ids": list(m.active_event_ids),
            "completed_event_ids": list(m.completed_event_ids),
        }
        transport = {
            "transport_chunk_index": m.transport_chunk_index,
            "transport_num_frames": m.fragment_frames,
            "byte_length": m.byte_length,
            "received_at_seconds": chunk.received_at,
        }
        chunks.append(save_chunk(out, k, array, metadata, chunk.latency_seconds, transport))
    total = time.perf_counter() - t_start
    frames_delivered = sum(c["num_frames"] for c in chunks)
    frames_expected = frames_for_blocks(blocks, fpb, tf)
    failure = result.failure()
    matches = (
        failure is None
        and not problems
        and len(chunks) == blocks
        and frames_delivered == frames_expected
        and all(c["num_frames"] == frames_in_block(c["index"], fpb, tf) for c in chunks)
    )
    summary = {
        "request_id": result.request_id,
        "model": str(args.model) if args.model is not None else (start.config.get("model") if start else None),
        "prompt": args.prompt,
        "seed": start.seed if start else None,
        "height": args.height,
        "width": args.width,
        "image": args.image,
        "action_script": args.action_script,
        # The server's engine settings: not reported on the wire.
        "device": None,
        "dtype": None,
        "tensor_parallel_size": None,
        "gpu_memory_fraction": None,
        "enforce_eager": None,
        "chunks_delivered": len(chunks),
        "chunks_expected": blocks,
        "frames_delivered": frames_delivered,
        "frames_expected": frames_expected,
        "matches_offline_frame_timeline": matches,
        "time_to_first_frame_seconds": result.time_to_first_frame,
        "total_seconds": total,
        "load_seconds": start.received_at if start else None,  # session.start sent -> video.start
        "chunks": chunks,
        # remote only
        "url": result.url,
        "replica_id": start.replica_id if start else None,
        "frames_per_block": fpb,
        "temporal_factor": tf,
        "geometry_from_server": bool(start and start.geometry_from_server),
        "frame_counting_rule": FRAME_COUNTING_RULE,
        "transport_chunks": [
            {**c.summary(), "decoded_frames": per_transport[i] if i < len(per_transport) else None} for i, c in enumerate(result.chunks)
        ],
        "trailer_frames": result.trailer.fragment_frames if result.trailer else None,
        "interactions": interaction_report(outcome),
        "errors": [e.summary() for e in result.errors],
        "problems": problems,
        "failure": failure,
        "done": None if result.done is None else {"chunks": result.done.chunks, "stopped": result.done.stopped},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if failure:
        print(f"{name}: error: {_one_line(failure)}", file=sys.stderr)
    for problem in problems:
        print(f"{name}: {problem}", file=sys.stderr)
    print(f"summary: {out / 'summary.json'}")
    ttff = summary["time_to_first_frame_seconds"]
    print(
        f"{len(chunks)}/{blocks} blocks, {frames_delivered}/{frames_expected} frames at {args.height}x{args.width}, "
        f"first frame after {ttff if ttff is None else round(ttff, 2)}s, total {total:.2f}s "
        f"(session open {summary['load_seconds'] or 0:.2f}s), "
        f"timeline {'matches' if matches else 'DOES NOT match'} offline"
    )
    if failure:
        return 1
    return 0 if matches else 1
