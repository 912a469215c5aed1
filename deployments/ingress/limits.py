"""Per-session input rates, enforced without sleeping: a message over the rate is dropped with an error."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """`rate` events per second on average, bursts of up to `burst`; `take` says whether this one may pass."""

    def __init__(self, rate: float, burst: float | None = None, now: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, 2 * rate)
        self._now = now
        self._tokens = self.burst
        self._at = now()
        self.refused = 0

    def take(self) -> bool:
        now = self._now()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.refused += 1
        return False
