"""The watchdog: if no fresh chunk arrives within a deadline, the runtime brakes the arm to a hold."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


class Watchdog:
    def __init__(self, timeout_s: float):
        if timeout_s <= 0:
            raise ValueError(f"runtime.watchdog_timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.fired_count = 0
        self._last_feed: float | None = None
        self._tripped = False

    def start(self, now: float) -> None:
        self._last_feed, self._tripped = now, False

    def feed(self, now: float) -> None:
        """A fresh chunk arrived."""
        if self._tripped:
            logger.info("watchdog: fresh chunk at t=%.3fs, resuming", now)
        self._last_feed, self._tripped = now, False

    def expired(self, now: float) -> bool:
        if self._last_feed is None:
            raise RuntimeError("Watchdog.start(now) must be called before use")
        if now - self._last_feed <= self.timeout_s:
            return False
        if not self._tripped:
            self._tripped = True
            self.fired_count += 1
            logger.warning(
                "watchdog: no fresh chunk for %.3fs (deadline %.3fs): braking to a hold",
                now - self._last_feed,
                self.timeout_s,
            )
        return True
