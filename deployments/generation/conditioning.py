"""The transformer's condition channels (Wan image-to-video layout: 4 mask channels + one latent frame).

Two readings of those channels, chosen by the checkpoint:

- stock Wan image-to-video: the start image's latent on the first latent frame
  of the first block, mask all ones there; everything else zero.
- last-frame condition (our extension, transformer config key
  `last_frame_condition`): every block carries the last latent frame before
  it, repeated on each of its frames, with the mask channels one-hot in how
  far back that frame lies (0: this frame is the given one, as the start
  image is for the first frame; 1, 2, 3+: that many frames back). Copying
  what is already on screen is then a local operation, so a small model
  learns to continue the picture and spends its attention on motion.

The engine and the trainer both build their channels here, so what a model
is trained on is what it is served.
"""

from __future__ import annotations

import torch

MASK_CHANNELS = 4


def image_condition(image_latent: torch.Tensor, frames: int) -> torch.Tensor:
    """Stock Wan image-to-video channels for a first block: (B, 4 + z, frames, h, w) from a (B, z, h, w) latent."""
    b, z, h, w = image_latent.shape
    cond = image_latent.new_zeros((b, MASK_CHANNELS + z, frames, h, w))
    cond[:, :MASK_CHANNELS, 0] = 1.0
    cond[:, MASK_CHANNELS:, 0] = image_latent
    return cond


def last_frame_condition(given: torch.Tensor, frames: int, first_distance: int, present: torch.Tensor | None = None) -> torch.Tensor:
    """Last-frame channels for a block: (B, 4 + z, frames, h, w).

    `given` (B, z, h, w) is the latent frame before the block (the start image, for a first block),
    or that frame as each of the block's frames would see it (B, z, frames, h, w; see reprojection.py);
    the block's frame j lies `first_distance + j` frames after it. Rows where `present` (B,) is False
    get all-zero channels: nothing is given (a first block with no start image).
    """
    if given.dim() == 4:
        given = given.unsqueeze(2).expand(-1, -1, frames, -1, -1)
    b, z, _, h, w = given.shape
    cond = given.new_zeros((b, MASK_CHANNELS + z, frames, h, w))
    for j in range(frames):
        cond[:, min(first_distance + j, MASK_CHANNELS - 1), j] = 1.0
    cond[:, MASK_CHANNELS:] = given
    if present is not None:
        cond = cond * present.to(cond.dtype).view(b, 1, 1, 1, 1)
    return cond
