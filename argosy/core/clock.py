"""Injected clocks: the scheduler, simulator and watchdog never call time.time() directly.

clock = FakeClock(start_s=0.0)
clock.advance(5.0)
assert clock.now_s() == 5.0
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds; what it counts from is the clock's business."""

    def now_s(self) -> float: ...


class SystemClock:
    """Wall-monotonic time of this process."""

    def now_s(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to; for tests and the simulator."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def now_s(self) -> float:
        return self._now_s

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "time never runs backwards"
        self._now_s += seconds

    def set(self, now_s: float) -> None:
        assert now_s >= self._now_s, "time never runs backwards"
        self._now_s = now_s
