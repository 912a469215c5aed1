"""What the behaviour tests and the world benchmark measure on frames: motion, zoom, colour, fidelity, coherence.

All take uint8 frames (H, W, 3) or stacks (T, H, W, 3), as the engine and the
renderer make them. Image rows grow downwards: a positive `dy` is content
moving down the frame, a positive `dx` content moving right.
"""

from __future__ import annotations

import numpy as np


def gray(frame: np.ndarray) -> np.ndarray:
    return frame[..., :3].astype(np.float64) @ np.array([0.299, 0.587, 0.114])


def _window(h: int, w: int) -> np.ndarray:
    return np.outer(np.hanning(h), np.hanning(w))


def displacement(prev: np.ndarray, nxt: np.ndarray, rows: slice = slice(None)) -> tuple[float, float]:
    """(dx, dy) in pixels by which the content of `prev` moved to reach `nxt` (the windowed cross-correlation's
    peak, refined to sub-pixel).

    Not phase correlation: whitening the spectrum lifts a soft picture's empty high frequencies to the
    level of its content, the peak collapses to the nearest whole pixel, and frame-to-frame motion under
    a pixel reads as none (a half-resolution render of a pan at 0.75 px a frame read an eighth of its motion)."""
    a, b = gray(prev)[rows], gray(nxt)[rows]
    win = _window(*a.shape)
    fa, fb = np.fft.fft2((a - a.mean()) * win), np.fft.fft2((b - b.mean()) * win)
    corr = np.real(np.fft.ifft2(fb * np.conj(fa)))
    h, w = corr.shape
    iy, ix = np.unravel_index(int(np.argmax(corr)), corr.shape)

    def refine(c_minus: float, c0: float, c_plus: float) -> float:
        denom = c_minus - 2 * c0 + c_plus
        return 0.0 if abs(denom) < 1e-12 else 0.5 * (c_minus - c_plus) / denom

    dy = iy + refine(corr[(iy - 1) % h, ix], corr[iy, ix], corr[(iy + 1) % h, ix])
    dx = ix + refine(corr[iy, (ix - 1) % w], corr[iy, ix], corr[iy, (ix + 1) % w])
    dy = dy - h if dy > h / 2 else dy
    dx = dx - w if dx > w / 2 else dx
    return float(dx), float(dy)


def block_motion(frames: np.ndarray, rows: slice = slice(None)) -> tuple[float, float]:
    """Summed frame-to-frame displacement over a stack of frames."""
    total = np.zeros(2)
    for a, b in zip(frames[:-1], frames[1:]):
        total += displacement(a, b, rows)
    return float(total[0]), float(total[1])


def zoom(prev: np.ndarray, nxt: np.ndarray, centre: tuple[float, float] | None = None, scales: np.ndarray | None = None) -> float:
    """The scale about `centre` (default: the image centre, where the horizon's vanishing point is) that best
    maps the lower half of `prev` onto that of `nxt`: > 1 when the ground texture expands (moving forward)."""
    import torch
    import torch.nn.functional as F

    h, w = prev.shape[:2]
    cy, cx = centre if centre is not None else (h / 2, w / 2)
    scales = np.linspace(0.85, 1.15, 61) if scales is None else scales
    src = torch.from_numpy(gray(prev)).float()[None, None]
    target = torch.from_numpy(gray(nxt)).float()
    ys, xs = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
    lower = slice(int(h * 0.62), int(h * 0.95))
    errors = []
    for s in scales:
        # Where in `prev` each pixel of `nxt` came from if the picture grew by s about the centre.
        sx, sy = cx + (xs - cx) / s, cy + (ys - cy) / s
        grid = torch.stack([sx / w * 2 - 1, sy / h * 2 - 1], dim=-1)[None]
        warped = F.grid_sample(src, grid, mode="bilinear", padding_mode="border", align_corners=False)[0, 0]
        errors.append(float((warped[lower, 4:-4] - target[lower, 4:-4]).pow(2).mean()))
    return float(scales[int(np.argmin(errors))])


def block_zoom(frames: np.ndarray) -> float:
    """Product of frame-to-frame zooms over a stack."""
    total = 1.0
    for a, b in zip(frames[:-1], frames[1:]):
        total *= zoom(a, b)
    return total


def mean_colour(frames: np.ndarray) -> np.ndarray:
    """Mean RGB (0..255) over a frame or a stack."""
    return frames.reshape(-1, 3).astype(np.float64).mean(axis=0)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 10 * np.log10(255.0**2 / max(mse, 1e-10))


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Mean SSIM of two frames' luma (Gaussian window, sigma 1.5)."""
    x, y = gray(a), gray(b)
    radius = 5
    k = np.exp(-0.5 * (np.arange(-radius, radius + 1) / 1.5) ** 2)
    k /= k.sum()

    def blur(img: np.ndarray) -> np.ndarray:
        img = np.apply_along_axis(lambda r: np.convolve(r, k, mode="valid"), 1, img)
        return np.apply_along_axis(lambda c: np.convolve(c, k, mode="valid"), 0, img)

    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mx, my = blur(x), blur(y)
    vx, vy, cxy = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
    return float(np.mean(((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))))


def neighbour_correlation(frame: np.ndarray) -> float:
    """Correlation of each pixel's luma with its right and lower neighbours: near 1 for pictures, near 0 for noise."""
    g = gray(frame)
    pairs = [(g[:, :-1].ravel(), g[:, 1:].ravel()), (g[:-1].ravel(), g[1:].ravel())]
    values = []
    for a, b in pairs:
        if a.std() < 1e-6 or b.std() < 1e-6:
            values.append(0.0)
        else:
            values.append(float(np.corrcoef(a, b)[0, 1]))
    return float(np.mean(values))


def contrast(frame: np.ndarray) -> float:
    """Standard deviation of luma (0..255): near 0 for a frame collapsed to one colour."""
    return float(gray(frame).std())


def sharpness(frame: np.ndarray) -> float:
    """Mean absolute Laplacian of luma: the edges and texture in a frame (a blur of the same picture scores less)."""
    g = gray(frame)
    lap = 4 * g[1:-1, 1:-1] - g[:-2, 1:-1] - g[2:, 1:-1] - g[1:-1, :-2] - g[1:-1, 2:]
    return float(np.abs(lap).mean())


def colour_histogram(frames: np.ndarray, bins: int = 8) -> np.ndarray:
    """Joint RGB histogram (bins^3), normalized to sum 1."""
    q = (frames.reshape(-1, 3).astype(np.int64) * bins) // 256
    idx = (q[:, 0] * bins + q[:, 1]) * bins + q[:, 2]
    hist = np.bincount(idx, minlength=bins**3).astype(np.float64)
    return hist / hist.sum()


def histogram_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Total variation distance between two colour histograms: 0 same, 1 disjoint."""
    return float(0.5 * np.abs(a - b).sum())
