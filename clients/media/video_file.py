"""Reading a video file to stream it as a live camera would: its facts, frames picked by time, PCM16 audio.

Frames are picked by timestamp at a rate: for each time k/fps (k = 0, 1, ...,
before the clip's end) the latest frame shown at that time is taken, each
source frame at most once. Audio is resampled by PyAV to 16 kHz mono PCM16 LE.
Raises the SDK's ClientInputError for a file that cannot be opened; the caller
turns a failure part way through into MediaError.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from clients.sdk.chat import AUDIO_SAMPLE_RATE, DEFAULT_JPEG_QUALITY
from clients.sdk.connection import one_line as _one_line
from clients.sdk.errors import ClientInputError

TIME_EPSILON = 1e-4  # seconds: timestamps this close count as equal
T = TypeVar("T")


@dataclass(frozen=True)
class VideoInfo:
    path: Path
    width: int
    height: int
    frame_rate: float | None  # the stream's average rate
    num_frames: int | None  # as the container states it (0/None: unknown)
    start: float  # seconds: the video stream's start time (time 0 of the clip's timeline)
    duration: float | None  # seconds of video, when the container says
    has_audio: bool
    audio_sample_rate: int | None = None
    audio_channels: int | None = None
    audio_start: float | None = None  # seconds, on the file's clock
    audio_duration: float | None = None

    @property
    def end(self) -> float | None:
        """End of the clip on its timeline (seconds from `start`): the longer of video and audio."""
        ends = [self.duration] if self.duration is not None else []
        if self.audio_duration is not None and self.audio_start is not None:
            ends.append(self.audio_start - self.start + self.audio_duration)
        return max(ends) if ends else None

    def summary(self) -> dict:
        return {
            "path": str(self.path),
            "width": self.width,
            "height": self.height,
            "frame_rate": self.frame_rate,
            "num_frames": self.num_frames,
            "duration_seconds": self.duration,
            "has_audio": self.has_audio,
            "audio_sample_rate": self.audio_sample_rate,
            "audio_channels": self.audio_channels,
            "audio_duration_seconds": self.audio_duration,
        }


def _seconds(value: Any, time_base: Any) -> float | None:
    if value is None or time_base is None:
        return None
    return float(value * time_base)


def probe_video(path: str | os.PathLike) -> VideoInfo:
    """What `rtv chat` needs to know about a video file; raises ClientInputError."""
    import av

    p = Path(path)
    if not p.exists():
        raise ClientInputError(f"video file {p} does not exist")
    if not p.is_file():
        raise ClientInputError(f"video path {p} is not a file")
    try:
        with av.open(str(p), "r") as container:
            if not container.streams.video:
                raise ClientInputError(f"{p} has no video stream")
            v = container.streams.video[0]
            start = _seconds(v.start_time, v.time_base) or 0.0
            duration = _seconds(v.duration, v.time_base)
            if duration is None and container.duration is not None:
                duration = container.duration / 1_000_000 - start
            rate = float(v.average_rate) if v.average_rate else None
            a = container.streams.audio[0] if container.streams.audio else None
            audio = {}
            if a is not None:
                audio = dict(
                    audio_sample_rate=a.sample_rate or None,
                    audio_channels=a.channels or None,
                    audio_start=_seconds(a.start_time, a.time_base) if a.start_time is not None else start,
                    audio_duration=_seconds(a.duration, a.time_base),
                )
            return VideoInfo(
                path=p,
                width=v.codec_context.width,
                height=v.codec_context.height,
                frame_rate=rate,
                num_frames=v.frames or None,
                start=start,
                duration=duration if duration is not None and duration > 0 else None,
                has_audio=a is not None,
                **audio,
            )
    except ClientInputError:
        raise
    except (av.FFmpegError, OSError, ValueError) as exc:
        raise ClientInputError(f"cannot read video {p}: {_one_line(exc)}") from None


def _first_target(t: float, fps: float) -> float:
    """The first sampling time k/fps (k >= 0) at or after `t` (within TIME_EPSILON)."""
    k = max(0, math.ceil((t - TIME_EPSILON) * fps - 1e-9))
    return k / fps


def pick_by_time(items: Iterable[tuple[T, float]], fps: float, end: float | None = None) -> Iterator[tuple[T, float]]:
    """Pick (item, time) pairs by timestamp at `fps`, streaming (one item of lookahead).

    For each sampling time k/fps (k = 0, 1, ... while k/fps < `end`, the clip's end;
    without `end`, the last item's time + one frame interval), the latest item with
    time <= k/fps is picked; an item picked for several times is yielded once. The
    first item is always picked. Items whose time does not increase are skipped.
    """
    if not (fps > 0 and math.isfinite(fps)):
        raise ValueError(f"fps must be a positive number, got {fps!r}")
    previous: tuple[T, float] | None = None
    interval: float | None = None
    first = True
    for item, t in items:
        if previous is not None:
            if t <= previous[1] + TIME_EPSILON:
                continue
            interval = t - previous[1]
            if first or _first_target(previous[1], fps) < t - TIME_EPSILON:
                yield previous
            first = False
        previous = (item, t)
    if previous is not None:
        stop = end if end is not None else previous[1] + (interval if interval is not None else 1.0 / fps)
        if first or _first_target(previous[1], fps) < stop - TIME_EPSILON:
            yield previous


def pick_frame_times(times: Iterable[float], fps: float, end: float | None = None) -> list[float]:
    """The times `pick_by_time` picks from `times` (a pure function, for tests and planning)."""
    return [t for _, t in pick_by_time(((t, t) for t in times), fps, end)]


@dataclass(frozen=True)
class PickedFrame:
    index: int  # 0, 1, ... among the picked frames
    source_index: int  # index of the frame in the file's decode order
    time: float  # seconds on the clip's timeline
    jpeg: bytes = field(repr=False)

    @property
    def pts_ms(self) -> int:
        return int(round(self.time * 1000))


def iter_frames(
    path: str | os.PathLike, fps: float, *, jpeg_quality: int = DEFAULT_JPEG_QUALITY, info: VideoInfo | None = None
) -> Iterator[PickedFrame]:
    """Decode the video and yield the frames picked at `fps` (see `pick_by_time`) as JPEGs."""
    import io

    import av

    info = info or probe_video(path)

    def decoded() -> Iterator[tuple[tuple[int, Any], float]]:
        with av.open(str(path), "r") as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for i, frame in enumerate(container.decode(stream)):
                t = frame.time
                if t is None:
                    t = info.start + i / (info.frame_rate or fps)
                yield (i, frame), t - info.start

    for n, ((i, frame), t) in enumerate(pick_by_time(decoded(), fps, info.duration)):
        out = io.BytesIO()
        frame.to_image().save(out, format="JPEG", quality=jpeg_quality)
        yield PickedFrame(n, i, max(0.0, t), out.getvalue())


def iter_audio_pcm16(path: str | os.PathLike, rate: int = AUDIO_SAMPLE_RATE) -> Iterator[bytes]:
    """The file's first audio track as PCM16 LE mono at `rate`, in pieces as decoded (PyAV's
    AudioResampler), from the track's first sample; cut at the track's stated duration when the
    container gives one (the encoder's padding at the end is not audio)."""
    import av
    from av.audio.resampler import AudioResampler

    with av.open(str(path), "r") as container:
        if not container.streams.audio:
            raise ClientInputError(f"{path} has no audio stream")
        stream = container.streams.audio[0]
        duration = _seconds(stream.duration, stream.time_base)
        limit = round(duration * rate) if duration else None
        resampler = AudioResampler(format="s16", layout="mono", rate=rate)
        emitted = 0

        def pieces(frames) -> Iterator[bytes]:
            nonlocal emitted
            for out in frames:
                data = out.to_ndarray().astype("<i2", copy=False).tobytes()[: out.samples * 2]
                if limit is not None:
                    data = data[: max(0, limit - emitted) * 2]
                if data:
                    emitted += len(data) // 2
                    yield data

        for frame in container.decode(stream):
            yield from pieces(resampler.resample(frame))
            if limit is not None and emitted >= limit:
                return
        yield from pieces(resampler.resample(None))


def decode_audio_pcm16(path: str | os.PathLike, rate: int = AUDIO_SAMPLE_RATE) -> bytes:
    """The whole first audio track as PCM16 LE mono at `rate` (see `iter_audio_pcm16`)."""
    return b"".join(iter_audio_pcm16(path, rate))


class PcmTimeline:
    """PCM16 mono pieces laid on the clip's timeline: `take_until(t)` gives the samples from where
    the last call stopped up to time t. `offset` is the audio's start on that timeline (silence
    fills a later start; an earlier start is cut)."""

    def __init__(self, pieces: Iterable[bytes], offset: float = 0.0, rate: int = AUDIO_SAMPLE_RATE) -> None:
        self.rate = rate
        self._pieces = iter(pieces)
        self._buffer = bytearray()
        self._position = 0  # samples handed out
        self._skip = 0  # samples still to cut from the start
        self._exhausted = False
        shift = round(offset * rate)
        if shift > 0:
            self._buffer += bytes(2 * shift)
        else:
            self._skip = -shift

    def _pull(self) -> bool:
        while not self._exhausted:
            piece = next(self._pieces, None)
            if piece is None:
                self._exhausted = True
                return False
            if self._skip:
                cut = min(self._skip, len(piece) // 2)
                self._skip -= cut
                piece = piece[2 * cut :]
            if piece:
                self._buffer += piece
                return True
        return False

    def take_until(self, seconds: float) -> bytes:
        want = max(0, round(seconds * self.rate) - self._position)
        while len(self._buffer) < 2 * want and self._pull():
            pass
        return self._take(min(want, len(self._buffer) // 2))

    def take_rest(self) -> bytes:
        while self._pull():
            pass
        return self._take(len(self._buffer) // 2)

    def _take(self, samples: int) -> bytes:
        data = bytes(self._buffer[: 2 * samples])
        del self._buffer[: 2 * samples]
        self._position += samples
        return data

    @property
    def position(self) -> float:
        """Seconds handed out so far."""
        return self._position / self.rate
