"""The world model with nothing around it: the engine in this process, blocks and fMP4 encoding inline.

The yardstick the served path is compared with: what a session costs before
Ray, the ingress and the WebSocket add anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

PROMPT = "a lighthouse on a cliff at dawn"


def load_engine(model: Path, video_decoder: str | None = None):
    """The engine as a replica loads it by default (its `video_decoder` included: the built-in world model's
    replica decodes with its trained tiny decoder, so a yardstick on the Wan VAE would run 4x slower)."""
    from deployments.config import AppConfig
    from deployments.generation.engine import WorldModelEngine

    return WorldModelEngine.from_pretrained(model, video_decoder=video_decoder or AppConfig.model_fields["video_decoder"].default)


def session_config(size: tuple[int, int], seed: int, steps: int | None = None, prompt: str = PROMPT):
    from deployments.contract.session_spec import SessionSpec

    width, height = size
    return SessionSpec(prompt=prompt, height=height, width=width, seed=seed, num_inference_steps=steps)


@dataclass
class EngineRun:
    """One in-process session: when its first chunk was ready, and each block's engine time."""

    first_chunk_s: float  # open_session + block 0 + its fMP4 encode: what the replica does before chunk 0
    block_s: list[float] = field(default_factory=list)  # generate_block (denoise + commit + VAE decode), per block
    encode_s: list[float] = field(default_factory=list)  # fMP4 encode of that block's frames
    frames: int = 0


def run_session(engine, config, blocks: int, fps: int) -> EngineRun:
    """Open a session and run `blocks` blocks, encoding each one right after it (no overlap)."""
    from deployments.media.fmp4 import FragmentedMP4Encoder

    began = time.perf_counter()
    session = engine.open_session(config)
    encoder = FragmentedMP4Encoder(config.width, config.height, fps)
    run = EngineRun(first_chunk_s=0.0)
    try:
        for index in range(blocks):
            t0 = time.perf_counter()
            block = engine.generate_block(session)
            t1 = time.perf_counter()
            encoder.encode(block.frames)
            t2 = time.perf_counter()
            run.block_s.append(t1 - t0)
            run.encode_s.append(t2 - t1)
            run.frames += block.metadata.num_frames
            if index == 0:
                run.first_chunk_s = t2 - began
        encoder.close()
    finally:
        encoder.discard()
        session.close()
    return run
