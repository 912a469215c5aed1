"""`rtv chat`: stream a video file (and its audio) to `WS /v1/video/chat/stream` and print the answers.

The file is read with PyAV and played to the server as a live camera would:

- Frames are picked by timestamp at `--fps`: for each time k/fps (k = 0, 1, ...,
  before the clip's end) the latest frame shown at that time is taken, each
  source frame at most once (so `--fps` above the file's rate sends every frame).
  Times are seconds from the start of the video stream. Each frame goes out as a
  JPEG `video.frame` with `frame_id` ("frame-000000"...) and `pts_ms` (its time).
- `--with-audio`: the audio track is decoded, resampled by PyAV's
  `AudioResampler` to 16 kHz mono PCM16 LE and sent in `audio.chunk`s cut at the
  frames' times: the audio up to a frame's time goes right before the frame
  (and the audio up to a query's time right before the query); the rest after
  the last frame.
- `--realtime` (default): everything leaves at its time on the clip's timeline
  (a frame at 1.5 s leaves 1.5 s after the first). `--no-realtime`: as fast as
  the server acks the frames (each frame waits for the previous one's
  `video.frame.ack`).
- Queries: `--query-at T` (one per `--query`, in order, not decreasing) asks a
  query once the frames up to T have been sent (and, in real time, T seconds
  into the clip); frames keep flowing while it is answered. Without
  `--query-at`, the queries are asked after the last frame. Either way they are
  asked one after the other: a query waits for the previous answer's
  `response.text.done`.

Answers stream to stdout token by token as they arrive, one line per answer.
Notes (each query as it is asked), server errors and the closing statistics
(EVS, frames, audio) go to stderr. At the end `video.done` is sent and the
client waits for `session.done`.

Bad input: one line on stderr, exit 2 (nothing is sent). A session that ends
without `session.done`, or a query that gets an error instead of an answer:
exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

from clients.media.video_file import TIME_EPSILON, PcmTimeline, PickedFrame, VideoInfo, iter_audio_pcm16, iter_frames, probe_video
from clients.sdk.chat import DEFAULT_JPEG_QUALITY, ChatResult, ChatStreamClient, Event, chat_url, session_config_message
from clients.sdk.connection import one_line as _one_line
from clients.sdk.errors import (
    ClientConnectionError,
    ClientError,
    ClientInputError,
    ClientProtocolError,
    ClientTimeoutError,
    MediaError,
    ServerError,
    SessionEndedError,
)

DEFAULT_FPS = 2.0
DEFAULT_OPEN_TIMEOUT = 10.0
DEFAULT_REPLY_TIMEOUT = 300.0
QUERY_AT_SLACK = 0.05  # seconds a --query-at may pass the clip's end (container rounding)
NAME = "rtv chat"




# =====================================================================================
# Inputs
# =====================================================================================
@dataclass(frozen=True)
class PlannedQuery:
    index: int
    text: str
    at: float | None  # seconds on the clip's timeline; None: after the last frame


@dataclass
class ChatPlan:
    url: str
    video: VideoInfo
    fps: float
    with_audio: bool
    queries: list[PlannedQuery]
    config: dict
    realtime: bool
    json_path: Path | None
    open_timeout: float
    reply_timeout: float
    jpeg_quality: int = DEFAULT_JPEG_QUALITY


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def prepare_chat(args: argparse.Namespace) -> ChatPlan:
    """Check every input before anything is sent; raises ClientInputError (one line)."""
    url = chat_url(args.url)
    if not (_finite(args.fps) and args.fps > 0):
        raise ClientInputError(f"--fps must be a positive number, got {args.fps:g}")
    queries = list(args.query or [])
    for i, text in enumerate(queries):
        if not text.strip():
            raise ClientInputError(f"--query {i + 1} is blank")
    at = list(args.query_at) if args.query_at else None
    if at is not None:
        if len(at) != len(queries):
            raise ClientInputError(f"got {len(at)} --query-at for {len(queries)} --query; give one time per query, or none")
        for i, t in enumerate(at):
            if not (_finite(t) and t >= 0):
                raise ClientInputError(f"--query-at must be a number of seconds >= 0, got {t:g}")
            if i and t < at[i - 1]:
                raise ClientInputError(f"--query-at times must not decrease: query {i + 1} at {t:g}s comes before query {i} at {at[i - 1]:g}s")
    for name in ("max_frames", "sample_frames"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ClientInputError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if args.evs_threshold is not None:
        if args.no_evs:
            raise ClientInputError("--evs-threshold has no effect with --no-evs; give one or the other")
        if not (_finite(args.evs_threshold) and 0 <= args.evs_threshold <= 1):
            raise ClientInputError(f"--evs-threshold must be a similarity between 0 and 1, got {args.evs_threshold:g}")
    if not (1 <= args.jpeg_quality <= 100):
        raise ClientInputError(f"--jpeg-quality must be between 1 and 100, got {args.jpeg_quality}")
    for name in ("timeout", "reply_timeout"):
        value = getattr(args, name)
        if not (_finite(value) and value > 0):
            raise ClientInputError(f"--{name.replace('_', '-')} must be a positive number of seconds, got {value:g}")
    json_path = Path(args.json) if args.json else None
    if json_path is not None:
        if json_path.is_dir():
            raise ClientInputError(f"--json path {json_path} is a folder; give a file name such as {json_path / 'chat.json'}")
        if not json_path.parent.is_dir():
            raise ClientInputError(f"--json folder {json_path.parent} does not exist")

    info = probe_video(args.video)
    if args.with_audio and not info.has_audio:
        raise ClientInputError(f"{info.path} has no audio stream; drop --with-audio")
    if at is not None and info.duration is not None:
        last = at[-1]
        if last > info.duration + QUERY_AT_SLACK:
            raise ClientInputError(f"--query-at {last:g} is past the end of the clip ({info.duration:.2f}s)")

    config = session_config_message(
        model=args.model,
        modalities=["text"],
        max_frames=args.max_frames,
        num_sample_frames=args.sample_frames,
        evs_enabled=False if args.no_evs else None,
        evs_threshold=args.evs_threshold,
        system_prompt=args.system_prompt,
    )
    return ChatPlan(
        url=url,
        video=info,
        fps=float(args.fps),
        with_audio=bool(args.with_audio),
        queries=[PlannedQuery(i, text, at[i] if at is not None else None) for i, text in enumerate(queries)],
        config=config,
        realtime=bool(args.realtime),
        json_path=json_path,
        open_timeout=float(args.timeout),
        reply_timeout=float(args.reply_timeout),
        jpeg_quality=int(args.jpeg_quality),
    )


# =====================================================================================
# Driving one session
# =====================================================================================
@dataclass
class ChatOutcome:
    result: ChatResult
    sent_frames: list[PickedFrame] = field(default_factory=list)  # jpeg bytes dropped after sending
    query_media_times: dict[int, float] = field(default_factory=dict)  # where on the clip each query left (seconds)
    failure: str | None = None
    total_seconds: float = 0.0


class _Run:
    """One `rtv chat` session: a sender task (frames, audio, query marks) and an asker task."""

    def __init__(self, plan: ChatPlan, client: ChatStreamClient, out: TextIO, note: Callable[[str], None]) -> None:
        self.plan = plan
        self.client = client
        self.out = out
        self.note = note
        self.outcome = ChatOutcome(client.result())
        self.reached = [asyncio.Event() for _ in plan.queries]  # the sender got to the query's time
        self.asked = [asyncio.Event() for _ in plan.queries]  # the query is on the wire
        self.media_time = 0.0  # how far along the clip the sender is
        self._t0: float | None = None  # loop time of media time 0

    async def _at(self, t: float, audio: PcmTimeline | None) -> None:
        """Move the clip's clock to `t`: wait for it in real time, send the audio up to it."""
        loop = asyncio.get_running_loop()
        if self.plan.realtime and self._t0 is not None:
            delay = self._t0 + t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        self.media_time = max(self.media_time, t)
        if audio is not None:
            pcm = await self._read_audio(audio.take_until, t)
            if pcm:
                await self.client.send_audio(pcm)

    def _clip_time(self) -> float:
        """Where on the clip we are now: the clip's clock in real time (a query may leave later
        than its --query-at while the previous answer streams), else how far the sender got."""
        if self.plan.realtime and self._t0 is not None:
            return max(self.media_time, asyncio.get_running_loop().time() - self._t0)
        return self.media_time

    async def _read_audio(self, function: Callable[..., bytes], *args: Any) -> bytes:
        try:
            return await asyncio.to_thread(function, *args)
        except ClientError:
            raise
        except Exception as exc:
            raise MediaError(f"cannot decode the audio of {self.plan.video.path}: {_one_line(exc) or type(exc).__name__}") from None

    async def _mark(self, index: int) -> None:
        self.reached[index].set()
        if not self.plan.realtime:  # the clip waits for the query (a real camera would not)
            await self.asked[index].wait()

    async def send_media(self) -> None:
        plan = self.plan
        info = plan.video
        frames = iter_frames(info.path, plan.fps, jpeg_quality=plan.jpeg_quality, info=info)
        audio = None
        if plan.with_audio:
            offset = (info.audio_start if info.audio_start is not None else info.start) - info.start
            audio = PcmTimeline(iter_audio_pcm16(info.path), offset)
        timed = [q for q in plan.queries if q.at is not None]
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    frame = await asyncio.to_thread(next, frames, None)
                except ClientError:
                    raise
                except Exception as exc:  # PyAV / Pillow failing on a damaged file
                    raise MediaError(f"cannot decode {info.path}: {_one_line(exc) or type(exc).__name__}") from None
                if frame is None:
                    break
                if self._t0 is None:
                    self._t0 = loop.time() - frame.time
                while timed and timed[0].at < frame.time - TIME_EPSILON:
                    query = timed.pop(0)
                    await self._at(query.at, audio)
                    await self._mark(query.index)
                if not plan.realtime:
                    await self.client.wait_acks(0, timeout=plan.reply_timeout)
                await self._at(frame.time, audio)
                await self.client.send_frame(frame.jpeg, pts_ms=frame.pts_ms)
                self.outcome.sent_frames.append(PickedFrame(frame.index, frame.source_index, frame.time, b""))
            for query in timed:
                await self._at(query.at, audio)
                await self._mark(query.index)
            end = info.end
            if end is not None:
                await self._at(end, audio)
            if audio is not None:
                rest = await self._read_audio(audio.take_rest)
                if rest:
                    await self.client.send_audio(rest)
            for query in plan.queries:
                if query.at is None:
                    await self._mark(query.index)
        finally:
            try:
                frames.close()
            except ValueError:  # still running in its worker thread (we were cancelled): it ends on its own
                pass

    async def ask_queries(self) -> None:
        total = len(self.plan.queries)
        for query in self.plan.queries:
            await self.reached[query.index].wait()
            stream = await self.client.query(query.text, timeout=self.plan.reply_timeout)
            self.asked[query.index].set()
            where = self._clip_time()
            self.outcome.query_media_times[query.index] = where
            self.note(f"query {query.index + 1}/{total} at {where:.2f}s of the clip: {query.text}")
            async for delta in stream:
                self.out.write(delta.delta)
                self.out.flush()
            answer = stream.answer
            streamed = answer.streamed_text
            if answer.text and answer.text != streamed:
                # A server that sends the text only in response.text.done (or more than it streamed).
                self.out.write(answer.text[len(streamed) :] if answer.text.startswith(streamed) else ("\n" if streamed else "") + answer.text)
            if answer.started_at is not None or answer.text:
                self.out.write("\n")
                self.out.flush()
            if answer.ended_by == "closed":
                raise SessionEndedError(self.client.result().failure() or "the connection closed during an answer")


async def drive_chat(
    plan: ChatPlan,
    *,
    out: TextIO | None = None,
    note: Callable[[str], None] | None = None,
    on_error: Callable[[ServerError], None] | None = None,
) -> ChatOutcome:
    """Run one session by the plan; answers stream to `out` (default stdout).

    Returns the outcome (with `failure` set when the session failed after it
    started); raises ClientConnectionError when the server cannot be reached.
    """
    out = out if out is not None else sys.stdout
    note = note or (lambda text: None)

    def on_event(event: Event) -> None:
        if isinstance(event, ServerError) and on_error is not None:
            on_error(event)

    client = ChatStreamClient(plan.url, open_timeout=plan.open_timeout, on_event=on_event)
    t_start = time.perf_counter()
    await client.connect()
    run = _Run(plan, client, out, note)
    outcome = run.outcome
    try:
        await client.configure(message=plan.config)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(run.send_media())
                group.create_task(run.ask_queries())
        except BaseExceptionGroup as group_error:
            raise _first_error(group_error) from None
        await client.done(timeout=plan.reply_timeout)
        await client.wait_closed(2.0)
    except ClientTimeoutError as exc:
        outcome.failure = _one_line(exc)
    except (SessionEndedError, ClientProtocolError) as exc:
        outcome.failure = client.result().failure() or _one_line(exc)
    finally:
        await client.close()
        outcome.total_seconds = time.perf_counter() - t_start
    return outcome


def _first_error(group: BaseExceptionGroup) -> BaseException:
    """The first exception of a TaskGroup failure that is not a cancellation (ours before others)."""
    flat: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            flat.append(exc)

    walk(group)
    for exc in flat:
        if isinstance(exc, ClientError):
            return exc
    for exc in flat:
        if not isinstance(exc, asyncio.CancelledError):
            return exc
    return flat[0] if flat else group


def chat_summary(plan: ChatPlan, outcome: ChatOutcome) -> dict:
    result = outcome.result
    return {
        **result.summary(),
        "video": plan.video.summary(),
        "fps": plan.fps,
        "realtime": plan.realtime,
        "with_audio": plan.with_audio,
        "queries": [
            {
                "index": q.index,
                "text": q.text,
                "at_seconds": q.at,
                "asked_at_media_seconds": outcome.query_media_times.get(q.index),
            }
            for q in plan.queries
        ],
        "picked_frames": [{"index": f.index, "source_index": f.source_index, "time_seconds": f.time} for f in outcome.sent_frames],
        "total_seconds": outcome.total_seconds,
        "session_failure": outcome.failure,
    }


# =====================================================================================
# rtv chat
# =====================================================================================
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `rtv chat` (argparse only)."""
    parser.add_argument("--url", required=True, metavar="ws://HOST:PORT", help="the server (the /v1/video/chat/stream path is added when missing)")
    parser.add_argument("--video", required=True, metavar="FILE", help="the video file to stream (anything PyAV reads: MP4, MKV, WebM...)")
    parser.add_argument("--fps", type=float, default=DEFAULT_FPS, metavar="N", help=f"frames per second to send, picked by timestamp (default: {DEFAULT_FPS:g})")
    parser.add_argument("--with-audio", action="store_true", help="also send the audio track (16 kHz mono PCM16, cut at the frames' times)")
    parser.add_argument("--query", action="append", required=True, metavar="TEXT", help="a question about the video (repeatable; asked in order)")
    parser.add_argument(
        "--query-at", action="append", type=float, metavar="SECONDS",
        help="when to ask each --query, in seconds into the clip (one per --query, not decreasing; "
        "default: each after the last frame)",
    )
    parser.add_argument("--system-prompt", metavar="TEXT", help="system prompt of the session (default: the server's)")
    parser.add_argument("--model", metavar="NAME", help="model name to send in session.config (default: the server's)")
    parser.add_argument("--max-frames", type=int, metavar="N", help="frames the server keeps (default: the server's, 64)")
    parser.add_argument("--sample-frames", type=int, metavar="N", help="frames sampled for each query (num_sample_frames; default: the server's, 16); at least --max-frames: every kept frame, which the server prefills as it arrives")
    parser.add_argument("--no-evs", action="store_true", help="turn the server's similar-frame filter (EVS) off")
    parser.add_argument("--evs-threshold", type=float, metavar="X", help="EVS similarity at or above which a frame is dropped (default: the server's, 0.95)")
    parser.add_argument(
        "--realtime", action=argparse.BooleanOptionalAction, default=True,
        help="pace frames and audio on the clip's clock like a live camera (default); "
        "--no-realtime sends each frame once the previous one is acked",
    )
    parser.add_argument("--json", metavar="OUT.json", help="write a JSON summary of the session (frames, acks, answers with their timings, EVS stats)")
    parser.add_argument("--jpeg-quality", type=int, default=DEFAULT_JPEG_QUALITY, metavar="Q", help=f"JPEG quality of the frames, 1-100 (default: {DEFAULT_JPEG_QUALITY})")
    parser.add_argument("--timeout", type=float, default=DEFAULT_OPEN_TIMEOUT, metavar="SECONDS", help=f"connection timeout (default: {DEFAULT_OPEN_TIMEOUT:g})")
    parser.add_argument(
        "--reply-timeout", type=float, default=DEFAULT_REPLY_TIMEOUT, metavar="SECONDS",
        help=f"longest wait for an ack, for the next piece of an answer, or for session.done (default: {DEFAULT_REPLY_TIMEOUT:g})",
    )


EPILOG = """\
Examples:
  rtv chat --url ws://127.0.0.1:8000 --video clip.mp4 --query "What is moving?"
  rtv chat --url ws://127.0.0.1:8000 --video clip.mp4 --fps 2 --with-audio \\
      --query "What colour is the square?" --query-at 1.5 \\
      --query "Which way does it move?" --query-at 4 --json chat.json

Answers stream to stdout, one line each; notes, server errors and the EVS
statistics go to stderr. Queries are asked one at a time (each waits for the
previous answer's response.text.done); frames keep flowing meanwhile.
Exit codes: 0 every query answered and session.done; 1 the session failed or a
query got an error instead of an answer; 2 bad input; 130 interrupted.
"""


def main(args: argparse.Namespace) -> int:
    """Run `rtv chat` from parsed arguments; returns the exit code."""
    err = sys.stderr

    def say(text: str) -> None:
        err.write(f"{NAME}: {text}\n")
        err.flush()

    try:
        plan = prepare_chat(args)
    except ClientInputError as exc:
        say(f"error: {_one_line(exc)}")
        return 2
    try:
        outcome = asyncio.run(drive_chat(plan, out=sys.stdout, note=say, on_error=lambda e: say(f"server error: {e}")))
    except (ClientConnectionError, ClientError) as exc:
        say(f"error: {_one_line(exc)}")
        return 1
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    result = outcome.result
    if result.evs_stats is not None:
        say(f"EVS: {result.evs_stats}")
    acked = len(result.acks)
    audio = f", {result.audio_seconds:.2f}s of audio in {len(result.audio)} chunks" if plan.with_audio else ""
    say(
        f"sent {len(result.frames)} frames ({acked} acked, {result.accepted_frames} accepted){audio}; "
        f"{sum(1 for a in result.answers if a.ok)}/{len(plan.queries)} answers; {outcome.total_seconds:.2f}s"
    )
    if plan.json_path is not None:
        summary = chat_summary(plan, outcome)
        try:
            plan.json_path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
        except OSError as exc:
            say(f"error: cannot write {plan.json_path}: {_one_line(exc)}")
            return 1
    failed = [a.failure() for a in result.answers if not a.ok]
    if outcome.failure is not None:
        say(f"error: {outcome.failure}")
        return 1
    if len(result.answers) < len(plan.queries):
        say(f"error: only {len(result.answers)} of {len(plan.queries)} queries were asked")
        return 1
    if failed:
        say(f"error: {len(failed)} of {len(plan.queries)} queries got no answer ({failed[0]})")
        return 1
    return 0
