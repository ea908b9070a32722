"""The actor the hole tests share (test_hole_race.py, test_hole_cases.py):
its calls answer only once the test lets them, after a ``replace``."""

from __future__ import annotations

import asyncio

import meshio
from meshio import Actor, endpoint


class Gated(Actor):
    """``wait`` answers (its rank) once ``open`` was called on the same actor."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()

    @endpoint(concurrent=True)  # (opened while waiting)
    async def wait(self) -> int:
        await self.opened.wait()
        return meshio.current_rank().rank

    @endpoint(concurrent=True)
    async def open(self) -> None:
        self.opened.set()
