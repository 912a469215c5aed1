"""A session's self-attention KV cache: sink frames plus a rolling window, allocated up front.

Keys are stored before RoPE. Positions are given at attention time by each
frame's place in the attended sequence (sink, window oldest to newest, current
block), so positions stay below sink + window + block however long a session
runs, and a block costs the same at block 5 and at block 5000.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    sink_frames: int
    window_frames: int
    tokens_per_frame: int
    heads: int
    head_dim: int

    @property
    def capacity_frames(self) -> int:
        return self.sink_frames + self.window_frames

    def nbytes(self, dtype: torch.dtype) -> int:
        elems = 2 * self.num_layers * self.capacity_frames * self.tokens_per_frame * self.heads * self.head_dim
        return elems * torch.empty((), dtype=dtype).element_size()


class RollingKVCache:
    def __init__(self, layout: KVLayout, dtype: torch.dtype, device: torch.device | str) -> None:
        self.layout = layout
        shape = (layout.num_layers, layout.capacity_frames * layout.tokens_per_frame, layout.heads, layout.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.frames_committed = 0

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    @property
    def context_frames(self) -> int:
        return min(self.frames_committed, self.layout.capacity_frames)

    def _slot(self, frame: int) -> int | None:
        """Storage slot of a frame; None when it is kept nowhere (no window)."""
        sink, window = self.layout.sink_frames, self.layout.window_frames
        if frame < sink:
            return frame
        return sink + (frame - sink) % window if window else None

    def _ordered_slot_runs(self) -> list[tuple[int, int]]:
        """Slot ranges [start, stop) holding the attended frames, oldest first."""
        sink, window = self.layout.sink_frames, self.layout.window_frames
        n = self.frames_committed
        runs = [(0, min(n, sink))]
        if n > sink and window:
            first = max(sink, n - window)  # oldest frame still in the window
            count = n - first
            start = self._slot(first)
            head = min(count, sink + window - start)
            runs.append((start, start + head))
            if count > head:
                runs.append((sink, sink + count - head))
        return [r for r in runs if r[1] > r[0]]

    def context(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) of the attended frames in temporal order, shaped (1, tokens, heads, head_dim)."""
        tpf = self.layout.tokens_per_frame
        runs = self._ordered_slot_runs()
        if len(runs) == 1:
            a, b = runs[0]
            return self.k[layer, a * tpf : b * tpf].unsqueeze(0), self.v[layer, a * tpf : b * tpf].unsqueeze(0)
        if not runs:
            return self.k[layer, :0].unsqueeze(0), self.v[layer, :0].unsqueeze(0)
        ks = [self.k[layer, a * tpf : b * tpf] for a, b in runs]
        vs = [self.v[layer, a * tpf : b * tpf] for a, b in runs]
        return torch.cat(ks).unsqueeze(0), torch.cat(vs).unsqueeze(0)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the pending block's k/v (1, frames*tpf, heads, head_dim) after the committed frames."""
        tpf = self.layout.tokens_per_frame
        frames = k.shape[1] // tpf
        for i in range(frames):
            slot = self._slot(self.frames_committed + i)
            if slot is None:
                continue
            self.k[layer, slot * tpf : (slot + 1) * tpf] = k[0, i * tpf : (i + 1) * tpf]
            self.v[layer, slot * tpf : (slot + 1) * tpf] = v[0, i * tpf : (i + 1) * tpf]

    def advance(self, frames: int) -> None:
        self.frames_committed += frames
