"""The actor the hole tests share (test_hole_race.py, test_hole_cases.py):
its calls answer only once the test lets them, after a ``replace``."""

from __future__ import annotations

import asyncio

from supervision_helpers import DEADLINE

import meshio
from meshio import Actor, endpoint
from meshio._value_mesh import ValueMesh


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


async def answered_after_replace(procs: meshio.ProcMesh, g: Gated,
                                 pending: asyncio.Future[ValueMesh[int]]) -> ValueMesh[int]:
    """Fill the hole at rank 1 (``procs.replace(1)``), then let every actor
    answer: ``pending``, a call made while rank 1 was a hole, keeps it a
    hole (ranks 0 and 2 answer), and a call made now reaches all three.
    Returns what ``pending`` got."""
    await asyncio.wait_for(procs.replace(1), DEADLINE)
    assert procs.holes == [] and not pending.done()  # ranks 0 and 2 still wait
    await asyncio.wait_for(g.open.call(), DEADLINE)
    values = await asyncio.wait_for(pending, DEADLINE)
    assert [p.rank for p in values.holes] == [1]
    assert values.values() == [0, 2]
    assert (await asyncio.wait_for(g.wait.call(), DEADLINE)).values() == [0, 1, 2]
    return values
