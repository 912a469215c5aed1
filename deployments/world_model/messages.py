"""Typed messages between the ingress and a WorldModel replica (pickled by Ray, never on the wire)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from deployments.generation.interactions import Interaction
from deployments.world_model.pacing import PacingSettings


@dataclass(frozen=True)
class SessionRequest:
    """A validated `session.start`, resolved against the server's defaults."""

    session_id: str
    prompt: str
    height: int
    width: int
    fps: int
    seed: int | None = None
    num_blocks: int | None = None  # None: until stop, disconnect or the session length limit
    num_inference_steps: int | None = None
    flow_shift: float | None = None
    image: np.ndarray | None = None
    pacing: PacingSettings | None = None  # release chunks on the media timeline (extra_params.pace_to_media_time)
    # Submitted before block 0 starts, so they always apply from the first frame (a video job's action script);
    # interactions sent through the mailbox land on whichever block starts after they arrive.
    interactions: tuple[Interaction, ...] = ()
    codec_options: tuple[tuple[str, str], ...] = ()  # x264 options the session asked for (checked by the protocol)


# -- replica -> ingress (items of the session stream) ---------------------------------
@dataclass(frozen=True)
class SessionAccepted:
    session_id: str
    replica_id: str
    seed: int
    mailbox: Any  # the replica's MailboxActor handle


@dataclass(frozen=True)
class SessionRefused:
    code: str  # "over_capacity" or "invalid_request"
    message: str
    retry_after_s: float | None = None


@dataclass(frozen=True)
class MediaChunk:
    data: bytes
    num_frames: int  # frames the fragment completes (a block's last one leaves with the next chunk)
    block_index: int
    block_frames: int = 0  # frames the block generated: the wire's `num_frames`
    started_event_ids: tuple[str, ...] = ()
    active_event_ids: tuple[str, ...] = ()
    completed_event_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Trailer:
    data: bytes
    num_frames: int


@dataclass(frozen=True)
class InteractionFailed:
    event_id: str
    reason: str


@dataclass(frozen=True)
class SessionEnded:
    stopped: bool
    reason: str = "complete"  # complete | stopped | lease_expired | max_length | client_too_slow | error
    blocks: int = 0
    frames: int = 0


# -- ingress -> replica (through the mailbox) ------------------------------------------
@dataclass(frozen=True)
class Interact:
    interaction: Interaction


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Playback:
    position_seconds: float
