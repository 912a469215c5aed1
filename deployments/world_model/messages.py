"""Typed messages between the ingress and a WorldModel replica (pickled by Ray, never on the wire).

A session is opened with its `SessionSpec` (deployments/contract/session_spec.py); these are what flows after.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deployments.contract.events import Interaction


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
    # Wall-clock seconds (time.time()) when the block's frames were decoded: the client's arrival time minus
    # this is what serving adds to the engine (encode, Ray, ingress, WebSocket), on one host's clock.
    frames_ready_at: float | None = None
    sent_at: float | None = None  # time.time() when the replica yielded it (encoded, paced)


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
