"""The README's demo in a real browser, on the built-in world model: hold D and the view pans; Send
prompt "a snowy field" with a transition and the world turns to snow.

tests/browser/world.mjs drives the player page of a real `serve.run` of the shipped weights in
headless Chromium and reads the frames off the playing <video> element; the screenshots of the meadow
and the snow stay under artifacts/browser/.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import app_args, deployed
from test_browser import pytestmark as needs_browser  # the same skip without node or chromium
from test_browser import run_script

from deployments.models.builtin_world_model import weights_available
from deployments.training.behaviour import renderer_colour
from deployments.training.trajectories import DEMO_PROMPTS

pytestmark = [needs_browser, pytest.mark.timeout(300)]

if not weights_available():
    pytest.skip("the trained built-in world model's weights are not in deployments/models/weights/world/", allow_module_level=True)


@pytest.fixture(scope="module")
def base_url(serve_address, tmp_path_factory):
    from deployments.models.builtin_world_model import install_builtin_world_models

    model = install_builtin_world_models(tmp_path_factory.mktemp("builtin"))["world-model"]
    with deployed("browser-builtin-world", "/", app_args(model)):  # the page uses absolute paths
        yield f"http://{serve_address}"


def colour_distance(colour: list[float], prompt: str) -> float:
    return float(np.linalg.norm(np.array(colour) - renderer_colour(prompt)))


def test_the_page_pans_on_d_and_turns_to_snow_on_the_prompt(base_url) -> None:
    r = run_script("world", base_url)
    assert r["errors"] == []
    blocks = {int(k): v for k, v in r["blocks"].items()}
    held = sorted(set(r["d_blocks"]))
    assert len(held) >= 3, r["d_blocks"]
    before = [blocks[k] for k in range(1, held[0]) if k in blocks]
    meadow = before[-1]["mean"]
    assert min(DEMO_PROMPTS, key=lambda p: colour_distance(meadow, p)) == "a green meadow", meadow
    # Holding D strafes right: in every block it was held for, the ground slides left across the frame.
    shifts = [blocks[k]["shift"] for k in held if k in blocks and blocks[k]["shift"] is not None]
    still = [abs(b["shift"]) for b in before if b["shift"] is not None]
    assert len(shifts) >= 2 and all(s < 0 for s in shifts), (shifts, r["blocks"])
    assert np.mean(np.abs(shifts)) > np.mean(still or [0]) + 1, (shifts, still)
    # The page's prompt box says "a snowy field" over 4 blocks; played through, the world is snow.
    assert r["new_prompt"] == "a snowy field" and r["transition"] == 4
    start, end = r["prompt_blocks"]
    assert end >= start + 3, r["prompt_blocks"]  # spread over the transition's blocks, not one jump
    after = blocks[max(blocks)]["mean"]
    assert colour_distance(after, "a snowy field") < 0.5 * colour_distance(meadow, "a snowy field"), (meadow, after)
    assert colour_distance(after, "a snowy field") < colour_distance(after, "a green meadow"), after
