"""Cases of a call made while a rank is a hole that must keep it among the
call's holes once ``procs.replace`` filled the hole before the other ranks
answered (see tests/test_hole_race.py for a process killed):

- an actor ended by its endpoint's ``SystemExit`` (its process serves on):
  the call was sent to it, and its failure, arriving from the process, was
  judged once the call completed, after ``replace`` had made the rank serve
  again, so the call raised ``SupervisionError``.  Now a call to such an
  actor is not sent; it fails at once with a hole's error.

Real processes; nothing sleeps: the survivors' calls wait on an event of
their actor that the test sets only once ``replace`` returned.
"""

from __future__ import annotations

import asyncio

from supervision_helpers import DEADLINE

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

    @endpoint
    async def exit(self) -> None:
        raise SystemExit(3)


async def test_a_call_to_an_actor_its_system_exit_ended_keeps_it_a_hole_after_replace(
        ) -> None:
    async with meshio.this_host().spawn_procs(per_host={"gpus": 3}) as procs:
        g = await procs.spawn("gated", Gated)
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
        await asyncio.wait_for(procs.replace(1), DEADLINE)
        await asyncio.wait_for(g.open.call(), DEADLINE)
        values = await asyncio.wait_for(pending, DEADLINE)
        assert [p.rank for p in values.holes] == [1]
        assert values.values() == [0, 2]
        try:
            values.item(gpus=1)
        except meshio.SupervisionError as e:
            assert e.rank == 1 and "SystemExit" in str(e) and "procs.replace(1)" in str(e)
        else:
            raise AssertionError("the hole's item() did not raise")
        assert (await asyncio.wait_for(g.wait.call(), DEADLINE)).values() == [0, 1, 2]
