"""The endpoints the many-host tests share (loopback agents, Slurm): an
actor that answers, calls another actor of its kind, or hangs.  Each test
module subclasses it with a ``where`` of its own setting."""

from __future__ import annotations

import asyncio

from meshio import Actor, endpoint


class Hop(Actor):
    @endpoint
    async def echo(self, x: int) -> int:
        return x

    @endpoint
    async def ask(self, other: Hop, x: int) -> list[int]:
        """Call ``other`` (on another host) from this actor."""
        return (await other.echo.call(x)).values()

    @endpoint
    async def hang(self) -> None:
        await asyncio.Event().wait()
