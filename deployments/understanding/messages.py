"""Typed messages between the ingress and an Understanding replica (pickled by Ray, never on the wire)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ChatRequest:
    session_id: str
    system_prompt: str | None = None
    max_frames: int = 64  # the ingress's ring; the replica keeps the same frames
    live_context: bool = False  # questions see every retained frame: keep them prefilled
    replace_running_answer: bool = False  # a newer query ends the running answer (else: each in full, in order)


@dataclass(frozen=True)
class ChatAccepted:
    session_id: str
    replica_id: str
    takes_audio: bool
    mailbox: Any


@dataclass(frozen=True)
class ChatRefused:
    code: str
    message: str
    retry_after_s: float | None = None


# -- ingress -> replica (through the mailbox) ------------------------------------------
@dataclass(frozen=True)
class FrameIn:
    """A frame the ingress retained (after the frame filter), numbered in the order retained."""

    seq: int
    image: np.ndarray  # uint8 (H, W, 3)
    pts_ms: float | None = None


@dataclass(frozen=True)
class Query:
    query_id: str
    text: str
    frame_seqs: tuple[int, ...]  # the sampled frames (already sent as `FrameIn`), in order
    fps: float
    audio: np.ndarray | None = None  # float32 mono 16 kHz, what was buffered since the last query


@dataclass(frozen=True)
class EndChat:
    pass


# -- replica -> ingress (items of the session stream) ----------------------------------
@dataclass(frozen=True)
class QueryStarted:
    query_id: str
    frames: int = 0  # what the model is given: sampled frames, seconds of audio
    audio_seconds: float = 0.0


@dataclass(frozen=True)
class TextDelta:
    query_id: str
    delta: str


@dataclass(frozen=True)
class QueryFinished:
    query_id: str
    text: str
    interrupted: bool = False  # a newer query replaced it
    error: str | None = None  # why it failed, for logs; the client gets the fixed text


@dataclass(frozen=True)
class ChatEnded:
    reason: str = "done"  # done | lease_expired
