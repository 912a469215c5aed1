"""Camera poses, keyboard motion and Plücker rays (Unity axes: +X right, +Y up, +Z forward).

Rotations are unit quaternions (x, y, z, w). Poses map camera coordinates to
world coordinates: world = rotation * camera + translation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from deployments.contract.keys import KEYS

IDENTITY_ROTATION = (0.0, 0.0, 0.0, 1.0)
FOV_DEGREES = 60.0  # the engine's camera: rays, the camera adapter's default, reprojection and the procedural world

# Keys the server turns into motion: (axis in camera frame, sign) for moves,
# (rotation axis in camera frame, sign) for looks. Looking up is a rotation
# about +X that tips +Z towards +Y, i.e. a negative angle in a left-handed frame.
MOVES: dict[str, tuple[int, float]] = {"w": (2, 1.0), "s": (2, -1.0), "d": (0, 1.0), "a": (0, -1.0)}
LOOKS: dict[str, tuple[int, float]] = {"i": (0, -1.0), "k": (0, 1.0), "l": (1, 1.0), "j": (1, -1.0)}
assert frozenset(MOVES) | frozenset(LOOKS) == KEYS, "every key the protocol allows has a motion"


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return np.array(
        [
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
            aw * bw - ax * bx - ay * by - az * bz,
        ]
    )


def quat_normalize(q: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(q))
    if not math.isfinite(n) or n < 1e-12:
        raise ValueError("rotation quaternion must be non-zero and finite")
    return np.asarray(q, dtype=np.float64) / n


def quat_to_matrix(q: np.ndarray) -> np.ndarray:
    x, y, z, w = q
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def quat_axis_angle(axis: int, angle: float) -> np.ndarray:
    q = np.zeros(4)
    q[axis] = math.sin(angle / 2)
    q[3] = math.cos(angle / 2)
    return q


def slerp(a: np.ndarray, b: np.ndarray, t: float) -> np.ndarray:
    dot = float(np.dot(a, b))
    if dot < 0.0:  # take the short way round
        b, dot = -b, -dot
    if dot > 0.9995:
        return quat_normalize(a + t * (b - a))
    theta = math.acos(dot)
    return (math.sin((1 - t) * theta) * a + math.sin(t * theta) * b) / math.sin(theta)


@dataclass(frozen=True)
class Pose:
    translation: tuple[float, float, float] = (0.0, 0.0, 0.0)
    rotation: tuple[float, float, float, float] = IDENTITY_ROTATION

    def compose(self, delta: "Pose") -> "Pose":
        """Apply `delta` expressed in this pose's own camera frame."""
        r = np.array(self.rotation)
        t = np.array(self.translation) + quat_to_matrix(r) @ np.array(delta.translation)
        return Pose(tuple(t.tolist()), tuple(quat_normalize(quat_mul(r, np.array(delta.rotation))).tolist()))

    def relative_to(self, ref: "Pose") -> "Pose":
        """This pose in `ref`'s camera frame."""
        ref_r = np.array(ref.rotation)
        inv = np.array([-ref_r[0], -ref_r[1], -ref_r[2], ref_r[3]])
        t = quat_to_matrix(inv) @ (np.array(self.translation) - np.array(ref.translation))
        return Pose(tuple(t.tolist()), tuple(quat_normalize(quat_mul(inv, np.array(self.rotation))).tolist()))

    def interpolate(self, other: "Pose", t: float) -> "Pose":
        a, b = np.array(self.translation), np.array(other.translation)
        rot = slerp(np.array(self.rotation), np.array(other.rotation), t)
        return Pose(tuple((a + t * (b - a)).tolist()), tuple(rot.tolist()))


@dataclass(frozen=True)
class KeyMotion:
    """How far one latent frame of a held key moves or turns the camera."""

    step: float = 0.1
    turn_radians: float = math.radians(3.0)

    def delta(self, keys: tuple[str, ...]) -> Pose:
        t = np.zeros(3)
        rot = np.array(IDENTITY_ROTATION)
        for key in keys:
            if key in MOVES:
                axis, sign = MOVES[key]
                t[axis] += sign * self.step
            elif key in LOOKS:
                axis, sign = LOOKS[key]
                rot = quat_mul(rot, quat_axis_angle(axis, sign * self.turn_radians))
            else:
                raise ValueError(f"unknown key {key!r}; keys are {' '.join(sorted(KEYS))}")
        return Pose(tuple(t.tolist()), tuple(rot.tolist()))


def pixel_directions(height: int, width: int, fov_degrees: float = FOV_DEGREES) -> np.ndarray:
    """Unit ray directions through each pixel's centre, in the camera frame: (H, W, 3)."""
    focal = 0.5 * width / math.tan(math.radians(fov_degrees) / 2)
    u = (np.arange(width) + 0.5 - width / 2) / focal
    v = -(np.arange(height) + 0.5 - height / 2) / focal  # image rows grow downwards, +Y is up
    dirs_cam = np.stack(np.broadcast_arrays(u[None, :], v[:, None], np.ones((height, 1))), axis=-1)
    return dirs_cam / np.linalg.norm(dirs_cam, axis=-1, keepdims=True)


def plucker_rays(poses: list[Pose], height: int, width: int, fov_degrees: float = FOV_DEGREES) -> np.ndarray:
    """Per-pixel Plücker coordinates (moment o x d, direction d) -> float32 (6, F, H, W)."""
    dirs_cam = pixel_directions(height, width, fov_degrees)
    out = np.empty((6, len(poses), height, width), dtype=np.float32)
    for i, pose in enumerate(poses):
        d = dirs_cam @ quat_to_matrix(np.array(pose.rotation)).T
        o = np.broadcast_to(np.array(pose.translation), d.shape)
        out[:3, i] = np.moveaxis(np.cross(o, d), -1, 0)
        out[3:, i] = np.moveaxis(d, -1, 0)
    return out
