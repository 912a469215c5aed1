"""What a user sends mid-stream, as values: the protocol parses the wire into these, the engine plays them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class CameraCommand:
    """`velocity`: a delta in the camera's own frame per latent frame until replaced; `target`: an absolute pose."""

    mode: Literal["velocity", "target"]
    translation: tuple[float, float, float] = (0.0, 0.0, 0.0)
    rotation: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 1.0)  # quaternion (x, y, z, w)


@dataclass(frozen=True)
class Interaction:
    event_id: str
    prompt: str | None = None
    camera: CameraCommand | None = None
    actions: tuple[tuple[str, ...], ...] | None = None  # one key set per latent frame
    transition_chunks: int = 0
