"""Streaming decode and image encode with the stock AutoencoderKLWan.

`vae.decode()` clears the causal conv cache at its start and end, so decoding a
clip block by block through it loses frames. Each session keeps its own
decoder cache and feeds the decoder one latent frame at a time, the way
`_decode` does inside one call, so the concatenated chunks equal one whole-clip
decode bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify


class LatentNormalizer:
    """Between the VAE's raw latent space and the normalized space the transformer works in."""

    def __init__(self, vae) -> None:
        z = vae.config.z_dim
        self.mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32).view(1, z, 1, 1, 1)
        self.std = torch.tensor(vae.config.latents_std, dtype=torch.float32).view(1, z, 1, 1, 1)

    def to_raw(self, latents: torch.Tensor) -> torch.Tensor:
        return latents * self.std.to(latents) + self.mean.to(latents)

    def to_normalized(self, raw: torch.Tensor) -> torch.Tensor:
        return (raw - self.mean.to(raw)) / self.std.to(raw)


class StreamingDecoder:
    """One session's causal VAE decoder state."""

    def __init__(self, vae) -> None:
        self.vae = vae
        self.feat_cache: list[torch.Tensor | None] = [None] * vae._cached_conv_counts["decoder"]
        self.started = False

    @torch.no_grad()
    def decode(self, raw_latents: torch.Tensor) -> torch.Tensor:
        """Raw latents (1, z, F, h, w) -> pixels (1, 3, T, H, W) in [-1, 1], continuing the stream."""
        vae = self.vae
        x = vae.post_quant_conv(raw_latents.to(vae.dtype))
        chunks = []
        for i in range(x.shape[2]):
            chunks.append(
                vae.decoder(x[:, :, i : i + 1], feat_cache=self.feat_cache, feat_idx=[0], first_chunk=not self.started)
            )
            self.started = True
        out = torch.cat(chunks, dim=2)
        if vae.config.patch_size is not None:
            out = unpatchify(out, patch_size=vae.config.patch_size)
        return out.clamp(-1.0, 1.0)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.feat_cache if isinstance(t, torch.Tensor))

    def close(self) -> None:
        self.feat_cache = [None] * len(self.feat_cache)


def to_uint8_frames(pixels: torch.Tensor) -> np.ndarray:
    """(1, 3, T, H, W) in [-1, 1] -> uint8 (T, H, W, 3)."""
    x = ((pixels[0].float() + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
    return x.permute(1, 2, 3, 0).contiguous().cpu().numpy()


@torch.no_grad()
def encode_image(vae, normalizer: LatentNormalizer, image: np.ndarray) -> torch.Tensor:
    """uint8 (H, W, 3) -> normalized latent (1, z, 1, h, w) of a one-frame clip (the mode, as Wan I2V uses)."""
    x = torch.from_numpy(np.array(image, copy=True)).to(vae.device, torch.float32).permute(2, 0, 1)[None, :, None] / 127.5 - 1.0
    raw = vae.encode(x.to(vae.dtype)).latent_dist.mode()
    return normalizer.to_normalized(raw.float())
