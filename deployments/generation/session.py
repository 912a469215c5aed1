"""One rollout's state: everything a session owns, freed by `close()`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from deployments.contract.events import Interaction
from deployments.contract.session_spec import SessionSpec
from deployments.generation.interactions import Director
from deployments.generation.kv_cache import RollingKVCache
from deployments.generation.tiny_decoder import TinyStreamingDecoder
from deployments.generation.vae_stream import StreamingDecoder


@dataclass(frozen=True)
class BlockMetadata:
    block_index: int
    num_frames: int
    started_event_ids: tuple[str, ...]
    active_event_ids: tuple[str, ...]
    completed_event_ids: tuple[str, ...]

    def to_dict(self) -> dict:
        return {
            "block_index": self.block_index,
            "num_frames": self.num_frames,
            "started_event_ids": list(self.started_event_ids),
            "active_event_ids": list(self.active_event_ids),
            "completed_event_ids": list(self.completed_event_ids),
        }


@dataclass
class GeneratedBlock:
    """One block of a session.

    `frames` is uint8 (T, H, W, 3). Under tensor parallel only rank 0 decodes:
    the other ranks run the same denoising in lockstep (they hold the other
    heads) but skip the VAE, so their blocks have `frames=None`; their
    metadata is the same as rank 0's. `latents` are the block's clean latents
    x0 (normalized, float32, on the CPU, shape (1, z, frames_per_block, h, w)),
    on every rank.
    """

    frames: np.ndarray | None
    metadata: BlockMetadata
    latents: torch.Tensor | None = None


@dataclass
class WorldSession:
    session_id: str
    config: SessionSpec
    seed: int
    sigmas: list[float]
    director: Director
    kv: RollingKVCache
    decoder: StreamingDecoder | TinyStreamingDecoder
    generator: torch.Generator
    image_latent: torch.Tensor | None = None  # normalized (1, z, 1, h, w), image-to-video only
    last_latent: torch.Tensor | None = None  # normalized (1, z, 1, h, w): the last frame made, for last-frame models
    block_index: int = 0
    closed: bool = False
    # Cross-attention K/V for the text condition in use, and which prompt mix it was made for.
    text_kv: dict = field(default_factory=dict)
    text_key: tuple | None = None

    cancelled: bool = False  # set from another thread: the engine stops at its next step
    # Raw latents of blocks made with decode deferred, oldest first, waiting for `engine.decode_many`.
    pending_decode: list = field(default_factory=list)

    def cancel(self) -> None:
        """Ask a block in progress to stop at its next denoising step; the session is then only good for close()."""
        self.cancelled = True

    def submit(self, interaction: Interaction) -> None:
        """Queue an interaction for the next block boundary; raises InteractionRefused with the reason."""
        if self.closed:
            raise RuntimeError(f"session {self.session_id} is closed")
        self.director.submit(interaction)

    def memory_bytes(self) -> int:
        """Bytes of tensors this session holds (KV cache, text K/V, decoder cache, image and last-frame latents)."""
        if self.closed:
            return 0
        text = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.text_kv.values())
        latents = sum(t.numel() * t.element_size() for t in (self.image_latent, self.last_latent) if t is not None)
        return self.kv.nbytes + text + self.decoder.nbytes + latents

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.kv.k = self.kv.v = None
        self.text_kv.clear()
        self.decoder.close()
        self.image_latent = self.last_latent = None
        self.pending_decode.clear()
