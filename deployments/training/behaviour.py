"""Does a world model do what the keys and prompts ask? Rollouts through the engine, measured.

Shared by the behaviour tests (which assert on these reports) and
`bench/world_behaviour.py` (which prints them): one place runs each
experiment, so the numbers in the README are the ones the tests check.
"""

from __future__ import annotations

import numpy as np

from deployments.contract.events import Interaction
from deployments.contract.session_spec import SessionSpec
from deployments.contract.timeline import frames_in_block
from deployments.training import measures
from deployments.training.trajectories import render_session
from deployments.training.world import biome_weights, render

LOWER_HALF = slice(34, 64)  # ground rows of a 64-row frame: where strafing and turning show best
PAN_PROMPT = "a city plaza"  # a ground with sharp, regular texture


def split_blocks(frames: np.ndarray, blocks: int) -> list[np.ndarray]:
    """A session's frames cut back into its blocks (9, 12, 12, ... frames, as the timeline counts them)."""
    bounds = np.cumsum([0] + [frames_in_block(k) for k in range(blocks)])
    return [frames[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def held(keys: tuple[str, ...], blocks: int, frames_per_block: int = 3, first: int = 0) -> list[list[Interaction]]:
    """Interactions that hold `keys` for every latent frame of `blocks` blocks."""
    return [[Interaction(event_id=f"keys-{first + b}", actions=(tuple(keys),) * frames_per_block)] for b in range(blocks)]


def rollout(engine, prompt: str, per_block: list[list[Interaction]], *, seed: int = 0, image: np.ndarray | None = None, size: int = 64) -> list[np.ndarray]:
    """Frames of each block of a session that sends `per_block[k]` before block k."""
    session = engine.open_session(SessionSpec(prompt=prompt, height=size, width=size, seed=seed, image=image))
    try:
        out = []
        for events in per_block:
            for event in events:
                session.submit(event)
            out.append(engine.generate_block(session).frames)
        return out
    finally:
        session.close()


def pan_report(engine, key: str | None, *, blocks: int = 6, seed: int = 0, prompt: str = PAN_PROMPT) -> dict:
    """Per block: horizontal motion of the lower half, vertical motion of the whole frame, and zoom."""
    frames = rollout(engine, prompt, held((key,) if key else (), blocks), seed=seed)
    return {
        "key": key,
        "dx": [measures.block_motion(f, LOWER_HALF)[0] for f in frames],
        "dy": [measures.block_motion(f)[1] for f in frames],
        "zoom": [measures.block_zoom(f[::3]) for f in frames],
    }


def sign_agreement(values: list[float], sign: int) -> float:
    """Share of blocks whose motion has the expected sign."""
    return float(np.mean([np.sign(v) == sign for v in values]))


def colour_report(engine, prompts: list[str], *, blocks: int = 3, seed: int = 0) -> dict[str, list[float]]:
    """Mean colour of the last block each prompt makes (no keys)."""
    return {p: measures.mean_colour(rollout(engine, p, held((), blocks), seed=seed)[-1]).tolist() for p in prompts}


def transition_report(engine, start: str, target: str, *, transition: int, before: int = 2, after: int = 3, seed: int = 0) -> dict:
    """Distance of each block's mean colour to the target prompt's settled colour, across a switch."""
    per_block = held((), before + transition + after)
    per_block[before].append(Interaction(event_id="switch", prompt=target, transition_chunks=transition))
    frames = rollout(engine, start, per_block, seed=seed)
    settled = measures.mean_colour(rollout(engine, target, held((), before + transition + after), seed=seed)[-1])
    colours = [measures.mean_colour(f) for f in frames]
    return {
        "switch_block": before,
        "transition": transition,
        "distance_to_target": [float(np.linalg.norm(c - settled)) for c in colours],
    }


def fidelity_report(engine, prompt: str, per_block: list[list[Interaction]], *, seed: int = 0, from_image: bool = True) -> dict:
    """A session against the renderer along the same key script, block by block: image-to-video from the
    renderer's own start frame, or (`from_image=False`) text-to-video, which opens at the renderer's start
    pose. `sharpness` is the blocks' edges and texture as a share of the renderer's (1: as sharp)."""
    truth = render_session(prompt, per_block)
    generated = rollout(engine, prompt, per_block, seed=seed, image=truth.frames[0] if from_image else None)
    psnrs, ssims, sharp = [], [], []
    for made, real in zip(generated, split_blocks(truth.frames, len(per_block))):
        psnrs.append(float(np.mean([measures.psnr(g, t) for g, t in zip(made, real)])))
        ssims.append(float(np.mean([measures.ssim(g, t) for g, t in zip(made, real)])))
        sharp.append(float(np.mean([measures.sharpness(g) for g in made]) / max(np.mean([measures.sharpness(t) for t in real]), 1e-9)))
    return {"psnr_db": psnrs, "ssim": ssims, "sharpness": sharp}


def coherence_report(engine, *, blocks: int = 200, every: int = 10, seed: int = 0, prompt: str = "a green meadow") -> dict:
    """A long session with keys held (a walk that turns now and then): does it stay a picture?"""
    pattern = [("w",), ("w",), ("w", "l"), ("w",), ("a",), ("w", "j"), ("d",), ("w",)]
    per_block = [[Interaction(event_id=f"keys-{b}", actions=(pattern[b % len(pattern)],) * 3)] for b in range(blocks)]
    session_frames = rollout(engine, prompt, per_block, seed=seed)
    reference = measures.colour_histogram(np.concatenate(session_frames[:3]))
    sampled = list(range(0, blocks, every)) + ([blocks - 1] if (blocks - 1) % every else [])
    return {
        "blocks": blocks,
        "sampled_blocks": sampled,
        "neighbour_correlation": [measures.neighbour_correlation(session_frames[b][-1]) for b in sampled],
        "contrast": [measures.contrast(session_frames[b][-1]) for b in sampled],
        "histogram_drift": [measures.histogram_distance(reference, measures.colour_histogram(session_frames[b])) for b in sampled],
    }


def renderer_colour(prompt: str) -> np.ndarray:
    """Mean colour the renderer gives a prompt at the start pose (what a generated biome should approach)."""
    from deployments.generation.camera import Pose

    return measures.mean_colour(render(Pose(), biome_weights(prompt)))
