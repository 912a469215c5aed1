"""Small real MP4 clips for tests and benchmarks of the video-understanding endpoint.

`make_test_clip` writes H.264 (yuv420p) video and, when `tone_hz` is set, an
AAC mono sine tone, muxed into a plain MP4 with PyAV:

    from deployments.media.testclips import make_test_clip
    clip = make_test_clip(tmp_path / "clip.mp4", seconds=3.0, fps=10)            # moving + 440 Hz tone
    still = make_test_clip(tmp_path / "still.mp4", moving=False, tone_hz=None)   # static image, no audio

Picture (`moving=True`): a colour pattern scrolling sideways at SCROLL_CYCLES_PER_SECOND
plus a bright square (half the frame height) sliding right across the whole
width every SQUARE_PERIOD_SECONDS (wrapping around the edge). Both rates are chosen so that no common
sampling rate (1, 2, 5, 10 fps...) sees the same picture twice, and two
frames half a second apart differ far more than the default EVS threshold
(similarity well under 0.95). `moving=False` gives the same picture (the
pattern at t=0, the square in the middle) in every frame, so EVS keeps only the
first frame.

Frame i has pts i (time base 1/fps), i.e. time i/fps; there are
round(seconds * fps) frames. The tone has round(seconds * sample_rate)
samples at amplitude TONE_AMPLITUDE, starting at time 0.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

SCROLL_CYCLES_PER_SECOND = 0.37
SQUARE_PERIOD_SECONDS = 1.3
TONE_AMPLITUDE = 0.5
AAC_SAMPLE_RATES = (7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000)


def clip_frame(index: int, fps: float, size: tuple[int, int] = (160, 120), moving: bool = True) -> np.ndarray:
    """Frame `index` of a clip as RGB uint8 [H, W, 3] (what `make_test_clip` encodes)."""
    width, height = size
    t = index / fps if moving else 0.0
    x = np.arange(width, dtype=np.float32)[None, :]
    y = np.arange(height, dtype=np.float32)[:, None]
    phase = 2.0 * math.pi * (x / width - SCROLL_CYCLES_PER_SECOND * t)
    frame = np.empty((height, width, 3), np.float32)
    frame[..., 0] = 40.0 + 60.0 * (1.0 + np.sin(phase))  # red: scrolling waves, 40..160
    frame[..., 1] = 30.0 + 90.0 * (y / max(1, height - 1))  # green: vertical ramp, 30..120
    frame[..., 2] = 60.0 + 50.0 * (1.0 + np.cos(phase + y / height * math.pi))  # blue: slanted waves, 60..160
    side = max(2, height // 2)
    if moving:  # slides right at constant speed, leaving on the right and coming back in on the left
        left = int(round(width * ((t / SQUARE_PERIOD_SECONDS) % 1.0)))
    else:
        left = (width - side) // 2
    top = (height - side) // 2
    columns = (left + np.arange(min(side, width))) % width
    frame[top : top + side, columns] = (250.0, 250.0, 235.0)
    return np.clip(frame, 0, 255).astype(np.uint8)


def tone_samples(count: int, sample_rate: int, tone_hz: float, amplitude: float = TONE_AMPLITUDE, start: int = 0) -> np.ndarray:
    """Samples [start, start + count) of the clip's sine tone, float32 in [-1, 1]."""
    n = np.arange(start, start + count, dtype=np.float64)
    return (amplitude * np.sin(2.0 * math.pi * tone_hz * n / sample_rate)).astype(np.float32)


def make_test_clip(
    path: str | os.PathLike,
    seconds: float = 3.0,
    fps: int = 10,
    size: tuple[int, int] = (160, 120),
    moving: bool = True,
    tone_hz: float | None = 440.0,
    sample_rate: int = 16000,
) -> Path:
    """Write an MP4 (H.264 video; AAC mono audio when `tone_hz` is set) to `path` and return it as a Path.

    `size` is (width, height), both even. `fps` is a positive integer frame
    rate. `sample_rate` is one of the AAC rates (16000 and 44100 are the
    usual ones). Raises ValueError on bad arguments.
    """
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds must be a positive number, got {seconds!r}")
    if isinstance(fps, bool) or not isinstance(fps, int) or fps < 1:
        raise ValueError(f"fps must be a positive integer, got {fps!r}")
    width, height = size
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 16 or value % 2:
            raise ValueError(f"{name} must be an even integer >= 16, got {value!r}")
    if tone_hz is not None:
        if not (isinstance(tone_hz, (int, float)) and math.isfinite(tone_hz) and 0 < tone_hz < sample_rate / 2):
            raise ValueError(f"tone_hz must be between 0 and half the sample rate ({sample_rate / 2:g}), got {tone_hz!r}")
        if sample_rate not in AAC_SAMPLE_RATES:
            raise ValueError(f"sample_rate must be one of {AAC_SAMPLE_RATES}, got {sample_rate!r}")
    num_frames = max(1, round(seconds * fps))
    num_samples = round(seconds * sample_rate)

    out = Path(path)
    part = out.with_name(out.name + ".part")
    try:
        with av.open(str(part), "w", format="mp4") as container:
            video = container.add_stream("libx264", rate=fps)
            video.width, video.height = width, height
            video.pix_fmt = "yuv420p"
            video.time_base = Fraction(1, fps)
            video.codec_context.options = {"preset": "veryfast", "crf": "20", "bf": "0"}
            audio = None
            if tone_hz is not None:
                audio = container.add_stream("aac", rate=sample_rate, layout="mono")
                audio.time_base = Fraction(1, sample_rate)

            samples_sent = 0
            block = 1024  # AAC frame size
            for i in range(num_frames):
                frame = av.VideoFrame.from_ndarray(clip_frame(i, fps, (width, height), moving), format="rgb24")
                frame.pts = i
                for packet in video.encode(frame):
                    container.mux(packet)
                if audio is not None:
                    # Keep the audio up to this frame's end so the muxer interleaves them evenly.
                    until = min(num_samples, round((i + 1) / fps * sample_rate))
                    while samples_sent < until:
                        count = min(block, num_samples - samples_sent)
                        samples_sent = _encode_audio(container, audio, tone_hz, sample_rate, samples_sent, count)
            if audio is not None:
                while samples_sent < num_samples:
                    count = min(block, num_samples - samples_sent)
                    samples_sent = _encode_audio(container, audio, tone_hz, sample_rate, samples_sent, count)
                for packet in audio.encode(None):
                    container.mux(packet)
            for packet in video.encode(None):
                container.mux(packet)
        os.replace(part, out)
    finally:
        part.unlink(missing_ok=True)
    return out


def _encode_audio(container, stream, tone_hz: float, sample_rate: int, start: int, count: int) -> int:
    samples = tone_samples(count, sample_rate, tone_hz, start=start)
    frame = av.AudioFrame.from_ndarray(samples[None, :], format="fltp", layout="mono")
    frame.sample_rate = sample_rate
    frame.pts = start
    frame.time_base = Fraction(1, sample_rate)
    for packet in stream.encode(frame):
        container.mux(packet)
    return start + count
