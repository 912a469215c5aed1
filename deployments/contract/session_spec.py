"""`SessionSpec`: what one world-model session runs with, from the request that asked for it to the engine.

A `session.start` or a `/v1/videos` job is parsed into its wire model, then
resolved against the server's defaults into this (`protocol.video.
resolve_generation`), and nothing re-shapes it after: the ingress echoes its
`config` in `video.start`, the replica reads the stream fields, the engine the
generation fields.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import numpy as np

from deployments.contract.events import Interaction


@dataclass(frozen=True)
class PacingSettings:
    """`extra_params.pace_to_media_time`: chunk k leaves no earlier than its media time minus `lead_seconds`;
    a generator more than `max_lag_seconds` behind rebases the clock (None: never)."""

    lead_seconds: float = 0.0
    max_lag_seconds: float | None = 5.0


@dataclass(frozen=True)
class SessionSpec:
    # What the engine reads; None means the checkpoint's default (a drawn seed for `seed`).
    prompt: str
    height: int
    width: int
    seed: int | None = None
    image: np.ndarray | None = field(default=None, repr=False, compare=False)  # uint8 (H, W, 3), any size: fitted
    num_inference_steps: int | None = None
    flow_shift: float | None = None
    # What the replica reads.
    fps: int = 16
    num_blocks: int | None = None  # None: until stop, disconnect or the session length limit
    num_frames: int | None = None  # the frames num_blocks make (None with it)
    pacing: PacingSettings | None = None
    codec_options: tuple[tuple[str, str], ...] = ()  # extra_params.video_codec_options, checked
    # Submitted before block 0 starts, so they apply from the first frame (an action script); interactions
    # sent mid-stream land on whichever block starts after they arrive.
    interactions: tuple[Interaction, ...] = ()
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex, compare=False)
    # What the session echoes.
    negative_prompt: str | None = None  # a guidance-free model does not use it
    config: dict = field(default_factory=dict, compare=False)  # `video.start`'s config: the fields set, num_frames as used
