"""Clips the built-in world model makes, for the thinker to learn from beside the renderer's.

The renderer's clips teach the questions; on the world model's own video the
answers were less sure (a turn over an empty snowfield the model lets fade, lava
that drifts down the frame while the camera turns), and a world-model video is
what a user plays to `/chat` after `rtv generate`. A clip here is one session of
the world model at 64x64: a biome's prompt, one key held from the first block
(or none), sometimes a prompt switch to another biome part-way (the "what
changed?" answer), its 16 frames/s sampled every 8th frame from a random
offset, as the chat client's 2 frames/s would. The label is what the session
was asked to do, so the thinker learns what the world model shows for it.
"""

from __future__ import annotations

import numpy as np

from deployments.contract.events import Interaction
from deployments.training.behaviour import rollout
from deployments.training.omni_data import BIOME_ANSWERS, MOTIONS, Clip
from deployments.training.world import BIOME_NAMES

STRIDE = 8  # 16 frames/s to the chat path's 2
MIN_BLOCKS, MAX_BLOCKS = 3, 8  # 33-93 frames: 4 to 12 sampled
MAX_PITCH_BLOCKS = 4  # up and down: 12 latent frames of 3 degrees stay inside the player's 40 degrees
CHANGE = 0.3  # share of clips with a prompt switch


def world_clip(engine, seed: int) -> Clip:
    """One clip of the world model `engine`, the same for the same seed."""
    rng = np.random.default_rng([seed, 18, 1])
    start = str(rng.choice(BIOME_NAMES))
    motion = str(rng.choice(list(MOTIONS)))
    blocks = int(rng.integers(MIN_BLOCKS, (MAX_PITCH_BLOCKS if motion in ("up", "down") else MAX_BLOCKS) + 1))
    key = MOTIONS[motion]
    per_block = [[Interaction(event_id=f"keys-{b}", actions=((key,),) * 3)] if key else [] for b in range(blocks)]
    end = start
    if rng.random() < CHANGE:
        end = str(rng.choice([b for b in BIOME_NAMES if b != start]))
        # Switched early enough that the transition (one or two blocks) has settled before the clip ends.
        at = int(rng.integers(1, blocks - 1))
        transition = min(int(rng.integers(1, 3)), blocks - 1 - at)
        per_block[at] = [*per_block[at], Interaction(event_id="prompt", prompt=BIOME_ANSWERS[end], transition_chunks=transition)]
    frames = np.concatenate(rollout(engine, BIOME_ANSWERS[start], per_block, seed=int(rng.integers(2**31))))
    return Clip(frames[int(rng.integers(STRIDE)) :: STRIDE], start, end, motion)


def world_clips(seeds: list[int]) -> list[Clip]:
    """Clips of `seeds`, in order, from the shipped built-in world model."""
    import tempfile
    from pathlib import Path

    from deployments.generation.engine import WorldModelEngine
    from deployments.models.builtin_world_model import install_builtin_world_models

    with tempfile.TemporaryDirectory() as root:
        engine = WorldModelEngine.from_pretrained(install_builtin_world_models(Path(root))["world-model"])
        return [world_clip(engine, seed) for seed in seeds]
