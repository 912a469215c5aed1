"""Attention processors that give the stock WanTransformer3DModel a per-session cache.

`forward(attention_kwargs=...)` does not reach the processors (the blocks call
`attn1(hidden, None, None, rotary_emb)`), so the session whose block is being
computed is bound through a `CacheBinding` the processors share; forwards on
one transformer are serialized by the engine.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn

from deployments.generation.kv_cache import RollingKVCache


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's interleaved-pair RoPE; x (B, S, H, D), cos/sin (1, S, 1, D)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


@dataclass
class ForwardState:
    """What one transformer forward reads and writes for the session it serves."""

    kv: RollingKVCache
    commit: bool = False
    # Cross-attention K/V of the current text condition, per layer; emptied when the text changes.
    text_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    camera_tokens: torch.Tensor | None = None


class CacheBinding:
    def __init__(self) -> None:
        self._state: ForwardState | None = None

    @property
    def state(self) -> ForwardState:
        if self._state is None:
            raise RuntimeError("transformer called outside a session forward")
        return self._state

    @property
    def bound(self) -> bool:
        return self._state is not None

    @contextmanager
    def bind(self, state: ForwardState) -> Iterator[ForwardState]:
        if self._state is not None:
            raise RuntimeError("transformer forwards must not overlap")
        self._state = state
        try:
            yield state
        finally:
            self._state = None


def _heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    # -1 heads: with tensor parallel a rank holds only its share of them.
    return x.unflatten(2, (-1, head_dim))


class CausalSelfAttnProcessor:
    """Self-attention over [sink, window, current block]; appends the block's K/V on commit."""

    def __init__(self, layer: int, head_dim: int, binding: CacheBinding) -> None:
        self.layer, self.head_dim, self.binding = layer, head_dim, binding

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        state = self.binding.state
        q = _heads(attn.norm_q(attn.to_q(hidden_states)), self.head_dim)
        k = _heads(attn.norm_k(attn.to_k(hidden_states)), self.head_dim)
        v = _heads(attn.to_v(hidden_states), self.head_dim)
        k_ctx, v_ctx = state.kv.context(self.layer)
        k_all = torch.cat([k_ctx.to(k.dtype), k], dim=1)
        v_all = torch.cat([v_ctx.to(v.dtype), v], dim=1)
        cos, sin = rotary_emb  # covers context + current tokens (see OffsetRope)
        n = q.shape[1]
        q = apply_rotary(q, cos[:, -n:], sin[:, -n:])
        k_all = apply_rotary(k_all, cos, sin)
        out = dispatch_attention_fn(q, k_all, v_all, attn_mask=None, dropout_p=0.0, is_causal=False)
        if state.commit:
            state.kv.write(self.layer, k, v)
        out = out.flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


class CachedCrossAttnProcessor:
    """Text cross-attention whose K/V are computed once per text condition, not every forward."""

    def __init__(self, layer: int, head_dim: int, binding: CacheBinding) -> None:
        self.layer, self.head_dim, self.binding = layer, head_dim, binding

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        state = self.binding.state
        q = _heads(attn.norm_q(attn.to_q(hidden_states)), self.head_dim)
        cached = state.text_kv.get(self.layer)
        if cached is None:
            k = _heads(attn.norm_k(attn.to_k(encoder_hidden_states)), self.head_dim)
            v = _heads(attn.to_v(encoder_hidden_states), self.head_dim)
            cached = state.text_kv[self.layer] = (k, v)
        k, v = cached
        out = dispatch_attention_fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)
        out = out.flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


def install_processors(transformer, binding: CacheBinding) -> None:
    """Put the cached processors on every block of a stock WanTransformer3DModel."""
    head_dim = transformer.config.attention_head_dim
    processors = {}
    for name in transformer.attn_processors:
        layer = int(name.split(".")[1])  # "blocks.{i}.attn1.processor"
        if ".attn1." in name:
            processors[name] = CausalSelfAttnProcessor(layer, head_dim, binding)
        elif ".attn2." in name:
            processors[name] = CachedCrossAttnProcessor(layer, head_dim, binding)
        else:
            raise ValueError(f"unexpected attention layer {name}")
    transformer.set_attn_processor(processors)
