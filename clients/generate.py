"""`rtv generate`: stream one session from a running server into an MP4; and `rtv rollout --url`.

`rtv generate` connects to `WS /v1/realtime/video`, sends `session.start`,
sends the scripted interactions as the chunks arrive, prints a live progress
line on stderr, and writes a playable progressive MP4 (the concatenated
fragmented MP4, remuxed) plus an optional JSON summary.

When interactions are sent: block k's entry of the action script (interaction
`actions-kkk`) and `--interact k:PROMPT` (interaction `prompt-kkk`) go out
right after media chunk k-1-d has arrived, where d is the `pipeline_depth` the
server states in `video.start` (it starts the next block while it encodes the
last one); earlier blocks' right after `video.start`. The summary's
`interactions` say where each one started.

`rtv rollout --url ws://HOST:PORT` drives the same kind of session against a
server instead of in-process and writes what the offline rollout writes
(chunk_NNN.npy, chunk_NNN.json, summary.json); see `remote_rollout_main`.

Bad input: one line on stderr, exit 2 (nothing is sent). A session that ends
without `session.done` (an `error`, or the connection closing): exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import signal
import sys
import threading
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

from clients.common import one_line as _one_line
from clients.stream_client import (
    ServerError,
    SessionEndedError,
    SessionResult,
    StreamClientError,
    StreamConnectionError,
    StreamInputError,
    StreamProtocolError,
    VideoChunk,
    VideoStart,
    VideoStreamClient,
    image_data_url,
    interaction_message,
    session_start_message,
    video_url,
)
from deployments.contract.timeline import (
    FRAMES_PER_BLOCK,
    TEMPORAL_FACTOR,
    blocks_for_frames,
    frames_for_blocks,
    frames_in_block,
)

DEFAULT_BLOCKS = 4
DEFAULT_OPEN_TIMEOUT = 10.0

# How `rtv rollout --url` counts a block's frames from the stream (also written into summary.json).
FRAME_COUNTING_RULE = (
    "The concatenated fMP4 is demuxed once and every packet is decoded; each decoded frame is attributed to the binary "
    "frame (transport chunk) holding its packet's bytes, giving D_j decoded frames for transport chunk j, checked "
    "against that chunk's metadata fragment_frames (its num_frames counts the frames the block generated). The muxer writes a frame's fragment only when the next frame arrives, "
    "so every block's last frame travels in the next binary frame (the next media chunk, or the trailer): block k "
    "owns decoded frames [E_(k-1), E_k) with E_k = D_0 + ... + D_k + 1 (E_-1 = 0; the last block ends at the total)."
)


class GenerateInputError(ValueError):
    """A bad input; its message is the one line the user sees."""


class SessionFailed(RuntimeError):
    """The server or the connection ended the session; the message is one line."""




# =====================================================================================
# Inputs
# =====================================================================================
@dataclass(frozen=True)
class Interact:
    block: int
    prompt: str


def parse_interact(text: str) -> Interact:
    """`BLOCK:PROMPT` (e.g. `3:a snowy forest`) -> Interact; raises argparse.ArgumentTypeError."""
    block, sep, prompt = text.partition(":")
    block = block.strip()
    if not sep or not block.isdigit():
        raise argparse.ArgumentTypeError(f"expected BLOCK:PROMPT with BLOCK a block index >= 0 (e.g. 3:\"a snowy forest\"), got {text!r}")
    if not prompt.strip():
        raise argparse.ArgumentTypeError(f"the prompt after {block}: is blank, in {text!r}")
    return Interact(int(block), prompt.strip())


def parse_param(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` -> (key, JSON value, else the string); raises argparse.ArgumentTypeError."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (VALUE as JSON, else a string), got {text!r}")
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    return key.strip(), parsed


def load_image_url(path: str | os.PathLike) -> str:
    """An image file as a data URL; raises GenerateInputError."""
    try:
        return image_data_url(path)
    except StreamInputError as exc:
        raise GenerateInputError(str(exc)) from None


@dataclass(frozen=True)
class Scheduled:
    """One interaction of the script, meant to shape block `block`."""

    block: int
    event_id: str
    kind: str  # "actions" | "prompt"
    message: dict


def build_schedule(actions: list | None, interacts: list[Interact], transition_chunks: int | None) -> list[Scheduled]:
    out: list[Scheduled] = []
    for k, block in enumerate(actions or []):
        event_id = f"actions-{k:03d}"
        message = interaction_message(event_id=event_id, actions=[list(frame) for frame in block])
        out.append(Scheduled(k, event_id, "actions", message))
    for item in interacts:
        event_id = f"prompt-{item.block:03d}"
        message = interaction_message(event_id=event_id, prompt=item.prompt, transition_chunks=transition_chunks)
        out.append(Scheduled(item.block, event_id, "prompt", message))
    out.sort(key=lambda s: (s.block, s.kind != "actions"))
    return out


@dataclass
class GeneratePlan:
    url: str
    start_message: dict
    blocks: int
    output: Path
    summary: Path | None
    schedule: list[Scheduled]
    open_timeout: float
    action_script: Path | None = None
    image: Path | None = None


def prepare_generate(args: argparse.Namespace) -> GeneratePlan:
    """Check every input before anything is sent; raises GenerateInputError."""
    from clients.rollout import RolloutInputError, load_action_script

    try:
        url = video_url(args.url)
    except StreamInputError as exc:
        raise GenerateInputError(str(exc)) from None
    if not args.prompt.strip():
        raise GenerateInputError("--prompt must be a non-blank string")
    if args.blocks is not None and args.blocks < 1:
        raise GenerateInputError(f"--blocks must be a positive integer, got {args.blocks}")
    if args.num_frames is not None and args.num_frames < 1:
        raise GenerateInputError(f"--num-frames must be a positive integer, got {args.num_frames}")
    if args.seed is not None and args.seed < 0:
        raise GenerateInputError(f"--seed must be a non-negative integer, got {args.seed}")
    if (args.width is None) != (args.height is None):
        raise GenerateInputError("--width and --height must be given together")
    for name in ("width", "height"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise GenerateInputError(f"--{name} must be a positive integer, got {value}")
    if args.transition_chunks is not None and args.transition_chunks < 0:
        raise GenerateInputError(f"--transition-chunks must be >= 0, got {args.transition_chunks}")
    if args.timeout <= 0:
        raise GenerateInputError(f"--timeout must be positive, got {args.timeout:g}")

    output = Path(args.output)
    if output.is_dir():
        raise GenerateInputError(f"output path {output} is a folder; give a file name such as {output / 'out.mp4'}")
    if not output.parent.is_dir():
        raise GenerateInputError(f"output folder {output.parent} does not exist")
    summary = Path(args.summary) if args.summary else None
    if summary is not None:
        if summary.is_dir():
            raise GenerateInputError(f"summary path {summary} is a folder; give a file name such as {summary / 'summary.json'}")
        if not summary.parent.is_dir():
            raise GenerateInputError(f"summary folder {summary.parent} does not exist")

    image_url = load_image_url(args.image) if args.image else None

    actions = None
    if args.actions is not None:
        try:
            actions = load_action_script(args.actions, FRAMES_PER_BLOCK)
        except RolloutInputError as exc:
            raise GenerateInputError(str(exc)) from None

    if args.num_frames is not None:
        blocks = blocks_for_frames(args.num_frames)
    elif args.blocks is not None:
        blocks = args.blocks
    elif actions is not None:
        blocks = len(actions)
    else:
        blocks = DEFAULT_BLOCKS
    if actions is not None and len(actions) > blocks:
        given = f"--blocks {args.blocks}" if args.blocks is not None else f"--num-frames {args.num_frames} ({blocks} blocks)"
        raise GenerateInputError(f"the action script has {len(actions)} blocks but the session has only {blocks} ({given}); give fewer actions or more blocks")

    interacts: list[Interact] = list(args.interact or [])
    seen: set[int] = set()
    for item in interacts:
        if item.block >= blocks:
            raise GenerateInputError(f"--interact {item.block}:... is past the last block: the session has {blocks} blocks (0-{blocks - 1})")
        if item.block in seen:
            raise GenerateInputError(f"--interact gives block {item.block} twice; one prompt switch per block")
        seen.add(item.block)

    extra = dict(args.param or [])
    if "type" in extra:
        raise GenerateInputError("--param cannot set 'type'")
    try:
        start = session_start_message(
            args.prompt,
            image_reference_url=image_url,
            num_frames=args.num_frames if args.num_frames is not None else frames_for_blocks(blocks),
            seed=args.seed,
            width=args.width,
            height=args.height,
            extra=extra,
        )
        schedule = build_schedule(actions, interacts, args.transition_chunks)
    except StreamInputError as exc:
        raise GenerateInputError(str(exc)) from None
    return GeneratePlan(
        url=url,
        start_message=start,
        blocks=blocks,
        output=output,
        summary=summary,
        schedule=schedule,
        open_timeout=args.timeout,
        action_script=Path(args.actions) if args.actions else None,
        image=Path(args.image) if args.image else None,
    )


# =====================================================================================
# Progress line
# =====================================================================================
class Progress:
    """A live progress line on `stream`: rewritten in place (`\\r`) on a TTY, one line per block otherwise."""

    def __init__(self, total_blocks: int | None, total_frames: int | None, stream: TextIO | None = None, tty: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.total_blocks = total_blocks
        self.total_frames = total_frames
        self._width = 0  # length of the line on screen (TTY)

    def line(self, result: SessionResult, now: float) -> str:
        blocks = len(result.media_chunks)
        frames = result.num_frames
        ttff = result.time_to_first_frame
        of_blocks = f"/{self.total_blocks}" if self.total_blocks else ""
        of_frames = f"/{self.total_frames}" if self.total_frames else ""
        fps = frames / now if now > 0 else 0.0
        first = f"first frame {ttff:.2f}s" if ttff is not None else "first frame -"
        return f"block {blocks}{of_blocks}  frames {frames}{of_frames}  {fps:.1f} fps  {first}  {now:.1f}s"

    def update(self, result: SessionResult, now: float) -> None:
        text = self.line(result, now)
        if self.tty:
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A line of its own (an error, a note), without breaking the in-place line."""
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0
        self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0


# =====================================================================================
# Driving one session
# =====================================================================================
@dataclass
class SentRecord:
    scheduled: Scheduled
    sent_after_chunk: int | None  # media chunk index it followed; None: right after video.start
    sent_at: float


@dataclass
class DriveOutcome:
    result: SessionResult
    sent: list[SentRecord] = field(default_factory=list)
    interrupted: bool = False


class _Interrupts:
    """First Ctrl-C: send session.stop (the server still finishes the file); second: abort."""

    def __init__(self, on_first: Callable[[], None]) -> None:
        self.count = 0
        self._on_first = on_first
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.current_task()
            self._loop.add_signal_handler(signal.SIGINT, self._handle)
        except (NotImplementedError, RuntimeError, ValueError):
            self._loop = None

    def remove(self) -> None:
        if self._loop is not None:
            try:
                self._loop.remove_signal_handler(signal.SIGINT)
            except (NotImplementedError, RuntimeError, ValueError):
                pass

    def _handle(self) -> None:
        self.count += 1
        if self.count == 1:
            self._on_first()
        elif self._task is not None:
            self._task.cancel()


async def drive_session(
    url: str,
    start_message: dict,
    schedule: list[Scheduled],
    *,
    open_timeout: float = DEFAULT_OPEN_TIMEOUT,
    on_start: Callable[[VideoStart], None] | None = None,
    on_chunk: Callable[[SessionResult, VideoChunk], None] | None = None,
    on_error: Callable[[ServerError], None] | None = None,
    on_note: Callable[[str], None] | None = None,
    check_start: Callable[[VideoStart], str | None] | None = None,
) -> DriveOutcome:
    """Stream one session; send each scheduled interaction early enough for its block (see the module note).

    `check_start(video_start)` may return a one-line problem (e.g. the server's
    geometry disagrees with the action script): the session is then stopped and
    SessionFailed raised. Raises StreamConnectionError / SessionEndedError /
    StreamProtocolError / SessionFailed.
    """
    client = VideoStreamClient(url, open_timeout=open_timeout)
    outcome = DriveOutcome(client.result())
    queue = list(schedule)

    depth = 0

    async def send_due(media_received: int, after: int | None) -> None:
        # The server starts `depth` blocks ahead of the chunks it sends: send early by that much.
        while queue and queue[0].block <= media_received + depth:
            item = queue.pop(0)
            await client.send_interaction_message(item.message)
            outcome.sent.append(SentRecord(item, after, client.elapsed()))

    def first_interrupt() -> None:
        outcome.interrupted = True
        if on_note:
            on_note("interrupted: stopping the session (Ctrl-C again to abort)")
        asyncio.ensure_future(_quiet(client.stop()))

    interrupts = _Interrupts(first_interrupt)
    interrupts.install()
    try:
        await client.connect()
        start = await client.start(message=start_message)
        if check_start is not None:
            problem = check_start(start)
            if problem:
                await _quiet(client.stop())
                raise SessionFailed(problem)
        if on_start is not None:
            on_start(start)
        depth = start.pipeline_depth
        fps = (start.raw.get("generation") or {}).get("fps")
        paced = bool((start.config.get("extra_params") or {}).get("pace_to_media_time"))
        stored_frames = 0
        await send_due(0, None)
        while (event := await client.next_event()) is not None:
            if isinstance(event, VideoChunk):
                if event.kind == "media":
                    media = len(client.result().media_chunks)
                    await send_due(media, media - 1)
                    stored_frames += event.fragment_frames
                    if fps and not paced:
                        # Kept as it arrives: say so, and the server's flow control never holds this client back.
                        # Best effort: after the last chunk the server may already have closed.
                        await _quiet(client.playback(stored_frames / fps))
                if on_chunk is not None:
                    on_chunk(client.result(), event)
            elif isinstance(event, ServerError) and on_error is not None:
                on_error(event)
        if client.result().done is not None:
            await client.wait_closed(2.0)
    except asyncio.CancelledError:
        if interrupts.count >= 2:
            outcome.interrupted = True
            return outcome
        raise
    finally:
        interrupts.remove()
        await client.close()
    return outcome


async def _quiet(awaitable) -> None:
    try:
        await awaitable
    except Exception:
        pass


def interaction_report(outcome: DriveOutcome) -> list[dict]:
    result = outcome.result
    queued = {q.event_id for q in result.queued}
    errors = {e.event_id: str(e) for e in result.errors if e.event_id}
    report = []
    for record in outcome.sent:
        s = record.scheduled
        started = result.started_block(s.event_id)
        report.append(
            {
                "event_id": s.event_id,
                "kind": s.kind,
                "target_block": s.block,
                "sent_after_chunk": record.sent_after_chunk,
                "sent_at_seconds": record.sent_at,
                "queued": s.event_id in queued,
                "started_block": started,
                "completed_block": result.completed_block(s.event_id),
                "blocks_late": None if started is None else started - s.block,
                "error": errors.get(s.event_id),
            }
        )
    return report


# =====================================================================================
# rtv generate
# =====================================================================================
def count_mp4_frames(mp4: bytes) -> tuple[int, int, int]:
    """(video packets, width, height) of an MP4, without decoding."""
    import av

    with av.open(io.BytesIO(mp4), "r") as container:
        stream = container.streams.video[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        count = sum(1 for p in container.demux(stream) if p.dts is not None)
    return count, width, height


def _write_atomic(path: Path, data: bytes) -> None:
    part = path.with_name(path.name + ".part")
    try:
        part.write_bytes(data)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


def run_generate(plan: GeneratePlan, progress: Progress | None = None, log: Callable[[str], None] | None = None) -> tuple[dict, int]:
    """Stream the session, write the MP4 (and summary); returns (summary, exit code)."""
    from deployments.media.remux import remux_to_mp4

    log = log or (lambda line: None)
    progress = progress or Progress(plan.blocks, frames_for_blocks(plan.blocks))

    def on_start(start: VideoStart) -> None:
        progress.total_frames = frames_for_blocks(plan.blocks, start.frames_per_block, start.temporal_factor)
        progress.message(f"session {start.request_id} on replica {start.replica_id} (seed {start.seed})")

    def on_error(error: ServerError) -> None:
        progress.message(f"server error: {error}")

    outcome = asyncio.run(
        drive_session(
            plan.url,
            plan.start_message,
            plan.schedule,
            open_timeout=plan.open_timeout,
            on_start=on_start,
            on_chunk=lambda result, chunk: progress.update(result, chunk.received_at),
            on_error=on_error,
            on_note=progress.message,
        )
    )
    progress.finish()
    result = outcome.result
    summary: dict[str, Any] = {
        **result.summary(),
        "prompt": plan.start_message["prompt"],
        "blocks_expected": plan.blocks,
        "frames_expected": frames_for_blocks(plan.blocks, *(_geometry(result.start))),
        "output": None,
        "mp4_frames": None,
        "width": None,
        "height": None,
        "interactions": interaction_report(outcome),
        "interrupted": outcome.interrupted,
    }
    code = 0
    failure = result.failure()
    if result.chunks and result.num_frames > 0:
        try:
            mp4 = remux_to_mp4(result.media)
            frames, width, height = count_mp4_frames(mp4)
        except Exception as exc:  # a stream PyAV cannot read: say so in one line
            failure = failure or f"cannot remux the received stream to MP4: {_one_line(exc)}"
        else:
            _write_atomic(plan.output, mp4)
            summary.update(output=str(plan.output), mp4_frames=frames, width=width, height=height)
    elif failure is None:
        failure = "the server sent no video frames"
    if failure is not None:
        code = 1
    summary["failure"] = failure
    if plan.summary is not None:
        plan.summary.write_text(json.dumps(summary, indent=2) + "\n")
    return summary, code


def _geometry(start: VideoStart | None) -> tuple[int, int]:
    if start is None:
        return FRAMES_PER_BLOCK, TEMPORAL_FACTOR
    return start.frames_per_block, start.temporal_factor


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `rtv generate` (argparse only)."""
    parser.add_argument("--url", required=True, metavar="ws://HOST:PORT", help="the server (the /v1/realtime/video path is added when missing)")
    parser.add_argument("--prompt", required=True, metavar="TEXT", help="text prompt of the session")
    parser.add_argument("--image", metavar="PNG", help="start image (PNG or JPEG; other formats Pillow reads are sent as PNG) for image-to-video models")
    parser.add_argument(
        "--actions",
        metavar="JSON",
        help="keyboard action script, the `rtv rollout --action-script` format: block k's entry is sent as interaction "
        "actions-kkk early enough to shape block k (see the note below); sets --blocks when not given",
    )
    parser.add_argument(
        "--interact",
        action="append",
        type=parse_interact,
        metavar="BLOCK:PROMPT",
        help="switch the prompt at block BLOCK: sent as interaction prompt-BBB (repeatable), e.g. 3:\"a snowy forest\"",
    )
    parser.add_argument("--transition-chunks", type=int, metavar="N", help="blend each --interact prompt in over N blocks (default: the server's, 0 = at once)")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--blocks", type=int, metavar="N", help=f"blocks to generate (default: the action script's length, else {DEFAULT_BLOCKS})")
    length.add_argument("--num-frames", type=int, metavar="N", help="frames to ask for (the server rounds up to whole blocks)")
    parser.add_argument("--seed", type=int, metavar="S", help="noise seed, a non-negative integer (default: the server draws one; video.start reports it)")
    parser.add_argument("--width", type=int, metavar="W", help="frame width (default: the server's)")
    parser.add_argument("--height", type=int, metavar="H", help="frame height (default: the server's)")
    parser.add_argument("--param", action="append", type=parse_param, metavar="KEY=VALUE", help="any other session.start field, VALUE as JSON (repeatable), e.g. num_inference_steps=2")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.mp4", help="the progressive MP4 to write")
    parser.add_argument("--summary", metavar="OUT.json", help="also write a JSON summary of the session")
    parser.add_argument("--timeout", type=float, default=DEFAULT_OPEN_TIMEOUT, metavar="SECONDS", help=f"connection timeout (default: {DEFAULT_OPEN_TIMEOUT:g})")


EPILOG = """\
Examples:
  rtv generate --url ws://127.0.0.1:8000 --prompt "a red room" --blocks 3 -o room.mp4
  rtv generate --url ws://127.0.0.1:8000 --prompt "a red room" --actions actions.json \\
      --interact 3:"a snowy forest" -o walk.mp4 --summary walk.json

Progress goes to stderr (in place on a terminal, one line per block otherwise).
The server starts block k+d before it sends chunk k (d = the pipeline_depth in
video.start), so the interaction for block k leaves once chunk k-1-d is in; the
summary's `interactions` list each one's started_block.
Exit codes: 0 done; 1 the session failed (server error, connection lost); 2 bad input; 130 interrupted.
"""


def main(args: argparse.Namespace) -> int:
    """Run `rtv generate` from parsed arguments; returns the exit code."""
    try:
        plan = prepare_generate(args)
    except GenerateInputError as exc:
        print(f"rtv generate: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    try:
        summary, code = run_generate(plan)
    except (StreamConnectionError, SessionEndedError, StreamProtocolError, SessionFailed, StreamClientError) as exc:
        print(f"rtv generate: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rtv generate: interrupted", file=sys.stderr)
        return 130
    for item in summary["interactions"]:
        if item["started_block"] is None and item["error"] is None and not summary["failure"]:
            print(
                f"rtv generate: note: interaction {item['event_id']} (scripted for block {item['target_block']}) was "
                f"{'queued' if item['queued'] else 'sent'} but never started: the session ended first",
                file=sys.stderr,
            )
    if summary["failure"]:
        print(f"rtv generate: error: {_one_line(summary['failure'])}", file=sys.stderr)
    if summary["output"]:
        ttff = summary["time_to_first_frame_seconds"]
        print(
            f"wrote {summary['output']}: {summary['mp4_frames']} frames at {summary['width']}x{summary['height']}, "
            f"{summary['num_chunks']} chunks, first frame after {ttff:.2f}s, total {summary['total_seconds']:.2f}s"
        )
    if plan.summary is not None:
        print(f"summary: {plan.summary}")
    if summary.get("interrupted") and code == 0:
        return 130
    return code


# =====================================================================================
# rtv rollout --url
# =====================================================================================
def add_rollout_url_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        metavar="ws://HOST:PORT",
        help="drive the session against this server instead of in-process (then --model is optional: "
        "it is only read to check the inputs; the geometry comes from video.start, else 3 latent frames per block, temporal factor 4)",
    )


def decode_stream(chunks: list[VideoChunk]) -> tuple[list, list[int]]:
    """Decode the concatenated fMP4 of `chunks`: (RGB uint8 frames in order, decoded frames per transport chunk)."""
    import av

    starts, pos = [], 0
    for chunk in chunks:
        starts.append(pos)
        pos += len(chunk.data)
    data = b"".join(c.data for c in chunks)
    per_chunk = [0] * len(chunks)
    frames = []
    owners: list[int] = []  # transport chunk of each packet, in decode order
    with av.open(io.BytesIO(data), "r", format="mp4") as container:
        stream = container.streams.video[0]
        for packet in container.demux(stream):
            if packet.dts is not None:
                owners.append(max(0, bisect_right(starts, packet.pos) - 1) if packet.pos is not None and packet.pos >= 0 else -1)
            for frame in packet.decode():
                frames.append(frame.to_ndarray(format="rgb24"))
    # No B-frames: frames come out in packet order, one per packet.
    for owner in owners[: len(frames)]:
        if owner >= 0:
            per_chunk[owner] += 1
    return frames, per_chunk


def split_blocks(frames: list, media_counts: list[int]) -> list[list]:
    """Cut decoded frames into blocks by FRAME_COUNTING_RULE (`media_counts`: D_j of the media chunks, in order)."""
    blocks, begin, total = [], 0, 0
    for k, count in enumerate(media_counts):
        total += count
        end = min(len(frames), total + 1) if k < len(media_counts) - 1 else len(frames)
        blocks.append(frames[begin:end])
        begin = end
    return blocks


def _prepare_remote_rollout(args) -> tuple[dict, list[Scheduled], int, int, int, Any]:
    """(session.start, schedule, blocks, frames_per_block, temporal_factor, offline plan or None); raises GenerateInputError."""
    from clients.rollout import (
        DEFAULT_NUM_BLOCKS,
        RolloutInputError,
        load_action_script,
        prepare_rollout,
    )

    try:
        video_url(args.url)
    except StreamInputError as exc:
        raise GenerateInputError(str(exc)) from None
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
            if not args.prompt.strip():
                raise RolloutInputError("prompt must be a non-blank string")
            for name in ("height", "width"):
                if getattr(args, name) < 1:
                    raise RolloutInputError(f"{name} must be a positive integer, got {getattr(args, name)!r}")
            if args.seed is not None and args.seed < 0:
                raise RolloutInputError(f"seed must be a non-negative integer, got {args.seed!r}")
            out = Path(args.output_dir)
            if out.exists() and not out.is_dir():
                raise RolloutInputError(f"output path {out} exists and is not a folder")
            actions = load_action_script(args.action_script, fpb) if args.action_script is not None else None
            if args.num_blocks is not None and args.num_blocks < 1:
                raise RolloutInputError(f"--num-blocks must be a positive integer, got {args.num_blocks!r}")
            if actions is not None and args.num_blocks is not None and args.num_blocks != len(actions):
                raise RolloutInputError(
                    f"--num-blocks {args.num_blocks} disagrees with the action script, which has {len(actions)} blocks (give one or make them match)"
                )
            blocks = len(actions) if actions is not None else (args.num_blocks or DEFAULT_NUM_BLOCKS)
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


def remote_rollout_main(args) -> int:
    """`rtv rollout --url`: the rollout against a server; same files and summary fields as in-process.

    Blocks' frames are decoded from the stream with PyAV and counted by FRAME_COUNTING_RULE.
    """
    import numpy as np

    from clients.rollout import chunk_line, save_chunk

    name = "rtv rollout"
    try:
        start_message, schedule, blocks, fpb, tf, _ = _prepare_remote_rollout(args)
    except (GenerateInputError, StreamInputError) as exc:
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
    except (StreamConnectionError, StreamProtocolError, SessionFailed, StreamClientError) as exc:
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
