"""Fragmented MP4 (a session's concatenated binary frames) -> a progressive MP4 players open.

Stream copy with PyAV, no re-encode, ``moov`` moved to the front (``+faststart``).
``+faststart`` makes the mov muxer reopen its output by name for a second
pass, which a Python file object cannot do (PyAV 18 fails with
``No such file or directory: '<none>'``), so the output always goes through a
real file.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

import av


def _remux(source, dst: str) -> int:
    """Copy the first video stream of `source` (path or file object) into the MP4 at `dst`; frames copied."""
    copied = 0
    with av.open(source, "r") as inp:
        if not inp.streams.video:
            raise ValueError("no video stream in the input")
        in_stream = inp.streams.video[0]
        with av.open(dst, "w", format="mp4", options={"movflags": "+faststart"}) as out:
            out_stream = out.add_stream_from_template(in_stream)
            for packet in inp.demux(in_stream):
                if packet.dts is None:  # the demuxer's end-of-stream packet
                    continue
                packet.stream = out_stream
                out.mux(packet)
                copied += 1
            if copied == 0:
                raise ValueError("no video frames in the input")
    return copied


def remux_file(src: str | os.PathLike, dst: str | os.PathLike) -> int:
    """Remux the fragmented MP4 file `src` to a progressive MP4 at `dst` (replaced atomically).

    Returns the number of frames copied.
    """
    dst = Path(dst)
    part = dst.with_name(dst.name + ".part")
    try:
        frames = _remux(os.fspath(src), os.fspath(part))
        os.replace(part, dst)
    finally:
        part.unlink(missing_ok=True)
    return frames


def remux_to_mp4(fragmented: bytes) -> bytes:
    """The progressive MP4 (``moov`` before ``mdat``) of concatenated fragmented-MP4 bytes."""
    with tempfile.TemporaryDirectory(prefix="remux-") as tmp:
        out = os.path.join(tmp, "out.mp4")
        _remux(io.BytesIO(fragmented), out)
        with open(out, "rb") as f:
            return f.read()
