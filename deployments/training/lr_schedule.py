"""The learning-rate schedule both training stages use: linear warm-up, then a cosine down to a floor."""

from __future__ import annotations

import math


def warmup_cosine(step: int, steps: int, warmup: int, lr: float, min_lr: float) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))
