"""One session's H.264 stream as fragmented MP4, one fragment per frame, for Media Source Extensions.

The muxer (PyAV 18 / FFmpeg's mov muxer with
``+frag_every_frame+empty_moov+default_base_moof``) writes the init segment
(``ftyp`` + ``moov``) when the first frame is muxed, and frame k's fragment
(``moof`` + ``mdat``) only when frame k+1 arrives: a fragment's duration is
known only then. So each call's last frame leaves with the next call, and the
session's last frame leaves with :meth:`FragmentedMP4Encoder.close`, together
with the ``mfra`` trailer. Flushing the encoder does not release it earlier,
and ``frag_custom`` would hold everything to the end.

The muxer writes into a sink that is not seekable, so it can never seek back
into bytes already handed out, and the sink is emptied on every call.

Colour: RGB is converted to BT.601 limited-range yuv420p (swscale's default
matrix) and the stream is tagged so (``smpte170m``) so decoders do not guess.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np
from av.video.reformatter import ColorRange, Colorspace, VideoReformatter

MOVFLAGS = "+frag_every_frame+empty_moov+default_base_moof"
_SMPTE170M = 6  # AVCOL_PRI/TRC/SPC_SMPTE170M: BT.601 525-line, what swscale's default matrix produces


@dataclass(frozen=True, slots=True)
class EncodedPiece:
    """Bytes the muxer emitted, cut at a fragment boundary.

    ``num_frames`` counts the frames whose fragments (``moof`` + ``mdat``) lie
    completely in ``data``. ``trailer`` marks the piece returned by ``close``.
    """

    data: bytes
    num_frames: int
    trailer: bool = False

    @property
    def byte_length(self) -> int:
        return len(self.data)


class _Sink:
    """Write-only, non-seekable file object PyAV muxes into; drained by the encoder."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    def write(self, data) -> int:
        self._chunks.append(bytes(data))  # PyAV reuses its buffer: copy
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self._chunks)
        self._chunks.clear()
        return data


def _box_header(buf, pos: int) -> tuple[bytes, int, int] | None:
    """(type, total size, header size) of the box at pos, or None when its header is not all there.

    Size 0 ("to the end of the file") is reported as None: it is complete only at the end.
    """
    if pos + 8 > len(buf):
        return None
    size = int.from_bytes(buf[pos : pos + 4], "big")
    kind = bytes(buf[pos + 4 : pos + 8])
    if size == 1:
        if pos + 16 > len(buf):
            return None
        size = int.from_bytes(buf[pos + 8 : pos + 16], "big")
        if size < 16:
            raise ValueError(f"corrupt MP4 box {kind!r}: size {size}")
        return kind, size, 16
    if size == 0:
        return None
    if size < 8:
        raise ValueError(f"corrupt MP4 box {kind!r}: size {size}")
    return kind, size, 8


def _complete_prefix(buf) -> tuple[int, int]:
    """(length, fragments) of the longest prefix of whole top-level boxes that
    does not end between a fragment's ``moof`` and its ``mdat``."""
    pos = cut = fragments = done = 0
    in_fragment = False
    while (header := _box_header(buf, pos)) is not None:
        kind, size, _ = header
        if pos + size > len(buf):
            break
        pos += size
        if kind == b"moof":
            in_fragment = True
            continue
        if in_fragment and kind == b"mdat":
            in_fragment = False
            done += 1
        if not in_fragment:
            cut, fragments = pos, done
    return cut, fragments


def _check_size(width: int, height: int) -> None:
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if width % 2 or height % 2:
        raise ValueError(f"frame size {width}x{height} is not supported: yuv420p needs an even width and height")


class FragmentedMP4Encoder:
    """H.264 (libx264 ultrafast + zerolatency, yuv420p, no B-frames) in fragmented MP4, one session.

    Not thread-safe: call it from one thread at a time (see :class:`AsyncFragmentEncoder`).
    """

    def __init__(self, width: int, height: int, fps: int, *, threads: int | None = None, options: dict[str, str] | None = None) -> None:
        _check_size(width, height)
        if isinstance(fps, bool) or not isinstance(fps, (int, np.integer)) or fps <= 0:
            raise ValueError(f"fps must be a positive integer, got {fps!r}")
        self.width, self.height, self.fps = int(width), int(height), int(fps)
        self._frame_time = Fraction(1, self.fps)
        self._sink = _Sink()
        self._pending = bytearray()  # emitted by the muxer, not yet returned: at most an unfinished fragment
        self._next_pts = 0
        self._frames_out = 0
        self._closed = False
        self._container = av.open(self._sink, "w", format="mp4", options={"movflags": MOVFLAGS})
        try:
            stream = self._container.add_stream(
                # `options` (a session's checked choices) never override the tune: zerolatency keeps one frame per fragment.
                "libx264", rate=self.fps, options={"preset": "ultrafast", **(options or {}), "tune": "zerolatency"}
            )
            stream.width, stream.height, stream.pix_fmt = self.width, self.height, "yuv420p"
            stream.time_base = self._frame_time  # the muxer may pick a multiple (e.g. 1/12288 at 24 fps)
            cc = stream.codec_context
            cc.time_base = self._frame_time
            cc.framerate = Fraction(self.fps, 1)
            cc.max_b_frames = 0
            cc.color_primaries = cc.color_trc = cc.colorspace = _SMPTE170M
            cc.color_range = int(ColorRange.MPEG)
            if threads is not None:
                cc.thread_count = int(threads)
        except BaseException:
            self._container.close()
            raise
        self._stream = stream
        self._reformatter = VideoReformatter()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def frames_in(self) -> int:
        """Frames given to :meth:`encode` so far."""
        return self._next_pts

    @property
    def frames_out(self) -> int:
        """Frames whose fragments have been returned so far."""
        return self._frames_out

    def encode(self, frames: np.ndarray) -> EncodedPiece:
        """Encode uint8 RGB frames [T, H, W, 3]; return what the muxer emitted since the last call.

        The first piece begins with the init segment. The block's last frame is
        held back by the muxer and leaves with the next call or with ``close``.
        """
        if self._closed:
            raise RuntimeError("encoder is closed")
        frames = self._validate(frames)
        for rgb in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            frame = self._reformatter.reformat(
                frame,
                format="yuv420p",
                dst_colorspace=Colorspace.ITU601,
                dst_color_range=ColorRange.MPEG,
            )
            frame.pts = self._next_pts
            frame.time_base = self._frame_time
            self._next_pts += 1
            for packet in self._stream.encode(frame):
                self._mux(packet)
        return self._drain(final=False)

    def close(self) -> EncodedPiece:
        """Flush the encoder, write the trailer, return the rest (the held-back frame and ``mfra``).

        A second call returns an empty trailer piece.
        """
        if self._closed:
            return EncodedPiece(b"", 0, trailer=True)
        self._closed = True
        try:
            for packet in self._stream.encode(None):
                self._mux(packet)
        finally:
            self._container.close()
        return self._drain(final=True)

    def discard(self) -> None:
        """Release the encoder without returning anything (a session that ended abnormally)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._container.close()
        except av.FFmpegError:
            pass
        finally:
            self._sink.take()
            self._pending.clear()

    # -- internals --------------------------------------------------------------
    def _validate(self, frames: np.ndarray) -> np.ndarray:
        if not isinstance(frames, np.ndarray):
            raise TypeError(f"frames must be a numpy array, got {type(frames).__name__}")
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
            raise ValueError(f"frames must be uint8 RGB of shape [T, H, W, 3], got {frames.dtype} {frames.shape}")
        height, width = frames.shape[1:3]
        if (width, height) != (self.width, self.height):
            raise ValueError(
                f"frame size {width}x{height} does not match this session's frame size {self.width}x{self.height}"
            )
        return frames

    def _mux(self, packet: av.Packet) -> None:
        if packet.dts is None:  # an empty flush packet
            return
        if not packet.duration:  # libx264 leaves it 0; the last fragment's duration needs it
            packet.duration = max(1, round(self._frame_time / packet.time_base))
        self._container.mux(packet)

    def _drain(self, final: bool) -> EncodedPiece:
        self._pending += self._sink.take()
        cut, fragments = _complete_prefix(self._pending)
        if final:
            cut = len(self._pending)
        data = bytes(self._pending[:cut])
        del self._pending[:cut]
        self._frames_out += fragments
        return EncodedPiece(data, fragments, trailer=final)


class AsyncFragmentEncoder:
    """A :class:`FragmentedMP4Encoder` driven from asyncio on one dedicated worker thread.

    Work runs in the order it is submitted (one thread, FIFO), so a caller can
    start encoding block k and go on generating block k+1::

        pending = enc.submit(frames_k)      # returns at once
        frames_k1 = await generate_next()
        piece_k = await pending

    The frames array must not be modified until its piece has come back.
    Cancelling an awaited encode loses that piece's bytes (the stream is then
    broken): only do it when the session is ending.
    """

    def __init__(self, width: int, height: int, fps: int, *, threads: int | None = None, options: dict[str, str] | None = None) -> None:
        self.encoder = FragmentedMP4Encoder(width, height, fps, threads=threads, options=options)
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="fmp4-encode")
        self._inflight: set[concurrent.futures.Future] = set()
        self._shut = False

    def _submit(self, fn, *args) -> asyncio.Future:
        if self._shut:
            raise RuntimeError("encoder has been shut down")
        future = self._executor.submit(fn, *args)
        self._inflight.add(future)
        future.add_done_callback(self._inflight.discard)
        return asyncio.wrap_future(future)

    def submit(self, frames: np.ndarray) -> asyncio.Future:
        """Queue ``encode(frames)`` now (order = call order); await the result later."""
        return self._submit(self.encoder.encode, frames)

    async def encode(self, frames: np.ndarray) -> EncodedPiece:
        return await self.submit(frames)

    async def close(self) -> EncodedPiece:
        """Queue ``close()`` behind the encodes already submitted and return the trailer piece."""
        return await self._submit(self.encoder.close)

    def shutdown(self, wait: bool = False) -> None:
        """Release the worker thread: queued encodes are cancelled, a running one finishes, then
        the encoder is discarded (a no-op after ``close``) and the thread exits. Returns at once
        unless `wait` (never wait on the event loop's thread). Idempotent."""
        if not self._shut:
            self._shut = True
            for future in list(self._inflight):
                future.cancel()  # only succeeds for work not yet started
            self._executor.submit(self.encoder.discard)
        self._executor.shutdown(wait=wait)

    async def __aenter__(self) -> AsyncFragmentEncoder:
        return self

    async def __aexit__(self, *exc) -> None:
        self.shutdown()


# -- codecs string for MediaSource.isTypeSupported / addSourceBuffer -----------
def _children(data, start: int, end: int):
    """(type, payload start, end) of each box between start and end."""
    pos = start
    while pos + 8 <= end:
        header = _box_header(data, pos)
        if header is None:
            if int.from_bytes(data[pos : pos + 4], "big") != 0:
                raise ValueError("truncated MP4 box header")
            yield bytes(data[pos + 4 : pos + 8]), pos + 8, end  # size 0: runs to the end of its parent
            return
        kind, size, header_size = header
        if pos + size > end:
            raise ValueError(f"truncated MP4 box {kind!r}")
        yield kind, pos + header_size, pos + size
        pos += size


def _find(data, start: int, end: int, kind: bytes):
    return [(s, e) for k, s, e in _children(data, start, end) if k == kind]


_VISUAL_SAMPLE_ENTRY = 78  # bytes of fixed fields before an avc1/avc3 entry's child boxes


def codec_string(init_segment: bytes) -> str:
    """RFC 6381 codecs string (``avc1.PPCCLL``) read off the ``avcC`` box of an init segment."""
    data = memoryview(init_segment)
    for moov_start, moov_end in _find(data, 0, len(data), b"moov"):
        for trak in _find(data, moov_start, moov_end, b"trak"):
            boxes = [trak]
            for kind in (b"mdia", b"minf", b"stbl", b"stsd"):
                boxes = [found for s, e in boxes for found in _find(data, s, e, kind)]
            for stsd_start, stsd_end in boxes:
                for entry, s, e in _children(data, stsd_start + 8, stsd_end):  # skip version/flags + count
                    if entry not in (b"avc1", b"avc3"):
                        continue
                    for avcc_start, avcc_end in _find(data, s + _VISUAL_SAMPLE_ENTRY, e, b"avcC"):
                        if avcc_end - avcc_start < 4:
                            raise ValueError("avcC box too short")
                        profile, constraints, level = data[avcc_start + 1 : avcc_start + 4]
                        return f"{entry.decode()}.{profile:02X}{constraints:02X}{level:02X}"
    raise ValueError("no avc1/avc3 sample entry with an avcC box in this init segment")
