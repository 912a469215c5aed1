"""The built-in model's tiny streaming decoder, trained on the world model's own latents and rendered frames.

Each sample is a stretch of one trajectory, decoded the way a session decodes
it: the latent frames before the stretch run first without gradients (they
leave the memory blocks as a stream would), then the stretch's frames are
decoded and compared with the rendered frames they stand for (latent frame 0
is frame 0; latent frame f >= 1 is frames 4f-3 .. 4f). The target is the
rendered video, not the VAE's decode of it, so the decoder is not bounded by
the VAE's blur. Loss: mean absolute error in [-1, 1].
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from deployments.generation.tiny_decoder import TinyDecoderConfig, TinyVideoDecoder


@dataclass(frozen=True)
class DecoderTraining:
    widths: tuple[int, int, int, int] = (48, 32, 24, 24)
    steps: int = 1500
    batch: int = 4
    stretch: int = 3  # latent frames decoded with gradients per sample (one block)
    warmup: int = 3  # latent frames before them, without gradients (the stream's memory)
    lr: float = 1e-3
    held_out: int = 8  # trajectories kept for the PSNR report
    checkpoint_every: int = 250


def frame_span(latent_index: int, time_factor: int) -> tuple[int, int]:
    """Rendered frames a latent frame stands for in a causal video VAE's layout."""
    if latent_index == 0:
        return 0, 1
    return 1 + time_factor * (latent_index - 1), 1 + time_factor * latent_index


def _sample(model: TinyVideoDecoder, raw: torch.Tensor, frames: torch.Tensor, start: int, cfg: DecoderTraining) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoded pixels and their targets for latent frames [start, start + stretch) of one trajectory."""
    tf = model.config.time_factor
    memory = [None] * len(model.memory_layers)
    before = max(0, start - cfg.warmup)
    if before < start:
        with torch.no_grad():
            _, memory = model.run(raw[None, :, before:start], memory)
    pixels, _ = model.run(raw[None, :, start : start + cfg.stretch], memory)
    if start == 0:
        pixels = pixels[:, :, model.frames_to_trim :]
    first, _ = frame_span(start, tf)
    _, last = frame_span(start + cfg.stretch - 1, tf)
    target = frames[first:last].permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0
    return pixels, target


def train_tiny_decoder(
    latents: list[torch.Tensor],
    videos: list[np.ndarray],
    latents_mean: list[float],
    latents_std: list[float],
    shape: TinyDecoderConfig,
    out_dir: Path,
    config: DecoderTraining = DecoderTraining(),
    seed: int = 0,
    log: Callable[[dict], None] = print,
) -> dict:
    """`latents`: normalized (z, F, h, w) per trajectory (`WORK/latents.pt`); `videos`: its rendered uint8
    frames (T, H, W, 3); `shape`: the decoder to train (`TinyDecoderConfig.for_vae`). Writes `out_dir`
    (the decoder's folder) and returns the held-out PSNR."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    z = latents[0].shape[0]
    mean, std = torch.tensor(latents_mean).view(z, 1, 1, 1), torch.tensor(latents_std).view(z, 1, 1, 1)
    raw = [lat.float() * std + mean for lat in latents]
    frames = [torch.from_numpy(v) for v in videos]
    model = TinyVideoDecoder(shape)
    held = config.held_out
    train_ids = list(range(len(raw) - held))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, config.lr, total_steps=config.steps, pct_start=0.05)
    began, running = time.time(), None
    for step in range(config.steps):
        loss = 0.0
        for i in rng.choice(train_ids, size=config.batch):
            start = int(rng.integers(0, raw[i].shape[1] - config.stretch + 1))
            pixels, target = _sample(model, raw[i], frames[i], start, config)
            loss = loss + (pixels - target).abs().mean() / config.batch
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        value = loss.item()
        running = value if running is None else 0.95 * running + 0.05 * value
        if step % 25 == 0 or step == config.steps - 1:
            log({"stage": "decoder", "step": step, "loss": round(value, 5), "loss_avg": round(running, 5),
                 "elapsed_s": round(time.time() - began, 1)})
        if (step + 1) % config.checkpoint_every == 0:
            model.save_pretrained(out_dir)
    model.eval().save_pretrained(out_dir)
    report = {"held_out_psnr_db": held_out_psnr(model, raw[-held:], frames[-held:]) if held else None}
    log({"stage": "decoder", **report})
    return report


@torch.no_grad()
def held_out_psnr(model: TinyVideoDecoder, raw: list[torch.Tensor], frames: list[torch.Tensor]) -> float:
    """PSNR (dB, 8-bit) of whole held-out trajectories decoded as one stream each."""
    errors = []
    for r, f in zip(raw, frames):
        pixels = model.decode_video(r[None])[0]
        decoded = ((pixels.permute(1, 2, 3, 0) + 1) * 127.5).round().clamp(0, 255)
        errors.append(float(((decoded - f[: decoded.shape[0]].float()) ** 2).mean()))
    return round(10 * float(np.log10(255.0**2 / np.mean(errors))), 2)
