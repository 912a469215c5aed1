"""Start the transformer as "the block is the frame it is given": a copy prior, then learn the change.

Trained from a random init, the built-in transformer never learned even to
copy the last frame it is given in its condition channels (fourth run: 25.5 dB
at sigma 1 where the copy scores 30.5 dB, 1,500 steps in), though that frame
sits at the very token it predicts. Here the stock `WanTransformer3DModel` is
set, before training, to predict the velocity `x_t - given` at every token:
at sigma 1 (every schedule's first step, and the one where the context must
carry the whole picture) its clean estimate is exactly the given frame; at
lower sigmas the model has to learn its timestep's scale. Training starts at
the copy and only has to learn what moves (camera, parallax, a prompt
switch). The architecture is untouched; only the starting weights differ, so
the engine serves the result like any Wan checkpoint.

How, in the transformer's own terms:

- the patch embedding writes, per token, `x_t - given` (one residual
  dimension per output value), the given frame itself (clean, for the blocks
  to read and move), small random features of every input channel (mask
  channels included), and a constant pair `+anchor, -anchor` that keeps the
  output LayerNorm's divisor nearly constant, so the copy passes it nearly
  linearly (the blocks' own input modulation hides the anchors from them);
- every block's attention and feed-forward output projections and the
  timestep embedding's last layer start at zero (DiT's adaLN-zero idea): the
  blocks add nothing until training makes them; the camera adapter writes
  only into the free dimensions;
- `proj_out` reads `x_t - given` back, rescaled by the LayerNorm's divisor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from deployments.generation.conditioning import MASK_CHANNELS


@dataclass(frozen=True)
class CopyLayout:
    """Where the copy start puts things in the residual stream (slices of the inner dimension)."""

    velocity: slice  # x_t - given, one dimension per output value (what proj_out reads)
    given: slice  # the given frame, clean, for the blocks to read and move
    free: slice  # small random features and the camera's tokens
    anchors: slice  # the constant +anchor, -anchor pair the blocks do not see


def copy_layout(transformer: nn.Module) -> CopyLayout:
    cfg = transformer.config
    pt, ph, pw = cfg.patch_size
    per_token = cfg.out_channels * pt * ph * pw
    dim = cfg.num_attention_heads * cfg.attention_head_dim
    return CopyLayout(slice(0, per_token), slice(per_token, 2 * per_token), slice(2 * per_token, dim - 2), slice(dim - 2, dim))


@torch.no_grad()
def init_as_copy(transformer: nn.Module, camera_adapter: nn.Module | None = None, *, anchor: float = 32.0,
                 feature_scale: float = 0.1, latent_variance: float = 1.0) -> None:
    """Set `transformer` (in place) to predict `x_t - given` from its last-frame condition channels."""
    cfg = transformer.config
    z = cfg.out_channels
    pt, ph, pw = cfg.patch_size
    per_token = z * pt * ph * pw
    dim = cfg.num_attention_heads * cfg.attention_head_dim
    if cfg.in_channels != 2 * z + MASK_CHANNELS:
        raise ValueError(f"copy init needs the last-frame condition layout ({2 * z + MASK_CHANNELS} input channels), not {cfg.in_channels}")
    if 2 * per_token + 2 > dim:
        raise ValueError(f"copy init needs an inner dimension of at least {2 * per_token + 2}, not {dim}")
    given = z + MASK_CHANNELS
    layout = copy_layout(transformer)
    free, anchors = layout.free, layout.anchors

    embed = transformer.patch_embedding
    weight = torch.zeros_like(embed.weight)  # (dim, in_channels, pt, ph, pw)
    weight[free] = embed.weight[free] * feature_scale
    for it in range(pt):
        for ih in range(ph):
            for iw in range(pw):
                for c in range(z):
                    k = ((it * ph + ih) * pw + iw) * z + c  # the order proj_out's values are unpatchified in
                    weight[layout.velocity.start + k, c, it, ih, iw] = 1.0
                    weight[layout.velocity.start + k, given + c, it, ih, iw] = -1.0
                    weight[layout.given.start + k, given + c, it, ih, iw] = 1.0
    bias = torch.zeros_like(embed.bias)
    bias[anchors] = torch.tensor([anchor, -anchor])
    embed.weight.copy_(weight)
    embed.bias.copy_(bias)

    timestep_bias = transformer.condition_embedder.time_proj.bias.view(6, dim)  # what the blocks' modulation adds
    for block in transformer.blocks:
        for layer in (block.attn1.to_out[0], block.attn2.to_out[0], block.ffn.net[2]):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
        # The blocks read their input with the anchors scaled to zero (modulation scale -1 before self-attention
        # and the feed-forward, a zero LayerNorm weight before cross-attention): left in, a constant 25 times
        # the content's size would fill every query, key and value, and the blocks would learn 25 times slower.
        table = block.scale_shift_table.view(6, dim)
        for chunk in (1, 4):  # scale_msa, c_scale_msa
            table[chunk, anchors] = -1.0 - timestep_bias[chunk, anchors]
        for chunk in (0, 3):  # shift_msa, c_shift_msa
            table[chunk, anchors] = -timestep_bias[chunk, anchors]
        block.norm2.weight[anchors] = 0.0
        block.norm2.bias[anchors] = 0.0
    nn.init.zeros_(transformer.condition_embedder.time_embedder.linear_2.weight)
    nn.init.zeros_(transformer.condition_embedder.time_embedder.linear_2.bias)
    nn.init.zeros_(transformer.scale_shift_table)
    if camera_adapter is not None:
        # The camera's tokens start in the free dimensions only: the copy is untouched, yet the blocks see the
        # camera from the first step. Zeroed outright, camera and blocks would both start at zero and the
        # product that moves the picture would have no gradient (the fifth run's probe: no motion in 500 steps).
        keep = torch.zeros(dim, dtype=torch.bool)
        keep[free] = True
        camera_adapter.proj_out.weight[~keep] = 0.0
        camera_adapter.proj_out.bias[~keep] = 0.0

    # At sigma 1, x_t - given has variance 1 + latent_variance per value and the given frame latent_variance:
    # with the anchors, the token's spread that the output LayerNorm divides by.
    spread = math.sqrt((2 * anchor**2 + per_token * (1 + 2 * latent_variance)) / dim)
    out = transformer.proj_out
    nn.init.zeros_(out.weight)
    nn.init.zeros_(out.bias)
    out.weight[:, layout.velocity].copy_(torch.eye(per_token) * spread)
