"""The built-in world model behaves: keys move the view, prompts pick the world, and it stays a picture.

These run the trained checkpoint (`rtv make-models` installs it from the
shipped weights) through the engine, as the server does, and measure the
frames (deployments/training/behaviour.py). Where a floor is set, the same
measure on a random-weight model of the same architecture is checked to
fall short of it, so the floor tests the training, not the plumbing.
"""

from __future__ import annotations

import numpy as np
import pytest

from deployments.training import behaviour
from deployments.training.behaviour import held, sign_agreement

pytestmark = pytest.mark.timeout(600)

from deployments.models.builtin_world_model import weights_available  # noqa: E402

if not weights_available():
    # They ship with the checkout (deployments/models/weights/world/); a checkout without them has nothing to test here.
    pytest.skip("the trained built-in world model's weights are not in deployments/models/weights/world/", allow_module_level=True)


@pytest.fixture(scope="module")
def builtin_dirs(tmp_path_factory):
    from deployments.models.builtin_world_model import install_builtin_world_models

    return install_builtin_world_models(tmp_path_factory.mktemp("builtin"))


@pytest.fixture(scope="module")
def t2v(builtin_dirs):
    from deployments.generation.engine import WorldModelEngine

    return WorldModelEngine.from_pretrained(builtin_dirs["world-model"])


@pytest.fixture(scope="module")
def i2v(builtin_dirs):
    from deployments.generation.engine import WorldModelEngine

    return WorldModelEngine.from_pretrained(builtin_dirs["world-model-i2v"])


@pytest.fixture(scope="module")
def random_i2v(tmp_path_factory):
    """The built-in architecture with untrained weights (what the server shipped before)."""
    from dataclasses import replace

    from deployments.generation.engine import WorldModelEngine
    from deployments.models.builtin_world_model import BUILTIN_SPEC
    from deployments.models.tiny_world_model import build_world_model

    path = tmp_path_factory.mktemp("random") / "world-model-i2v"
    build_world_model(path, replace(BUILTIN_SPEC, image_conditioned=True), seed=0)
    return WorldModelEngine.from_pretrained(path)


@pytest.fixture(scope="module")
def still(t2v):
    return behaviour.pan_report(t2v, None)


def test_the_installed_model_is_the_shipped_one(builtin_dirs) -> None:
    import json

    for name in ("world-model", "world-model-i2v"):
        config = json.loads((builtin_dirs[name] / "transformer" / "config.json").read_text())
        assert config["num_frames_per_block"] == 3 and config["patch_size"] == [1, 2, 2]
        assert config["in_channels"] == 36 and config["last_frame_condition"]
        assert config["start_image"] == name.endswith("i2v")
        assert config["last_frame_reprojection"] == 1.0  # the procedural world's eye height
        adapter = json.loads((builtin_dirs[name] / "camera_adapter" / "config.json").read_text())
        assert adapter["rest_relative"] and adapter["patch_size"] == [1, 2, 2]
        vae = json.loads((builtin_dirs[name] / "vae" / "config.json").read_text())
        assert vae["scale_factor_spatial"] == 4 and vae["latents_std"] != [1.0] * 16


@pytest.mark.parametrize("key,sign", [("a", 1), ("j", 1), ("d", -1), ("l", -1)])
def test_held_keys_pan_the_view(t2v, still, key: str, sign: int) -> None:
    report = behaviour.pan_report(t2v, key)
    assert sign_agreement(report["dx"], sign) >= 0.8, report["dx"]
    moving, resting = np.mean(np.abs(report["dx"])), np.mean(np.abs(still["dx"]))
    assert moving > 3 * resting, (report["dx"], still["dx"])


@pytest.mark.parametrize("key,sign", [("i", 1), ("k", -1)])
def test_pitch_keys_move_the_view_vertically(t2v, still, key: str, sign: int) -> None:
    report = behaviour.pan_report(t2v, key)
    assert sign_agreement(report["dy"], sign) >= 0.8, report["dy"]
    assert np.mean(np.abs(report["dy"])) > 3 * np.mean(np.abs(still["dy"])), (report["dy"], still["dy"])


def test_forward_expands_the_ground_and_back_contracts_it(t2v, still) -> None:
    forward, back = behaviour.pan_report(t2v, "w"), behaviour.pan_report(t2v, "s")
    assert sign_agreement([z - 1 for z in forward["zoom"]], 1) >= 0.8, forward["zoom"]
    assert sign_agreement([z - 1 for z in back["zoom"]], -1) >= 0.8, back["zoom"]


def test_biome_prompts_give_their_own_colours(t2v) -> None:
    prompts = ["a snowy field", "a lava field", "a green meadow", "a sandy desert"]
    colours = {p: np.array(c) for p, c in behaviour.colour_report(t2v, prompts).items()}
    for p in prompts:
        # Each generated world is nearest to the renderer's colours of its own biome.
        target = {q: np.linalg.norm(colours[p] - behaviour.renderer_colour(q)) for q in prompts}
        assert min(target, key=target.get) == p, (p, target)
    assert np.linalg.norm(colours["a snowy field"] - colours["a lava field"]) > 100


def test_a_prompt_transition_changes_the_world_gradually_then_holds(t2v) -> None:
    report = behaviour.transition_report(t2v, "a green meadow", "a snowy field", transition=4)
    d = report["distance_to_target"]
    switch, n = report["switch_block"], report["transition"]
    start = d[switch - 1]  # where the world was when the prompt changed
    during = d[switch : switch + n]
    settled = d[switch + n :]
    assert during[0] < start and during[-1] < during[0]  # moving towards snow...
    assert during[0] > max(settled) + 0.15 * (start - max(settled))  # ...not in one jump
    assert max(settled) < 0.35 * start and max(settled) - min(settled) < 0.2 * start  # then holding


@pytest.fixture(scope="module")
def script():
    return held(("w",), 2) + held(("l",), 2, first=2)


def test_image_to_video_tracks_the_renderer_and_random_weights_do_not(i2v, random_i2v, script) -> None:
    trained = behaviour.fidelity_report(i2v, "a city plaza", script)
    untrained = behaviour.fidelity_report(random_i2v, "a city plaza", script)
    floor_db, floor_ssim = 18.0, 0.4
    assert min(trained["psnr_db"][:2]) >= floor_db, trained
    assert min(trained["ssim"][:2]) >= floor_ssim, trained
    assert max(untrained["psnr_db"]) < floor_db - 4, untrained  # random weights: about 12-13 dB of grey noise
    assert max(untrained["ssim"]) < floor_ssim / 2, untrained


@pytest.fixture(scope="module")
def openings(t2v, i2v, script):
    """Text-to-video and image-to-video (from the renderer's start frame) sessions of two biomes, against the renderer."""
    return {p: (behaviour.fidelity_report(t2v, p, script, from_image=False), behaviour.fidelity_report(i2v, p, script))
            for p in ("a city plaza", "a snowy field")}


@pytest.mark.parametrize("prompt", ["a city plaza", "a snowy field"])
def test_text_to_video_opens_on_the_renderers_view(openings, prompt: str) -> None:
    """From the prompt alone a session starts where the renderer's does, and its first blocks track it."""
    text, _ = openings[prompt]
    assert min(text["psnr_db"][:2]) >= 18.0, text  # random weights: about 12-13 dB (the image-to-video test)


def test_text_to_video_opens_as_sharp_as_from_a_rendered_frame(openings) -> None:
    """The first block made from the prompt alone has the landmarks and texture the same model keeps when
    it is given the renderer's frame: not a soft colour field."""
    for prompt, (text, image) in openings.items():
        assert text["psnr_db"][0] >= image["psnr_db"][0] - 2.0, (prompt, text, image)
        assert text["sharpness"][0] >= 0.8 * image["sharpness"][0], (prompt, text, image)


def test_a_long_walk_stays_a_picture(t2v) -> None:
    report = behaviour.coherence_report(t2v, blocks=200)
    assert min(report["neighbour_correlation"]) > 0.8, report
    assert min(report["contrast"]) > 6, report
    assert max(report["histogram_drift"]) < 0.7, report
