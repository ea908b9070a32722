"""More cases of a call made while a rank is a hole that must keep it among
the call's holes once ``procs.replace`` filled the hole before the other
ranks answered (see tests/test_hole_race.py and tests/test_hole_cases.py):

- (b) a call made after the process's connection was lost but before its
  exit was handled (the verdict: a hole): it failed at once with what was
  known then, an error not remembered as a hole's, so once ``replace``
  finished first the call raised ``SupervisionError``.  The errors made in
  that window are now remembered as a hole's when the verdict is a hole.

Real processes and a real SIGKILL; nothing sleeps: the survivors' calls wait
on an event of their actor that the test sets only once ``replace`` returned.
"""

from __future__ import annotations

import asyncio
import os
import signal

from supervision_helpers import DEADLINE

import meshio
from meshio import Actor, endpoint
from meshio._transport._connection import Connection
from meshio._transport._runtime import runtime
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

    @endpoint
    async def addr(self) -> str:
        return meshio.context().proc.addr


async def test_a_call_made_before_a_lost_process_exit_is_handled_keeps_it_a_hole(
        ) -> None:
    async with meshio.this_host().spawn_procs(per_host={"gpus": 3}) as procs:
        g = await procs.spawn("gated", Gated)
        addr = await asyncio.wait_for(g.slice(gpus=1).addr.call_one(), DEADLINE)
        rt = runtime()
        lost = rt.on_lost[addr]
        made: asyncio.Future[asyncio.Future[ValueMesh[int]]] = rt.loop.create_future()

        def then_call(conn: Connection) -> None:  # the call goes before the exit is handled
            lost(conn)
            made.set_result(asyncio.ensure_future(g.wait.call()))

        rt.on_lost[addr] = then_call
        os.kill(procs.pids[1], signal.SIGKILL)
        pending = await asyncio.wait_for(made, DEADLINE)
        failure = await asyncio.wait_for(procs.wait_failed(), DEADLINE)
        assert failure.rank == 1 and [p.rank for p in procs.holes] == [1]
        await asyncio.wait_for(procs.replace(1), DEADLINE)
        assert procs.holes == [] and not pending.done()  # ranks 0 and 2 still wait
        await asyncio.wait_for(g.open.call(), DEADLINE)
        values = await asyncio.wait_for(pending, DEADLINE)
        assert [p.rank for p in values.holes] == [1]
        assert values.values() == [0, 2]
        assert (await asyncio.wait_for(g.wait.call(), DEADLINE)).values() == [0, 1, 2]
