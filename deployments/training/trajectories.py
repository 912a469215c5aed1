"""Random sessions in the procedural world: held keys and prompt switches, rendered frame by frame.

A trajectory is driven through the engine's own `Director`, so poses and
prompt blends follow exactly the rules a served session follows (key step
sizes, blocks, transitions). Latent frame j of a block ends at the Director's
j-th pose; the video frames between two latent frames are rendered at poses
in between (the causal VAE folds video frames 4j-3 .. 4j into latent frame j).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from deployments.generation.camera import Pose
from deployments.contract.events import Interaction
from deployments.generation.interactions import Director
from deployments.training.world import BIOMES, mix_weights, render

# Key sets a player holds, with how often each is chosen.
HELD_KEYS: tuple[tuple[tuple[str, ...], float], ...] = (
    ((), 3.0),
    (("w",), 3.0), (("s",), 1.0), (("a",), 1.5), (("d",), 1.5),
    (("j",), 2.0), (("l",), 2.0), (("i",), 1.0), (("k",), 1.0),
    (("w", "j"), 1.0), (("w", "l"), 1.0), (("w", "a"), 0.5), (("w", "d"), 0.5),
    (("s", "j"), 0.3), (("s", "l"), 0.3), (("a", "l"), 0.3), (("d", "j"), 0.3),
)
MAX_PITCH_DEGREES = 40.0  # the random player turns back before looking further up or down

NEUTRAL_NOUNS = ("field", "landscape", "valley", "plain", "hills", "world", "place", "scene", "view", "land", "road", "park")
NEUTRAL_ADJECTIVES = ("quiet", "wide", "open", "calm", "bright", "distant", "endless", "peaceful", "strange", "lonely")
SUFFIXES = ("", "", " at noon", " at dawn", " at dusk", " under a clear sky", " in the morning", " on a sunny day", " seen from above")
# Prompts named in the README and the page: trained on word for word.
DEMO_PROMPTS = (
    "a lighthouse on a cliff at dawn",
    "a snowy field",
    "a green meadow",
    "a sandy desert",
    "a lava field",
    "a dense forest",
    "a city plaza",
    "an ocean shore",
)


def random_prompt(rng: np.random.Generator) -> str:
    """A prompt naming one or two biomes in varied words, or now and then none (a deterministic mix)."""
    roll = rng.random()
    if roll < 0.15:
        return str(rng.choice(DEMO_PROMPTS))
    if roll < 0.25:
        words = [str(rng.choice(NEUTRAL_ADJECTIVES)), str(rng.choice(NEUTRAL_NOUNS))]
        return f"a {' '.join(words)}{rng.choice(SUFFIXES)}"
    first = BIOMES[rng.integers(len(BIOMES))]
    word = str(rng.choice(first.keywords))
    if rng.random() < 0.15:
        second = BIOMES[rng.integers(len(BIOMES))]
        return f"{word} and {rng.choice(second.keywords)}{rng.choice(SUFFIXES)}"
    shape = rng.integers(4)
    if shape == 0:
        text = word
    elif shape == 1:
        text = f"a {word} {rng.choice(NEUTRAL_NOUNS)}"
    elif shape == 2:
        text = f"a {rng.choice(NEUTRAL_ADJECTIVES)} {word}"
    else:
        text = f"the {word}"
    return f"{text}{rng.choice(SUFFIXES)}"


@dataclass
class Trajectory:
    """One rendered session: video frames, and what each block was conditioned on."""

    frames: np.ndarray  # uint8 (T, H, W, 3), T = 12 * blocks - 3
    prompt_mixes: list[tuple[tuple[str, float], ...]]  # per block
    relative_poses: list[tuple[Pose, ...]]  # per block: its latent frames' poses in the block's start frame
    frame_poses: list[Pose]  # per video frame
    frame_weights: np.ndarray  # (T, biomes)


def random_session_plan(rng: np.random.Generator, blocks: int, frames_per_block: int = 3, switch_probability: float = 0.12):
    """The interactions a random player sends before each block: (prompt, [(block, Interaction), ...])."""
    prompt = random_prompt(rng)
    keys, weights = zip(*HELD_KEYS)
    p = np.array(weights) / sum(weights)
    per_block: list[list[Interaction]] = []
    held: tuple[str, ...] = ()
    left = 0
    pitch = 0.0
    for b in range(blocks):
        events: list[Interaction] = []
        if b > 0 and rng.random() < switch_probability:
            events.append(Interaction(event_id=f"prompt-{b}", prompt=random_prompt(rng), transition_chunks=int(rng.integers(0, 5))))
        frames = []
        for _ in range(frames_per_block):
            if left == 0:
                held = keys[rng.choice(len(keys), p=p)]
                left = int(rng.integers(1, 10))
            if ("i" in held and pitch > MAX_PITCH_DEGREES) or ("k" in held and pitch < -MAX_PITCH_DEGREES):
                held = ("k",) if "i" in held else ("i",)
            pitch += 3.0 * (("i" in held) - ("k" in held))
            frames.append(held)
            left -= 1
        events.append(Interaction(event_id=f"keys-{b}", actions=tuple(frames)))
        per_block.append(events)
    return prompt, per_block


def random_origin(seed: int, reach: float = 40.0) -> Pose:
    """A place and heading on the ground to start a session from (the model never sees absolute poses)."""
    from deployments.generation.camera import quat_axis_angle

    rng = np.random.default_rng([seed, 7])
    x, z = rng.uniform(-reach, reach, size=2)
    return Pose((float(x), 0.0, float(z)), tuple(quat_axis_angle(1, float(rng.uniform(0, 2 * math.pi))).tolist()))


def render_trajectory(seed: int, blocks: int, height: int = 64, width: int = 64, frames_per_block: int = 3, temporal: int = 4, *, anywhere: bool = False) -> Trajectory:
    """A random session of `blocks` blocks, rendered; the same seed renders the same frames.

    It starts at the world's origin, or with `anywhere` at a random place and heading."""
    rng = np.random.default_rng(seed)
    prompt, per_block = random_session_plan(rng, blocks, frames_per_block)
    origin = random_origin(seed) if anywhere else Pose()
    return render_session(prompt, per_block, height, width, frames_per_block, temporal, origin=origin)


def render_session(prompt: str, per_block: list[list[Interaction]], height: int = 64, width: int = 64, frames_per_block: int = 3, temporal: int = 4, *, origin: Pose = Pose()) -> Trajectory:
    """What the world looks like for a session: its start prompt and the interactions sent before each block.

    This is the ground truth a generated session is compared with: frame 0 is the start image an
    image-to-video session is given. The session's poses are taken relative to `origin`."""
    director = Director(prompt, frames_per_block, accepts_camera=True)
    latent_poses: list[Pose] = []
    latent_weights: list[np.ndarray] = []
    mixes, relative = [], []
    for events in per_block:
        for event in events:
            director.submit(event)
        plan = director.plan_block()
        mixes.append(plan.prompt_mix)
        relative.append(tuple(p.relative_to(plan.reference_pose) for p in plan.poses))
        weights = mix_weights(plan.prompt_mix)
        for pose in plan.poses:
            latent_poses.append(pose)
            latent_weights.append(weights)
    frame_poses = [latent_poses[0]]
    frame_weights = [latent_weights[0]]
    for j in range(1, len(latent_poses)):
        for s in range(1, temporal + 1):
            frame_poses.append(latent_poses[j - 1].interpolate(latent_poses[j], s / temporal))
            frame_weights.append(latent_weights[j])
    frames = np.stack([render(origin.compose(p), w, height, width) for p, w in zip(frame_poses, frame_weights)])
    return Trajectory(frames, mixes, relative, frame_poses, np.stack(frame_weights))
