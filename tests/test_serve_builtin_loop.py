"""The README's loop on the laptop default, through the CLI: `rtv generate` makes a video with the built-in
world model holding a key, `rtv chat` plays it to the built-in thinker, which names where the video is and which
way the camera turns.

One real `serve.run` of both built-in models (what `make serve` runs), the two
commands in this process on real sockets, the MP4 on disk between them.
"""

from __future__ import annotations

import json

import pytest
from conftest import app_args, deployed

from clients import cli
from deployments.models.builtin_omni_model import weights_available as omni_weights
from deployments.models.builtin_world_model import weights_available as world_weights
from deployments.training.omni_data import BIOME_ANSWERS

pytestmark = pytest.mark.timeout(600)

if not (world_weights() and omni_weights()):
    pytest.skip("the built-in models' trained weights are not in deployments/models/weights/", allow_module_level=True)

APP, PREFIX = "builtin-loop", "/loop"


@pytest.fixture(scope="module")
def url(serve_address, tmp_path_factory) -> str:
    from deployments.models.builtin_omni_model import install_builtin_omni
    from deployments.models.builtin_world_model import install_builtin_world_models

    root = tmp_path_factory.mktemp("builtin-loop")
    world = install_builtin_world_models(root)["world-model"]
    omni = install_builtin_omni(root / "omni")
    with deployed(APP, PREFIX, app_args(world, understanding_model=str(omni), chat_max_new_tokens=48)):
        yield f"ws://{serve_address}{PREFIX}"


@pytest.mark.parametrize(("prompt", "key", "biome", "turn"), [("a snowy field", "l", "snow", "right"), ("a snowy field", "j", "snow", "left"),
                                                              ("a lava field", "j", "lava", "left")])
def test_a_video_the_world_model_made_is_named_by_the_thinker(url, tmp_path, capsys, prompt: str, key: str, biome: str, turn: str) -> None:
    script = tmp_path / "hold.json"
    script.write_text(json.dumps([[[key]] * 3] * 4))  # hold the key through 4 blocks from the first frame, as the README's example does
    video = tmp_path / "walk.mp4"
    assert cli.main(["generate", "--url", f"{url}/v1/realtime/video", "--prompt", prompt, "--action-script", str(script), "--seed", "0", "-o", str(video)]) == 0
    capsys.readouterr()
    # Which way: with the frame filter off; at its default it drops a slow turn's frames as alike and the answer is "still".
    asked = [("Where are we?", BIOME_ANSWERS[biome], []), ("Which way is the camera turning?", turn, ["--no-evs"])]
    for query, expected, extra in asked:
        assert cli.main(["chat", "--url", f"{url}/v1/video/chat/stream", "--video", str(video), "--fps", "2", "--query", query, *extra]) == 0
        out, err = capsys.readouterr()
        assert out.strip().splitlines()[-1].strip() == expected, (out, err)
