"""How the built-in models' trained weights sit in the repository: fp16 safetensors, read back as float32."""

from __future__ import annotations

import os

import torch


def save_fp16(state: dict[str, torch.Tensor], path: str | os.PathLike) -> None:
    """Half the bytes of float32, and the models' outputs (8-bit frames, argmax tokens) do not feel it."""
    from safetensors.torch import save_file

    save_file({k: v.detach().to(torch.float16).contiguous() for k, v in state.items()}, path)


def load_float(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v.float() for k, v in load_file(path).items()}
