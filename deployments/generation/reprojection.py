"""The last-frame condition moved to where each frame of the block looks (an opt-in geometric prior).

A held key moves the camera a known amount, and a small model learns that
shift slowly from pixels: trained on the last frame as it is, the built-in
model moved the picture a sixth of the way. With the transformer config key
`last_frame_reprojection` (the ground's depth below the session's start
pose, in the camera's units), the engine warps the given latent frame to
each frame's pose before it goes into the condition channels, as if the
scene were a flat ground under a sky at infinity: turns are exact whatever
the depth, moves are exact on the ground and leave the sky still. What the
plane does not explain (things standing up, edges coming into view) is left
to the model. The engine and the trainer both warp here, so a model is
served the condition it was trained on.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from deployments.generation.camera import FOV_DEGREES, Pose, pixel_directions, quat_to_matrix


def reprojection_grid(given: Pose, targets: Sequence[Pose], height: int, width: int, ground_depth: float,
                      fov_degrees: float = FOV_DEGREES) -> np.ndarray:
    """Where each pixel of each target view lies in the `given` view: float32 (F, height, width, 2), in
    `grid_sample`'s normalized coordinates (align_corners=False). Poses share one world frame whose
    ground is the plane y = -ground_depth; a point behind the given camera maps far outside the frame."""
    focal = 0.5 * width / math.tan(math.radians(fov_degrees) / 2)
    dirs_cam = pixel_directions(height, width, fov_degrees)
    to_given = quat_to_matrix(np.array(given.rotation)).T
    given_eye = np.array(given.translation)
    grids = np.empty((len(targets), height, width, 2), dtype=np.float32)
    for i, pose in enumerate(targets):
        d = dirs_cam @ quat_to_matrix(np.array(pose.rotation)).T
        eye = np.array(pose.translation)
        height_above = eye[1] + ground_depth
        down = d[..., 1] < -1e-4
        t = np.where(down, -height_above / np.minimum(d[..., 1], -1e-4), 0.0)
        on_ground = down & (height_above > 0)
        # Ground points move with the camera's position; the sky is directions only.
        seen = np.where(on_ground[..., None], (eye + t[..., None] * d - given_eye) @ to_given.T, d @ to_given.T)
        z = seen[..., 2]
        ahead = z > 1e-6
        safe_z = np.where(ahead, z, 1.0)
        u = np.where(ahead, seen[..., 0] / safe_z * focal + width / 2, -1e3)
        v = np.where(ahead, -seen[..., 1] / safe_z * focal + height / 2, -1e3)
        grids[i, ..., 0] = 2.0 * u / width - 1.0
        grids[i, ..., 1] = 2.0 * v / height - 1.0
    return grids


def reproject(latent: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
    """`latent` (B, z, h, w) seen from each view of `grids` ((F, h, w, 2), or (B, F, h, w, 2) per row):
    (B, z, F, h, w). Outside the given view the nearest edge is repeated (the model fills it in)."""
    b, z, h, w = latent.shape
    if grids.dim() == 4:
        grids = grids.unsqueeze(0).expand(b, *grids.shape)
    frames = grids.shape[1]
    src = latent.unsqueeze(1).expand(b, frames, z, h, w).reshape(b * frames, z, h, w)
    out = F.grid_sample(src, grids.reshape(b * frames, h, w, 2).to(latent.dtype), mode="bilinear",
                        padding_mode="border", align_corners=False)
    return out.reshape(b, frames, z, h, w).transpose(1, 2)
