"""Clocks: the engine reads time only through one of these, so tests can drive it."""
from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds, monotonic."""
        ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start: float = 0.0):
        self._t = start

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go back")
        self._t += seconds
