"""Stage 1: the video VAE, diffusers' `AutoencoderKLWan`, trained to reconstruct rendered clips.

Three phases. Short clips first (5 frames: the causal first frame and one
4-frame chunk), which are cheap and teach the spatial code; then clips from
a stream's start and from its middle (`steady`: 0-6 chunks streamed before
the clip without gradients), because a chunk deep in a stream sees full
temporal caches, which a clip from the start never shows (trained on short
clips only, the third chunk of a stream lost 8 dB); then the decoder alone on
long prefixes (`stream`), with the encoder, and so the latents, frozen.
The decoder is trained on the encoder's means plus a fixed small noise
(`latent_noise`), which teaches it to forgive the small errors a generated
latent has; the posterior's own variance is not used. (Sampled from the
posterior under a KL term, this session's first run had a posterior std near
0.6, as large as the picture's own signal in the anchored channels: noise no
decoder can see through.) A small penalty on the free channels' size keeps
them on the noise's scale.

The first 12 latent channels are anchored to the picture (`anchor_target`):
their means are trained to equal the chunk's last frame, average-pooled to
half the latent's stride and folded 2x2 into channels. A latent is then a
small image that moves as the picture moves, which is what the transformer
must learn to extrapolate; the first run's unanchored latents changed between
consecutive frames of a moving camera as much as they varied at all, and its
transformer learned no motion. The other 4 channels carry what the anchor
misses (finer detail, the frames between). After training, the per-channel mean and std of the
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
    short: VAEPhase = field(default_factory=lambda: VAEPhase(clip_frames=5, batch=6, steps=600, lr=2e-3, min_lr=1e-4, warmup=20))
    # Clips from the start of a stream and from its middle (0-6 chunks streamed before them): the
    # temporal caches are full there, as in a served session, and a decoder trained only on clips
    # from a stream's start lost quality chunk after chunk.
    steady: VAEPhase = field(default_factory=lambda: VAEPhase(clip_frames=8, batch=4, steps=1000, lr=1e-3, min_lr=2e-5, warmup=10, prefix_chunks=(0, 1, 2, 4, 6)))
    # Long streams for the decoder: a session's decode runs for hours, and its error kept growing over
    # the first 30 frames with only short prefixes seen.
    stream: VAEPhase = field(default_factory=lambda: VAEPhase(clip_frames=8, batch=4, steps=150, lr=3e-4, min_lr=1e-5, warmup=10, prefix_chunks=(6, 10, 14, 18, 21), decoder_only=True))
    latent_noise: float = 0.05  # std of the noise added to the latent means the decoder is trained on
    size_weight: float = 1e-3  # penalty on the free channels' mean square
    # The anchored picture is a fixed linear function of the frame; at weight 1 the encoder fitted it
    # loosely (a plaza's red post and grey ground lost), and the decoder with it. Weight 10, 300 steps in:
    # anchored picture 22.0 dB against 20.0, and the reconstruction better too (24.4 dB against 23.0).
    anchor_weight: float = 10.0
    held_out: int = 16  # trajectories kept out of training, for PSNR

    @property
    def phases(self) -> tuple[tuple[str, VAEPhase], ...]:
        return (("short", self.short), ("steady", self.steady), ("stream", self.stream))

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


ANCHORED_CHANNELS = 12  # RGB x (2 x 2) sub-positions per latent pixel


def anchor_target(x: torch.Tensor, spatial_factor: int, first_chunk: bool) -> torch.Tensor:
    """Pixels (B, 3, T, H, W) in the streaming layout (a lone first frame when `first_chunk`, then
    chunks of 4) -> what the anchored latent channels should hold: (B, 12, latent frames, H/s, W/s)."""
    import torch.nn.functional as F

    last = list(range(0 if first_chunk else 3, x.shape[2], 4))
    frames = x[:, :, last]  # each latent frame's chunk ends on its own pose
    b, c, f, h, w = frames.shape
    flat = frames.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w)
    pooled = F.avg_pool2d(flat, spatial_factor // 2)
    folded = F.pixel_unshuffle(pooled, 2)
    return folded.reshape(b, f, *folded.shape[1:]).permute(0, 2, 1, 3, 4)


def _size(mean: torch.Tensor) -> torch.Tensor:
    return mean[:, ANCHORED_CHANNELS:].pow(2).mean()


def _noisy(mean: torch.Tensor, noise: float) -> torch.Tensor:
    return mean + noise * torch.randn_like(mean)


def _anchor(vae, x: torch.Tensor, mean: torch.Tensor, first_chunk: bool) -> torch.Tensor:
    target = anchor_target(x, vae.config.scale_factor_spatial, first_chunk)
    return (mean[:, :ANCHORED_CHANNELS] - target).pow(2).mean()


def _reconstruct(vae, x: torch.Tensor, noise: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Whole clips through `encode` / `decode` (each starts its own stream): (output, size, anchor error)."""
    mean = vae.encode(x).latent_dist.mean
    return vae.decode(_noisy(mean, noise)).sample, _size(mean), _anchor(vae, x, mean, True)


def _reconstruct_streamed(vae, prefix: torch.Tensor, x: torch.Tensor, noise: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`prefix` (whole chunks) then `x` (4-frame chunks) through one stream, chunk by chunk, the way
    `encode` and the streaming decoder go; only `x`'s chunks carry gradients: (output for x, size, anchor error)."""
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

    enc_cache = [None] * vae._cached_conv_counts["encoder"]
    dec_cache = [None] * vae._cached_conv_counts["decoder"]

    def chunk(frames: torch.Tensor, first: bool):
        posterior = DiagonalGaussianDistribution(vae.quant_conv(vae.encoder(frames, feat_cache=enc_cache, feat_idx=[0])))
        out = vae.decoder(vae.post_quant_conv(_noisy(posterior.mean, noise)), feat_cache=dec_cache, feat_idx=[0], first_chunk=first)
        return out, posterior

    with torch.no_grad():
        chunk(prefix[:, :, :1], True)
        for i in range(1, prefix.shape[2], 4):
            chunk(prefix[:, :, i : i + 4], False)
    outs, sizes, anchors = [], [], []
    for i in range(0, x.shape[2], 4):
        out, posterior = chunk(x[:, :, i : i + 4], False)
        outs.append(out)
        sizes.append(_size(posterior.mean))
        anchors.append(_anchor(vae, x[:, :, i : i + 4], posterior.mean, False))
    return torch.cat(outs, dim=2), torch.stack(sizes).mean(), torch.stack(anchors).mean()


def _reconstruct_decoder(vae, prefix: torch.Tensor, x: torch.Tensor, noise: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole stream encoded at once (the encoder is frozen), then decoded latent by latent; only
    `x`'s latents carry gradients: (output for x, zero size, zero anchor error)."""
    with torch.no_grad():
        z = _noisy(vae.encode(torch.cat([prefix, x], dim=2)).latent_dist.mean, noise)
        cache = [None] * vae._cached_conv_counts["decoder"]
        known = 1 + (prefix.shape[2] - 1) // 4
        for i in range(known):
            vae.decoder(vae.post_quant_conv(z[:, :, i : i + 1]), feat_cache=cache, feat_idx=[0], first_chunk=i == 0)
    outs = [vae.decoder(vae.post_quant_conv(z[:, :, i : i + 1]), feat_cache=cache, feat_idx=[0], first_chunk=i == 0) for i in range(known, z.shape[2])]
    return torch.cat(outs, dim=2), torch.zeros(()), torch.zeros(())


def _train_phase(vae, videos: list[np.ndarray], phase: VAEPhase, config: "VAETraining", rng: np.random.Generator, name: str, log: Callable[[dict], None]) -> None:
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
            y, size, anchor = _reconstruct_decoder(vae, frames[:, :, :prefix_frames], x, config.latent_noise)
        elif prefix_frames:
            y, size, anchor = _reconstruct_streamed(vae, frames[:, :, :prefix_frames], x, config.latent_noise)
        else:
            y, size, anchor = _reconstruct(vae, x, config.latent_noise)
        loss = (y - x).abs().mean() + (y - x).pow(2).mean() + config.size_weight * size + config.anchor_weight * anchor
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0 or step == phase.steps - 1:
            log({"stage": "vae", "phase": name, "step": step, "prefix_chunks": prefix_chunks, "loss": round(loss.item(), 5),
                 "size": round(size.item(), 4), "anchor": round(anchor.item(), 5), "train_psnr": round(psnr(y.detach(), x), 2), "elapsed_s": round(time.time() - started, 1)})
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
        _train_phase(vae, train, phase, config, np.random.default_rng(seed if index == 0 else [seed, index + 1]), name, log)
        vae.save_pretrained(done, safe_serialization=True)
    stats = latent_statistics(vae, train[:64])
    vae.register_to_config(latents_mean=stats[0], latents_std=stats[1])
    whole, anchored = held_out_psnr(vae, held)
    report = {"held_out_psnr_db": round(whole, 2), "held_out_anchored_psnr_db": round(anchored, 2), "held_out_latent_motion": round(latent_motion(vae, held), 3), "config": asdict(config), "train_seconds": round(time.time() - started, 1)}
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
def latent_motion(vae, videos: list[np.ndarray]) -> float:
    """Mean squared change between consecutive normalized latent frames, per unit of the latents' variance
    (the statistics must be in `vae.config` already).

    The transformer extrapolates latents, so a camera move should change them about as smoothly as it
    changes the picture; the first run's unanchored VAE gave 0.86."""
    from deployments.generation.vae_stream import LatentNormalizer

    normalizer = LatentNormalizer(vae)
    ratios = []
    for video in videos:
        z = normalizer.to_normalized(encode_video(vae, video)[None])[0]
        ratios.append(float((z[:, 1:] - z[:, :-1]).pow(2).mean() / z.var()))
    return float(np.mean(ratios))


@torch.no_grad()
def held_out_psnr(vae, videos: list[np.ndarray]) -> tuple[float, float]:
    """Whole held-out videos through the streaming path's layout (first frame alone, then chunks of 4):
    PSNR of the reconstruction, and of the anchored channels against the half-size pictures they hold.

    The second is the one to watch: a large smooth sky keeps the first near 25 dB while the anchored
    picture, which is all the transformer sees, has lost a plaza's posts and its ground colour."""
    whole, anchored = [], []
    for video in videos:
        n = 1 + ((len(video) - 1) // 4) * 4
        x = to_pixels(video[None, :n])
        mean = vae.encode(x).latent_dist.mode()
        whole.append(psnr(vae.decode(mean).sample, x))
        anchored.append(psnr(mean[:, :ANCHORED_CHANNELS], anchor_target(x, vae.config.scale_factor_spatial, first_chunk=True)))
    return float(np.mean(whole)), float(np.mean(anchored))
