"""``procs.options(restart=...)``: meshio's spawn options kept apart from the
constructor arguments of the user's class, on a proc mesh and on a reference
to one held by an actor."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

import meshio
from meshio import Actor, ProcMesh, SchemaError, endpoint
from meshio.supervision import ManualClock, SupervisionEvent

#: generous bound on any single wait on a loaded machine
DEADLINE = 30.0


class W(Actor):
    def __init__(self, k: int) -> None:
        self.k = k

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Spawner(Actor):
    @endpoint
    async def spawn_temporary(self, procs: ProcMesh) -> W:
        return await procs.options(restart="temporary").spawn("temp", W, 2)


async def test_restart_option_through_a_reference() -> None:
    """issue 9 (types): ``options(restart=...)`` on a proc mesh reference held
    by an actor reaches the owning controller: a temporary actor mesh spawned
    that way is not rebuilt when its process is restarted."""
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0, clock=ManualClock())
    events = sup.events()
    async with meshio.this_host().spawn_procs(name="w", supervisor=sup) as procs, \
            meshio.this_host().spawn_procs(name="spawner") as other:
        keep = await procs.spawn("keep", W, 1)  # permanent: the process is restarted
        spawner = await other.spawn("spawner", Spawner)
        temp = await spawner.spawn_temporary.call_one(procs)
        old = await temp.pid.call_one()
        os.kill(old, signal.SIGKILL)

        async def restarted() -> SupervisionEvent:
            async for event in events:
                if event.kind == "restart":
                    return event
            raise AssertionError("events() ended")

        restart = await asyncio.wait_for(restarted(), DEADLINE)
        assert await keep.pid.call_one() == restart.pid != old
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(temp.pid.call_one(), DEADLINE)
        assert "temporary" in str(ei.value)
    await events.aclose()


async def test_restart_keyword_goes_to_the_constructor() -> None:
    """issue 9 (types): ``spawn(..., restart=...)`` no longer means a meshio
    option: it is a constructor argument, so a class without one fails with a
    SchemaError naming it (the old form does not silently succeed)."""
    async with meshio.this_host().spawn_procs() as procs:
        with pytest.raises(SchemaError, match=r"W\.__init__\(\).*unexpected.*'restart'"):
            await procs.spawn("w", W, 1, restart="transient")  # type: ignore[call-arg]
        with pytest.raises(ValueError, match=r"options\(restart=\.\.\.\) must be"):
            procs.options(restart="sometimes")  # type: ignore[arg-type]
