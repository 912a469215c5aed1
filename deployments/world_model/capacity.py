"""How many sessions a replica can hold: its memory budget over one session's state, or the configured cap."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deployments.generation.engine import WorldModelEngine
from deployments.generation.vae_stream import StreamingDecoder


@dataclass(frozen=True)
class SessionFootprint:
    kv_bytes: int
    vae_bytes: int
    scratch_bytes: int

    @property
    def total(self) -> int:
        return self.kv_bytes + self.vae_bytes + self.scratch_bytes


@torch.no_grad()
def measure_footprint(engine: WorldModelEngine, height: int, width: int) -> SessionFootprint:
    """KV cache by formula; the VAE decoder cache by decoding two latent frames once (its size is then fixed)."""
    kv = engine.kv_layout(height, width).nbytes(engine.dtype)
    lh, lw = engine.geometry.latent_size(height, width)
    decoder = StreamingDecoder(engine.vae)
    decoder.decode(torch.zeros((1, engine.vae.config.z_dim, 2, lh, lw), device=engine.device, dtype=engine.vae.dtype))
    vae = decoder.nbytes
    decoder.close()
    # One block's activations in flight: a few copies of its hidden states per layer input, plus the latents.
    config = engine.transformer.config
    inner = config.num_attention_heads * config.attention_head_dim
    tokens = engine.geometry.tokens_per_frame(height, width) * engine.geometry.num_frames_per_block
    # plus the context keys rotated once per block (half the KV cache) while the block runs.
    scratch = 8 * tokens * max(inner, config.ffn_dim) * torch.empty((), dtype=engine.dtype).element_size() + kv // 2
    return SessionFootprint(kv, vae, scratch)


def session_slots(footprint: SessionFootprint, cap: int | None, gpu_memory_fraction: float, device: torch.device) -> int:
    """Sessions that fit: on a GPU, the free share of its memory over the footprint; capped by config."""
    budget_slots = None
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        reserved_by_others = total - free  # weights and whatever else is already there
        budget = gpu_memory_fraction * total - reserved_by_others
        budget_slots = max(0, int(budget // max(1, footprint.total)))
    if budget_slots is None:
        return cap if cap is not None else 4
    return budget_slots if cap is None else min(cap, budget_slots)
