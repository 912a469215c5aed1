"""Clips the built-in world model makes, for the thinker to learn from beside the renderer's.

The renderer's clips teach the questions; on the world model's own video the
answers were less sure (a turn over an empty snowfield the model lets fade, lava
that drifts down the frame while the camera turns), and a world-model video is
what a user plays to `/chat` after `rtv generate`. A clip here is one session of
the world model at 64x64: a biome's prompt, one key held from the first block
(or none), sometimes a prompt switch to another biome part-way (the "what
changed?" answer), its 16 frames/s sampled every 8th frame from a random
offset, as the chat client's 2 frames/s would. The label is what the session
was asked to do, so the thinker learns what the world model shows for it; but
after a prompt switch, the place is what the clip's last frames show: the world
model's transition does not always reach the new place by the clip's end (it
may pass through a grey murk, or still show the old place), and a clip labelled
with a place it never showed teaches the thinker to name a place it cannot see.
What the last frames show is judged by colour against the world model's own
palette of each place (`biome_palettes`: its sessions holding that place's
prompt), and a picture near neither place is not asked where it is or what
changed.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from deployments.contract.events import Interaction
from deployments.training.behaviour import held, rollout
from deployments.training.measures import colour_histogram, histogram_distance
from deployments.training.omni_data import BIOME_ANSWERS, MOTIONS, Clip
from deployments.training.world import BIOME_NAMES

STRIDE = 8  # 16 frames/s to the chat path's 2
MADE_PER_TASK = 50  # clips a worker makes per task (loading the world model takes a few seconds)
MIN_BLOCKS, MAX_BLOCKS = 3, 8  # 33-93 frames: 4 to 12 sampled
MAX_PITCH_BLOCKS = 4  # up and down: 12 latent frames of 3 degrees stay inside the player's 40 degrees
CHANGE = 0.3  # share of clips with a prompt switch
PALETTE_BINS = 6  # per colour channel: 216 bins, coarse enough for 64x64 frames
PALETTE_FRAMES = 2  # the clip's last sampled frames that say where it ends
PALETTE_BLOCKS = 3  # per reference session: one for each biome and motion
# How much nearer the picture must be to one of the two places than to the other to be named it
# (total variation between colour histograms, 0 to 1): a murk halfway between them is named neither.
PALETTE_MARGIN = 0.05


def holding(key: str | None, blocks: int) -> list[list[Interaction]]:
    """Each block's interactions for a session holding `key` from its first block (None: no key, no interaction)."""
    return held((key,), blocks) if key else [[] for _ in range(blocks)]


def world_clip(engine, seed: int) -> Clip:
    """One clip of the world model `engine`, the same for the same seed."""
    rng = np.random.default_rng([seed, 18, 1])
    start = str(rng.choice(BIOME_NAMES))
    motion = str(rng.choice(list(MOTIONS)))
    blocks = int(rng.integers(MIN_BLOCKS, (MAX_PITCH_BLOCKS if motion in ("up", "down") else MAX_BLOCKS) + 1))
    key = MOTIONS[motion]
    per_block = holding(key, blocks)
    end = start
    if rng.random() < CHANGE:
        end = str(rng.choice([b for b in BIOME_NAMES if b != start]))
        # Switched early enough that the transition (one or two blocks) has settled before the clip ends.
        at = int(rng.integers(1, blocks - 1))
        transition = min(int(rng.integers(1, 3)), blocks - 1 - at)
        per_block[at] = [*per_block[at], Interaction(event_id="prompt", prompt=BIOME_ANSWERS[end], transition_chunks=transition)]
    frames = np.concatenate(rollout(engine, BIOME_ANSWERS[start], per_block, seed=int(rng.integers(2**31))))
    return Clip(frames[int(rng.integers(STRIDE)) :: STRIDE], start, end, motion)


def biome_palettes(engine) -> dict[str, np.ndarray]:
    """What the world model shows for each biome: the colour histogram of the last block of its sessions
    holding that biome's prompt, one session per motion (looking up shows sky, down the ground)."""
    palettes = {}
    for b, biome in enumerate(BIOME_NAMES):
        last_blocks = []
        for m, key in enumerate(MOTIONS.values()):
            last_blocks.append(rollout(engine, BIOME_ANSWERS[biome], holding(key, PALETTE_BLOCKS), seed=1000 * b + m)[-1][::STRIDE // 2])
        palettes[biome] = colour_histogram(np.concatenate(last_blocks), PALETTE_BINS)
    return palettes


def shown_biome(frames: np.ndarray, palettes: dict[str, np.ndarray], places: tuple[str, str]) -> str | None:
    """Which of `places` the last frames show: the one nearer their palette by `PALETTE_MARGIN`, when no
    third place's palette is nearer still; None when the picture is neither (mid-transition, a murk)."""
    seen = colour_histogram(frames[-PALETTE_FRAMES:], PALETTE_BINS)
    distance = {biome: histogram_distance(seen, palette) for biome, palette in palettes.items()}
    first, second = sorted(places, key=distance.__getitem__)
    if min(distance, key=distance.__getitem__) != first or distance[second] - distance[first] < PALETTE_MARGIN:
        return None
    return first


def as_shown(clip: Clip, palettes: dict[str, np.ndarray]) -> Clip:
    """`clip` with the place it ends in as its last frames show it (a clip that holds one prompt as it is)."""
    if clip.start_biome == clip.biome:
        return clip
    return dataclasses.replace(clip, biome=shown_biome(clip.frames, palettes, (clip.start_biome, clip.biome)))


@contextmanager
def shipped_world_model() -> Iterator:
    """The shipped built-in world model's engine, installed in a folder that goes with it."""
    from deployments.generation.engine import WorldModelEngine
    from deployments.models.builtin_world_model import install_builtin_world_models

    with tempfile.TemporaryDirectory() as root:
        yield WorldModelEngine.from_pretrained(install_builtin_world_models(Path(root))["world-model"])


def world_clips(engine, seeds: list[int], palettes: dict[str, np.ndarray]) -> list[Clip]:
    """Clips of `seeds`, in order, labelled as shown (`as_shown`)."""
    return [as_shown(world_clip(engine, seed), palettes) for seed in seeds]


def _made_in_worker(seeds: list[int], palettes: dict[str, np.ndarray]) -> list[Clip]:
    import torch

    torch.set_num_threads(1)  # a worker per core: the same frames as with more threads, bit for bit
    with shipped_world_model() as engine:
        return world_clips(engine, seeds, palettes)


def made_world_clips(seeds: list[int], palettes: dict[str, np.ndarray], workers: int) -> list[Clip]:
    """`world_clips` of the shipped world model, made by `workers` processes (the same clips as by one)."""
    if workers <= 1:
        with shipped_world_model() as engine:
            return world_clips(engine, seeds, palettes)
    import multiprocessing

    tasks = [seeds[i : i + MADE_PER_TASK] for i in range(0, len(seeds), MADE_PER_TASK)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return [clip for made in pool.map(_made_in_worker, tasks, [palettes] * len(tasks)) for clip in made]
