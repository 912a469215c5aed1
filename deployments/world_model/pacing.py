"""Pacing (PROTOCOL extension `extra_params.pace_to_media_time`): release chunks on the media timeline.

Without it a fast generator runs far ahead of playback: the client buffers
seconds of video, and a key press lands on screen only after all of it.
With it, chunk k leaves no earlier than its first frame's media time (minus
`pacing_lead_seconds`), so the replica stays about one block ahead. When the
generator falls more than `pacing_max_lag_seconds` behind, the clock is
rebased instead of bursting to catch up (null: never rebase); the protocol
parses the settings (`protocol.video.parse_pacing`). A client's
`session.playback` reports re-anchor the clock to what it actually shows.
"""

from __future__ import annotations

import time

from deployments.contract.session_spec import PacingSettings


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
