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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from deployments.contract.session_spec import SessionSpec
from deployments.generation.attention import (
    CacheBinding,
    ForwardState,
    install_processors,
)
from deployments.generation.camera import plucker_rays
from deployments.generation.checkpoint import WorldModelComponents, load_world_model, resolve_video_decoder
from deployments.generation.conditioning import image_condition, last_frame_condition
from deployments.generation.interactions import BlockPlan, Director
from deployments.generation.kv_cache import KVLayout, RollingKVCache
from deployments.generation.reprojection import reproject, reprojection_grid
from deployments.generation.rope import OffsetRope
from deployments.generation.schedule import denoising_sigmas
from deployments.generation.session import BlockMetadata, GeneratedBlock, WorldSession
from deployments.generation.tensor_parallel import TensorParallel
from deployments.generation.text import PromptEncoder
from deployments.generation.tiny_decoder import TinyStreamingDecoder
from deployments.generation.vae_stream import (
    LatentNormalizer,
    StreamingDecoder,
    decode_batch,
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


CAMERA_CACHE_SIZE = 16  # camera token tensors kept (each one block's worth of tokens)


class SessionCancelled(RuntimeError):
    """A block was abandoned half-way because its session was cancelled."""


class WorldModelEngine:
    def __init__(self, components: WorldModelComponents) -> None:
        self.components = components
        self.geometry = components.geometry
        self.transformer = components.transformer
        self.vae = components.vae
        self.tiny_decoder = components.tiny_decoder  # None: frames come from the VAE
        self.camera_adapter = components.camera_adapter
        self.image_conditioned = components.image_conditioned
        self.last_frame_condition = components.last_frame_condition
        self.reprojection_ground_depth = components.reprojection_ground_depth
        self.tensor_parallel = components.tensor_parallel
        self.rank = self.tensor_parallel.rank if self.tensor_parallel else 0
        self.world_size = self.tensor_parallel.world_size if self.tensor_parallel else 1
        self.device = next(self.transformer.parameters()).device
        # Not the first parameter's dtype: diffusers keeps some Wan tables (scale_shift_table) in float32.
        self.dtype = self.transformer.dtype
        self.normalizer = LatentNormalizer(self.vae)
        self.prompts = PromptEncoder(components.tokenizer, components.text_encoder)
        self.binding = CacheBinding()
        install_processors(self.transformer, self.binding)
        self.transformer.rope = OffsetRope(self.transformer.rope, self.binding)
        self.transformer.patch_embedding.register_forward_hook(self._add_camera_tokens)
        self._lock = threading.Lock()
        self._camera_cache: dict[tuple, torch.Tensor] = {}
        self._decode_stream = None  # created on first deferred decode on a GPU
        self.compiled = False

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        vae_dtype: torch.dtype = torch.float32,
        tensor_parallel: TensorParallel | None = None,
        video_decoder: str = "vae",
        compile_blocks: bool = False,
    ) -> "WorldModelEngine":
        """Load a checkpoint; with `tensor_parallel` every rank calls this and the transformer is sharded after loading.
        `video_decoder`: "vae" (the Wan VAE, exact), "tiny" (the folder's `tiny_decoder/`), or "auto" (the tiny
        one when it was trained for this model). `compile_blocks`: regional torch.compile of the transformer's
        repeated blocks; each new shape (context length, batch) compiles on its first forward, which
        `warm_up_blocks` blocks of one session cover."""
        tiny = resolve_video_decoder(Path(path), video_decoder) == "tiny"
        engine = cls(load_world_model(path, device=device, dtype=dtype, vae_dtype=vae_dtype, tensor_parallel=tensor_parallel,
                                      tiny_decoder=tiny))
        if compile_blocks:
            engine.transformer.compile_repeated_blocks()
            engine.compiled = True
        return engine

    @property
    def compiled_graphs(self) -> int:
        """Graphs torch.compile has made in this process (0 when eager): one more after the warm-up is a recompile."""
        if not self.compiled:
            return 0
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])

    @property
    def warm_up_blocks(self) -> int:
        """Blocks a session runs before its attention context stops growing: after them every forward
        has a shape seen before (what a compiled engine's warm-up must cover)."""
        return self.geometry.first_full_context_block + 1

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

    def open_session(self, config: SessionSpec, session_id: str | None = None) -> WorldSession:
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
            decoder=StreamingDecoder(self.vae) if self.tiny_decoder is None else TinyStreamingDecoder(self.tiny_decoder),
            generator=torch.Generator(device=self.device).manual_seed(seed),
            image_latent=image_latent,
        )

    # -- one block -------------------------------------------------------------
    def generate_block(self, session: WorldSession) -> GeneratedBlock:
        """The session's next block; raises SessionCancelled when it was cancelled half-way."""
        (outcome,) = self.generate_blocks([session])
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def batch_key(self, session: WorldSession) -> tuple:
        """Sessions with equal keys can share forwards: same latent shape, schedule and cache length."""
        return (
            self._latent_shape(session),
            tuple(float(s) for s in session.sigmas),
            session.kv.context_frames,
            session.image_latent is not None,
        )

    @torch.no_grad()
    def generate_blocks(self, sessions: list[WorldSession], decode: bool = True) -> list[GeneratedBlock | SessionCancelled]:
        """The next block of each session, denoised together: one forward per step for the whole batch.

        The sessions must share a `batch_key`. Each keeps its own noise generator, prompt, camera, image
        and caches, so a session's blocks are the same alone or in a batch (up to float rounding). A
        session cancelled half-way drops out at the next step; its place in the result holds
        SessionCancelled. With `decode=False` the blocks carry no frames: each session's latents wait
        for `decode_next` / `decode_many`, which the caller runs outside the engine lock, beside the next block.
        """
        for session in sessions:
            if session.closed:
                raise RuntimeError(f"session {session.session_id} is closed")
        if len({self.batch_key(s) for s in sessions}) > 1:
            raise ValueError("sessions of one batch must share a batch_key")
        outcomes: dict[int, GeneratedBlock | SessionCancelled] = {}
        with self._lock:
            plans = [s.director.plan_block() for s in sessions]
            shape = self._latent_shape(sessions[0])
            sigmas = sessions[0].sigmas
            batch = _Batch(
                sessions=list(sessions),
                index=list(range(len(sessions))),
                text=torch.cat([self.text_condition(s, p.prompt_mix) for s, p in zip(sessions, plans)]),
                camera=_cat([self._camera_tokens(s, p) for s, p in zip(sessions, plans)]),
                cond=_cat([self._condition(s, p) for s, p in zip(sessions, plans)]),
                context={},
            )
            x = batch.noise(shape, self.device)
            for i, sigma in enumerate(sigmas):
                x = self._drop_cancelled(batch, x, outcomes)
                if x is None:
                    break
                v = self.forward(batch.sessions, x, sigma, batch.text, batch.camera, batch.cond, block_context=batch.context)
                x0 = x - sigma * v
                if i + 1 < len(sigmas):
                    x = (1.0 - sigmas[i + 1]) * x0 + sigmas[i + 1] * batch.noise(shape, self.device)
            # One clean pass at t = 0 writes the blocks' K/V for the blocks after them.
            x0 = self._drop_cancelled(batch, x0, outcomes) if x is not None else None
            if x0 is not None:
                self.forward(batch.sessions, x0, 0.0, batch.text, batch.camera, batch.cond, commit=True, block_context=batch.context)
                for b, session in enumerate(batch.sessions):
                    session.kv.advance(shape[2])
                    if self.last_frame_condition:
                        session.last_latent = x0[b : b + 1, :, -1:].clone()
                    if self.decodes:
                        raw = self.normalizer.to_raw(x0[b : b + 1]).to(self.vae.dtype)
                        session.pending_decode.append((raw, None if decode else self._ready_event()))
                frames = self.decode_grouped(batch.sessions) if decode and self.decodes else {}
                for b, session in enumerate(batch.sessions):
                    block = self._finish(session, plans[batch.index[b]], frames.get(b), x0[b : b + 1])
                    outcomes[batch.index[b]] = block
        return [outcomes[i] for i in range(len(sessions))]

    def decode_next(self, session: WorldSession) -> np.ndarray:
        """Frames of the session's oldest block made with decode deferred."""
        return self.decode_many([session])[0]

    def decode_key(self, session: WorldSession) -> tuple:
        """Sessions with equal keys can decode in one VAE batch."""
        if not session.pending_decode:
            raise RuntimeError(f"session {session.session_id} has no block waiting to be decoded")
        raw = session.pending_decode[0][0]
        return (tuple(raw.shape), session.decoder.batch_key())

    @torch.no_grad()
    def decode_many(self, sessions: list[WorldSession]) -> list[np.ndarray]:
        """Frames of each session's oldest deferred block, decoded as one VAE batch (sessions share a `decode_key`).

        Runs without the engine lock: each session's streaming state is its own (passed to every call),
        so decodes run while the transformer makes the next blocks. One decode per session at a time,
        in block order.
        """
        if len({self.decode_key(s) for s in sessions}) > 1:
            raise ValueError("sessions of one decode batch must share a decode_key")
        pending = [s.pending_decode.pop(0) for s in sessions]
        raws = [raw for raw, _ in pending]
        decoders = [s.decoder for s in sessions]
        if pending[0][1] is None:
            return [to_uint8_frames(p) for p in decode_batch(decoders, raws)]
        # On a GPU the decode gets its own stream, so its kernels can run beside the transformer's.
        if self._decode_stream is None:
            self._decode_stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self._decode_stream):
            for raw, ready in pending:
                self._decode_stream.wait_event(ready)
                raw.record_stream(self._decode_stream)
            return [to_uint8_frames(p) for p in decode_batch(decoders, raws)]

    def _ready_event(self):
        """A CUDA event after the work queued so far (None off the GPU): deferred decodes wait on it."""
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def decode_grouped(self, sessions: list[WorldSession]) -> dict[int, np.ndarray]:
        """Each session's oldest deferred block, sessions at the same point decoded as one batch; by position."""
        groups: dict[tuple, list[int]] = {}
        for i, session in enumerate(sessions):
            groups.setdefault(self.decode_key(session), []).append(i)
        frames: dict[int, np.ndarray] = {}
        for rows in groups.values():
            frames.update(zip(rows, self.decode_many([sessions[i] for i in rows])))
        return frames

    def _finish(self, session: WorldSession, plan, frames: np.ndarray | None, latents: torch.Tensor) -> GeneratedBlock:
        meta = BlockMetadata(
            block_index=session.block_index,
            num_frames=frames.shape[0] if frames is not None else self.geometry.frames_in_block(session.block_index),
            started_event_ids=plan.started,
            active_event_ids=plan.active,
            completed_event_ids=plan.completed,
        )
        session.block_index += 1
        return GeneratedBlock(frames=frames, metadata=meta, latents=latents.to("cpu", torch.float32, copy=True))

    def _drop_cancelled(self, batch: "_Batch", x: torch.Tensor, outcomes: dict) -> torch.Tensor | None:
        """Between steps, so a dropped session frees the engine for the others within one forward."""
        keep = []
        for b, session in enumerate(batch.sessions):
            if self._cancelled(session):
                outcomes[batch.index[b]] = SessionCancelled(f"session {session.session_id} was cancelled")
            else:
                keep.append(b)
        if len(keep) == len(batch.sessions):
            return x
        batch.keep(keep)
        return x[keep] if keep else None

    def _cancelled(self, session: WorldSession) -> bool:
        cancelled = session.cancelled
        if self.world_size > 1:
            # All ranks must stop at the same step or the next forward's collectives hang:
            # a cancel seen by any rank cancels the block on every rank.
            flag = torch.tensor([int(cancelled)], dtype=torch.int32, device=self.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self.tensor_parallel.group)
            cancelled = bool(flag.item())
            if cancelled:
                session.cancelled = True
        return cancelled

    def _latent_shape(self, session: WorldSession) -> tuple[int, ...]:
        lh, lw = self.geometry.latent_size(session.config.height, session.config.width)
        return (1, self.vae.config.z_dim, self.geometry.num_frames_per_block, lh, lw)

    def forward(self, sessions, latents, sigma, text, camera=None, cond=None, commit: bool = False, block_context: dict | None = None) -> torch.Tensor:
        """The velocity the transformer predicts for a batch of blocks at `sigma`, each attending to its session's cache.

        `sessions` is one session or a list, in the batch's order. With `commit` the blocks' K/V are written
        after the cached frames (the caller then advances the caches). `block_context`, a dict shared by the
        forwards of one block, keeps the rotated context between them. Callers hold the engine lock.
        """
        sessions = [sessions] if isinstance(sessions, WorldSession) else sessions
        x = latents if cond is None else torch.cat([latents, cond], dim=1)
        t = torch.full((x.shape[0],), sigma * 1000.0, device=self.device, dtype=torch.float32)
        state = ForwardState(
            kvs=[s.kv for s in sessions],
            commit=commit,
            text_kvs=[s.text_kv for s in sessions],
            camera_tokens=camera,
            block_context=block_context,
        )
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
        poses = tuple(p.relative_to(plan.reference_pose) for p in plan.poses)
        # A camera at rest (or moving steadily) repeats its relative poses block after block, in every
        # session: the rays, built on the CPU at full resolution, and the adapter's tokens are kept.
        key = (poses, session.config.height, session.config.width)
        tokens = self._camera_cache.get(key)
        if tokens is None:
            rays = torch.from_numpy(plucker_rays(list(poses), session.config.height, session.config.width))
            tokens = self.camera_adapter(rays.unsqueeze(0).to(self.device, self.dtype))
            self._camera_cache[key] = tokens
            if len(self._camera_cache) > CAMERA_CACHE_SIZE:
                self._camera_cache.pop(next(iter(self._camera_cache)))
        return tokens

    def _condition(self, session: WorldSession, plan: BlockPlan) -> torch.Tensor | None:
        """The condition channels of the session's next block (conditioning.py), None when the model has none."""
        b, z, f, h, w = self._latent_shape(session)
        first = session.block_index == 0
        if self.last_frame_condition:
            given = session.image_latent if first else session.last_latent
            if given is not None:
                frame = given[:, :, -1]
                if self.reprojection_ground_depth is not None:
                    # The start image is the first frame's view; a later block's given frame, the pose before it.
                    grids = reprojection_grid(plan.poses[0] if first else plan.reference_pose, plan.poses, h, w, self.reprojection_ground_depth)
                    frame = reproject(frame.float(), torch.from_numpy(grids).to(frame.device)).to(frame.dtype)
                return last_frame_condition(frame, f, first_distance=0 if first else 1)
        elif session.image_latent is None:
            return None
        elif first:
            return image_condition(session.image_latent[:, :, 0], f)
        return torch.zeros((b, 4 + z, f, h, w), device=self.device, dtype=torch.float32)


def _cat(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
    """Per-session tensors along the batch; None when the model takes none."""
    if tensors[0] is None:
        return None
    return torch.cat(tensors)


@dataclass
class _Batch:
    """The sessions of one batched block, and their per-session inputs in the same order."""

    sessions: list[WorldSession]
    index: list[int]  # each session's place in the caller's list
    text: torch.Tensor
    camera: torch.Tensor | None
    cond: torch.Tensor | None
    context: dict  # the forwards' shared block context (attention.ForwardState.block_context)

    def noise(self, shape: tuple[int, ...], device) -> torch.Tensor:
        # Drawn per session from its own generator, in the order a session alone would draw it.
        return torch.cat([torch.randn(shape, generator=s.generator, device=device, dtype=torch.float32) for s in self.sessions])

    def keep(self, rows: list[int]) -> None:
        self.sessions = [self.sessions[r] for r in rows]
        self.index = [self.index[r] for r in rows]
        self.text = self.text[rows]
        self.camera = None if self.camera is None else self.camera[rows]
        self.cond = None if self.cond is None else self.cond[rows]
        self.context = {layer: (k[rows], v[rows]) for layer, (k, v) in self.context.items()}
