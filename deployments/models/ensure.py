"""Build the tiny built-in models on first start, once, even when several replicas start together."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

TINY_NAMES = ("world-model", "world-model-i2v", "omni")


def ensure_tiny_models(model_path: str | os.PathLike, seed: int = 0) -> Path:
    """Make sure `model_path` exists, building the tiny set into its parent when it is one of theirs."""
    path = Path(model_path)
    if path.is_dir():
        return path
    if path.name not in TINY_NAMES:
        raise FileNotFoundError(f"model folder {path} does not exist (only the tiny built-in models are built on demand)")
    root = path.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the second process waits, then finds the folder built
        if not path.is_dir():
            from deployments.models.tiny_world_model import make_models

            make_models(root, seed=seed)
    return path
