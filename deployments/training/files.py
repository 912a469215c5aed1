"""Training outputs written whole or not at all, so a stopped run resumes from a file it can read."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def torch_save_atomic(obj, path: str | os.PathLike) -> None:
    path = Path(path)
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    torch.save(obj, tmp)
    os.replace(tmp, path)
