"""Frames in (`WS /v1/video/chat/stream`, PROTOCOL.md section 2): decode, filter (EVS), buffer, sample; audio in.

No Ray, no sockets, no torch: bytes in, numpy out.

    thumb = frame_thumbnail(data)                 # bounded, cheap decode; FrameError when not a usable image
    if evs.check(thumb):                          # drop near-duplicates of the last RETAINED frame
        evicted = buffer.append(decode_image(data, max_side=448))   # ring of max_frames, oldest out
    ...                                           # (or decode_frame(data, 448): both at once)
    images = buffer.sample(config.num_sample_frames)
    pcm = audio.take()                            # float32 in [-1, 1), buffer cleared

Decoding is bounded before any pixel is decoded: the frame's own header
(PNG IHDR, JPEG SOF) is read here, and a declared width x height above
`max_pixels` is refused; Pillow's own decompression-bomb check stays on
behind it (our limit is far below its warning level, so it never warns
unless `max_pixels` is raised above `Image.MAX_IMAGE_PIXELS`). JPEG is decoded at reduced size straight from the DCT (Pillow's
`draft()`: 1/2, 1/4 or 1/8 scale), so neither the model-sized image nor the
EVS thumbnail pays for a full-resolution decode.

EVS (PROTOCOL.md): shrink to 64x64 RGB (bilinear, aspect ignored); similarity
= 1 - mean((a - b)^2) / 255^2 against the last retained frame; drop when
similarity >= threshold; the first frame is always kept. vLLM-Omni computes
the thumbnail from a full decode (`reference_thumbnail`, kept here as the
yardstick); ours decodes a JPEG at the smallest DCT scale that still leaves
at least 56 px (7/8 of the thumbnail) on both sides and resizes that, which
agrees with the full decode to well under 0.01 in similarity
(tests/test_frames.py) at a fraction of the cost. EXIF orientation is not
applied (neither does the reference): webcam frames carry none, and the
filter compares frames of one stream with each other.
"""

from __future__ import annotations

import io
import struct
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
from PIL import Image

THUMBNAIL_SIZE = 64  # PROTOCOL.md: EVS compares 64x64 RGB thumbnails
FRAME_MAX_PIXELS = 4096 * 4096  # declared width x height above this is refused before decoding
DEFAULT_EVS_THRESHOLD = 0.95
AUDIO_SAMPLE_RATE = 16000  # PROTOCOL.md: audio.chunk is PCM16 LE, 16 kHz, mono
AUDIO_MAX_SECONDS = 30.0

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SOI = b"\xff\xd8"
# Start-of-frame markers (baseline, extended, progressive, lossless; Huffman and arithmetic). Not C4/C8/CC.
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RSTn: no length field


class FrameError(ValueError):
    """The bytes are not a usable frame; `str(error)` is a reason a person can read."""


# =====================================================================================
# Header probe: format and declared size, no pixels decoded
# =====================================================================================
def probe_frame(data: bytes) -> tuple[str, int, int]:
    """`("JPEG" | "PNG", width, height)` from the file's own header; FrameError for anything else."""
    if data.startswith(_PNG_SIGNATURE):
        # The first chunk must be IHDR: length 13, type, width, height (big-endian).
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise FrameError("corrupt PNG: no IHDR header")
        width, height = struct.unpack(">II", data[16:24])
        return "PNG", width, height
    if data.startswith(_JPEG_SOI):
        width, height = _jpeg_size(data)
        return "JPEG", width, height
    if not data:
        raise FrameError("empty frame")
    raise FrameError("not a JPEG or PNG image")


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """Walk the marker segments up to the first SOF; its height and width."""
    i, n = 2, len(data)
    while i < n:
        if data[i] != 0xFF:
            raise FrameError("corrupt JPEG: bad marker")
        while i < n and data[i] == 0xFF:  # fill bytes
            i += 1
        if i >= n:
            break
        marker = data[i]
        i += 1
        if marker in _JPEG_STANDALONE:
            continue
        if marker in (0xD9, 0xDA):  # EOI or SOS before any SOF
            raise FrameError("corrupt JPEG: no frame header before the image data")
        if i + 2 > n:
            break
        length = (data[i] << 8) | data[i + 1]
        if length < 2:
            raise FrameError("corrupt JPEG: bad segment length")
        if marker in _JPEG_SOF:
            if i + 7 > n:
                break
            height = (data[i + 3] << 8) | data[i + 4]
            width = (data[i + 5] << 8) | data[i + 6]
            return width, height
        i += length
    raise FrameError("truncated JPEG: no frame header")


def _check_size(width: int, height: int, max_pixels: int) -> None:
    if width <= 0 or height <= 0:
        raise FrameError(f"the image declares a size of {width}x{height}")
    if width * height > max_pixels:
        raise FrameError(f"the image is {width}x{height} ({width * height} pixels), more than the limit of {max_pixels} pixels")


# =====================================================================================
# Decode
# =====================================================================================
@dataclass(frozen=True, eq=False)
class DecodedFrame:
    """One decoded frame: the EVS thumbnail, and (when asked for) the image at most `max_side` on its longest side."""

    format: str  # "JPEG" or "PNG"
    width: int  # as the file declares it
    height: int
    thumbnail: np.ndarray  # uint8 (64, 64, 3): the EVS view, aspect ignored
    image: np.ndarray | None  # uint8 (h, w, 3), max(h, w) <= max_side, aspect kept; None when with_image=False
    nbytes: int  # size of the encoded frame


def fit_within(width: int, height: int, max_side: int) -> tuple[int, int]:
    """The size with the longest side at most `max_side`, aspect kept (never upscaled, never 0)."""
    longest = max(width, height)
    if longest <= max_side:
        return width, height
    scale = max_side / longest
    return max(1, round(width * scale)), max(1, round(height * scale))


def decode_frame(
    data: bytes,
    max_side: int,
    *,
    with_image: bool = True,
    max_pixels: int = FRAME_MAX_PIXELS,
) -> DecodedFrame:
    """JPEG or PNG bytes -> `DecodedFrame`; FrameError (with the reason) for anything else, corrupt, or too large.

    The declared size is checked against `max_pixels` before any decoding. A
    JPEG is decoded at the smallest DCT scale that still covers the size
    needed (`draft()`), once for the thumbnail and, with `with_image`, once
    for the image; a PNG is decoded once and both are cut from it.
    `with_image=False` is the cheap path for a frame that EVS may drop (then
    `decode_image` for one it keeps).
    """
    if max_side < 1:
        raise ValueError(f"max_side must be >= 1, got {max_side}")
    data = _as_bytes(data)
    fmt, width, height = _probe(data, max_pixels)
    with _decode_errors(fmt, max_pixels):
        if fmt == "JPEG":
            thumbnail = _thumbnail(_jpeg_rgb(data, _thumbnail_draft(width, height), max_pixels))
            image = _jpeg_image(data, width, height, max_side, max_pixels) if with_image else None
        else:
            full = _open_rgb(data, fmt, max_pixels)
            thumbnail = _thumbnail(full)
            image = _fit(full, max_side) if with_image else None
    return DecodedFrame(
        format=fmt,
        width=width,
        height=height,
        thumbnail=np.asarray(thumbnail, dtype=np.uint8),
        image=None if image is None else np.asarray(image, dtype=np.uint8),
        nbytes=len(data),
    )


def decode_image(data: bytes, max_side: int, *, max_pixels: int = FRAME_MAX_PIXELS) -> np.ndarray:
    """The image alone: uint8 (h, w, 3), longest side at most `max_side` (JPEG decoded at reduced size)."""
    if max_side < 1:
        raise ValueError(f"max_side must be >= 1, got {max_side}")
    data = _as_bytes(data)
    fmt, width, height = _probe(data, max_pixels)
    with _decode_errors(fmt, max_pixels):
        if fmt == "JPEG":
            image = _jpeg_image(data, width, height, max_side, max_pixels)
        else:
            image = _fit(_open_rgb(data, fmt, max_pixels), max_side)
    return np.asarray(image, dtype=np.uint8)


def frame_thumbnail(data: bytes, *, max_pixels: int = FRAME_MAX_PIXELS) -> np.ndarray:
    """The 64x64 RGB uint8 EVS thumbnail alone (the cheap path)."""
    return decode_frame(data, THUMBNAIL_SIZE, with_image=False, max_pixels=max_pixels).thumbnail


_THUMBNAIL = (THUMBNAIL_SIZE, THUMBNAIL_SIZE)
# The thumbnail's decode may come out up to 1/8 short on a side (640x480 at 1/8 is 80x60; 448x252 at
# 1/4 is 112x63): stretching 60 rows to 64 moves the similarity by ~0.001, while decoding at the next
# larger DCT scale cost 30-50% more per frame here.
_THUMBNAIL_MIN_DECODED = THUMBNAIL_SIZE * 7 // 8


def _thumbnail_draft(width: int, height: int) -> tuple[int, int]:
    """The size to ask `draft()` for the thumbnail, so it picks the smallest DCT scale that leaves at
    least `_THUMBNAIL_MIN_DECODED` px on each side (draft takes the largest scale s with size // s >= asked)."""
    for scale in (8, 4, 2):
        if min(width, height) // scale >= _THUMBNAIL_MIN_DECODED:
            return min(THUMBNAIL_SIZE, width // scale), min(THUMBNAIL_SIZE, height // scale)
    return _THUMBNAIL


def _as_bytes(data: bytes | bytearray | memoryview) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"frame data must be bytes, got {type(data).__name__}")


def _probe(data: bytes, max_pixels: int) -> tuple[str, int, int]:
    fmt, width, height = probe_frame(data)
    _check_size(width, height, max_pixels)
    return fmt, width, height


@contextmanager
def _decode_errors(fmt: str, max_pixels: int) -> Iterator[None]:
    """Whatever Pillow raises on hostile or broken input -> FrameError with a reason."""
    try:
        yield
    except FrameError:
        raise
    except Image.DecompressionBombError:
        raise FrameError(f"the image is more than the limit of {max_pixels} pixels") from None
    except MemoryError:
        raise FrameError("the image is too large to decode") from None
    except Exception as exc:  # noqa: BLE001 - OSError, SyntaxError, ValueError, struct.error, ... on corrupt input
        raise FrameError(f"corrupt or truncated {fmt}: {_reason(exc)}") from None


def _thumbnail(img: Image.Image) -> Image.Image:
    return _resize(img, _THUMBNAIL)


def _fit(img: Image.Image, max_side: int) -> Image.Image:
    return _resize(img, fit_within(img.width, img.height, max_side))


def _jpeg_image(data: bytes, width: int, height: int, max_side: int, max_pixels: int) -> Image.Image:
    target = fit_within(width, height, max_side)
    return _resize(_jpeg_rgb(data, target, max_pixels), target)


def _reason(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."


def _open(data: bytes, fmt: str, max_pixels: int) -> Image.Image:
    img = Image.open(io.BytesIO(data), formats=(fmt,))
    # Pillow may read a different size than our probe (several SOF markers): check what it will decode.
    _check_size(img.width, img.height, max_pixels)
    return img


def _jpeg_rgb(data: bytes, size: tuple[int, int], max_pixels: int) -> Image.Image:
    """Decode at the smallest DCT scale (1, 1/2, 1/4, 1/8) whose result is still at least `size`."""
    img = _open(data, "JPEG", max_pixels)  # no `with`: closing an image frees its pixels; BytesIO needs no closing
    img.draft("RGB", size)
    img.load()
    return _to_rgb(img)


def _open_rgb(data: bytes, fmt: str, max_pixels: int) -> Image.Image:
    img = _open(data, fmt, max_pixels)
    img.load()
    return _to_rgb(img)


def _to_rgb(img: Image.Image) -> Image.Image:
    if img.mode == "RGB":
        return img
    if img.mode.startswith("I"):  # 16-bit greyscale PNG: keep the top 8 bits (convert() would clip at 255)
        grey = (np.asarray(img).astype(np.int64) >> 8).clip(0, 255).astype(np.uint8)
        return Image.fromarray(np.repeat(grey[:, :, None], 3, axis=2))
    return img.convert("RGB")


def _resize(img: Image.Image, size: tuple[int, int]) -> Image.Image:
    # Bilinear for both: PROTOCOL's EVS filter, and Pillow's (antialiased) bilinear is also what the
    # model-sized image gets (bicubic costs ~1.7x as much here for no difference a VLM would see).
    return img if img.size == size else img.resize(size, Image.Resampling.BILINEAR)


# =====================================================================================
# EVS frame filter
# =====================================================================================
def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """PROTOCOL.md's EVS similarity of two thumbnails: 1 - mean((a - b)^2) / 255^2, in [0, 1]."""
    diff = np.asarray(a, dtype=np.float64).ravel() - np.asarray(b, dtype=np.float64).ravel()
    # An elementwise square and sum, not np.dot: a dot of float64 goes through OpenBLAS, whose worker
    # threads made each comparison cost ~0.7 ms on a busy 2-core machine (0.03 ms on one thread), more
    # than decoding the thumbnail. The squares of whole-number differences add up exactly either way.
    mse = float(np.square(diff).sum()) / diff.size
    return 1.0 - mse / (255.0 * 255.0)


class FrameFilter:
    """EVS: drop a frame whose thumbnail is at least `threshold` similar to the last RETAINED one.

    The first frame is always kept. Disabled, every frame is kept (and counted
    as retained). Counters: `retained`, `dropped`, `total`.
    """

    def __init__(self, threshold: float = DEFAULT_EVS_THRESHOLD, enabled: bool = True) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        self.threshold = float(threshold)
        self.enabled = enabled
        self.retained = 0
        self.dropped = 0
        self.last_similarity: float | None = None  # of the last frame checked against a retained one
        self._reference: np.ndarray | None = None

    @property
    def total(self) -> int:
        return self.retained + self.dropped

    @property
    def drop_rate(self) -> float:
        return self.dropped / self.total if self.total else 0.0

    def check(self, thumbnail: np.ndarray) -> bool:
        """True: keep this frame (it becomes the reference); False: drop it."""
        if not self.enabled:
            self.retained += 1
            return True
        current = np.asarray(thumbnail, dtype=np.float64)
        if self._reference is not None:
            self.last_similarity = similarity(self._reference, current)
            if self.last_similarity >= self.threshold:
                self.dropped += 1
                return False
        self._reference = current
        self.retained += 1
        return True

    def stats(self) -> dict[str, int | float]:
        """The fields of `response.evs_stats`."""
        return {
            "retained_count": self.retained,
            "dropped_count": self.dropped,
            "total_count": self.total,
            "drop_rate": self.drop_rate,
        }

    def reset(self) -> None:
        """Forget the reference (the next frame is kept) and zero the counters."""
        self._reference = None
        self.last_similarity = None
        self.retained = self.dropped = 0


def reference_thumbnail(data: bytes) -> np.ndarray:
    """The slow way, as vLLM-Omni's filter does it: full decode, resize to 64x64 bilinear, RGB. Benchmarks and tests only."""
    with Image.open(io.BytesIO(data)) as img:
        small = img.resize((THUMBNAIL_SIZE, THUMBNAIL_SIZE), Image.Resampling.BILINEAR).convert("RGB")
        return np.asarray(small, dtype=np.uint8)


def reference_similarity(jpeg_a: bytes, jpeg_b: bytes) -> float:
    """EVS similarity of two encoded frames the slow way (full decodes); the yardstick for the fast path."""
    return similarity(reference_thumbnail(jpeg_a), reference_thumbnail(jpeg_b))


# =====================================================================================
# Buffers
# =====================================================================================
def sample_indices(n: int, k: int) -> list[int]:
    """PROTOCOL.md's sampling: k = min(n, k); k == 1 -> newest; k >= n -> all; else int(i*(n-1)/(k-1)).

    With 2 <= k < n the first and the last frame are always in, and the indices strictly increase.
    """
    k = min(n, k)
    if k <= 0:
        return []
    if k == 1:
        return [n - 1]
    if k >= n:
        return list(range(n))
    return [int(i * (n - 1) / (k - 1)) for i in range(k)]


T = TypeVar("T")


DEFAULT_FRAME_RATE = 2.0  # frames per second, when frames carry no timestamps


def frame_rate(pts_ms: list[float | None], default: float = DEFAULT_FRAME_RATE) -> float:
    """The rate frames span, from the first and last timestamps (milliseconds) when both are known."""
    if len(pts_ms) > 1 and pts_ms[0] is not None and pts_ms[-1] is not None:
        span = (pts_ms[-1] - pts_ms[0]) / 1000.0
        if span > 0:
            return (len(pts_ms) - 1) / span
    return default


class FrameBuffer(Generic[T]):
    """Ring of the last `max_frames` retained frames, oldest out. Holds whatever the caller stores per frame."""

    def __init__(self, max_frames: int) -> None:
        if max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {max_frames}")
        self.max_frames = max_frames
        self._frames: deque[T] = deque()
        self.evicted = 0  # frames pushed out by newer ones, over the buffer's life

    def append(self, frame: T) -> T | None:
        """Add the newest frame; returns the evicted oldest one when the ring was full."""
        out = None
        if len(self._frames) >= self.max_frames:
            out = self._frames.popleft()
            self.evicted += 1
        self._frames.append(frame)
        return out

    def sample(self, num_sample_frames: int) -> list[T]:
        """The frames a query sees, oldest first (a snapshot: frames arriving later do not change it)."""
        frames = self._frames
        return [frames[i] for i in sample_indices(len(frames), num_sample_frames)]

    def frames(self) -> list[T]:
        return list(self._frames)

    def newest(self) -> T | None:
        return self._frames[-1] if self._frames else None

    def clear(self) -> None:
        self._frames.clear()

    def __len__(self) -> int:
        return len(self._frames)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._frames))


class AudioBuffer:
    """PCM16 LE mono audio, kept until the next query takes it.

    Bounded to `max_seconds`: past that the OLDEST audio is dropped (the query
    hears the latest `max_seconds`), and `dropped_samples` counts what went.
    Chunks must be whole 16-bit samples (an even byte count).
    """

    def __init__(self, max_seconds: float = AUDIO_MAX_SECONDS, sample_rate: int = AUDIO_SAMPLE_RATE) -> None:
        if max_seconds <= 0 or sample_rate <= 0:
            raise ValueError("max_seconds and sample_rate must be positive")
        self.sample_rate = sample_rate
        self.max_samples = max(1, int(max_seconds * sample_rate))
        self.dropped_samples = 0
        self._pcm = bytearray()

    def append(self, pcm: bytes | bytearray | memoryview) -> int:
        """Add a chunk; returns how many old samples were dropped to stay within the bound."""
        n = len(pcm)
        if n % 2:
            raise ValueError(f"PCM16 audio must be whole 16-bit samples, got {n} bytes")
        self._pcm += pcm
        excess = len(self._pcm) // 2 - self.max_samples
        if excess <= 0:
            return 0
        del self._pcm[: 2 * excess]
        self.dropped_samples += excess
        return excess

    def take(self) -> np.ndarray:
        """All buffered audio as float32 in [-1, 1) (sample / 32768), and the buffer cleared."""
        audio = np.frombuffer(bytes(self._pcm), dtype="<i2").astype(np.float32) / 32768.0
        self._pcm.clear()
        return audio

    def clear(self) -> None:
        self._pcm.clear()

    @property
    def seconds(self) -> float:
        return len(self) / self.sample_rate

    def __len__(self) -> int:
        """Buffered samples."""
        return len(self._pcm) // 2

    def __bool__(self) -> bool:
        return bool(self._pcm)


__all__ = [
    "AUDIO_MAX_SECONDS",
    "AUDIO_SAMPLE_RATE",
    "DEFAULT_EVS_THRESHOLD",
    "FRAME_MAX_PIXELS",
    "THUMBNAIL_SIZE",
    "AudioBuffer",
    "DecodedFrame",
    "FrameBuffer",
    "FrameError",
    "FrameFilter",
    "decode_frame",
    "decode_image",
    "fit_within",
    "frame_thumbnail",
    "probe_frame",
    "reference_similarity",
    "reference_thumbnail",
    "sample_indices",
    "similarity",
]
