"""The few-step flow-matching schedule a causal (distilled) world model denoises a block with."""

from __future__ import annotations


def shift_sigma(sigma: float, shift: float) -> float:
    return shift * sigma / (1.0 + (shift - 1.0) * sigma)


def denoising_sigmas(steps: int, shift: float, timesteps: list[float] | None = None) -> list[float]:
    """Sigmas for timesteps 1000, 1000(1-1/n), ... (1000/750/500/250 for n = 4), shifted by `shift`."""
    if timesteps is None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"num_inference_steps must be a positive integer, got {steps!r}")
        timesteps = [1000.0 * (1.0 - i / steps) for i in range(steps)]
    if shift <= 0:
        raise ValueError(f"flow_shift must be positive, got {shift!r}")
    return [shift_sigma(t / 1000.0, shift) for t in timesteps]
