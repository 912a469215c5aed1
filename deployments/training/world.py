"""A procedural world to train and test the built-in world model on.

A pinhole camera (the engine's own: Unity axes, 60 degree field of view, the
pixel rays `camera.plucker_rays` uses) over an endless textured ground plane
under a sky with a cloud layer, with landmarks (posts, rocks, trees) scattered
on a grid of cells so that motion parallax shows. Everything is a function of
world coordinates, so any pose renders, and the same pose renders the same
picture every time.

A **biome** sets the palette and patterns; a prompt picks biomes by keywords
(`biome_weights`), and an unknown prompt gets a deterministic mix from its
hash. A mix of biomes blends their colours, which is what a prompt transition
renders.

Detail finer than a few pixels would be noise the models cannot learn (it
aliases as the camera moves, and a small VAE cannot keep it): each texture
octave fades to its mean as its wavelength shrinks towards three output
pixels (`DETAIL_FADE`), distant ground fades into the horizon haze, and
frames are rendered at twice the size and averaged down. The world is made
of shapes a 64x64 picture can carry, so that what the camera does shows.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

import numpy as np

from deployments.generation.camera import FOV_DEGREES, Pose, pixel_directions, quat_to_matrix

EYE_HEIGHT = 1.0  # the start pose stands this far above the ground
MIN_CLEARANCE = 0.15  # a camera driven below the ground is held this far above it
CLOUD_HEIGHT = 9.0
CELL = 3.0  # landmark grid spacing, world units
LANDMARK_RADIUS = 22.0  # cells farther than this from the camera are not drawn
SUN = np.array([0.45, 0.75, -0.35]) / np.linalg.norm([0.45, 0.75, -0.35])
# Octaves fade from full (wavelength >= 16 render footprints, 8 output pixels at the default 2x
# supersampling) to their mean (<= 5.3 footprints): the first session's model, trained on a world
# textured down to single pixels, learned its latents' scramble instead of the camera's motion.
DETAIL_FADE = 8.0


@dataclass(frozen=True)
class Biome:
    name: str
    keywords: tuple[str, ...]
    ground: tuple[tuple[float, float, float], tuple[float, float, float]]  # two colours the pattern runs between
    pattern: str  # how the two colours are laid out on the ground
    scale: float  # pattern wavelength, world units
    sky: tuple[tuple[float, float, float], tuple[float, float, float]]  # zenith, horizon
    cloud: tuple[float, float, float]
    cloud_cover: float  # 0..1
    landmark_density: float  # probability that a cell holds a landmark
    landmarks: tuple[tuple[str, tuple[float, float, float]], ...]  # (kind, colour) choices


BIOMES: tuple[Biome, ...] = (
    Biome("meadow", ("meadow", "grass", "grassy", "green", "lawn", "prairie", "pasture", "flower", "spring"),
          ((0.20, 0.55, 0.15), (0.55, 0.75, 0.25)), "patches", 2.5,
          ((0.25, 0.50, 0.90), (0.70, 0.85, 1.00)), (1.0, 1.0, 1.0), 0.45, 0.25,
          (("tree", (0.10, 0.40, 0.10)), ("rock", (0.50, 0.50, 0.45)), ("post", (0.55, 0.35, 0.20)))),
    Biome("desert", ("desert", "sand", "sandy", "dune", "dunes", "sahara", "arid", "dry"),
          ((0.85, 0.68, 0.40), (0.70, 0.48, 0.25)), "dunes", 3.0,
          ((0.35, 0.55, 0.90), (0.95, 0.85, 0.65)), (1.0, 0.95, 0.85), 0.10, 0.12,
          (("rock", (0.60, 0.35, 0.20)), ("post", (0.25, 0.50, 0.20)))),
    Biome("snow", ("snow", "snowy", "winter", "ice", "icy", "frozen", "glacier", "arctic"),
          ((0.92, 0.94, 0.98), (0.70, 0.78, 0.90)), "drifts", 2.0,
          ((0.55, 0.65, 0.80), (0.88, 0.90, 0.95)), (0.85, 0.87, 0.90), 0.70, 0.18,
          (("tree", (0.10, 0.25, 0.20)), ("rock", (0.35, 0.38, 0.42)))),
    Biome("shore", ("ocean", "sea", "shore", "beach", "coast", "lighthouse", "cliff", "waves", "island"),
          ((0.05, 0.35, 0.60), (0.90, 0.82, 0.60)), "shore", 4.0,
          ((0.20, 0.50, 0.95), (0.75, 0.90, 1.00)), (1.0, 1.0, 1.0), 0.30, 0.08,
          (("post", (0.90, 0.90, 0.90)), ("rock", (0.40, 0.40, 0.40)))),
    Biome("forest", ("forest", "woods", "wood", "jungle", "trees", "pine", "woodland", "moss"),
          ((0.10, 0.25, 0.08), (0.30, 0.22, 0.10)), "patches", 1.5,
          ((0.30, 0.45, 0.60), (0.60, 0.70, 0.65)), (0.80, 0.85, 0.80), 0.55, 0.60,
          (("tree", (0.05, 0.30, 0.08)), ("tree", (0.15, 0.40, 0.10)), ("rock", (0.30, 0.30, 0.28)))),
    Biome("lava", ("lava", "volcano", "volcanic", "magma", "fire", "inferno", "molten", "hell"),
          ((0.12, 0.08, 0.07), (1.00, 0.40, 0.05)), "cracks", 2.5,
          ((0.15, 0.05, 0.05), (0.60, 0.20, 0.08)), (0.35, 0.30, 0.30), 0.60, 0.15,
          (("rock", (0.20, 0.15, 0.15)), ("post", (0.90, 0.30, 0.05)))),
    Biome("city", ("city", "plaza", "street", "town", "urban", "square", "downtown", "pavement"),
          ((0.55, 0.55, 0.58), (0.35, 0.35, 0.40)), "tiles", 1.0,
          ((0.40, 0.55, 0.75), (0.80, 0.82, 0.85)), (0.95, 0.95, 0.95), 0.35, 0.35,
          (("post", (0.20, 0.20, 0.25)), ("post", (0.75, 0.20, 0.15)), ("tree", (0.20, 0.45, 0.15)))),
)
BIOME_NAMES = tuple(b.name for b in BIOMES)


def biome_weights(prompt: str) -> np.ndarray:
    """How much of each biome a prompt asks for: keyword counts, or a deterministic two-biome mix from its hash."""
    words = re.findall(r"[a-z]+", prompt.lower())
    counts = np.array([sum(w in b.keywords for w in words) for b in BIOMES], dtype=np.float64)
    if counts.sum() > 0:
        return counts / counts.sum()
    digest = hashlib.sha256(prompt.strip().lower().encode()).digest()
    first, second = digest[0] % len(BIOMES), digest[1] % (len(BIOMES) - 1)
    second += second >= first
    share = 0.5 + 0.5 * digest[2] / 255.0
    weights = np.zeros(len(BIOMES))
    weights[first], weights[second] = share, 1.0 - share
    return weights


def mix_weights(prompt_mix: dict[str, float] | tuple[tuple[str, float], ...]) -> np.ndarray:
    """Biome weights of a blend of prompts (what a prompt transition conditions a block on)."""
    items = prompt_mix.items() if isinstance(prompt_mix, dict) else prompt_mix
    total = sum(w * biome_weights(p) for p, w in items)
    return np.asarray(total, dtype=np.float64) / max(float(np.sum(total)), 1e-12)


# -- noise -------------------------------------------------------------------------


def _hash2(ix: np.ndarray, iz: np.ndarray, salt: int) -> np.ndarray:
    """Integer lattice -> uniform [0, 1), the same on every machine."""
    h = (ix.astype(np.int64) * 374761393 + iz.astype(np.int64) * 668265263 + salt * 2246822519) & 0xFFFFFFFF
    h = ((h ^ (h >> 13)) * 1274126177) & 0xFFFFFFFF
    h = h ^ (h >> 16)
    return (h & 0xFFFFFF).astype(np.float64) / float(0x1000000)


def _value_noise(x: np.ndarray, z: np.ndarray, salt: int) -> np.ndarray:
    ix, iz = np.floor(x), np.floor(z)
    fx, fz = x - ix, z - iz
    fx, fz = fx * fx * (3 - 2 * fx), fz * fz * (3 - 2 * fz)
    ix, iz = ix.astype(np.int64), iz.astype(np.int64)
    a, b = _hash2(ix, iz, salt), _hash2(ix + 1, iz, salt)
    c, d = _hash2(ix, iz + 1, salt), _hash2(ix + 1, iz + 1, salt)
    return (a * (1 - fx) + b * fx) * (1 - fz) + (c * (1 - fx) + d * fx) * fz


def _fbm(x: np.ndarray, z: np.ndarray, footprint: np.ndarray, salt: int, octaves: int = 4) -> np.ndarray:
    """Fractal noise in [0, 1]; octaves finer than two pixel footprints fade to their mean."""
    total = np.zeros_like(x)
    amp, freq, norm = 0.5, 1.0, 0.0
    for o in range(octaves):
        fade = np.clip(1.5 - DETAIL_FADE * footprint * freq, 0.0, 1.0)
        total += amp * (0.5 + fade * (_value_noise(x * freq, z * freq, salt + o) - 0.5))
        norm += amp
        amp, freq = amp * 0.5, freq * 2.0
    return total / norm


def _band(value: np.ndarray, fade: np.ndarray) -> np.ndarray:
    """A periodic 0/1 pattern softened to its mean where it is too fine to see."""
    return 0.5 + fade * 0.5 * np.sin(value)


def _ground_pattern(biome: Biome, x: np.ndarray, z: np.ndarray, footprint: np.ndarray) -> np.ndarray:
    """0..1 per ground point: where between the biome's two colours it lies."""
    s = biome.scale
    fp = footprint / s
    n = _fbm(x / s, z / s, fp, salt=BIOME_NAMES.index(biome.name) * 31 if biome.name in BIOME_NAMES else 0)
    fade = np.clip(1.5 - DETAIL_FADE * fp, 0.0, 1.0)
    if biome.pattern == "patches":
        return np.clip((n - 0.5) * 3.5 + 0.5, 0.0, 1.0)
    if biome.pattern == "dunes":
        return np.clip(_band(2 * math.pi * (x / s + 0.8 * n), fade) * 0.8 + 0.2 * n, 0.0, 1.0)
    if biome.pattern == "drifts":
        return np.clip((n - 0.5) * 3.0 + 0.5, 0.0, 1.0)
    if biome.pattern == "shore":
        # Water on one side of a wavy shoreline, sand on the other, foam bands near it.
        line = x / s + 1.5 * (n - 0.5) + 0.6 * np.sin(z / (2 * s))
        sand = 0.5 + 0.5 * np.tanh(2.0 * line)
        waves = 0.15 * fade * np.sin(2 * math.pi * (z / (0.7 * s) + n)) * (1 - sand)
        return np.clip(sand + waves, 0.0, 1.0)
    if biome.pattern == "cracks":
        ridge = 1.0 - np.abs(2.0 * _fbm(x / s, z / s, fp, salt=77) - 1.0)
        return np.clip((ridge - 0.75) * 5.0 * fade, 0.0, 1.0)
    if biome.pattern == "tiles":
        tx, tz = np.sin(math.pi * x / s), np.sin(math.pi * z / s)
        checker = 0.5 + 0.5 * fade * np.sign(tx * tz) * np.minimum(1.0, 4 * np.abs(tx * tz))
        return np.clip(0.85 * checker + 0.15 * n, 0.0, 1.0)
    raise ValueError(f"unknown pattern {biome.pattern!r}")


# -- the scene ---------------------------------------------------------------------


def _rays(pose: Pose, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Eye position and unit world directions (H, W, 3): the rays `camera.plucker_rays` gives the model."""
    dirs = pixel_directions(height, width, FOV_DEGREES) @ quat_to_matrix(np.array(pose.rotation)).T
    eye = np.array(pose.translation, dtype=np.float64)
    eye[1] = max(eye[1], MIN_CLEARANCE - EYE_HEIGHT)
    return eye, dirs


def _landmarks(eye: np.ndarray, weights: np.ndarray) -> list[tuple[str, np.ndarray, float, float, np.ndarray]]:
    """(kind, base centre on the ground, radius, height, colour) of each landmark near the eye."""
    cx, cz = int(math.floor(eye[0] / CELL)), int(math.floor(eye[2] / CELL))
    reach = int(math.ceil(LANDMARK_RADIUS / CELL))
    ix, iz = np.meshgrid(np.arange(cx - reach, cx + reach + 1), np.arange(cz - reach, cz + reach + 1), indexing="ij")
    ix, iz = ix.ravel(), iz.ravel()
    pick = _hash2(ix, iz, 11)
    cumulative = np.cumsum(weights)
    biome_index = np.minimum(np.searchsorted(cumulative, pick * cumulative[-1], side="right"), len(BIOMES) - 1)
    present = _hash2(ix, iz, 12)
    jx, jz, size, kind_pick = (_hash2(ix, iz, s) for s in (13, 14, 15, 16))
    out = []
    for k in range(len(ix)):
        biome = BIOMES[biome_index[k]]
        if present[k] >= biome.landmark_density:
            continue
        px, pz = (ix[k] + 0.2 + 0.6 * jx[k]) * CELL, (iz[k] + 0.2 + 0.6 * jz[k]) * CELL
        if (px - eye[0]) ** 2 + (pz - eye[2]) ** 2 > LANDMARK_RADIUS**2:
            continue
        kind, colour = biome.landmarks[int(kind_pick[k] * len(biome.landmarks)) % len(biome.landmarks)]
        scale = 0.6 + 0.8 * size[k]
        base = np.array([px, -EYE_HEIGHT, pz])
        radius, tall = {"tree": (0.45, 1.6), "rock": (0.5, 0.5), "post": (0.12, 1.4)}[kind]
        out.append((kind, base, radius * scale, tall * scale, np.array(colour)))
    return out


def tall_landmarks(position: tuple[float, float, float], weights: np.ndarray) -> set[tuple[float, float]]:
    """Ground positions (x, z) of the posts and trees drawn around `position` under biome `weights`
    (one-hot or blended, as `render` takes them): what "how many did we pass?" counts."""
    weights = np.asarray(weights, dtype=np.float64)
    eye = np.array(position, dtype=np.float64)
    return {(float(base[0]), float(base[2])) for kind, base, *_ in _landmarks(eye, weights / weights.sum()) if kind in ("post", "tree")}


def _hit_sphere(eye, dirs, centre, radius):
    oc = eye - centre
    b = dirs @ oc
    c = oc @ oc - radius * radius
    disc = b * b - c
    t = -b - np.sqrt(np.maximum(disc, 0.0))
    hit = (disc > 0) & (t > 1e-3)
    return np.where(hit, t, np.inf)


def _hit_cylinder(eye, dirs, base, radius, tall):
    dx, dz = dirs[..., 0], dirs[..., 2]
    ox, oz = eye[0] - base[0], eye[2] - base[2]
    a = dx * dx + dz * dz
    b = dx * ox + dz * oz
    c = ox * ox + oz * oz - radius * radius
    disc = b * b - a * c
    t = (-b - np.sqrt(np.maximum(disc, 0.0))) / np.maximum(a, 1e-12)
    y = eye[1] + t * dirs[..., 1]
    hit = (disc > 0) & (t > 1e-3) & (y >= base[1]) & (y <= base[1] + tall)
    return np.where(hit, t, np.inf)


def _shade(normal: np.ndarray, colour: np.ndarray) -> np.ndarray:
    light = 0.45 + 0.55 * np.clip(normal @ SUN, 0.0, 1.0)
    return colour * light[..., None]


def render(pose: Pose, weights: np.ndarray, height: int = 64, width: int = 64, supersample: int = 2) -> np.ndarray:
    """One frame of the world seen from `pose` under biome `weights`: uint8 (height, width, 3)."""
    weights = np.asarray(weights, dtype=np.float64)
    if weights.shape != (len(BIOMES),) or weights.min() < 0 or weights.sum() <= 0:
        raise ValueError(f"weights must be {len(BIOMES)} non-negative numbers with a positive sum")
    weights = weights / weights.sum()
    h, w = height * supersample, width * supersample
    eye, dirs = _rays(pose, h, w)
    focal = 0.5 * w / math.tan(math.radians(FOV_DEGREES) / 2)
    active = [(b, float(wt)) for b, wt in zip(BIOMES, weights) if wt > 1e-3]

    def blend(fn) -> np.ndarray:
        return sum(wt * fn(b) for b, wt in active)

    up = dirs[..., 1]
    # Sky: zenith-to-horizon gradient, then clouds where rays meet the cloud plane.
    elevation = np.clip(up, 0.0, 1.0)[..., None]
    horizon = blend(lambda b: np.array(b.sky[1]))
    sky = blend(lambda b: np.array(b.sky[0])) * elevation ** 0.6 + horizon * (1 - elevation ** 0.6)
    t_cloud = np.where(up > 0.02, (CLOUD_HEIGHT - eye[1]) / np.maximum(up, 0.02), np.inf)
    cx, cz = eye[0] + t_cloud * dirs[..., 0], eye[2] + t_cloud * dirs[..., 2]
    cx, cz = np.where(np.isfinite(cx), cx, 0.0), np.where(np.isfinite(cz), cz, 0.0)
    cloud_fp = np.where(np.isfinite(t_cloud), t_cloud / (focal * np.maximum(up, 0.05)), 1e3) / 6.0
    cover = blend(lambda b: np.full(up.shape, b.cloud_cover))
    density = np.clip((_fbm(cx / 6.0, cz / 6.0, cloud_fp, salt=5) - (1.0 - cover) * 0.7 - 0.15) * 3.0, 0.0, 1.0)
    density *= np.clip((up - 0.02) * 8.0, 0.0, 1.0)
    sky = sky * (1 - density[..., None]) + blend(lambda b: np.array(b.cloud)) * density[..., None]

    # Ground.
    ground_y = -EYE_HEIGHT
    t_ground = np.where(up < -1e-4, (ground_y - eye[1]) / np.minimum(up, -1e-4), np.inf)
    gx, gz = eye[0] + t_ground * dirs[..., 0], eye[2] + t_ground * dirs[..., 2]
    gx, gz = np.where(np.isfinite(gx), gx, 0.0), np.where(np.isfinite(gz), gz, 0.0)
    footprint = np.where(np.isfinite(t_ground), t_ground / (focal * np.maximum(-up, 0.02)), 1e3)

    def ground_colour(b: Biome) -> np.ndarray:
        p = _ground_pattern(b, gx, gz, footprint)[..., None]
        lo, hi = np.array(b.ground[0]), np.array(b.ground[1])
        return lo * (1 - p) + hi * p

    ground = blend(ground_colour)
    image = np.where(np.isfinite(t_ground)[..., None], ground, sky)
    depth = np.where(np.isfinite(t_ground), t_ground, np.inf)

    # Landmarks, nearest hit wins; those wholly outside the view cone are skipped.
    forward = dirs[h // 2, w // 2]
    cone = math.cos(math.radians(FOV_DEGREES) * 0.75)  # half the diagonal field of view, with margin
    for kind, base, radius, tall, colour in _landmarks(eye, weights):
        to = base + np.array([0.0, tall * 0.5, 0.0]) - eye
        dist = float(np.linalg.norm(to))
        if dist > tall + radius and float(to @ forward) < dist * cone - (tall + radius):
            continue
        if kind == "post" or kind == "tree":
            trunk_r = radius if kind == "post" else radius * 0.25
            trunk_h = tall if kind == "post" else tall * 0.55
            t = _hit_cylinder(eye, dirs, base, trunk_r, trunk_h)
            closer = t < depth
            if closer.any():
                p = eye + t[closer][:, None] * dirs[closer]
                n = np.stack([p[:, 0] - base[0], np.zeros(len(p)), p[:, 2] - base[2]], axis=-1)
                n /= np.linalg.norm(n, axis=-1, keepdims=True) + 1e-9
                trunk = colour if kind == "post" else np.array([0.35, 0.22, 0.12])
                image[closer] = _shade(n, trunk)
                depth = np.where(closer, t, depth)
        if kind in ("tree", "rock"):
            centre = base + np.array([0.0, tall * 0.7 if kind == "tree" else 0.0, 0.0])
            r = radius
            t = _hit_sphere(eye, dirs, centre, r)
            closer = t < depth
            if closer.any():
                p = eye + t[closer][:, None] * dirs[closer]
                n = (p - centre) / r
                image[closer] = _shade(n, colour)
                depth = np.where(closer, t, depth)

    # Haze: far things take the horizon's colour, which also hides the ground's far aliasing.
    haze = np.where(np.isfinite(depth), 1.0 - np.exp(-np.where(np.isfinite(depth), depth, 0.0) / 18.0), 0.0)
    image = image * (1 - haze[..., None]) + horizon * haze[..., None]
    if supersample > 1:
        image = image.reshape(height, supersample, width, supersample, 3).mean(axis=(1, 3))
    return (np.clip(image, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
