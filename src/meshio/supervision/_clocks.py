"""Clocks for heartbeats and restart-intensity windows: the real one, and
one that moves only when a test tells it to."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ("Clock", "ManualClock", "MonotonicClock")


class Clock(Protocol):
    """Time for heartbeats and intensity windows (injectable for tests).

    Any object with these two methods is a clock (it need not derive from
    this class); ``Supervisor(clock=...)`` refuses, with a ``TypeError``, one
    that lacks either.
    """

    def now(self) -> float: ...
    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """The real clock: the event loop's monotonic time."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ManualClock:
    """A clock that moves only when told to: ``clock.advance(seconds)``.

    Sleepers wake, in deadline order, when the clock passes their deadline.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self._now + seconds, fut))
        await fut

    def advance(self, seconds: float) -> None:
        """Move time forward, waking every sleeper whose deadline passed."""
        self._now += seconds
        due = sorted((s for s in self._sleepers if s[0] <= self._now), key=lambda s: s[0])
        self._sleepers = [s for s in self._sleepers if s[0] > self._now]
        for _, fut in due:
            if not fut.done():
                fut.set_result(None)

    @property
    def sleepers(self) -> int:
        """How many tasks are waiting on this clock (for tests to sync on)."""
        return sum(1 for _, f in self._sleepers if not f.done())
