"""How blocks of latent frames become video frames, for every layer that counts them.

A causal VAE decodes the session's very first latent frame to one video frame
and every later latent frame to `temporal` frames: with 3 latent frames a
block and a factor of 4, blocks give 9, 12, 12, ... frames. The engine, the
protocol checks and the clients all count with these three functions.
"""

from __future__ import annotations

FRAMES_PER_BLOCK = 3  # latent frames per block of a causal Wan; servers state theirs in video.start
TEMPORAL_FACTOR = 4  # video frames per latent frame (Wan VAE)


def frames_in_block(index: int, frames_per_block: int = FRAMES_PER_BLOCK, temporal: int = TEMPORAL_FACTOR) -> int:
    return (frames_per_block - 1) * temporal + 1 if index == 0 else frames_per_block * temporal


def frames_for_blocks(blocks: int, frames_per_block: int = FRAMES_PER_BLOCK, temporal: int = TEMPORAL_FACTOR) -> int:
    return 0 if blocks <= 0 else (blocks * frames_per_block - 1) * temporal + 1


def blocks_for_frames(num_frames: int, frames_per_block: int = FRAMES_PER_BLOCK, temporal: int = TEMPORAL_FACTOR) -> int:
    """The fewest whole blocks that give at least `num_frames` frames (at least one)."""
    latent = -(-(num_frames - 1) // temporal) + 1
    return max(1, -(-latent // frames_per_block))
