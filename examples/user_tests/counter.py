"""The code under test: an actor a user's project defines."""

from __future__ import annotations

from meshio import Actor, current_rank, endpoint


class Counter(Actor):
    def __init__(self, start: int = 0) -> None:
        self.value = start

    @endpoint
    async def add(self, n: int) -> int:
        self.value += n
        return self.value

    @endpoint
    async def rank(self) -> int:
        return current_rank().rank

    @endpoint
    async def fail(self) -> None:
        raise ValueError("counter says no")
