"""Camera conditioning for a Wan transformer, added without forking it.

Each latent frame's camera pose becomes per-pixel Plücker rays (6 channels at
pixel resolution), pixel-unshuffled to latent resolution and projected by a
patch-sized convolution to the transformer's inner dimension, so the result
lines up token for token with the patch embedding it is added to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn


class CameraAdapter(ModelMixin, ConfigMixin):
    """Plücker rays (B, 6, F, H, W) -> tokens (B, inner_dim, F, H/s/p, W/s/p)."""

    config_name = "config.json"

    @register_to_config
    def __init__(
        self,
        inner_dim: int,
        spatial_factor: int = 8,
        patch_size: tuple[int, int, int] = (1, 2, 2),
        plucker_channels: int = 6,
        hidden_dim: int | None = None,
    ) -> None:
        super().__init__()
        unshuffled = plucker_channels * spatial_factor * spatial_factor
        hidden = hidden_dim or inner_dim
        self.proj_in = nn.Conv3d(unshuffled, hidden, kernel_size=tuple(patch_size), stride=tuple(patch_size))
        self.act = nn.SiLU()
        self.proj_out = nn.Linear(hidden, inner_dim)

    def forward(self, plucker: torch.Tensor) -> torch.Tensor:
        b, c, f, h, w = plucker.shape
        s = self.config.spatial_factor
        # pixel_unshuffle works on 4-D tensors: fold frames into the batch.
        x = plucker.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w)
        x = F.pixel_unshuffle(x, s)
        x = x.reshape(b, f, c * s * s, h // s, w // s).permute(0, 2, 1, 3, 4)
        x = self.act(self.proj_in(x.to(self.proj_in.weight.dtype)))
        return self.proj_out(x.movedim(1, -1)).movedim(-1, 1)
