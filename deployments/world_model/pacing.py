"""Pacing (PROTOCOL extension `extra_params.pace_to_media_time`): release chunks on the media timeline.

Without it a fast generator runs far ahead of playback: the client buffers
seconds of video, and a key press lands on screen only after all of it.
With it, chunk k leaves no earlier than its first frame's media time (minus
`pacing_lead_seconds`), so the replica stays about one block ahead. When the
generator falls more than `pacing_max_lag_seconds` behind, the clock is
rebased instead of bursting to catch up (null: never rebase). A client's
`session.playback` reports re-anchor the clock to what it actually shows.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any


class PacingError(ValueError):
    pass


@dataclass(frozen=True)
class PacingSettings:
    lead_seconds: float = 0.0
    max_lag_seconds: float | None = 5.0

    @classmethod
    def from_extra_params(cls, extra: dict[str, Any]) -> "PacingSettings | None":
        """None unless `pace_to_media_time` is true; raises PacingError naming a bad value."""
        enabled = extra.get("pace_to_media_time", False)
        if not isinstance(enabled, bool):
            raise PacingError("extra_params.pace_to_media_time must be true or false")
        if not enabled:
            return None
        lead = extra.get("pacing_lead_seconds", 0.0)
        if isinstance(lead, bool) or not isinstance(lead, (int, float)) or not math.isfinite(lead) or lead < 0:
            raise PacingError("extra_params.pacing_lead_seconds must be a finite number >= 0")
        lag = extra.get("pacing_max_lag_seconds", 5.0)
        if lag is not None and (isinstance(lag, bool) or not isinstance(lag, (int, float)) or not math.isfinite(lag) or lag <= 0):
            raise PacingError("extra_params.pacing_max_lag_seconds must be a finite number > 0, or null")
        return cls(float(lead), None if lag is None else float(lag))


class MediaClock:
    """Maps media time to wall time for one session."""

    def __init__(self, settings: PacingSettings, now=time.monotonic) -> None:
        self.settings = settings
        self._now = now
        self._origin: float | None = None  # wall time at which media time 0 plays

    def delay(self, media_seconds: float) -> float:
        """How long to hold a chunk whose first frame is at `media_seconds` (0 = send now)."""
        now = self._now()
        if self._origin is None:
            self._origin = now - media_seconds  # the first chunk goes at once and anchors the clock
        due = self._origin + media_seconds - self.settings.lead_seconds
        lag = now - due
        if self.settings.max_lag_seconds is not None and lag > self.settings.max_lag_seconds:
            self._origin += lag  # behind by too much: rebase rather than burst
            return 0.0
        return max(0.0, due - now)

    def observe_playback(self, position_seconds: float) -> None:
        """The client shows `position_seconds` now: anchor the timeline there."""
        self._origin = self._now() - position_seconds
