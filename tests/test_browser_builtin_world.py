"""The README's demos in a real browser, on the built-in models: hold D and the view pans; Send
prompt "a snowy field" with a transition and the world turns to snow; a video the world model made,
played to the chat page as a file, is named by the thinker.

tests/browser/world.mjs drives the player page of a real `serve.run` of the shipped weights in
headless Chromium and reads the frames off the playing <video> element; tests/browser/chat_file.mjs
plays an `rtv generate` MP4 through the chat page's "Video file" source and asks about it. The
screenshots stay under artifacts/browser/.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import app_args, deployed
from test_browser import pytestmark as needs_browser  # the same skip without node or chromium
from test_browser import run_script

from clients import cli
from deployments.models.builtin_omni_model import weights_available as omni_weights
from deployments.models.builtin_world_model import weights_available
from deployments.training.behaviour import renderer_colour
from deployments.training.omni_data import BIOME_ANSWERS
from deployments.training.trajectories import DEMO_PROMPTS

pytestmark = [needs_browser, pytest.mark.timeout(300)]

if not (weights_available() and omni_weights()):
    pytest.skip("the built-in models' trained weights are not in deployments/models/weights/", allow_module_level=True)


@pytest.fixture(scope="module")
def base_url(serve_address, tmp_path_factory):
    from deployments.models.builtin_omni_model import install_builtin_omni
    from deployments.models.builtin_world_model import install_builtin_world_models

    root = tmp_path_factory.mktemp("builtin")
    model = install_builtin_world_models(root)["world-model"]
    omni = install_builtin_omni(root / "omni")
    with deployed("browser-builtin-world", "/", app_args(model, understanding_model=str(omni), chat_max_new_tokens=48)):  # the pages use absolute paths
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


@pytest.mark.parametrize(("prompt", "biome"), [("a snowy field", "snow"), ("a city plaza", "city")])
def test_the_chat_page_names_the_place_and_the_turn_of_a_video_the_world_model_made(base_url, tmp_path, capsys, prompt: str, biome: str) -> None:
    script = tmp_path / "hold-l.json"
    script.write_text(json.dumps([[["l"]] * 3] * 4))  # hold `l` through 4 blocks as the README does: 2.8 s, 6 frames at the page's 2 a second
    video = tmp_path / "walk.mp4"
    ws = base_url.replace("http://", "ws://")
    assert cli.main(["generate", "--url", ws, "--prompt", prompt, "--action-script", str(script), "--seed", "0", "-o", str(video)]) == 0
    capsys.readouterr()
    # The frame filter off, as the README asks the turn: at its default a slow turn's frames are dropped as alike.
    r = run_script("chat_file", base_url, str(video), "Where are we?", "Which way is the camera turning?")
    assert r["source"] == "file" and r["errors"] == [], r
    assert r["source_ended"] and "played to its end" in r["status_at_end"], r  # it says so, and the session goes on for questions
    assert r["frames_sent"] == r["frames_at_end"] >= 4 and r["kept"] == r["frames_sent"], r  # sent once, nothing after the end
    assert [a["text"] for a in r["answers"]] == [BIOME_ANSWERS[biome], "right"] == r["shown"], r
    assert all(a["start"]["frames"] == r["kept"] for a in r["answers"]), r  # each answer read every frame of the clip
