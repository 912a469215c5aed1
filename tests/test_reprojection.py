"""The last-frame reprojection agrees with the procedural world it was made for.

Frames rendered at one pose, warped to another with `reprojection_grid`,
are compared with the renderer's own frame at the other pose: turns are
exact whatever the depth, moves are exact on the ground.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deployments.generation.camera import KeyMotion, Pose
from deployments.generation.reprojection import reproject, reprojection_grid
from deployments.training.world import EYE_HEIGHT, biome_weights, render

CITY = biome_weights("a city plaza")


def warped(frame: np.ndarray, given: Pose, target: Pose) -> tuple[np.ndarray, np.ndarray]:
    """`frame` (seen from `given`) as `target` sees it, and where that view lies inside the given one."""
    h, w = frame.shape[:2]
    grid = reprojection_grid(given, [target], h, w, EYE_HEIGHT)
    image = torch.from_numpy(frame).permute(2, 0, 1)[None].float()
    out = reproject(image, torch.from_numpy(grid))[0, :, 0].permute(1, 2, 0).numpy()
    inside = (np.abs(grid[0]) <= 1.0).all(axis=-1)
    return out, inside


def test_the_identity_view_is_the_frame_itself() -> None:
    frame = render(Pose(), CITY)
    out, inside = warped(frame, Pose(), Pose())
    assert inside.all()
    np.testing.assert_allclose(out, frame, atol=1e-4)


@pytest.mark.parametrize("key,first_row,prompt,ratio", [
    # Turns: everything, on the sharpest texture (what is left is interpolation's blur of its edges).
    *[(k, 0, "a city plaza", 0.35) for k in "ljik"],
    # Moves: the near ground of a smooth biome (landmarks stand up off the plane, so they are not exact).
    *[(k, 48, "a green meadow", 0.2) for k in "dasw"],
])
def test_a_warped_frame_matches_the_renderer_at_the_new_pose(key: str, first_row: int, prompt: str, ratio: float) -> None:
    start = Pose(translation=(0.3, 0.0, 0.7))
    moved = start
    for _ in range(3):  # three latent frames of the key held
        moved = moved.compose(KeyMotion().delta((key,)))
    weights = biome_weights(prompt)
    before, after = render(start, weights).astype(np.float64), render(moved, weights).astype(np.float64)
    out, inside = warped(before.astype(np.uint8), start, moved)
    keep = inside.copy()
    keep[:first_row] = False
    unmoved_error = np.mean((before - after)[keep] ** 2)
    warped_error = np.mean((out - after)[keep] ** 2)
    assert warped_error < ratio * unmoved_error, (warped_error, unmoved_error)


def test_ground_behind_the_given_camera_lands_outside_its_view() -> None:
    turned = Pose().compose(Pose(rotation=(0.0, 1.0, 0.0, 0.0)))  # facing the other way
    grid = reprojection_grid(Pose(), [turned], 16, 16, EYE_HEIGHT)
    assert (np.abs(grid) > 1).any(axis=-1).all()


def test_rows_of_a_batch_take_their_own_views() -> None:
    frame = torch.from_numpy(render(Pose(), CITY)).permute(2, 0, 1)[None].float()
    right = Pose().compose(KeyMotion().delta(("l",)))
    grids = torch.from_numpy(np.stack([reprojection_grid(Pose(), [Pose(), right], 64, 64, EYE_HEIGHT),
                                       reprojection_grid(Pose(), [right, Pose()], 64, 64, EYE_HEIGHT)]))
    out = reproject(frame.expand(2, -1, -1, -1), grids)
    assert out.shape == (2, 3, 2, 64, 64)
    torch.testing.assert_close(out[0, :, 0], frame[0])
    torch.testing.assert_close(out[1, :, 1], frame[0])
    torch.testing.assert_close(out[0, :, 1], out[1, :, 0])
