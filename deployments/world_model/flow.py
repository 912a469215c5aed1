"""Flow control: how far generation may run ahead of what the client has taken.

Through Serve's proxy the replica never sees the client's socket fill up (the
proxy buffers whatever the ingress sends), so the client's progress comes from
the protocol instead. The rule (README, "Slow clients"):

- A client confirms progress with `session.playback` (position_seconds: media
  time it has shown or stored). Between reports its position is taken to
  advance at real time for at most `report_grace_s`.
- A client that has never reported is taken to consume at real time from its
  first chunk, which is what a live player does.
- Generation waits while the media sent is more than `ahead_limit_s` beyond
  that position; memory per session is bounded by that many seconds of media
  plus the two blocks in the pipeline.
- A reporting client whose position has not moved for `stalled_after_s` while
  generation waits is too slow: the session ends with `client_too_slow`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class FlowSettings:
    ahead_limit_s: float = 30.0
    stalled_after_s: float = 20.0
    report_grace_s: float = 2.0


class ClientWindow:
    def __init__(self, settings: FlowSettings, now: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._now = now
        self._first_chunk_at: float | None = None
        self._reported: float | None = None
        self._reported_at = 0.0
        self._moved_at = now()  # the last time the client's position advanced (or the window opened)
        self._blocked_since: float | None = None

    def chunk_sent(self) -> None:
        if self._first_chunk_at is None:
            self._first_chunk_at = self._now()

    def observe_playback(self, position_seconds: float) -> None:
        now = self._now()
        if self._reported is not None and position_seconds < self._reported:
            return  # a seek back or a late report: what was confirmed stays confirmed
        if self._reported is None or position_seconds > self._reported:
            self._moved_at = now
        self._reported = position_seconds
        self._reported_at = now

    def position(self) -> float:
        """Where the client is taken to be on the media timeline now."""
        now = self._now()
        if self._reported is not None:
            return self._reported + min(now - self._reported_at, self.settings.report_grace_s)
        if self._first_chunk_at is None:
            return 0.0
        return now - self._first_chunk_at

    def may_generate(self, sent_seconds: float) -> bool:
        """True when one more block may start; records how long generation has been held back."""
        if sent_seconds - self.position() <= self.settings.ahead_limit_s:
            self._blocked_since = None
            return True
        if self._blocked_since is None:
            self._blocked_since = self._now()
        return False

    def too_slow(self) -> bool:
        """A reporting client that stopped advancing while generation waits on it."""
        if self._reported is None or self._blocked_since is None:
            return False
        now = self._now()
        return now - max(self._moved_at, self._blocked_since) > self.settings.stalled_after_s
