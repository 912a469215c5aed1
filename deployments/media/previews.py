"""A finished video's previews, the two image variants of OpenAI's content download.

`thumbnail`: the first frame at full size, WebP (for an image-conditioned
video, the frame the start image became). `spritesheet`: up to
`SPRITE_TILES` frames spaced evenly from first to last, in reading order on
a near-square grid, each scaled to at most `SPRITE_TILE_WIDTH` pixels wide,
JPEG; a scrubbing bar shows one tile per position. One pass of decoding
keeps only the frames it needs.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import av
from PIL import Image

SPRITE_TILES = 16
SPRITE_TILE_WIDTH = 256


@dataclass(frozen=True)
class SpriteLayout:
    frames: tuple[int, ...]  # which frames, in order
    columns: int
    rows: int
    tile_width: int
    tile_height: int


def sprite_layout(num_frames: int, width: int, height: int, tiles: int = SPRITE_TILES,
                  max_tile_width: int = SPRITE_TILE_WIDTH) -> SpriteLayout:
    if num_frames < 1:
        raise ValueError("a spritesheet needs at least one frame")
    count = min(tiles, num_frames)
    frames = tuple(sorted({round(i * (num_frames - 1) / max(count - 1, 1)) for i in range(count)}))
    columns = math.ceil(math.sqrt(len(frames)))
    rows = math.ceil(len(frames) / columns)
    tile_width = min(width, max_tile_width)
    tile_height = max(1, round(height * tile_width / width))
    return SpriteLayout(frames, columns, rows, tile_width, tile_height)


def write_previews(video: str | os.PathLike, thumbnail: str | os.PathLike, spritesheet: str | os.PathLike) -> SpriteLayout:
    """Decode the MP4 at `video` once; write its thumbnail (WebP) and spritesheet (JPEG). Returns the sheet's layout."""
    with av.open(os.fspath(video)) as container:
        stream = container.streams.video[0]
        # A progressive MP4 states its frame count (its sample table): the tiles are chosen before decoding.
        layout = sprite_layout(stream.frames, stream.codec_context.width, stream.codec_context.height)
        wanted = set(layout.frames)
        tiles: dict[int, Image.Image] = {}
        for index, frame in enumerate(container.decode(stream)):
            if index == 0:
                frame.to_image().save(thumbnail, format="WEBP", quality=90)
            if index in wanted:
                tiles[index] = frame.to_image().resize((layout.tile_width, layout.tile_height), Image.Resampling.BILINEAR)
            if index >= layout.frames[-1]:
                break
    if not tiles:
        raise ValueError(f"no frames decoded from {os.fspath(video)}")
    sheet = Image.new("RGB", (layout.columns * layout.tile_width, layout.rows * layout.tile_height))
    for slot, index in enumerate(layout.frames):
        # A container that over-reports its frame count leaves the last tiles as the last frame decoded.
        tile = tiles.get(index) or tiles[max(tiles)]
        sheet.paste(tile, ((slot % layout.columns) * layout.tile_width, (slot // layout.columns) * layout.tile_height))
    sheet.save(spritesheet, format="JPEG", quality=85)
    return layout
