"""The procedural world the built-in model is trained on, and the measures its behaviour tests use."""

from __future__ import annotations

import numpy as np
import pytest

from deployments.generation.camera import Pose
from deployments.training import measures
from deployments.training.behaviour import held
from deployments.training.dataset import load_trajectory, render_dataset
from deployments.training.trajectories import render_session, render_trajectory
from deployments.training.world import BIOMES, biome_weights, mix_weights, render


def _held(key: str | None, blocks: int = 3, prompt: str = "a green meadow") -> np.ndarray:
    """The renderer's frames for a session holding `key` (None: no key), posed by the engine's Director."""
    return render_session(prompt, held((key,) if key else (), blocks)).frames


def test_prompts_pick_biomes_by_keyword_and_unknown_prompts_get_a_fixed_mix() -> None:
    names = [b.name for b in BIOMES]
    assert len(BIOMES) >= 6
    assert names[int(np.argmax(biome_weights("a snowy field")))] == "snow"
    assert biome_weights("a snowy field").max() == 1.0
    assert names[int(np.argmax(biome_weights("Lava flows near a VOLCANO")))] == "lava"
    both = biome_weights("desert and snow")
    assert both[names.index("desert")] == both[names.index("snow")] == 0.5
    unknown = biome_weights("a quiet place")
    assert np.isclose(unknown.sum(), 1.0) and (unknown > 0).sum() == 2
    np.testing.assert_array_equal(unknown, biome_weights("a quiet place"))
    assert not np.array_equal(unknown, biome_weights("somewhere else entirely"))
    half = mix_weights({"a snowy field": 0.5, "a sandy desert": 0.5})
    assert half[names.index("snow")] == pytest.approx(0.5) and half[names.index("desert")] == pytest.approx(0.5)


def test_render_is_deterministic_and_biomes_look_different() -> None:
    pose = Pose((0.3, 0.0, -1.2))
    colours = []
    for i in range(len(BIOMES)):
        w = np.eye(len(BIOMES))[i]
        frame = render(pose, w)
        assert frame.shape == (64, 64, 3) and frame.dtype == np.uint8
        np.testing.assert_array_equal(frame, render(pose, w))
        colours.append(measures.mean_colour(frame[32:]))  # the ground
    gaps = [np.abs(a - b).max() for i, a in enumerate(colours) for b in colours[i + 1 :]]
    assert min(gaps) > 15, gaps
    with pytest.raises(ValueError, match="weights"):
        render(pose, np.zeros(len(BIOMES)))


@pytest.mark.parametrize("key,sign", [("a", 1), ("j", 1), ("d", -1), ("l", -1)])
def test_held_keys_pan_the_rendered_world_the_engine_way(key: str, sign: int) -> None:
    frames = _held(key)[-12:]
    dx, _ = measures.block_motion(frames, rows=slice(34, 64))
    still, _ = measures.block_motion(_held(None)[-12:], rows=slice(34, 64))
    assert sign * dx > 1.5 and abs(still) < 0.3


@pytest.mark.parametrize("key,sign", [("i", 1), ("k", -1)])
def test_pitch_keys_move_the_rendered_world_vertically(key: str, sign: int) -> None:
    _, dy = measures.block_motion(_held(key)[-12:])
    assert sign * dy > 4


def test_forward_expands_the_ground_and_back_contracts_it() -> None:
    assert measures.block_zoom(_held("w")[-12:][::3]) > 1.02
    assert measures.block_zoom(_held("s")[-12:][::3]) < 0.98
    assert measures.block_zoom(_held(None)[-12:][::3]) == pytest.approx(1.0, abs=0.01)


def test_measures_recover_known_shifts_and_tell_pictures_from_noise() -> None:
    rng = np.random.default_rng(0)
    frame = render(Pose(), biome_weights("a city plaza"))
    shifted = np.roll(frame, (2, -3), axis=(0, 1))
    dx, dy = measures.displacement(frame, shifted)
    assert dx == pytest.approx(-3, abs=0.3) and dy == pytest.approx(2, abs=0.3)
    noise = rng.integers(0, 256, frame.shape, dtype=np.uint8)
    assert measures.neighbour_correlation(frame) > 0.8 > 0.2 > abs(measures.neighbour_correlation(noise))
    assert measures.ssim(frame, frame) == pytest.approx(1.0)
    assert measures.ssim(frame, noise) < 0.2
    assert measures.psnr(frame, frame) > 90
    assert measures.histogram_distance(measures.colour_histogram(frame), measures.colour_histogram(frame)) == 0.0
    assert measures.contrast(np.full_like(frame, 128)) == 0.0


def test_trajectories_follow_the_director_and_are_reproducible(tmp_path) -> None:
    a = render_trajectory(5, blocks=3)
    b = render_trajectory(5, blocks=3)
    assert a.frames.shape == (33, 64, 64, 3)  # 9 + 12 + 12
    np.testing.assert_array_equal(a.frames, b.frames)
    assert len(a.prompt_mixes) == len(a.relative_poses) == 3
    assert all(len(p) == 3 for p in a.relative_poses)
    assert not np.array_equal(a.frames, render_trajectory(6, blocks=3).frames)
    paths = render_dataset(tmp_path, 2, 2, seed=1)
    stored = load_trajectory(paths[1])
    assert stored.frames.shape == (21, 64, 64, 3)
    again = render_dataset(tmp_path, 2, 2, seed=1)  # already there: nothing is rendered again
    assert again == paths and paths[0].stat().st_mtime == again[0].stat().st_mtime


def test_a_rest_relative_camera_adapter_sees_only_the_motion() -> None:
    import torch

    from deployments.generation.camera import KeyMotion, plucker_rays
    from deployments.generation.camera_adapter import CameraAdapter

    torch.manual_seed(0)
    relative = CameraAdapter(inner_dim=8, spatial_factor=4, patch_size=(1, 4, 4), rest_relative=True, gain=5.0)
    raw = CameraAdapter(inner_dim=8, spatial_factor=4, patch_size=(1, 4, 4))
    raw.load_state_dict(relative.state_dict())
    rest = torch.from_numpy(plucker_rays([Pose()] * 3, 64, 64))[None]
    # At rest the adapter's input is all zeros...
    torch.testing.assert_close(relative(rest), raw(torch.zeros_like(rest)))
    # ...and a turn is the change of the rays, amplified.
    turned = torch.from_numpy(plucker_rays([Pose().compose(KeyMotion().delta(("l",)))] * 3, 64, 64))[None]
    torch.testing.assert_close(relative(turned), raw((turned - rest) * 5.0))


def test_the_position_code_tells_tokens_at_rest_apart_and_starts_as_no_change() -> None:
    """At rest a rest-relative adapter gives every token the same vector (Wan's RoPE is relative, so a
    text-to-video first block could not place anything); the position code gives each its own, starts
    at zero so weights trained without it load unchanged, and names a ray, not a pixel index."""
    import torch

    from deployments.generation.camera import plucker_rays
    from deployments.generation.camera_adapter import CameraAdapter
    from deployments.models.tiny_world_model import load_adapter_weights

    torch.manual_seed(0)
    plain = CameraAdapter(inner_dim=8, spatial_factor=4, patch_size=(1, 2, 2), rest_relative=True, gain=5.0)
    coded = CameraAdapter(inner_dim=8, spatial_factor=4, patch_size=(1, 2, 2), rest_relative=True, gain=5.0, position_bands=3)
    load_adapter_weights(coded, plain.state_dict())
    rest = torch.from_numpy(plucker_rays([Pose()] * 3, 64, 64))[None]
    tokens = plain(rest)
    assert torch.allclose(tokens, tokens[..., :1, :1].expand_as(tokens))  # all alike
    torch.testing.assert_close(coded(rest), tokens)  # the zero start changes nothing

    with torch.no_grad():
        coded.proj_position.weight.normal_()
    placed = coded(rest)[0, :, 0].flatten(1).T  # (tokens, dim)
    assert torch.cdist(placed, placed).add(torch.eye(len(placed)) * 1e3).min() > 1e-3  # every token its own
    # The same ray at twice the size gets the same code: the centre of a 4x4 latent block is a pixel corner shared by both grids.
    small = coded._position_code(16, 16, rest)[0, :, 0]
    large = coded._position_code(32, 32, rest)[0, :, 0]
    torch.testing.assert_close(small[:, 7:9, 7:9].mean((1, 2)), large[:, 14:18, 14:18].mean((1, 2)), atol=0.05, rtol=0)

    with pytest.raises(ValueError, match="unexpected"):
        load_adapter_weights(plain, coded.state_dict())


@pytest.mark.parametrize("softness", [1, 2, 4])
def test_block_motion_reads_a_sub_pixel_pan_of_a_soft_picture(softness: int) -> None:
    """A pan of 0.75 px a frame (a held turn) reads near its whole length, however soft the picture:
    frames rendered while turning, averaged over `softness` pixels and spread back."""
    import torch
    import torch.nn.functional as F

    frames = _held("l")[-12:]
    x = torch.from_numpy(frames).permute(0, 3, 1, 2).float()
    if softness > 1:
        x = F.interpolate(F.avg_pool2d(x, softness), size=frames.shape[1:3], mode="bilinear", align_corners=False)
    soft = x.round().clamp(0, 255).byte().permute(0, 2, 3, 1).numpy()
    sharp_dx, _ = measures.block_motion(frames, rows=slice(34, 64))
    dx, _ = measures.block_motion(soft, rows=slice(34, 64))
    assert sharp_dx < -4 and dx == pytest.approx(sharp_dx, rel=0.3), (dx, sharp_dx)
