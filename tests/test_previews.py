"""A finished video's thumbnail and spritesheet, from a real MP4."""

import io

import numpy as np
import pytest
from PIL import Image

from deployments.media.fmp4 import FragmentedMP4Encoder
from deployments.media.previews import SpriteLayout, sprite_layout, write_previews
from deployments.media.remux import remux_file

pytestmark = pytest.mark.timeout(60)


def tile(sheet: np.ndarray, layout: SpriteLayout, slot: int) -> np.ndarray:
    """The `slot`-th tile of a decoded spritesheet."""
    row, column = divmod(slot, layout.columns)
    top, left = row * layout.tile_height, column * layout.tile_width
    return sheet[top:top + layout.tile_height, left:left + layout.tile_width]


def flat_frames(count: int, width: int, height: int) -> np.ndarray:
    """Each frame one flat grey level, frame i at 10 * i + 20: a tile tells which frame it is."""
    levels = (20 + 10 * np.arange(count)).astype(np.uint8)
    return np.broadcast_to(levels[:, None, None, None], (count, height, width, 3)).copy()


def mp4(tmp_path, frames: np.ndarray, fps: int = 8):
    encoder = FragmentedMP4Encoder(frames.shape[2], frames.shape[1], fps)
    stream = tmp_path / "v.fmp4"
    stream.write_bytes(encoder.encode(frames).data + encoder.close().data)
    remux_file(stream, tmp_path / "v.mp4")
    return tmp_path / "v.mp4"


def test_layout_spaces_tiles_evenly_from_first_to_last_frame():
    layout = sprite_layout(33, 1280, 720)
    assert layout.frames[0] == 0 and layout.frames[-1] == 32 and len(layout.frames) == 16
    assert (layout.columns, layout.rows, layout.tile_width, layout.tile_height) == (4, 4, 256, 144)
    few = sprite_layout(3, 64, 48)
    assert few.frames == (0, 1, 2) and (few.columns, few.rows, few.tile_width, few.tile_height) == (2, 2, 64, 48)
    assert sprite_layout(1, 64, 64).frames == (0,)
    with pytest.raises(ValueError):
        sprite_layout(0, 64, 64)


def test_thumbnail_is_the_first_frame_and_each_tile_its_frame(tmp_path):
    frames = flat_frames(20, 96, 64)
    layout = write_previews(mp4(tmp_path, frames), tmp_path / "t.webp", tmp_path / "s.jpg")
    with Image.open(tmp_path / "t.webp") as thumb:
        assert thumb.format == "WEBP" and thumb.size == (96, 64)
        assert abs(np.asarray(thumb.convert("RGB")).astype(int).mean() - 20) < 3
    with Image.open(tmp_path / "s.jpg") as sheet:
        assert sheet.format == "JPEG" and sheet.size == (layout.columns * 96, layout.rows * 64)
        pixels = np.asarray(sheet.convert("RGB")).astype(int)
    assert len(layout.frames) == 16 and layout.frames[-1] == 19
    for slot, index in enumerate(layout.frames):
        assert abs(tile(pixels, layout, slot).mean() - (20 + 10 * index)) < 3, (slot, index)


def test_a_short_video_fills_part_of_its_grid(tmp_path):
    layout = write_previews(mp4(tmp_path, flat_frames(3, 32, 32)), tmp_path / "t.webp", tmp_path / "s.jpg")
    assert layout.frames == (0, 1, 2)
    pixels = np.asarray(Image.open(io.BytesIO((tmp_path / "s.jpg").read_bytes())).convert("RGB")).astype(int)
    assert [round(tile(pixels, layout, slot).mean() / 10) for slot in range(3)] == [2, 3, 4]
    assert tile(pixels, layout, 3).mean() < 3  # the empty fourth cell stays black
