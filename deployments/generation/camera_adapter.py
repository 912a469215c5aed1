"""Camera conditioning for a Wan transformer, added without forking it.

Each latent frame's camera pose becomes per-pixel Plücker rays (6 channels at
pixel resolution), pixel-unshuffled to latent resolution and projected by a
patch-sized convolution to the transformer's inner dimension, so the result
lines up token for token with the patch embedding it is added to.

With `rest_relative`, the adapter sees the rays minus those of a camera at
rest (times `gain`): a block's motion is a few degrees or a tenth of a unit,
a small change on rays of length one, and a model trained on the raw rays
learned to ignore it (the built-in model, 500 steps in: no pan at all).

Rest-relative rays are zero for a camera at rest, and Wan's only positions
are relative (RoPE): in a text-to-video first block, made from noise at the
start pose, every token then gets the same input, and where a post or a
tree stands in the picture can only be told from how far a token is from
the frame's edges. `position_bands` adds an absolute position code: Fourier features of each latent pixel's ray at rest
(so any frame size with the same field of view gets the same code for the
same direction), through a projection that starts at zero, so weights
trained without it keep their function until training moves it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

CODE_CHANNELS_PER_BAND = 6  # sin and cos of a ray's three direction components


def position_bands_of(state: dict[str, torch.Tensor]) -> int:
    """How many position-code bands a camera adapter's state dict was trained with (0: none)."""
    weight = state.get("proj_position.weight")  # (hidden, channels, 1, p, p)
    return 0 if weight is None else weight.shape[1] // CODE_CHANNELS_PER_BAND


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
        rest_relative: bool = False,
        gain: float = 1.0,
        fov_degrees: float = 60.0,
        position_bands: int = 0,
    ) -> None:
        super().__init__()
        self._rest: dict[tuple, torch.Tensor] = {}
        unshuffled = plucker_channels * spatial_factor * spatial_factor
        hidden = hidden_dim or inner_dim
        self.proj_in = nn.Conv3d(unshuffled, hidden, kernel_size=tuple(patch_size), stride=tuple(patch_size))
        self.act = nn.SiLU()
        self.proj_out = nn.Linear(hidden, inner_dim)
        if position_bands:
            self._codes: dict[tuple, torch.Tensor] = {}
            self.proj_position = nn.Conv3d(CODE_CHANNELS_PER_BAND * position_bands, hidden, kernel_size=tuple(patch_size), stride=tuple(patch_size))
            nn.init.zeros_(self.proj_position.weight)
            nn.init.zeros_(self.proj_position.bias)

    def _position_code(self, h: int, w: int, like: torch.Tensor) -> torch.Tensor:
        """(1, 6 * bands, 1, h, w): sin and cos of each latent pixel's ray direction at octave frequencies."""
        key = (h, w, like.device, like.dtype)
        if key not in self._codes:
            from deployments.generation.camera import pixel_directions

            dirs = torch.from_numpy(pixel_directions(h, w, self.config.fov_degrees)).float().permute(2, 0, 1)  # (3, h, w)
            scaled = torch.cat([dirs * (math.pi * 2**k) for k in range(self.config.position_bands)])
            self._codes[key] = torch.cat([scaled.sin(), scaled.cos()])[None, :, None].to(like.device, like.dtype)
        return self._codes[key]

    def _rest_rays(self, h: int, w: int, like: torch.Tensor) -> torch.Tensor:
        key = (h, w, like.device, like.dtype)
        if key not in self._rest:
            from deployments.generation.camera import Pose, plucker_rays

            rays = torch.from_numpy(plucker_rays([Pose()], h, w, self.config.fov_degrees))
            self._rest[key] = rays[None].to(like.device, like.dtype)  # (1, 6, 1, H, W)
        return self._rest[key]

    def forward(self, plucker: torch.Tensor) -> torch.Tensor:
        b, c, f, h, w = plucker.shape
        s = self.config.spatial_factor
        if self.config.rest_relative:
            plucker = (plucker - self._rest_rays(h, w, plucker)) * self.config.gain
        # pixel_unshuffle works on 4-D tensors: fold frames into the batch.
        x = plucker.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w)
        x = F.pixel_unshuffle(x, s)
        x = x.reshape(b, f, c * s * s, h // s, w // s).permute(0, 2, 1, 3, 4)
        x = self.proj_in(x.to(self.proj_in.weight.dtype))
        if self.config.position_bands:
            x = x + self.proj_position(self._position_code(h // s, w // s, x))
        x = self.act(x)
        return self.proj_out(x.movedim(1, -1)).movedim(-1, 1)
