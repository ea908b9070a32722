"""Cases of a call made while a rank is a hole that must keep it among the
call's holes once ``procs.replace`` filled the hole before the other ranks
answered (see tests/test_hole_race.py for a process killed):

- an actor ended by its endpoint's ``SystemExit`` (its process serves on):
  the call was sent to it, and its failure, arriving from the process, was
  judged once the call completed, after ``replace`` had made the rank serve
  again, so the call raised ``SupervisionError``.  Now a call to such an
  actor is not sent; it fails at once with a hole's error.
- a call made after the process's connection was lost but before its exit
  was handled (the verdict: a hole): it failed at once with what was known
  then, an error not remembered as a hole's.  The errors made in that
  window are now remembered as a hole's when the verdict is a hole.

Real processes; nothing sleeps: the survivors' calls wait on an event of
their actor that the test sets only once ``replace`` returned.
"""

from __future__ import annotations

import asyncio
import os
import signal

from supervision_helpers import DEADLINE

import meshio
from gated_actor import Gated, answered_after_replace
from meshio import endpoint
from meshio._transport._connection import Connection
from meshio._transport._runtime import runtime
from meshio._value_mesh import ValueMesh


class Ending(Gated):
    """Gated, whose actor can end itself and say where it runs."""

    @endpoint
    async def exit(self) -> None:
        raise SystemExit(3)

    @endpoint
    async def addr(self) -> str:
        return meshio.context().proc.addr


async def test_a_call_to_an_actor_its_system_exit_ended_keeps_it_a_hole_after_replace(
        ) -> None:
    async with meshio.this_host().spawn_procs(per_host={"gpus": 3}) as procs:
        g = await procs.spawn("gated", Ending)
        one = g.slice(gpus=1)
        try:
            await asyncio.wait_for(one.exit.call_one(), DEADLINE)
        except meshio.ActorError as e:
            assert e.remote_type == "SystemExit"
        else:
            raise AssertionError("exit() did not raise")

        async def until_hole() -> None:  # the controller hears of it after the actor's stop
            while True:
                try:
                    if (await one.wait.call()).holes:
                        return
                except meshio.SupervisionError as e:  # (not yet: the process answered)
                    assert "SystemExit" in str(e)

        await asyncio.wait_for(until_hole(), DEADLINE)
        pending = g.wait.call()  # rank 1's actor is a hole
        values = await answered_after_replace(procs, g, pending)
        try:
            values.item(gpus=1)
        except meshio.SupervisionError as e:
            assert e.rank == 1 and "SystemExit" in str(e) and "procs.replace(1)" in str(e)
        else:
            raise AssertionError("the hole's item() did not raise")


async def test_a_call_made_before_a_lost_process_exit_is_handled_keeps_it_a_hole(
        ) -> None:
    async with meshio.this_host().spawn_procs(per_host={"gpus": 3}) as procs:
        g = await procs.spawn("gated", Ending)
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
        await answered_after_replace(procs, g, pending)
