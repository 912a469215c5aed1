"""RoPE for a block that attends to cached frames before it.

The stock `transformer.rope` always numbers frames from 0. Wrapped, it numbers
the current block's frames after the cached context, and returns the table for
context + block so the self-attention processor can rotate cached keys too.
"""

from __future__ import annotations

import torch
from torch import nn

from deployments.generation.attention import CacheBinding


class OffsetRope(nn.Module):
    def __init__(self, rope: nn.Module, binding: CacheBinding, max_tables: int = 64) -> None:
        super().__init__()
        self.inner = rope
        self.binding = binding
        self.max_tables = max_tables
        self._tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, c, frames, h, w = hidden_states.shape
        context = self.binding.state.context_frames if self.binding.bound else 0
        key = (context + frames, h, w, hidden_states.device)
        table = self._tables.get(key)
        if table is None:
            cos, sin = self.inner(_ShapeOnly((b, c, context + frames, h, w)))
            table = (cos.to(hidden_states.device), sin.to(hidden_states.device))
            if len(self._tables) >= self.max_tables:
                self._tables.pop(next(iter(self._tables)))
            self._tables[key] = table
        return table


class _ShapeOnly:
    """Stands in for a tensor where the stock rope reads nothing but `.shape`."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = torch.Size(shape)
