"""Stage 2: the causal transformer (stock `WanTransformer3DModel` + camera adapter), by teacher forcing.

One training sequence is a run of blocks of one trajectory's latents, twice
over: first every block clean, then every block noised to its own level.
A block-causal mask lets clean block i see clean blocks <= i (what the
engine's commit forward sees), and noisy block i see clean blocks < i and
itself (what a denoising step sees); both copies of a block take the same
frame positions, the same camera tokens and the same text. So one forward
trains the denoising of every block of the run, each given the clean blocks
before it, exactly as the engine's KV cache presents them: the sequences
start at the trajectory's first block (the engine's sink) and either go on
without a gap or jump to a later run, as the rolling window does once it
slides (the engine numbers cached frames from 0 in cache order, and so do
these sequences).

The loss is flow matching's velocity (noise - x0) at the sigmas of the
checkpoint's own schedule (its `denoising_step_list`, else the engine's four
steps, with its shift), plus some at random sigmas. Blocks inside a prompt
transition can be weighted down (`switch_weight`): at the copy they carry
about two thirds of the error though they are a fifth of the blocks, so
their colour change drowns the camera's motion in the gradient. Hence a
curriculum: for the first `motion_steps` every sample is image-to-video and
transitions weigh nothing; then text-to-video first blocks and (lightly
weighted) transitions join in. The
transformer starts as a copy of the frame each block is given
(`copy_init`). Context latents are sometimes slightly
noised (still at t = 0), so the model tolerates its own imperfect blocks in
the cache, and so is the last frame each block is given in its condition
channels (`conditioning.last_frame_condition`, built as the engine builds
it). Some samples (`own_context_fraction`) read the model's own one-step
guesses as their context instead, against the true targets. After the
motion phase half the samples carry the start image (image-to-video), half none (text-to-video; see `builtin_world_model`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from deployments.generation.attention import apply_rotary
from deployments.generation.camera import Pose, plucker_rays
from deployments.generation.conditioning import last_frame_condition
from deployments.generation.reprojection import reproject, reprojection_grid
from deployments.generation.schedule import denoising_sigmas
from deployments.generation.text import prompt_states
from deployments.training.files import torch_save_atomic
from deployments.training.lr_schedule import warmup_cosine
from deployments.training.trajectories import DEMO_PROMPTS


@dataclass(frozen=True)
class TransformerTraining:
    # Blocks per sequence: the sink block, the window's blocks and the current one, so the last block of a
    # sequence sees exactly what the engine's full cache holds (`sequence_blocks_for` sets it from the spec).
    blocks: int = 4
    batch: int = 5
    steps: int = 2000
    lr: float = 3e-4
    min_lr: float = 1e-5
    warmup: int = 50
    weight_decay: float = 0.01
    image_fraction: float = 0.5
    schedule_fraction: float = 1.0  # noisy blocks at the checkpoint's own sigmas; the rest uniform
    context_noise: float = 0.05
    context_noise_fraction: float = 0.5
    # Samples whose context (the clean blocks and the frames the blocks are given) is blurred, the
    # targets kept sharp: a one-step model's own blocks are soft (a text-to-video first block most of
    # all), and the blocks after them should sharpen what they are given rather than keep its blur.
    context_blur_fraction: float = 0.5
    # Samples whose context is the model's own one-step guess of each block (given the true blocks before
    # it), the targets kept true: what the engine's cache holds is its own output, and training on it
    # teaches the next block to pull back towards the world rather than carry the error on (exposure bias).
    own_context_fraction: float = 0.0
    # Loss weight of a text-to-video sample's first block: made from nothing but the prompt and the camera,
    # it has one right answer per prompt at the origin, and a one-step model that underfits it makes blur.
    first_block_weight: float = 1.0
    # Samples drawn so that a prompt transition falls in them (the rest as they come, where about one block
    # in eight is one): a model that mostly sees blocks whose text matches their context learns to copy the
    # context's colours and keep them when the prompt changes.
    transition_fraction: float = 0.0
    # Those samples may also end this many blocks after a transition has finished: the blocks that must
    # settle on the new prompt from a context still half-way (with own context, one that lags behind).
    transition_tail: int = 0
    # Lone text-to-video first blocks added to every step (a second, one-block forward): made from the prompt
    # and the keys alone at the start pose, each has one right answer, and inside 4-block sequences they are
    # too few for the model to learn them sharp (the eleventh session's blocks were soft colour fields). Half
    # come from sessions that open on a prompt the README and the page name (`DEMO_PROMPTS`).
    first_blocks: int = 0
    held_out: int = 16  # trajectories kept out of training, for the context probe
    gap_fraction: float = 0.6  # sequences whose later blocks jump ahead, as after the window slides (most of a session)
    switch_weight: float = 0.3  # loss weight of blocks in a prompt transition (they carry most of the copy's error)
    copy_init: bool = True  # start from "the block is the frame it is given" (see `copy_init`)
    # The curriculum's first phase: image-to-video samples only and transitions weighted 0, so the gradient
    # speaks of the camera's motion before text-to-video first blocks and prompt changes join in.
    motion_steps: int = 1250

    def at(self, step: int) -> "TransformerTraining":
        """The recipe in force at `step` (the motion phase's, then this one)."""
        return replace(self, image_fraction=1.0, switch_weight=0.0, first_blocks=0) if step < self.motion_steps else self


class _Binding:
    """What the training processors read during one forward."""

    mask: torch.Tensor | None = None  # (S, S) bool, True = may attend
    blocks: int = 0  # text conditions per sample (one per block)


class MaskedSelfAttention:
    def __init__(self, head_dim: int, binding: _Binding) -> None:
        self.head_dim, self.binding = head_dim, binding

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (-1, self.head_dim))
        k = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (-1, self.head_dim))
        v = attn.to_v(hidden_states).unflatten(2, (-1, self.head_dim))
        cos, sin = rotary_emb
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=self.binding.mask)
        out = out.transpose(1, 2).flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


class PerBlockTextAttention:
    """Cross-attention where each block's tokens (clean and noisy copy) see that block's own text."""

    def __init__(self, head_dim: int, binding: _Binding) -> None:
        self.head_dim, self.binding = head_dim, binding

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        n = self.binding.blocks
        b, s, _ = hidden_states.shape
        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (-1, self.head_dim))
        q = q.reshape(b * 2 * n, s // (2 * n), -1, self.head_dim)  # segments: clean blocks, then noisy blocks
        k = attn.norm_k(attn.to_k(encoder_hidden_states)).unflatten(2, (-1, self.head_dim))
        v = attn.to_v(encoder_hidden_states).unflatten(2, (-1, self.head_dim))

        def per_segment(x):  # (b * n, L, H, D) -> (b * 2n, L, H, D), the clean and the noisy copy
            x = x.reshape(b, 1, n, *x.shape[1:]).expand(b, 2, n, *x.shape[1:])
            return x.reshape(b * 2 * n, *x.shape[3:])

        out = F.scaled_dot_product_attention(q.transpose(1, 2), per_segment(k).transpose(1, 2), per_segment(v).transpose(1, 2))
        out = out.transpose(1, 2).reshape(b, s, -1).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


class _TwiceRope(nn.Module):
    """Frame positions 0..F-1 for the clean half and again for the noisy half."""

    def __init__(self, rope: nn.Module) -> None:
        super().__init__()
        self.inner = rope

    def forward(self, hidden_states):
        b, c, f, h, w = hidden_states.shape
        cos, sin = self.inner(hidden_states[:, :, : f // 2])
        return torch.cat([cos, cos], dim=1), torch.cat([sin, sin], dim=1)


def block_causal_mask(blocks: int, tokens_per_block: int) -> torch.Tensor:
    """(2 * blocks * tokens, same) bool: clean i sees clean <= i; noisy i sees clean < i and itself."""
    ids = torch.arange(blocks).repeat_interleave(tokens_per_block)
    qi, ki = ids[:, None], ids[None, :]
    clean_clean = ki <= qi
    noisy_clean = ki < qi
    noisy_noisy = ki == qi
    none = torch.zeros_like(clean_clean)
    return torch.cat([torch.cat([clean_clean, none], 1), torch.cat([noisy_clean, noisy_noisy], 1)], 0)


@dataclass
class Sample:
    latents: torch.Tensor  # normalized (z, blocks * fpb, h, w)
    mixes: list[tuple[tuple[str, float], ...]]  # per block
    poses: list  # per block: relative poses
    image: bool  # carries the start image (its first latent frame)
    before: torch.Tensor  # (z, blocks, h, w): the trajectory's latent frame just before each block (zero for block 0)
    switching: tuple[bool, ...] = ()  # per block: its prompt mix differs from the block before it (a transition)
    views: tuple = ()  # per block: (pose of the frame it is given, its frames' poses), in the session's frame
    indices: tuple[int, ...] = ()  # per block: its index in the trajectory

    @classmethod
    def of_blocks(cls, latents: torch.Tensor, chosen: list[int], fpb: int, mixes: list, poses: list, image: bool) -> "Sample":
        """Blocks `chosen` (the first is block 0) of a trajectory's latents (z, F, h, w) and per-block conditions."""
        frames = torch.cat([latents[:, i * fpb : (i + 1) * fpb] for i in chosen], dim=1).float()
        before = torch.stack([latents[:, i * fpb - 1] if i > 0 else torch.zeros_like(latents[:, 0]) for i in chosen], dim=1).float()
        switching = tuple(i > 0 and mixes[i] != mixes[i - 1] for i in chosen)
        views = session_views(poses[: max(chosen) + 1])
        return cls(frames, [mixes[i] for i in chosen], [poses[i] for i in chosen], image, before, switching, tuple(views[i] for i in chosen), tuple(chosen))


def session_views(relative: list[tuple[Pose, ...]]) -> list[tuple[Pose, tuple[Pose, ...]]]:
    """Per block of a session, from the director's relative poses: the pose of the frame the block is
    given (the start image's, its own first frame, for block 0; the frame before it otherwise) and its
    frames' poses, chained from the start pose as the engine's director keeps them."""
    views, reference = [], Pose()
    for k, block in enumerate(relative):
        frames = tuple(reference.compose(p) for p in block)
        views.append((frames[0] if k == 0 else reference, frames))
        reference = frames[-1]
    return views


def sequence_blocks_for(sink_frames: int, window_frames: int, frames_per_block: int) -> int:
    """Blocks in a training sequence that ends the way a full cache ends: sink, window, current block."""
    return -(-sink_frames // frames_per_block) + window_frames // frames_per_block + 1


def sequence_blocks(rng: np.random.Generator, available: int, blocks: int, gap_fraction: float) -> list[int]:
    """Block indices of one training sequence: the first block, then a run (with a jump now and then)."""
    if available > blocks and rng.random() < gap_fraction:
        start = int(rng.integers(2, available - blocks + 2))
        return [0] + list(range(start, start + blocks - 1))
    return list(range(min(blocks, available)))


class TeacherForcing:
    """Holds the models being trained and computes the loss of a batch of samples."""

    def __init__(self, transformer, camera_adapter, text_encoder, tokenizer, *, height: int, width: int, frames_per_block: int, shift: float,
                 config: TransformerTraining, timesteps: list[float] | None = None, ground_depth: float | None = None) -> None:
        from deployments.generation.text import PromptEncoder

        self.transformer, self.camera_adapter, self.text_encoder, self.tokenizer = transformer, camera_adapter, text_encoder, tokenizer
        self.height, self.width, self.fpb, self.config = height, width, frames_per_block, config
        self.max_length = PromptEncoder(tokenizer, text_encoder).max_length
        self.sigmas = denoising_sigmas(len(timesteps) if timesteps else 4, shift, timesteps)  # the checkpoint's own schedule
        self.shift = shift
        self.ground_depth = ground_depth  # the checkpoint's `last_frame_reprojection` (reprojection.py)
        self.binding = _Binding()
        head_dim = transformer.config.attention_head_dim
        processors = {}
        for name in transformer.attn_processors:
            processors[name] = (MaskedSelfAttention if ".attn1." in name else PerBlockTextAttention)(head_dim, self.binding)
        transformer.set_attn_processor(processors)
        transformer.rope = _TwiceRope(transformer.rope)
        self._camera = None
        transformer.patch_embedding.register_forward_hook(lambda m, a, out: out if self._camera is None else out + self._camera)
        self._masks: dict[tuple, torch.Tensor] = {}

    def parameters(self):
        for module in (self.transformer, self.camera_adapter, self.text_encoder):
            yield from module.parameters()

    def _text(self, samples: list[Sample]) -> torch.Tensor:
        prompts = sorted({p for s in samples for mix in s.mixes for p, _ in mix})
        states = prompt_states(self.tokenizer, self.text_encoder, prompts, self.max_length)
        index = {p: i for i, p in enumerate(prompts)}
        return torch.stack([sum(w * states[index[p]] for p, w in mix) for s in samples for mix in s.mixes])

    def _camera_tokens(self, samples: list[Sample], blocks: int) -> torch.Tensor:
        rays = np.stack([plucker_rays(list(poses), self.height, self.width) for s in samples for poses in s.poses])
        tokens = self.camera_adapter(torch.from_numpy(rays))  # (B * n, dim, fpb, hp, wp)
        d, f, hp, wp = tokens.shape[1:]
        tokens = tokens.reshape(len(samples), blocks, d, f, hp, wp).permute(0, 2, 1, 3, 4, 5).reshape(len(samples), d, blocks * f, hp, wp)
        return torch.cat([tokens, tokens], dim=2)

    def loss(self, samples: list[Sample], rng: np.random.Generator, generator: torch.Generator,
             config: TransformerTraining | None = None) -> torch.Tensor:
        cfg = config or self.config
        n = len(samples[0].mixes)
        x0 = torch.stack([s.latents for s in samples])  # (B, z, F, h, w)
        b = x0.shape[0]
        # Per block noise levels.
        sig = np.where(rng.random((b, n)) < cfg.schedule_fraction, rng.choice(self.sigmas, size=(b, n)),
                       [[_shifted(u, self.shift) for u in row] for row in rng.random((b, n))])
        noise = torch.randn(x0.shape, generator=generator)
        aug = torch.from_numpy(rng.random(b) < cfg.context_noise_fraction).float().view(b, 1, 1, 1, 1)
        before = torch.stack([s.before for s in samples])
        blur = rng.random(b) < cfg.context_blur_fraction
        clean = x0
        if cfg.own_context_fraction > 0:  # drawn only then, so recipes without it replay as they did
            own = rng.random(b) < cfg.own_context_fraction
            if own.any():
                guess, guessed_before = self.own_context(samples, before, generator)
                rows = torch.from_numpy(own).view(b, 1, 1, 1, 1)
                clean, before = torch.where(rows, guess, clean), torch.where(rows, guessed_before, before)
                blur &= ~own
        if blur.any():
            factors = rng.choice(BLUR_FACTORS, size=b)
            clean = torch.stack([soften(x, int(f)) if on else x for x, on, f in zip(clean, blur, factors)])
            before = torch.stack([soften(x, int(f)) if on else x for x, on, f in zip(before, blur, factors)])
        clean = clean + aug * cfg.context_noise * torch.randn(x0.shape, generator=generator)
        before = before + aug * cfg.context_noise * torch.randn(before.shape, generator=generator)
        v = self.velocity(samples, clean, sig, noise, before)
        weight = torch.tensor([[block_weight(cfg, s, k) for k in range(n)] for s in samples])
        weight = weight.repeat_interleave(self.fpb, dim=1).view(b, 1, -1, 1, 1)
        per_weight = x0.shape[1] * x0.shape[3] * x0.shape[4]  # values each weight entry covers
        # A weighted mean (the plain MSE when every weight is 1); a batch of transitions only, at weight 0, gives 0.
        return ((v.float() - (noise - x0)) ** 2 * weight).sum() / (weight.sum() * per_weight).clamp_min(1.0)

    @torch.no_grad()
    def own_context(self, samples: list[Sample], before: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Each block as the model makes it in one step from the schedule's first sigma, given the true
        blocks before it, and the frame before each block taken from those guesses where the block before
        it is in the sample (else the true one): the contexts of `TransformerTraining.own_context_fraction`."""
        x0 = torch.stack([s.latents for s in samples])
        b, n = x0.shape[0], len(samples[0].mixes)
        sigma = float(self.sigmas[0])
        noise = torch.randn(x0.shape, generator=generator)
        v = self.velocity(samples, x0, np.full((b, n), sigma), noise, before)
        guess = (((1 - sigma) * x0 + sigma * noise) - sigma * v).float()  # x0 = x_sigma - sigma * (noise - x0)
        guessed_before = before.clone()
        for row, s in enumerate(samples):
            for k in range(1, n):
                if s.indices and s.indices[k] == s.indices[k - 1] + 1:
                    guessed_before[row, :, k] = guess[row, :, k * self.fpb - 1]
        return guess, guessed_before

    def condition(self, samples: list[Sample], x0: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
        """Each block's last-frame channels, as the engine gives them: (B, 4 + z, F, h, w). Block 0 gets the
        start image (the first latent frame of `x0`) where the sample carries one; block k > 0 the frame before it."""
        image = torch.tensor([s.image for s in samples])
        given = [x0[:, :, 0]] + [before[:, :, k] for k in range(1, before.shape[2])]
        if self.ground_depth is not None:
            given = [self._reprojected(frame, [s.views[k] for s in samples]) for k, frame in enumerate(given)]
        blocks = [last_frame_condition(given[0], self.fpb, 0, present=image)]
        blocks += [last_frame_condition(frame, self.fpb, 1) for frame in given[1:]]
        return torch.cat(blocks, dim=2)

    def _reprojected(self, frame: torch.Tensor, views: list) -> torch.Tensor:
        """Each row's given latent frame (B, z, h, w) seen from its block's frames: (B, z, fpb, h, w)."""
        h, w = frame.shape[-2:]
        grids = np.stack([reprojection_grid(given, frames, h, w, self.ground_depth) for given, frames in views])
        return reproject(frame, torch.from_numpy(grids))

    def velocity(self, samples: list[Sample], clean: torch.Tensor, sig: np.ndarray, noise: torch.Tensor, before: torch.Tensor | None = None) -> torch.Tensor:
        """The velocity predicted for every block of every sample noised to its `sig` (B, blocks), each
        given the `clean` blocks before it and the frame `before` it (default: the samples' own): (B, z, F, h, w)."""
        x0 = torch.stack([s.latents for s in samples])
        b, z, frames, h, w = x0.shape
        n = sig.shape[1]
        sig_frames = torch.from_numpy(np.repeat(sig, self.fpb, axis=1)).float().view(b, 1, frames, 1, 1)
        noisy = (1 - sig_frames) * x0 + sig_frames * noise
        cond = self.condition(samples, x0, torch.stack([s.before for s in samples]) if before is None else before)
        x = torch.cat([torch.cat([clean, noisy], dim=2), torch.cat([cond, cond], dim=2)], dim=1)

        patch = self.transformer.config.patch_size
        tokens_per_frame = (h // patch[1]) * (w // patch[2])
        key = (n, tokens_per_frame * self.fpb)
        if key not in self._masks:
            self._masks[key] = block_causal_mask(n, tokens_per_frame * self.fpb)
        self.binding.mask, self.binding.blocks = self._masks[key], n
        t_tokens = np.concatenate([np.zeros((b, n)), sig * 1000.0], axis=1)  # clean at t = 0
        timestep = torch.from_numpy(np.repeat(t_tokens, tokens_per_frame * self.fpb, axis=1)).float()
        self._camera = self._camera_tokens(samples, n)
        try:
            out = self.transformer(x, timestep, self._text(samples), return_dict=False)[0]
        finally:
            self._camera = None
        return out[:, :, frames:]


def block_weight(cfg: TransformerTraining, sample: Sample, k: int) -> float:
    """Loss weight of block k of a sample: transitions weigh `switch_weight`, a text-to-video first block `first_block_weight`."""
    if k < len(sample.switching) and sample.switching[k]:
        return cfg.switch_weight
    return cfg.first_block_weight if k == 0 and not sample.image else 1.0


def draw_samples(rng: np.random.Generator, recipe: TransformerTraining, fpb: int, latents: list[torch.Tensor], mixes: list[list],
                 poses: list[list], text_to_video: list[int] | None = None) -> list[Sample]:
    """One batch: each sample a run of blocks of a random trajectory, with the start image or (from
    `text_to_video` when given) without."""
    samples = []
    switches = None
    for _ in range(recipe.batch):
        image = bool(rng.random() < recipe.image_fraction)
        pool = text_to_video if not image and text_to_video else None
        if recipe.transition_fraction > 0 and rng.random() < recipe.transition_fraction:  # drawn only then: old recipes replay
            switches = switches if switches is not None else transition_blocks(mixes, fpb, latents, recipe.blocks, recipe.transition_tail)
            listed = None if pool is None else set(pool)
            allowed = switches if listed is None else [c for c in switches if c[0] in listed]
            if allowed:
                t, chosen = allowed[int(rng.integers(len(allowed)))]
                samples.append(Sample.of_blocks(latents[t], chosen, fpb, mixes[t], poses[t], image))
                continue
        t = int(pool[rng.integers(len(pool))]) if pool else int(rng.integers(len(latents)))
        chosen = sequence_blocks(rng, latents[t].shape[1] // fpb, recipe.blocks, recipe.gap_fraction)
        samples.append(Sample.of_blocks(latents[t], chosen, fpb, mixes[t], poses[t], image))
    return samples


def draw_first_blocks(rng: np.random.Generator, count: int, fpb: int, latents: list[torch.Tensor], mixes: list[list], poses: list[list],
                      text_to_video: list[int] | None) -> list[Sample]:
    """`count` lone first blocks of text-to-video sessions (`TransformerTraining.first_blocks`), half of them
    (when there are any) from sessions that open on a named prompt."""
    pool = list(text_to_video) if text_to_video else list(range(len(latents)))
    named = [t for t in pool if len(mixes[t][0]) == 1 and mixes[t][0][0][0] in DEMO_PROMPTS]
    picks = [named[int(rng.integers(len(named)))] if named and k % 2 == 0 else pool[int(rng.integers(len(pool)))] for k in range(count)]
    return [Sample.of_blocks(latents[t], [0], fpb, mixes[t], poses[t], False) for t in picks]


def transition_blocks(mixes: list[list], fpb: int, latents: list[torch.Tensor], blocks: int, tail: int = 0) -> list[tuple[int, list[int]]]:
    """Every (trajectory, sequence) whose last block is inside a prompt transition or at most `tail` blocks
    after one: the sink block, then the blocks just before it, so the block learns the change from a
    context that still shows the old prompt."""
    out = []
    for t, per_block in enumerate(mixes):
        available = latents[t].shape[1] // fpb
        for i in range(blocks - 1, available):
            if any(per_block[j] != per_block[j - 1] for j in range(max(1, i - tail), i + 1)):
                out.append((t, [0] + list(range(i - blocks + 2, i + 1))))
    return out


BLUR_FACTORS = (2, 4)  # a context is softened by averaging over this many latent pixels a side, then spread back


def soften(latents: torch.Tensor, factor: int) -> torch.Tensor:
    """Latent frames (z, F, h, w) with their detail finer than `factor` latent pixels taken away."""
    frames = latents.transpose(0, 1)  # (F, z, h, w)
    h, w = frames.shape[-2:]
    small = F.avg_pool2d(frames, factor, ceil_mode=True)
    return F.interpolate(small, size=(h, w), mode="bilinear", align_corners=False).transpose(0, 1)


def _shifted(u: float, shift: float) -> float:
    return shift * u / (1 + (shift - 1) * u)


def _lr(cfg: TransformerTraining, step: int) -> float:
    return warmup_cosine(step, cfg.steps, cfg.warmup, cfg.lr, cfg.min_lr)


SNAPSHOT_KEYS = ("transformer", "camera_adapter", "text_encoder")


def snapshot_path(out_dir: str | Path, step: int) -> Path:
    return Path(out_dir) / f"snapshot-{step}.pt"


def snapshot_steps(out_dir: str | Path) -> list[int]:
    return sorted(int(p.stem.split("-", 1)[1]) for p in Path(out_dir).glob("snapshot-*.pt") if p.stem.split("-", 1)[1].isdigit())


def train_transformer(
    trainer: TeacherForcing,
    latents: list[torch.Tensor],
    mixes: list[list],
    poses: list[list],
    out_dir: str | Path,
    *,
    seed: int = 0,
    log: Callable[[dict], None] = print,
    checkpoint_every: int = 250,
    probe: Callable[[], dict] | None = None,
    text_to_video: list[int] | None = None,
) -> dict:
    """Train on the trajectories' normalized latents (z, F, h, w) and per-block conditions; checkpoints in
    `out_dir`. `probe` (see `probe.context_probe`) is measured and logged at each checkpoint.

    Samples without a start image come from the trajectories `text_to_video` lists (default: any): a
    text-to-video session opens at the world's origin, so from those its first block has one right
    answer per prompt, which a one-step model can learn sharp; from anywhere it would learn their blur."""
    cfg = trainer.config
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    params = [p for p in trainer.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    start_step = 0
    resume = out / "checkpoint.pt"
    if resume.is_file():
        state = torch.load(resume, weights_only=False)
        for module, name in ((trainer.transformer, "transformer"), (trainer.camera_adapter, "camera_adapter"), (trainer.text_encoder, "text_encoder")):
            module.load_state_dict(state[name])
        opt.load_state_dict(state["optimizer"])
        rng.bit_generator.state = state["rng"]
        generator.set_state(state["generator"])
        start_step = state["step"]
        log({"stage": "transformer", "resumed_at": start_step})
    fpb = trainer.fpb
    started = time.time()
    running = None
    for step in range(start_step, cfg.steps):
        for group in opt.param_groups:
            group["lr"] = _lr(cfg, step)
        recipe = cfg.at(step)
        samples = draw_samples(rng, recipe, fpb, latents, mixes, poses, text_to_video)
        loss = trainer.loss(samples, rng, generator, recipe)
        if recipe.first_blocks:  # drawn only then: recipes without it replay as they did
            lone = draw_first_blocks(rng, recipe.first_blocks, fpb, latents, mixes, poses, text_to_video)
            loss = loss + trainer.loss(lone, rng, generator, replace(recipe, own_context_fraction=0.0, context_blur_fraction=0.0))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        value = loss.item()
        running = value if running is None else 0.95 * running + 0.05 * value
        if step % 25 == 0 or step == cfg.steps - 1:
            log({"stage": "transformer", "step": step, "loss": round(value, 5), "loss_avg": round(running, 5),
                 "lr": round(_lr(cfg, step), 6), "elapsed_s": round(time.time() - started, 1)})
        if (step + 1) % checkpoint_every == 0 or step == cfg.steps - 1:
            state = {"transformer": trainer.transformer.state_dict(), "camera_adapter": trainer.camera_adapter.state_dict(),
                     "text_encoder": trainer.text_encoder.state_dict(), "optimizer": opt.state_dict(),
                     "rng": rng.bit_generator.state, "generator": generator.get_state(), "step": step + 1}
            torch_save_atomic(state, resume)
            # The weights at each checkpoint are kept by step, so a snapshot of a longer run can be exported
            # (`export_step`) and the command that made shipped weights names the run and the step.
            torch_save_atomic({k: state[k] for k in SNAPSHOT_KEYS + ("step",)}, snapshot_path(out, step + 1))
            if probe is not None:
                log({"stage": "transformer", "step": step + 1, "probe": probe()})
    report = {"steps": cfg.steps, "final_loss_avg": running, "config": asdict(cfg), "train_seconds": round(time.time() - started, 1)}
    (out / "training.json").write_text(json.dumps(report, indent=2))
    return report
