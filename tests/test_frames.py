"""Frames in for `/v1/video/chat/stream`: bounded decode, EVS, the frame ring and its sampling, the audio buffer."""

from __future__ import annotations

import io
import itertools
import struct
import time
import zlib

import numpy as np
import pytest
from PIL import Image

from deployments.media.frames import (
    THUMBNAIL_SIZE,
    AudioBuffer,
    DecodedFrame,
    FrameBuffer,
    FrameError,
    FrameFilter,
    decode_frame,
    decode_image,
    fit_within,
    frame_thumbnail,
    probe_frame,
    reference_similarity,
    reference_thumbnail,
    sample_indices,
    similarity,
)


# =====================================================================================
# Frames made here
# =====================================================================================
def encode(array: np.ndarray, fmt: str = "JPEG", **options) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, fmt, **options)
    return buf.getvalue()


def jpeg(array: np.ndarray, quality: int = 85) -> bytes:
    return encode(array, "JPEG", quality=quality)


def png(array: np.ndarray) -> bytes:
    return encode(array, "PNG")


def gradient(width: int = 640, height: int = 480, t: float = 0.0) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    r = 128 + 100 * np.sin(x / 40 + t)
    g = 128 + 100 * np.cos(y / 30 - t)
    b = (x + y + 50 * t) % 256
    return np.dstack([r, g, b]).astype(np.uint8)


def static_clip(n: int = 12, seed: int = 0) -> list[bytes]:
    """A still camera: the same scene with a little sensor noise per frame."""
    rng = np.random.default_rng(seed)
    scene = gradient().astype(np.int16)
    return [jpeg(np.clip(scene + rng.integers(-3, 4, scene.shape), 0, 255).astype(np.uint8)) for _ in range(n)]


def panning_clip(n: int = 12, block: int = 32, seed: int = 1) -> list[bytes]:
    """A fast pan across a coarse random texture: each frame moves one block, so consecutive frames share little."""
    rng = np.random.default_rng(seed)
    texture = rng.integers(0, 256, (480 // block, 640 // block + n, 3), dtype=np.uint8)
    wide = np.asarray(Image.fromarray(texture).resize((texture.shape[1] * block, 480), Image.Resampling.NEAREST))
    return [jpeg(np.ascontiguousarray(wide[:, i * block : i * block + 640])) for i in range(n)]


def cut_clip(scenes: int = 4, hold: int = 3, seed: int = 2) -> list[bytes]:
    """Hard cuts between unrelated scenes, each held for `hold` noisy frames: keep the first of each, drop the rest."""
    rng = np.random.default_rng(seed)
    frames = []
    for s in range(scenes):
        base = np.asarray(
            Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((640, 480), Image.Resampling.BILINEAR)
        ).astype(np.int16)
        for _ in range(hold):
            frames.append(jpeg(np.clip(base + rng.integers(-3, 4, base.shape), 0, 255).astype(np.uint8)))
    return frames


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def png_declaring(width: int, height: int) -> bytes:
    """A well-formed PNG whose IHDR declares width x height RGB, with one tiny IDAT: a decompression bomb's header."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + png_chunk(b"IEND", b"")


def jpeg_declaring(width: int, height: int) -> bytes:
    """A real small JPEG with its SOF0 patched to declare width x height."""
    data = bytearray(jpeg(gradient(16, 16)))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


# =====================================================================================
# Decode
# =====================================================================================
def test_jpeg_decoded_at_most_max_side():
    source = gradient(640, 480)
    frame = decode_frame(jpeg(source, quality=95), max_side=320)
    assert isinstance(frame, DecodedFrame)
    assert (frame.format, frame.width, frame.height) == ("JPEG", 640, 480)
    assert frame.image.shape == (240, 320, 3) and frame.image.dtype == np.uint8
    assert frame.thumbnail.shape == (THUMBNAIL_SIZE, THUMBNAIL_SIZE, 3) and frame.thumbnail.dtype == np.uint8
    expected = np.asarray(Image.fromarray(source).resize((320, 240), Image.Resampling.BILINEAR), dtype=np.float32)
    assert np.abs(frame.image.astype(np.float32) - expected).mean() < 4.0  # the same picture


def test_png_decoded_at_most_max_side():
    source = gradient(300, 500)
    frame = decode_frame(png(source), max_side=100)
    assert (frame.format, frame.width, frame.height) == ("PNG", 300, 500)
    assert frame.image.shape == (100, 60, 3)
    # PNG is lossless and decoded in full: its thumbnail is exactly the reference's
    assert np.array_equal(frame.thumbnail, reference_thumbnail(png(source)))


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_small_frames_are_not_upscaled(fmt):
    data = encode(gradient(48, 32), fmt)
    frame = decode_frame(data, max_side=448)
    assert frame.image.shape == (32, 48, 3)
    assert frame.thumbnail.shape == (64, 64, 3)  # the thumbnail is always 64x64, aspect ignored
    assert decode_image(data, 448).shape == (32, 48, 3)


def test_with_image_false_is_thumbnail_only():
    data = jpeg(gradient())
    frame = decode_frame(data, 448, with_image=False)
    assert frame.image is None
    assert np.array_equal(frame.thumbnail, frame_thumbnail(data))
    assert np.array_equal(frame.thumbnail, decode_frame(data, 448).thumbnail)  # one thumbnail whatever else is decoded
    assert np.array_equal(decode_image(data, 200), decode_frame(data, 200).image)


def test_jpeg_uses_draft_mode(monkeypatch):
    from PIL import JpegImagePlugin

    asked = []
    real = JpegImagePlugin.JpegImageFile.draft

    def spy(self, mode, size):
        asked.append(size)
        result = real(self, mode, size)
        asked.append(self.size)
        return result

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    decode_frame(jpeg(gradient(1280, 720)), max_side=320)
    # thumbnail: the smallest DCT scale still >= 64 px (1/8 -> 160x90); image: 1/4 -> 320x180, no resize
    assert asked == [(64, 64), (160, 90), (320, 180), (320, 180)]


@pytest.mark.parametrize(
    ("array", "fmt"),
    [
        (gradient(64, 48)[:, :, 0], "JPEG"),  # greyscale JPEG
        (gradient(64, 48)[:, :, 0], "PNG"),
        (np.dstack([gradient(64, 48), np.full((48, 64), 128, np.uint8)]), "PNG"),  # RGBA
        ((np.arange(64 * 48, dtype=np.uint16).reshape(48, 64) * 21), "PNG"),  # 16-bit greyscale
    ],
)
def test_other_modes_become_rgb(array, fmt):
    frame = decode_frame(encode(array, fmt), max_side=32)
    assert frame.image.shape == (24, 32, 3) and frame.image.dtype == np.uint8
    assert frame.thumbnail.shape == (64, 64, 3)


def test_palette_png_becomes_rgb():
    data = encode(np.asarray(Image.fromarray(gradient(64, 48)).convert("P")), "PNG")
    assert decode_frame(data, 64).image.shape == (48, 64, 3)


def test_sixteen_bit_png_keeps_the_top_byte():
    value = np.full((8, 8), 0xABCD, dtype=np.uint16)
    assert decode_image(encode(value, "PNG"), 8)[0, 0].tolist() == [0xAB, 0xAB, 0xAB]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty frame"),
        (b"hello world", "not a JPEG or PNG image"),
        (encode(gradient(16, 16), "GIF"), "not a JPEG or PNG image"),
        (encode(gradient(16, 16), "BMP"), "not a JPEG or PNG image"),
        (encode(gradient(16, 16), "WEBP"), "not a JPEG or PNG image"),
        (b"\x89PNG\r\n\x1a\n", "corrupt PNG: no IHDR header"),
        (b"\xff\xd8", "truncated JPEG: no frame header"),
        (b"\xff\xd8\xff\xda\x00\x02", "corrupt JPEG: no frame header before the image data"),
        (b"\xff\xd8\x00\x00", "corrupt JPEG: bad marker"),
    ],
)
def test_garbage_refused(data, reason):
    with pytest.raises(FrameError) as info:
        decode_frame(data, 448)
    assert str(info.value) == reason
    assert isinstance(info.value, ValueError)


def _corrupt_ihdr_crc(data: bytes) -> bytes:
    return data[:29] + bytes([data[29] ^ 0xFF]) + data[30:]


@pytest.mark.parametrize(
    ("fmt", "damage"),
    [
        ("JPEG", lambda d: d[: len(d) // 2]),
        ("JPEG", lambda d: d[:200] + bytes(len(d) - 200)),
        ("PNG", lambda d: d[: len(d) // 2]),
        ("PNG", _corrupt_ihdr_crc),
    ],
    ids=["jpeg-truncated", "jpeg-zeroed", "png-truncated", "png-bad-crc"],
)
def test_truncated_and_corrupt_refused(fmt, damage):
    data = encode(gradient(256, 256), fmt)
    with pytest.raises(FrameError, match=f"corrupt or truncated {fmt}"):
        decode_frame(damage(data), 448)


@pytest.mark.parametrize("make", [png_declaring, jpeg_declaring])
def test_decompression_bomb_refused_before_decoding(make):
    bomb = make(60000, 60000)
    assert probe_frame(bomb)[1:] == (60000, 60000)
    start = time.perf_counter()
    with pytest.raises(FrameError, match=r"60000x60000 \(3600000000 pixels\), more than the limit"):
        decode_frame(bomb, 448)
    with pytest.raises(FrameError):
        frame_thumbnail(bomb)
    assert time.perf_counter() - start < 0.1


@pytest.mark.parametrize("make", [png_declaring, jpeg_declaring])
def test_pillows_own_bomb_check_is_handled(make):
    # with our limit lifted, Pillow's DecompressionBombError (at open) still becomes a FrameError
    with pytest.raises(FrameError, match="more than the limit"):
        decode_frame(make(60000, 60000), 448, max_pixels=10**12)


def test_pixel_limit_is_ours():
    data = png(gradient(100, 100))
    assert decode_frame(data, 448, max_pixels=10_000).width == 100
    with pytest.raises(FrameError, match=r"100x100 \(10000 pixels\), more than the limit of 9999 pixels"):
        decode_frame(data, 448, max_pixels=9_999)
    with pytest.raises(FrameError, match="declares a size of 0x5"):
        decode_frame(png_declaring(0, 5), 448)


def test_a_second_frame_header_cannot_sneak_past_the_limit():
    # a fake small SOF before the real one: our probe reads the first, Pillow decodes the last; both are checked
    data = jpeg(gradient(200, 100))
    fake = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, 8, 8, 1) + b"\x01\x11\x00"
    sneaky = data[:2] + fake + data[2:]
    assert probe_frame(sneaky) == ("JPEG", 8, 8)
    with pytest.raises(FrameError):
        decode_frame(sneaky, 448, max_pixels=1_000)


def test_fit_within():
    assert fit_within(640, 480, 448) == (448, 336)
    assert fit_within(480, 640, 448) == (336, 448)
    assert fit_within(100, 50, 448) == (100, 50)
    assert fit_within(10000, 1, 64) == (64, 1)
    with pytest.raises(ValueError):
        decode_frame(png(gradient(8, 8)), 0)


def test_bytes_like_accepted():
    data = png(gradient(8, 8))
    assert decode_frame(bytearray(data), 8).width == 8
    assert decode_image(memoryview(data), 8).shape == (8, 8, 3)


# =====================================================================================
# EVS
# =====================================================================================
def test_similarity():
    black = np.zeros((64, 64, 3), np.uint8)
    white = np.full((64, 64, 3), 255, np.uint8)
    assert similarity(black, black) == 1.0
    assert similarity(black, white) == 0.0
    half = np.full((64, 64, 3), 51, np.uint8)
    assert similarity(black, half) == pytest.approx(1 - (51 / 255) ** 2)


def run_filter(clip: list[bytes], threshold: float = 0.95, thumbnail=frame_thumbnail, enabled: bool = True):
    evs = FrameFilter(threshold, enabled=enabled)
    return [evs.check(thumbnail(data)) for data in clip], evs


def test_static_clip_keeps_only_the_first():
    decisions, evs = run_filter(static_clip(12))
    assert decisions == [True] + [False] * 11
    assert (evs.retained, evs.dropped, evs.total) == (1, 11, 12)
    assert evs.stats() == {"retained_count": 1, "dropped_count": 11, "total_count": 12, "drop_rate": 11 / 12}
    assert evs.last_similarity > 0.99


def test_moving_clip_keeps_everything():
    decisions, evs = run_filter(panning_clip(12))
    assert all(decisions)
    assert (evs.retained, evs.dropped) == (12, 0)
    assert evs.stats()["drop_rate"] == 0.0


def test_cuts_keep_the_first_frame_of_each_scene():
    decisions, _ = run_filter(cut_clip(scenes=4, hold=3))
    assert decisions == [True, False, False] * 4


def test_compares_with_the_last_retained_frame_not_the_previous():
    # a slow fade: every step is small, but the drift from the last KEPT frame adds up until one is kept
    base = np.full((64, 64, 3), 0, np.uint8)
    evs = FrameFilter(0.95)
    steps = [evs.check(base + 10 * i) for i in range(12)]  # 10 levels a step; 58 levels (0.95) from the reference
    assert steps == [True] + [False] * 5 + [True] + [False] * 5
    assert evs.retained == 2


def test_disabled_filter_keeps_all_and_thresholds():
    clip = static_clip(5)
    decisions, evs = run_filter(clip, enabled=False)
    assert all(decisions) and evs.stats()["dropped_count"] == 0
    assert run_filter(clip, threshold=1.0)[0] == [True] * 5  # only byte-identical thumbnails reach 1.0
    same = [clip[0]] * 3
    assert run_filter(same, threshold=1.0)[0] == [True, False, False]
    assert run_filter(panning_clip(4), threshold=0.0)[0] == [True, False, False, False]  # everything is >= 0
    with pytest.raises(ValueError):
        FrameFilter(1.5)
    evs.reset()
    assert evs.total == 0 and evs.drop_rate == 0.0


@pytest.mark.parametrize("clip", [static_clip(8), panning_clip(8), cut_clip(3, 3)], ids=["static", "moving", "cuts"])
def test_fast_path_agrees_with_the_reference(clip):
    for a, b in itertools.pairwise(clip):
        fast = similarity(frame_thumbnail(a), frame_thumbnail(b))
        assert abs(fast - reference_similarity(a, b)) < 0.01
    assert run_filter(clip)[0] == run_filter(clip, thumbnail=reference_thumbnail)[0]


def test_fast_vs_reference_speed():
    """Prints frames/second of the EVS thumbnail path, ours vs the reference, on 640x480 JPEGs; asserts nothing."""
    clip = [jpeg(gradient(t=0.3 * i)) for i in range(10)] + panning_clip(10)

    def rate(thumbnail) -> float:
        evs, n, start = FrameFilter(0.95), 0, time.perf_counter()
        while time.perf_counter() - start < 0.5:
            for data in clip:
                evs.check(thumbnail(data))
                n += 1
        return n / (time.perf_counter() - start)

    fast, slow = rate(frame_thumbnail), rate(reference_thumbnail)
    print(f"\nEVS on 640x480 JPEG: fast {fast:.0f} frames/s, reference {slow:.0f} frames/s, {fast / slow:.1f}x")


# =====================================================================================
# Ring buffer and sampling
# =====================================================================================
@pytest.mark.parametrize(
    ("n", "k", "expected"),
    [
        (0, 16, []),
        (1, 16, [0]),
        (1, 1, [0]),
        (5, 1, [4]),  # k == 1: the newest
        (5, 5, [0, 1, 2, 3, 4]),  # k >= n: all
        (5, 16, [0, 1, 2, 3, 4]),
        (10, 4, [0, 3, 6, 9]),
        (10, 2, [0, 9]),
        (64, 16, [0, 4, 8, 12, 16, 21, 25, 29, 33, 37, 42, 46, 50, 54, 58, 63]),
        (7, 3, [0, 3, 6]),
    ],
)
def test_sample_indices(n, k, expected):
    assert sample_indices(n, k) == expected


def test_sample_indices_invariants():
    for n in range(1, 80):
        for k in range(1, 80):
            indices = sample_indices(n, k)
            assert len(indices) == min(n, k)
            assert indices[-1] == n - 1  # the newest frame is always in
            if min(n, k) >= 2:
                assert indices[0] == 0
                assert all(a < b for a, b in itertools.pairwise(indices))


def test_frame_buffer_ring():
    ring = FrameBuffer(3)
    assert [ring.append(i) for i in range(3)] == [None, None, None]
    assert ring.append(3) == 0 and ring.append(4) == 1  # oldest out
    assert len(ring) == 3 and ring.frames() == [2, 3, 4] and ring.newest() == 4
    assert ring.evicted == 2
    assert list(ring) == [2, 3, 4]
    ring.clear()
    assert len(ring) == 0 and ring.sample(4) == [] and ring.newest() is None
    with pytest.raises(ValueError):
        FrameBuffer(0)


def test_frame_buffer_sample():
    ring = FrameBuffer(64)
    for i in range(100):
        ring.append(f"frame-{i}")
    sampled = ring.sample(16)
    assert len(sampled) == 16 and sampled[0] == "frame-36" and sampled[-1] == "frame-99"
    assert ring.sample(1) == ["frame-99"]
    assert ring.sample(1000) == ring.frames()
    snapshot = ring.sample(4)
    ring.append("frame-100")  # frames keep arriving while a query is answered
    assert snapshot == ["frame-36", "frame-57", "frame-78", "frame-99"]


# =====================================================================================
# Audio
# =====================================================================================
def pcm16(samples) -> bytes:
    return np.asarray(samples, dtype="<i2").tobytes()


def test_audio_conversion_and_take_clears():
    audio = AudioBuffer()
    audio.append(pcm16([0, 16384, -16384]))
    audio.append(pcm16([-32768, 32767]))
    assert len(audio) == 5 and audio.seconds == 5 / 16000 and audio
    out = audio.take()
    assert out.dtype == np.float32
    assert out.tolist() == [0.0, 0.5, -0.5, -1.0, 32767 / 32768]
    assert len(audio) == 0 and not audio and audio.take().shape == (0,)


def test_audio_is_bounded_oldest_dropped():
    audio = AudioBuffer(max_seconds=1.0)
    assert audio.max_samples == 16000
    first = np.arange(12000) % 1000
    second = 1000 + np.arange(12000) % 1000
    assert audio.append(pcm16(first)) == 0
    assert audio.append(pcm16(second)) == 8000
    assert audio.dropped_samples == 8000 and audio.seconds == 1.0
    kept = np.round(audio.take() * 32768).astype(int)
    assert kept.tolist() == first[8000:].tolist() + second.tolist()  # the latest second, in order


def test_audio_longer_chunk_than_the_bound():
    audio = AudioBuffer(max_seconds=0.001)  # 16 samples
    audio.append(pcm16(range(100)))
    assert np.round(audio.take() * 32768).astype(int).tolist() == list(range(84, 100))


def test_audio_rejects_half_samples():
    with pytest.raises(ValueError, match="whole 16-bit samples, got 3 bytes"):
        AudioBuffer().append(b"\x00\x01\x02")
    with pytest.raises(ValueError):
        AudioBuffer(max_seconds=0)
