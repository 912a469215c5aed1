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
    """What one transformer forward reads and writes, per batch element (one session each).

    The sessions of a batch attend to caches of the same length (the engine groups them so), which is
    what lets their contexts stack into one attention call.
    """

    kvs: list[RollingKVCache]
    commit: bool = False
    # Cross-attention K/V of each session's current text condition, per layer; emptied when its text changes.
    text_kvs: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)
    camera_tokens: torch.Tensor | None = None  # (B, tokens, dim), already batched
    # Per layer, the batch's context keys with RoPE applied, and its values: the context does not change
    # between the forwards of one block, so it is stacked and rotated once per block, not once per forward.
    block_context: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None

    @property
    def context_frames(self) -> int:
        return self.kvs[0].context_frames


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


def _stacked(pairs) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-session (k, v) of shape (1, S, H, D) -> batched (B, S, H, D); a batch of one is not copied."""
    pairs = list(pairs)
    if len(pairs) == 1:
        return pairs[0]
    return torch.cat([k for k, _ in pairs]), torch.cat([v for _, v in pairs])


def _heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    # -1 heads: with tensor parallel a rank holds only its share of them.
    return x.unflatten(2, (-1, head_dim))


class CausalSelfAttnProcessor:
    """Self-attention over [sink, window, current block]; appends the block's K/V on commit.

    The cache is read and written only in `_context` and `_commit`, which torch.compile leaves out of its
    graphs: the session state they touch changes every block, the tensor math around them does not.
    """

    def __init__(self, layer: int, head_dim: int, binding: CacheBinding) -> None:
        self.layer, self.head_dim, self.binding = layer, head_dim, binding

    @torch.compiler.disable
    def _context(self, dtype: torch.dtype, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's cached keys (rotated) and values, built once per block and kept for its other forwards."""
        state = self.binding.state
        context = state.block_context.get(self.layer) if state.block_context is not None else None
        if context is None:
            k_ctx, v_ctx = _stacked(kv.context(self.layer) for kv in state.kvs)
            length = k_ctx.shape[1]
            context = (apply_rotary(k_ctx.to(dtype), cos[:, :length], sin[:, :length]), v_ctx.to(dtype))
            if state.block_context is not None:
                state.block_context[self.layer] = context
        return context

    @torch.compiler.disable
    def _commit(self, k: torch.Tensor, v: torch.Tensor) -> None:
        state = self.binding.state
        if state.commit:
            for b, kv in enumerate(state.kvs):
                kv.write(self.layer, k[b : b + 1], v[b : b + 1])

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        q = _heads(attn.norm_q(attn.to_q(hidden_states)), self.head_dim)
        k = _heads(attn.norm_k(attn.to_k(hidden_states)), self.head_dim)
        v = _heads(attn.to_v(hidden_states), self.head_dim)
        cos, sin = rotary_emb  # covers context + current tokens (see OffsetRope)
        n = q.shape[1]
        context = self._context(k.dtype, cos, sin)
        q = apply_rotary(q, cos[:, -n:], sin[:, -n:])
        k_all = torch.cat([context[0], apply_rotary(k, cos[:, -n:], sin[:, -n:])], dim=1)
        v_all = torch.cat([context[1], v], dim=1)
        out = dispatch_attention_fn(q, k_all, v_all, attn_mask=None, dropout_p=0.0, is_causal=False)
        self._commit(k, v)
        out = out.flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


class CachedCrossAttnProcessor:
    """Text cross-attention whose K/V are computed once per text condition, not every forward."""

    def __init__(self, layer: int, head_dim: int, binding: CacheBinding) -> None:
        self.layer, self.head_dim, self.binding = layer, head_dim, binding

    @torch.compiler.disable
    def _text(self, attn, encoder_hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's text K/V, from each session's cache or computed into it (outside compiled graphs)."""
        pairs = []
        for b, text_kv in enumerate(self.binding.state.text_kvs):
            cached = text_kv.get(self.layer)
            if cached is None:
                text = encoder_hidden_states[b : b + 1]
                cached = text_kv[self.layer] = (_heads(attn.norm_k(attn.to_k(text)), self.head_dim), _heads(attn.to_v(text), self.head_dim))
            pairs.append(cached)
        return _stacked(pairs)

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        q = _heads(attn.norm_q(attn.to_q(hidden_states)), self.head_dim)
        k, v = self._text(attn, encoder_hidden_states)
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
