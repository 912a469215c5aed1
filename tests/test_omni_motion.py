"""The motion sensor set into the thinker's weights (deployments/training/omni_motion.py): its video tokens say
which way the picture turns, and training leaves it as set."""

from __future__ import annotations

import pytest
import torch

from deployments.training.omni_data import FPS, TURNS, render_clip
from deployments.training.omni_motion import SENSOR_CHANNELS, freeze_motion_sensor, motion_readings
from deployments.training.omni_training import install_sensor


@pytest.fixture(scope="module")
def thinker():
    """A fresh (random) thinker of the built-in size with the sensor set, and the processor's view of some turns."""
    from deployments.models.builtin_omni_model import BUILTIN_OMNI_SPEC
    from deployments.models.tiny_vlm import build_vlm
    from deployments.understanding.engine import UnderstandingEngine

    torch.manual_seed(0)
    model, processor = build_vlm(BUILTIN_OMNI_SPEC, 0)
    engine = UnderstandingEngine(model, processor, model_type="qwen2_5_omni_thinker", model_name="omni")

    def view(clip):
        inputs = engine.build_inputs(list(clip.frames), None, "Which way?", fps=FPS)
        return inputs["pixel_values_videos"], inputs["video_grid_thw"]

    turns: dict[str, list] = {name: [] for name in TURNS}
    seed = 0
    while min(len(v) for v in turns.values()) < 4:
        clip = render_clip(seed, frames=6, change=0.0)
        if clip.motion in turns and len(turns[clip.motion]) < 4:
            turns[clip.motion].append(clip)
        seed += 1
    install_sensor(engine, [clip for clips in turns.values() for clip in clips[:2]])  # as rtv train-omni sets it
    return model, {name: [view(clip) for clip in clips[2:]] for name, clips in turns.items()}, view(turns["left"][0])


def test_the_video_tokens_say_which_way_the_picture_turns(thinker) -> None:
    model, turns, _ = thinker
    readings = {name: [motion_readings(model, *view) for view in views] for name, views in turns.items()}
    # The hand-made statistic's sign: a turn to the right reads positive x, down positive y (image coordinates).
    assert all(x > 0 for x, _ in readings["right"]) and all(x < 0 for x, _ in readings["left"]), readings
    assert all(y > 0 for _, y in readings["down"]) and all(y < 0 for _, y in readings["up"]), readings


def test_training_leaves_the_sensor_as_set_and_moves_the_rest(thinker) -> None:
    model, _, calibration = thinker
    visual = model.model.visual
    before = {name: p.detach().clone() for name, p in visual.named_parameters()}
    handles = freeze_motion_sensor(model)
    try:
        optimizer = torch.optim.Adam(visual.parameters(), lr=1e-2)
        rows, grid = calibration
        for _ in range(2):
            loss = visual(rows, grid_thw=grid).pooler_output.pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        for handle in handles:
            handle.remove()
    after = dict(visual.named_parameters())
    sensor = slice(-SENSOR_CHANNELS, None)
    assert torch.equal(after["patch_embed.proj.weight"][sensor], before["patch_embed.proj.weight"][sensor])
    assert not torch.equal(after["patch_embed.proj.weight"][:-SENSOR_CHANNELS],
                           before["patch_embed.proj.weight"][:-SENSOR_CHANNELS])
    for name in ("blocks.0.mlp.down_proj.weight", "blocks.3.attn.proj.weight"):
        assert torch.equal(after[name][sensor], before[name][sensor]), name  # nothing learns to write into the sensor's channels
        assert not torch.equal(after[name], before[name]), name
