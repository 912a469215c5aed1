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

    def batch_key(self) -> tuple:
        """Decoders with equal keys are at the same point of their streams: they can decode in one batch."""
        return ("vae", self.started, tuple(t is None for t in self.feat_cache))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.feat_cache if isinstance(t, torch.Tensor))

    def close(self) -> None:
        self.feat_cache = [None] * len(self.feat_cache)


@torch.no_grad()
def decode_together(decoders: list[StreamingDecoder], raw_latents: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each session's next latents through the VAE as one batch; each decoder's state advances as if alone.

    The decoders must be at the same point of their streams (all started or none, same shapes): their
    caches are stacked along the batch, decoded together, and handed back as per-session slices.
    """
    if len(decoders) == 1:
        return [decoders[0].decode(raw_latents[0])]
    started = {d.started for d in decoders}
    pattern = {tuple(t is None for t in d.feat_cache) for d in decoders}
    if len(started) > 1 or len(pattern) > 1:
        raise ValueError("decoders of one batch must be at the same point of their streams")
    vae = decoders[0].vae
    cache = [None if t is None else torch.cat([d.feat_cache[i] for d in decoders]) for i, t in enumerate(decoders[0].feat_cache)]
    x = vae.post_quant_conv(torch.cat(raw_latents).to(vae.dtype))
    chunks = [vae.decoder(x[:, :, i : i + 1], feat_cache=cache, feat_idx=[0], first_chunk=not decoders[0].started) for i in range(x.shape[2])]
    out = torch.cat(chunks, dim=2)
    if vae.config.patch_size is not None:
        out = unpatchify(out, patch_size=vae.config.patch_size)
    out = out.clamp(-1.0, 1.0)
    for b, decoder in enumerate(decoders):
        decoder.feat_cache = [None if t is None else t[b : b + 1] for t in cache]
        decoder.started = True
    return [out[b : b + 1] for b in range(len(decoders))]


def decode_batch(decoders: list, raw_latents: list[torch.Tensor]) -> list[torch.Tensor]:
    """One batch of sessions' next latents through their decoder (all Wan VAE streams or all tiny ones)."""
    from deployments.generation.tiny_decoder import TinyStreamingDecoder, decode_tiny_together

    if isinstance(decoders[0], TinyStreamingDecoder):
        return decode_tiny_together(decoders, raw_latents)
    return decode_together(decoders, raw_latents)


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
