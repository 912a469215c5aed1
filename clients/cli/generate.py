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
(chunk_NNN.npy, chunk_NNN.json, summary.json); see `clients/cli/remote_rollout.py`.

Bad input: one line on stderr, exit 2 (nothing is sent). A session that ends
without `session.done` (an `error`, or the connection closing): exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

from clients.media.stream import count_mp4_frames
from clients.sdk.connection import one_line as _one_line
from clients.sdk.errors import ClientConnectionError, ClientError, ClientInputError, ClientProtocolError, ServerError, SessionEndedError
from clients.sdk.video import (
    SessionResult,
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
)

DEFAULT_BLOCKS = 4
DEFAULT_OPEN_TIMEOUT = 10.0



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
    except ClientInputError as exc:
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
        message = interaction_message(event_id=event_id, actions=block)  # it writes the key tuples as JSON lists
        out.append(Scheduled(k, event_id, "actions", message))
    for item in interacts:
        event_id = f"prompt-{item.block:03d}"
        message = interaction_message(event_id=event_id, prompt=item.prompt, transition_chunks=transition_chunks)
        out.append(Scheduled(item.block, event_id, "prompt", message))
    out.sort(key=lambda s: (s.block, s.kind != "actions"))
    return out


def with_action_script(extra_params: object, actions: list) -> dict:
    """`extra_params` with the script as `camera_action_script`: the server plays it from block 0, in step with
    the blocks, where live interactions can only shape the blocks that start after they arrive."""
    if not isinstance(extra_params, dict):
        raise GenerateInputError("--param extra_params must be a JSON object to go with --action-script")
    if "camera_action_script" in extra_params:
        raise GenerateInputError("give the action script once: --action-script or --param extra_params's camera_action_script")
    return {**extra_params, "camera_action_script": [[list(frame) for frame in block] for block in actions]}


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
    from clients.cli.rollout import RolloutInputError, load_action_script

    try:
        url = video_url(args.url)
    except ClientInputError as exc:
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
    script_path = args.actions if args.actions is not None else args.action_script
    if script_path is not None:
        try:
            actions = load_action_script(script_path, FRAMES_PER_BLOCK)
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
    if args.action_script is not None:
        extra["extra_params"] = with_action_script(extra.get("extra_params", {}), actions)
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
        live = actions if args.actions is not None else None  # an --action-script left with session.start
        schedule = build_schedule(live, interacts, args.transition_chunks)
    except ClientInputError as exc:
        raise GenerateInputError(str(exc)) from None
    return GeneratePlan(
        url=url,
        start_message=start,
        blocks=blocks,
        output=output,
        summary=summary,
        schedule=schedule,
        open_timeout=args.timeout,
        action_script=Path(script_path) if script_path else None,
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
    SessionFailed raised. Raises ClientConnectionError / SessionEndedError /
    ClientProtocolError / SessionFailed.
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
    script = parser.add_mutually_exclusive_group()
    script.add_argument(
        "--actions",
        metavar="JSON",
        help="keyboard action script, the `rtv rollout --action-script` format, played live: block k's entry is sent as "
        "interaction actions-kkk early enough to shape block k (see the note below); sets --blocks when not given",
    )
    script.add_argument(
        "--action-script",
        metavar="JSON",
        help="the same script sent with session.start (extra_params.camera_action_script): it plays from block 0, "
        "each entry on its block exactly; sets --blocks when not given",
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
  rtv generate --url ws://127.0.0.1:8000 --prompt "a snowy field" --action-script hold-l.json -o snow.mp4

Progress goes to stderr (in place on a terminal, one line per block otherwise).
The server starts block k+d before it sends chunk k (d = the pipeline_depth in
video.start), so the interaction for block k leaves once chunk k-1-d is in; the
summary's `interactions` list each one's started_block. Block 0 starts as the
server takes the session, so --actions' first entry may land a block late;
--action-script plays every entry on its own block, from the first frame.
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
    except (ClientConnectionError, SessionEndedError, ClientProtocolError, SessionFailed, ClientError) as exc:
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

