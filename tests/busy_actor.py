"""The actor the tests of calls failed as "not responding" share (direct
calls: test_unresponsive_cancel.py; relayed ones: test_relayed_cancel.py):
it runs one call until cancelled and records what ran after it."""

from __future__ import annotations

import asyncio

import meshio
from meshio import Actor, endpoint


class Busy(Actor):
    def __init__(self) -> None:
        self.log: list[str] = []
        self.running = asyncio.Event()
        self.cancelled = asyncio.Event()

    @endpoint
    async def addr(self) -> str:
        return meshio.context().proc.addr

    @endpoint
    async def wait_long(self) -> None:
        self.running.set()
        try:
            await asyncio.Event().wait()  # until cancelled
        except asyncio.CancelledError:
            self.log.append("wait_long cancelled")
            self.cancelled.set()
            raise

    @endpoint
    async def record(self, what: str) -> None:
        self.log.append(what)

    @endpoint(concurrent=True)
    async def started(self) -> None:
        await self.running.wait()

    @endpoint(concurrent=True)
    async def was_cancelled(self) -> None:
        await self.cancelled.wait()

    @endpoint
    async def seen(self) -> list[str]:
        """What ran (through the mailbox: after what was queued before it)."""
        return self.log
