"""Fragmented-MP4 encoding for MSE, its async wrapper, and the remux to a plain MP4."""

from __future__ import annotations

import asyncio
import io
import json
import re
import shutil
import subprocess
import threading
import time

import av
import numpy as np
import pytest

from deployments.media import (
    AsyncFragmentEncoder,
    EncodedPiece,
    FragmentedMP4Encoder,
    codec_string,
    remux_file,
    remux_to_mp4,
)

BLOCKS = (9, 12, 12)  # the world model's first three blocks: 33 frames
TOTAL = sum(BLOCKS)
SIZES = [(64, 48, 24), (96, 64, 16)]  # width, height, fps


def moving_frames(start: int, count: int, width: int, height: int) -> np.ndarray:
    """uint8 RGB [count, H, W, 3]: colour gradients with a bright square moving right."""
    y, x = np.mgrid[0:height, 0:width]
    out = np.empty((count, height, width, 3), np.uint8)
    for i in range(count):
        t = start + i
        out[i, ..., 0] = (x * 255 // max(1, width - 1) + 3 * t) % 256
        out[i, ..., 1] = y * 255 // max(1, height - 1)
        out[i, ..., 2] = 128
        left = (2 * t) % max(1, width - 16)
        out[i, 8:24, left : left + 16] = 255
    return out


def top_level_boxes(data: bytes) -> list[str]:
    """Types of the top-level MP4 boxes; the data must end exactly at a box boundary."""
    kinds, pos = [], 0
    while pos < len(data):
        assert pos + 8 <= len(data), "truncated box header"
        size = int.from_bytes(data[pos : pos + 4], "big")
        if size == 1:
            size = int.from_bytes(data[pos + 8 : pos + 16], "big")
        assert size >= 8 and pos + size <= len(data), f"bad or truncated box at {pos}"
        kinds.append(data[pos + 4 : pos + 8].decode("latin-1"))
        pos += size
    return kinds


def encode_session(width: int, height: int, fps: int) -> list[EncodedPiece]:
    encoder = FragmentedMP4Encoder(width, height, fps)
    pieces, start = [], 0
    for count in BLOCKS:
        pieces.append(encoder.encode(moving_frames(start, count, width, height)))
        start += count
    pieces.append(encoder.close())
    return pieces


@pytest.fixture(scope="module", params=SIZES, ids=[f"{w}x{h}@{f}" for w, h, f in SIZES])
def session(request):
    width, height, fps = request.param
    pieces = encode_session(width, height, fps)
    return width, height, fps, pieces, b"".join(p.data for p in pieces)


# -- fragment structure -----------------------------------------------------------
@pytest.mark.timeout(60)
def test_pieces_are_whole_fragments_counted_exactly(session):
    _, _, _, pieces, _ = session
    first = top_level_boxes(pieces[0].data)
    assert first[:2] == ["ftyp", "moov"]
    for piece in pieces:
        kinds = top_level_boxes(piece.data)
        assert piece.num_frames == kinds.count("moof") == kinds.count("mdat")
        assert piece.byte_length == len(piece.data)
    assert [p.trailer for p in pieces] == [False, False, False, True]
    assert sum(p.num_frames for p in pieces) == TOTAL
    # Each block's last frame leaves with the next call; the trailer carries the session's last one.
    assert [p.num_frames for p in pieces] == [BLOCKS[0] - 1, BLOCKS[1], BLOCKS[2], 1]
    assert "ftyp" not in top_level_boxes(b"".join(p.data for p in pieces[1:]))


@pytest.mark.timeout(60)
def test_concatenation_decodes_to_every_frame(session):
    width, height, _, _, data = session
    with av.open(io.BytesIO(data)) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(decoded) == TOTAL
    assert all(f.shape == (height, width, 3) for f in decoded)
    source = moving_frames(0, TOTAL, width, height).astype(np.int16)
    error = np.abs(np.stack(decoded).astype(np.int16) - source).mean(axis=(1, 2, 3))
    assert error.max() < 12, error  # the right frames, in order, in roughly the right colours


@pytest.mark.timeout(60)
@pytest.mark.skipif(shutil.which("ffprobe") is None, reason="ffprobe not installed (apt-get install ffmpeg)")
def test_ffprobe_sees_h264_yuv420p_without_b_frames(session, tmp_path):
    width, height, fps, _, data = session
    path = tmp_path / "stream.mp4"
    path.write_bytes(data)
    result = subprocess.run(
        ["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
         "stream=nb_read_frames,width,height,codec_name,pix_fmt,has_b_frames,r_frame_rate",
         "-of", "json", str(path)],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    (stream,) = json.loads(result.stdout)["streams"]
    assert int(stream["nb_read_frames"]) == TOTAL
    assert (stream["codec_name"], stream["pix_fmt"]) == ("h264", "yuv420p")
    assert (stream["width"], stream["height"]) == (width, height)
    assert stream["has_b_frames"] == 0
    assert stream["r_frame_rate"] == f"{fps}/1"


@pytest.mark.timeout(60)
def test_codec_string_reads_the_avcc_box(session):
    _, _, _, pieces, _ = session
    init = pieces[0].data
    value = codec_string(init)
    assert re.fullmatch(r"avc1\.(42C0[0-9A-F]{2}|64[0-9A-F]{4})", value), value
    at = init.index(b"avcC") + 4  # configurationVersion, profile, constraints, level
    assert value == "avc1." + init[at + 1 : at + 4].hex().upper()
    with pytest.raises(ValueError, match="avcC"):
        codec_string(init[:28])  # ftyp alone


# -- remux -------------------------------------------------------------------------
def check_progressive(mp4: bytes, width: int, height: int, fps: int) -> None:
    kinds = top_level_boxes(mp4)
    assert "moov" in kinds and "mdat" in kinds and kinds.index("moov") < kinds.index("mdat")
    assert "moof" not in kinds
    with av.open(io.BytesIO(mp4)) as container:
        stream = container.streams.video[0]
        assert stream.frames == TOTAL
        assert abs(container.duration / av.time_base - TOTAL / fps) <= 1 / fps
        assert abs(float(stream.duration * stream.time_base) - TOTAL / fps) <= 1 / fps
        frames = list(container.decode(stream))
    assert len(frames) == TOTAL and (frames[0].width, frames[0].height) == (width, height)


@pytest.mark.timeout(60)
def test_remux_to_progressive_mp4(session, tmp_path):
    width, height, fps, _, data = session
    mp4 = remux_to_mp4(data)
    check_progressive(mp4, width, height, fps)
    with av.open(io.BytesIO(mp4)) as remuxed, av.open(io.BytesIO(data)) as original:  # stream copy
        assert [bytes(p) for p in remuxed.demux(video=0) if p.size] == [
            bytes(p) for p in original.demux(video=0) if p.size
        ]
    src, dst = tmp_path / "in.mp4", tmp_path / "out.mp4"
    src.write_bytes(data)
    assert remux_file(src, dst) == TOTAL
    check_progressive(dst.read_bytes(), width, height, fps)
    assert not (tmp_path / "out.mp4.part").exists()


@pytest.mark.timeout(60)
def test_remux_refuses_input_without_frames():
    with pytest.raises((ValueError, av.FFmpegError)):
        remux_to_mp4(b"not an mp4 at all")


# -- async wrapper --------------------------------------------------------------------
def encode_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("fmp4-encode")]


@pytest.mark.timeout(60)
def test_async_encoder_matches_sync_and_keeps_order(session):
    width, height, fps, pieces, _ = session

    async def main():
        encoder = AsyncFragmentEncoder(width, height, fps)
        try:
            first = await encoder.encode(moving_frames(0, BLOCKS[0], width, height))
            # Queue the next two blocks without waiting: they must come back in order.
            second = encoder.submit(moving_frames(BLOCKS[0], BLOCKS[1], width, height))
            third = encoder.submit(moving_frames(BLOCKS[0] + BLOCKS[1], BLOCKS[2], width, height))
            await asyncio.sleep(0)  # the loop stays free while the worker encodes
            trailer = await encoder.close()
            return [first, await second, await third, trailer]
        finally:
            encoder.shutdown()

    got = asyncio.run(main())
    assert [(p.data, p.num_frames, p.trailer) for p in got] == [(p.data, p.num_frames, p.trailer) for p in pieces]
    deadline = time.monotonic() + 10
    while encode_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not encode_threads(), "shutdown() left the worker thread running"


@pytest.mark.timeout(60)
def test_async_shutdown_without_close_and_errors_propagate():
    async def main():
        async with AsyncFragmentEncoder(64, 48, 24) as encoder:
            with pytest.raises(ValueError, match="96x64.*64x48"):
                await encoder.encode(moving_frames(0, 2, 96, 64))
            piece = await encoder.encode(moving_frames(0, 3, 64, 48))  # still usable after a refused block
            assert piece.num_frames == 2
        with pytest.raises(RuntimeError):
            encoder.submit(moving_frames(3, 1, 64, 48))
        return encoder

    encoder = asyncio.run(main())
    encoder.shutdown(wait=True)  # __aexit__ did not wait; this joins the worker
    assert encoder.encoder.closed and not encode_threads()


# -- refusals and edges -----------------------------------------------------------------
@pytest.mark.timeout(60)
def test_refuses_other_frame_size_and_odd_sizes():
    encoder = FragmentedMP4Encoder(64, 48, 24)
    assert encoder.encode(moving_frames(0, 2, 64, 48)).num_frames == 1
    with pytest.raises(ValueError) as refused:
        encoder.encode(moving_frames(2, 2, 96, 64))
    assert "96x64" in str(refused.value) and "64x48" in str(refused.value)
    with pytest.raises(ValueError, match="uint8"):
        encoder.encode(moving_frames(2, 2, 64, 48).astype(np.float32))
    with pytest.raises(ValueError, match=r"\[T, H, W, 3\]"):
        encoder.encode(moving_frames(2, 1, 64, 48)[0])
    assert encoder.close().num_frames == 1 and encoder.frames_in == encoder.frames_out == 2
    assert encoder.close() == EncodedPiece(b"", 0, trailer=True)
    with pytest.raises(RuntimeError, match="closed"):
        encoder.encode(moving_frames(0, 1, 64, 48))
    for width, height in ((63, 48), (64, 47), (65, 49)):
        with pytest.raises(ValueError, match=f"{width}x{height}.*even"):
            FragmentedMP4Encoder(width, height, 24)
    for bad in ((0, 48, 24), (64, 48, 0), (64, -2, 24)):
        with pytest.raises(ValueError):
            FragmentedMP4Encoder(*bad)


@pytest.mark.timeout(60)
def test_single_frame_session_and_empty_calls():
    encoder = FragmentedMP4Encoder(64, 48, 24)
    assert encoder.encode(np.zeros((0, 48, 64, 3), np.uint8)) == EncodedPiece(b"", 0)
    first = encoder.encode(moving_frames(0, 1, 64, 48))
    assert first.num_frames == 0 and top_level_boxes(first.data) == ["ftyp", "moov"]
    trailer = encoder.close()
    assert trailer.num_frames == 1
    mp4 = remux_to_mp4(first.data + trailer.data)
    with av.open(io.BytesIO(mp4)) as container:
        assert container.streams.video[0].frames == 1
        assert abs(container.duration / av.time_base - 1 / 24) < 1e-3
    assert FragmentedMP4Encoder(64, 48, 24).close() == EncodedPiece(b"", 0, trailer=True)


# -- measurement (printed, never asserted) ------------------------------------------------
@pytest.mark.timeout(60)
def test_report_encode_cost_at_832x480():
    width, height, fps, count = 832, 480, 16, 36
    smooth = moving_frames(0, count, width, height)
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (count, height, width, 3), dtype=np.uint8)  # what random-weight models make
    for name, frames in (("smooth", smooth), ("noise", noise)):
        encoder = FragmentedMP4Encoder(width, height, fps)
        encoder.encode(frames[:1])  # codec open + init segment
        start = time.perf_counter()
        for block in np.split(frames[1:], 5):
            encoder.encode(block)
        elapsed = time.perf_counter() - start
        encoder.close()
        print(f"\nfmp4 encode {width}x{height} {name}: {elapsed / (count - 1) * 1e3:.2f} ms/frame "
              "(rgb24->yuv420p + libx264 + mux)")  # fmt: skip


def test_session_codec_options_reach_x264_and_keep_one_frame_per_fragment():
    def encode(options):
        encoder = FragmentedMP4Encoder(64, 48, 24, options=options)
        pieces = [encoder.encode(moving_frames(0, 12, 64, 48)), encoder.close()]
        return b"".join(p.data for p in pieces), [p.num_frames for p in pieces]

    def profile(data: bytes) -> str:
        with av.open(io.BytesIO(data)) as container:
            return container.streams.video[0].codec_context.profile

    plain, plain_counts = encode(None)
    richer, richer_counts = encode({"preset": "fast"})  # CABAC and 8x8 transforms: the High profile
    capped, capped_counts = encode({"preset": "fast", "profile": "baseline", "crf": "45"})
    assert plain_counts == richer_counts == capped_counts == [11, 1]  # zerolatency stays: one frame per fragment
    assert (profile(plain), profile(richer), profile(capped)) == ("Constrained Baseline", "High", "Constrained Baseline")
    assert len(capped) < len(richer)  # crf 45 spends fewer bits than the default 23
