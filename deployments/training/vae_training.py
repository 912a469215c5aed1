"""Stage 1: the video VAE, diffusers' `AutoencoderKLWan`, trained to reconstruct rendered clips.

Two phases. Short clips first (5 frames: the causal first frame and one
4-frame chunk), which are cheap and teach the spatial code; then longer ones
(13 frames: three chunks), because a chunk after the second sees a full
temporal cache from the chunk before it, which a 5-frame clip never shows
(trained on short clips only, the third chunk of a stream lost 8 dB).
Latents are sampled from the posterior during training (a small KL keeps
them smooth), which also teaches the decoder to forgive the small errors a
generated latent has. After training, the per-channel mean and std of the
data's latents go into the config, where the engine's `LatentNormalizer`
reads them.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from deployments.training.lr_schedule import warmup_cosine


@dataclass(frozen=True)
class VAEPhase:
    clip_frames: int
    batch: int
    steps: int
    lr: float
    min_lr: float
    warmup: int
    # Chunks (the first frame, then 4 frames each) streamed through the encoder and decoder without
    # gradients before the clip, one count drawn per step: they fill the causal caches, so the clip is
    # trained in the middle of a stream, as the server decodes it, not at its start.
    prefix_chunks: tuple[int, ...] = (0,)
    # The decoder alone (encoder frozen): the latents the transformer learns from stay exactly as they were.
    decoder_only: bool = False


@dataclass(frozen=True)
class VAETraining:
    short: VAEPhase = field(default_factory=lambda: VAEPhase(clip_frames=5, batch=8, steps=900, lr=2e-3, min_lr=1e-4, warmup=30))
    long: VAEPhase = field(default_factory=lambda: VAEPhase(clip_frames=13, batch=4, steps=400, lr=1e-3, min_lr=5e-5, warmup=10))
    steady: VAEPhase = field(default_factory=lambda: VAEPhase(clip_frames=8, batch=4, steps=400, lr=5e-4, min_lr=2e-5, warmup=10, prefix_chunks=(0, 1, 2, 4, 6)))
    # Long streams for the decoder: a session's decode runs for hours, and its error kept growing over
    # the first 30 frames with only short prefixes seen.
    stream: VAEPhase = field(default_factory=lambda: VAEPhase(clip_frames=8, batch=4, steps=300, lr=3e-4, min_lr=1e-5, warmup=10, prefix_chunks=(6, 10, 14, 18, 21), decoder_only=True))
    kl_weight: float = 1e-4
    held_out: int = 16  # trajectories kept out of training, for PSNR

    @property
    def phases(self) -> tuple[tuple[str, VAEPhase], ...]:
        return (("short", self.short), ("long", self.long), ("steady", self.steady), ("stream", self.stream))

    def scaled(self, steps: int, batch: int | None = None) -> "VAETraining":
        """The same recipe with each phase's step count (and batch) set; for smoke runs."""
        from dataclasses import replace

        return replace(self, **{name: replace(phase, steps=steps, batch=batch or phase.batch) for name, phase in self.phases})


def to_pixels(frames: np.ndarray) -> torch.Tensor:
    """uint8 (B, T, H, W, 3) -> float (B, 3, T, H, W) in [-1, 1]."""
    return torch.from_numpy(frames).float().permute(0, 4, 1, 2, 3) / 127.5 - 1.0


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """Of two pixel tensors in [-1, 1], over [0, 255]."""
    mse = float(((a.clamp(-1, 1) - b.clamp(-1, 1)) * 127.5).pow(2).mean())
    return 10 * math.log10(255.0**2 / max(mse, 1e-10))


def _lr(phase: VAEPhase, step: int) -> float:
    return warmup_cosine(step, phase.steps, phase.warmup, phase.lr, phase.min_lr)


def _kl(posterior) -> torch.Tensor:
    return 0.5 * (posterior.mean.pow(2) + posterior.var - 1.0 - posterior.logvar).mean()


def _reconstruct(vae, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole clips through `encode` / `decode` (each starts its own stream): (output, KL)."""
    posterior = vae.encode(x).latent_dist
    return vae.decode(posterior.sample()).sample, _kl(posterior)


def _reconstruct_streamed(vae, prefix: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`prefix` (whole chunks) then `x` (4-frame chunks) through one stream, chunk by chunk, the way
    `encode` and the streaming decoder go; only `x`'s chunks carry gradients: (output for x, KL)."""
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

    enc_cache = [None] * vae._cached_conv_counts["encoder"]
    dec_cache = [None] * vae._cached_conv_counts["decoder"]

    def chunk(frames: torch.Tensor, first: bool):
        posterior = DiagonalGaussianDistribution(vae.quant_conv(vae.encoder(frames, feat_cache=enc_cache, feat_idx=[0])))
        out = vae.decoder(vae.post_quant_conv(posterior.sample()), feat_cache=dec_cache, feat_idx=[0], first_chunk=first)
        return out, posterior

    with torch.no_grad():
        chunk(prefix[:, :, :1], True)
        for i in range(1, prefix.shape[2], 4):
            chunk(prefix[:, :, i : i + 4], False)
    outs, kls = [], []
    for i in range(0, x.shape[2], 4):
        out, posterior = chunk(x[:, :, i : i + 4], False)
        outs.append(out)
        kls.append(_kl(posterior))
    return torch.cat(outs, dim=2), torch.stack(kls).mean()


def _reconstruct_decoder(vae, prefix: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole stream encoded at once (the encoder is frozen), then decoded latent by latent; only
    `x`'s latents carry gradients: (output for x, zero KL)."""
    with torch.no_grad():
        z = vae.encode(torch.cat([prefix, x], dim=2)).latent_dist.sample()
        cache = [None] * vae._cached_conv_counts["decoder"]
        known = 1 + (prefix.shape[2] - 1) // 4
        for i in range(known):
            vae.decoder(vae.post_quant_conv(z[:, :, i : i + 1]), feat_cache=cache, feat_idx=[0], first_chunk=i == 0)
    outs = [vae.decoder(vae.post_quant_conv(z[:, :, i : i + 1]), feat_cache=cache, feat_idx=[0]) for i in range(known, z.shape[2])]
    return torch.cat(outs, dim=2), torch.zeros(())


def _train_phase(vae, videos: list[np.ndarray], phase: VAEPhase, kl_weight: float, rng: np.random.Generator, name: str, log: Callable[[dict], None]) -> None:
    vae.train()
    params = list(vae.decoder.parameters()) + list(vae.post_quant_conv.parameters()) if phase.decoder_only else list(vae.parameters())
    opt = torch.optim.AdamW(params, lr=phase.lr, weight_decay=0.0)
    started = time.time()
    for step in range(phase.steps):
        for group in opt.param_groups:
            group["lr"] = _lr(phase, step)
        prefix_chunks = int(rng.choice(phase.prefix_chunks))
        prefix_frames = 0 if prefix_chunks == 0 else 1 + 4 * (prefix_chunks - 1)
        # A clip that starts the stream starts with its lone first frame.
        length = phase.clip_frames + (1 if prefix_frames == 0 and phase.clip_frames % 4 == 0 else 0)
        clips = []
        for _ in range(phase.batch):
            video = videos[rng.integers(len(videos))]
            first = rng.integers(0, len(video) - prefix_frames - length + 1)
            clip = video[first : first + prefix_frames + length]
            if rng.random() < 0.5:
                clip = clip[:, :, ::-1]  # mirrored worlds are worlds too
            clips.append(clip)
        frames = to_pixels(np.ascontiguousarray(np.stack(clips)))
        x = frames[:, :, prefix_frames:]
        if phase.decoder_only:
            y, kl = _reconstruct_decoder(vae, frames[:, :, :prefix_frames], x)
        elif prefix_frames:
            y, kl = _reconstruct_streamed(vae, frames[:, :, :prefix_frames], x)
        else:
            y, kl = _reconstruct(vae, x)
        loss = (y - x).abs().mean() + (y - x).pow(2).mean() + kl_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0 or step == phase.steps - 1:
            log({"stage": "vae", "phase": name, "step": step, "prefix_chunks": prefix_chunks, "loss": round(loss.item(), 5),
                 "kl": round(kl.item(), 4), "train_psnr": round(psnr(y.detach(), x), 2), "elapsed_s": round(time.time() - started, 1)})
    vae.eval()


def phase_dir(out_dir: str | Path, name: str) -> Path:
    out = Path(out_dir)
    return out.with_name(f"{out.name}-{name}")


def vae_trained(out_dir: str | Path, config: VAETraining) -> bool:
    """Whether `train_vae` finished every phase of `config` into `out_dir`."""
    return (Path(out_dir) / "config.json").is_file() and (phase_dir(out_dir, config.phases[-1][0]) / "config.json").is_file()


def train_vae(videos: list[np.ndarray], out_dir: str | Path, spec, config: VAETraining = VAETraining(), *, seed: int = 0, log: Callable[[dict], None] = print) -> dict:
    """Train the VAE of `spec` (a `WorldModelSpec`) on `videos` (uint8 (T, H, W, 3) each; the last
    `held_out` are not trained on); save it to `out_dir`. Each phase's result is kept beside it
    (`<out_dir>-<phase>`), so a stopped run starts again at the phase it was in."""
    from diffusers import AutoencoderKLWan

    from deployments.models.tiny_world_model import make_vae

    out = Path(out_dir)
    train, held = videos[: -config.held_out], videos[-config.held_out :]
    started = time.time()
    vae = None
    for index, (name, phase) in enumerate(config.phases):
        done = phase_dir(out, name)
        if (done / "config.json").is_file():
            vae = AutoencoderKLWan.from_pretrained(done)
            continue
        if vae is None:
            torch.manual_seed(seed)
            vae = make_vae(spec)
        torch.manual_seed(seed + index)
        _train_phase(vae, train, phase, config.kl_weight, np.random.default_rng(seed if index == 0 else [seed, index + 1]), name, log)
        vae.save_pretrained(done, safe_serialization=True)
    stats = latent_statistics(vae, train[:64])
    vae.register_to_config(latents_mean=stats[0], latents_std=stats[1])
    report = {"held_out_psnr_db": round(held_out_psnr(vae, held), 2), "config": asdict(config), "train_seconds": round(time.time() - started, 1)}
    vae.save_pretrained(out, safe_serialization=True)
    (out / "training.json").write_text(json.dumps(report, indent=2))
    log({"stage": "vae", **report})
    return report


@torch.no_grad()
def encode_video(vae, video: np.ndarray) -> torch.Tensor:
    """uint8 (T, H, W, 3) -> raw latent means (z, F, h, w)."""
    return vae.encode(to_pixels(video[None])).latent_dist.mode()[0]


@torch.no_grad()
def latent_statistics(vae, videos: list[np.ndarray]) -> tuple[list[float], list[float]]:
    z = torch.cat([encode_video(vae, v).flatten(1) for v in videos], dim=1)
    return z.mean(1).tolist(), z.std(1).clamp_min(1e-3).tolist()


@torch.no_grad()
def held_out_psnr(vae, videos: list[np.ndarray]) -> float:
    """Whole held-out videos through the streaming path's layout (first frame alone, then chunks of 4)."""
    values = []
    for video in videos:
        n = 1 + ((len(video) - 1) // 4) * 4
        x = to_pixels(video[None, :n])
        y = vae.decode(vae.encode(x).latent_dist.mode()).sample
        values.append(psnr(y, x))
    return float(np.mean(values))
