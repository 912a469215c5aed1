"""The causal world-model engine: one loaded checkpoint, many sessions, one block at a time.

No Ray and no WebSocket here; a Serve replica wraps it. Forwards on the shared
transformer are serialized by a lock because the KV cache reaches the
attention processors through a binding, not through arguments.

Tensor parallel: built with a `TensorParallel`, each rank holds heads / N of
every block (and 1/N of each session's KV cache). Every rank must make the
same calls in the same order (open_session with the same config and seed,
the same submits, generate_block) so the collectives inside the forwards
line up; the noise is the same on every rank because the seed is. Only rank
0 decodes frames.
"""

from __future__ import annotations

import secrets
import threading
import uuid
from pathlib import Path

import numpy as np
import torch

from deployments.generation.attention import (
    CacheBinding,
    ForwardState,
    install_processors,
)
from deployments.generation.camera import plucker_rays
from deployments.generation.checkpoint import WorldModelComponents, load_world_model
from deployments.generation.interactions import Director
from deployments.generation.kv_cache import KVLayout, RollingKVCache
from deployments.generation.rope import OffsetRope
from deployments.generation.schedule import denoising_sigmas
from deployments.generation.session import (
    BlockMetadata,
    GeneratedBlock,
    SessionConfig,
    WorldSession,
)
from deployments.generation.tensor_parallel import TensorParallel
from deployments.generation.text import PromptEncoder
from deployments.generation.vae_stream import (
    LatentNormalizer,
    StreamingDecoder,
    encode_image,
    to_uint8_frames,
)


def fit_image(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Centre-crop to the target aspect, then resize: uint8 (height, width, 3)."""
    from PIL import Image

    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError("image must be a uint8 array of shape (H, W, 3)")
    h, w = image.shape[:2]
    scale = max(height / h, width / w)
    crop_h, crop_w = min(h, round(height / scale)), min(w, round(width / scale))
    top, left = (h - crop_h) // 2, (w - crop_w) // 2
    cropped = Image.fromarray(image[top : top + crop_h, left : left + crop_w])
    return np.asarray(cropped.resize((width, height), Image.Resampling.BICUBIC))


class SessionCancelled(RuntimeError):
    """A block was abandoned half-way because its session was cancelled."""


class WorldModelEngine:
    def __init__(self, components: WorldModelComponents) -> None:
        self.components = components
        self.geometry = components.geometry
        self.transformer = components.transformer
        self.vae = components.vae
        self.camera_adapter = components.camera_adapter
        self.image_conditioned = components.image_conditioned
        self.tensor_parallel = components.tensor_parallel
        self.rank = self.tensor_parallel.rank if self.tensor_parallel else 0
        self.world_size = self.tensor_parallel.world_size if self.tensor_parallel else 1
        self.device = next(self.transformer.parameters()).device
        self.dtype = next(self.transformer.parameters()).dtype
        self.normalizer = LatentNormalizer(self.vae)
        self.prompts = PromptEncoder(components.tokenizer, components.text_encoder)
        self.binding = CacheBinding()
        install_processors(self.transformer, self.binding)
        self.transformer.rope = OffsetRope(self.transformer.rope, self.binding)
        self.transformer.patch_embedding.register_forward_hook(self._add_camera_tokens)
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        vae_dtype: torch.dtype = torch.float32,
        tensor_parallel: TensorParallel | None = None,
    ) -> "WorldModelEngine":
        """Load a checkpoint; with `tensor_parallel` every rank calls this and the transformer is sharded after loading."""
        return cls(load_world_model(path, device=device, dtype=dtype, vae_dtype=vae_dtype, tensor_parallel=tensor_parallel))

    @property
    def decodes(self) -> bool:
        """Whether this engine's blocks carry frames (False on tensor-parallel ranks other than 0)."""
        return self.rank == 0

    @property
    def accepts_camera(self) -> bool:
        return self.camera_adapter is not None

    def _add_camera_tokens(self, module, args, output):
        if not self.binding.bound or self.binding.state.camera_tokens is None:
            return output
        return output + self.binding.state.camera_tokens.to(output.dtype)

    # -- sessions ------------------------------------------------------------
    def kv_layout(self, height: int, width: int) -> KVLayout:
        """This rank's cache layout: under tensor parallel it holds only the local heads."""
        config = self.transformer.config
        return KVLayout(
            num_layers=config.num_layers,
            sink_frames=self.geometry.sink_size,
            window_frames=self.geometry.sliding_window_num_frames,
            tokens_per_frame=self.geometry.tokens_per_frame(height, width),
            heads=config.num_attention_heads // self.world_size,
            head_dim=config.attention_head_dim,
        )

    def open_session(self, config: SessionConfig, session_id: str | None = None) -> WorldSession:
        if not isinstance(config.prompt, str) or not config.prompt.strip():
            raise ValueError("prompt must be a non-blank string")
        self.geometry.check_size(config.height, config.width)
        if self.image_conditioned and config.image is None:
            raise ValueError("this model is image-to-video: the session needs a start image")
        if not self.image_conditioned and config.image is not None:
            raise ValueError("this model is text-to-video: it takes no start image")
        steps = config.num_inference_steps if config.num_inference_steps is not None else (
            len(self.components.timesteps) if self.components.timesteps else 4
        )
        timesteps = self.components.timesteps if config.num_inference_steps is None else None
        shift = self.components.flow_shift if config.flow_shift is None else config.flow_shift
        sigmas = denoising_sigmas(steps, shift, timesteps)
        seed = config.seed if config.seed is not None else secrets.randbits(63)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        image_latent = None
        if config.image is not None:
            with self._lock:
                image_latent = encode_image(self.vae, self.normalizer, fit_image(config.image, config.height, config.width))
        return WorldSession(
            session_id=session_id or uuid.uuid4().hex,
            config=config,
            seed=seed,
            sigmas=sigmas,
            director=Director(config.prompt, self.geometry.num_frames_per_block, self.accepts_camera),
            kv=RollingKVCache(self.kv_layout(config.height, config.width), self.dtype, self.device),
            decoder=StreamingDecoder(self.vae),
            generator=torch.Generator(device=self.device).manual_seed(seed),
            image_latent=image_latent,
        )

    # -- one block -------------------------------------------------------------
    @torch.no_grad()
    def generate_block(self, session: WorldSession) -> GeneratedBlock:
        if session.closed:
            raise RuntimeError(f"session {session.session_id} is closed")
        with self._lock:
            plan = session.director.plan_block()
            text = self.text_condition(session, plan.prompt_mix)
            camera = self._camera_tokens(session, plan)
            cond = self._image_condition(session)
            shape = self._latent_shape(session)

            x = torch.randn(shape, generator=session.generator, device=self.device, dtype=torch.float32)
            sigmas = session.sigmas
            for i, sigma in enumerate(sigmas):
                self._check_cancel(session)
                v = self.forward(session, x, sigma, text, camera, cond)
                x0 = x - sigma * v
                if i + 1 < len(sigmas):
                    noise = torch.randn(shape, generator=session.generator, device=self.device, dtype=torch.float32)
                    x = (1.0 - sigmas[i + 1]) * x0 + sigmas[i + 1] * noise
            # One clean pass at t = 0 writes the block's K/V for the blocks after it.
            self._check_cancel(session)
            self.forward(session, x0, 0.0, text, camera, cond, commit=True)
            session.kv.advance(shape[2])
            pixels = session.decoder.decode(self.normalizer.to_raw(x0).to(self.vae.dtype)) if self.decodes else None

        frames = to_uint8_frames(pixels) if pixels is not None else None
        meta = BlockMetadata(
            block_index=session.block_index,
            num_frames=frames.shape[0] if frames is not None else self.geometry.frames_in_block(session.block_index),
            started_event_ids=plan.started,
            active_event_ids=plan.active,
            completed_event_ids=plan.completed,
        )
        session.block_index += 1
        return GeneratedBlock(frames=frames, metadata=meta, latents=x0.to("cpu", torch.float32, copy=True))

    def _check_cancel(self, session: WorldSession) -> None:
        # Between steps, so a dropped session frees the engine for the others within one forward.
        cancelled = session.cancelled
        if self.world_size > 1:
            # All ranks must stop at the same step or the next forward's collectives hang:
            # a cancel seen by any rank cancels the block on every rank.
            flag = torch.tensor([int(cancelled)], dtype=torch.int32, device=self.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self.tensor_parallel.group)
            cancelled = bool(flag.item())
            if cancelled:
                session.cancelled = True
        if cancelled:
            raise SessionCancelled(f"session {session.session_id} was cancelled")

    def _latent_shape(self, session: WorldSession) -> tuple[int, ...]:
        lh, lw = self.geometry.latent_size(session.config.height, session.config.width)
        return (1, self.vae.config.z_dim, self.geometry.num_frames_per_block, lh, lw)

    def forward(self, session, latents, sigma, text, camera=None, cond=None, commit: bool = False) -> torch.Tensor:
        """The velocity the transformer predicts for one block at `sigma`, attending to the session's cache.

        With `commit` the block's K/V are written after the cached frames (the
        caller then advances the cache). Callers hold the engine lock.
        """
        x = latents if cond is None else torch.cat([latents, cond], dim=1)
        t = torch.full((1,), sigma * 1000.0, device=self.device, dtype=torch.float32)
        state = ForwardState(kv=session.kv, commit=commit, text_kv=session.text_kv, camera_tokens=camera)
        with self.binding.bind(state):
            out = self.transformer(x.to(self.dtype), t, text, return_dict=False)[0]
        return out.float()

    def text_condition(self, session: WorldSession, mix: tuple[tuple[str, float], ...]) -> torch.Tensor:
        if session.text_key != mix:
            session.text_kv.clear()  # cross-attention K/V belong to the old text
            session.text_key = mix
        return self.prompts.encode_mix(dict(mix)).to(self.dtype)

    def _camera_tokens(self, session: WorldSession, plan) -> torch.Tensor | None:
        if self.camera_adapter is None:
            return None
        poses = [p.relative_to(plan.reference_pose) for p in plan.poses]
        rays = torch.from_numpy(plucker_rays(poses, session.config.height, session.config.width))
        return self.camera_adapter(rays.unsqueeze(0).to(self.device, self.dtype))

    def _image_condition(self, session: WorldSession) -> torch.Tensor | None:
        """Wan image-to-video channels: 4 mask channels + the image latent, on the first latent frame only."""
        if session.image_latent is None:
            return None
        b, z, f, h, w = self._latent_shape(session)
        cond = torch.zeros((b, 4 + z, f, h, w), device=self.device, dtype=torch.float32)
        if session.block_index == 0:
            cond[:, :4, 0] = 1.0
            cond[:, 4:, :1] = session.image_latent
        return cond
