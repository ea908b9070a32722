"""Monitors (issue 18 item 6): ``meshio.monitor(mesh)`` reports each death
of a monitored actor's process, with rank, point and cause; at once for one
already down; again after a restart; and ends when the proc mesh stops.
Real processes, killed with real signals."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal

import pytest
from supervision_helpers import DEADLINE, W, supervised

import meshio
from meshio import ActorDown


async def next_down(m: meshio.Monitor) -> ActorDown:
    return await asyncio.wait_for(anext(m), DEADLINE)


async def test_a_death_is_reported_with_rank_point_and_cause_and_again_after_restart() -> None:
    async with supervised() as s:
        w = await s.procs.spawn("w", W, 1)
        async with meshio.monitor(w) as m:
            os.kill(s.old[1], signal.SIGKILL)
            down = await next_down(m)
            assert (down.rank, dict(down.point), down.pid) == (1, {"procs": 1}, s.old[1])
            assert "SIGKILL" in down.cause and down.host
            _, restart = await s.restarted(1)
            os.kill(restart.pid, signal.SIGKILL)  # the new incarnation dies too
            again = await next_down(m)
            assert (again.rank, again.pid) == (1, restart.pid)


async def test_a_slice_is_told_only_of_its_own_actors() -> None:
    async with supervised(3) as s:
        w = await s.procs.spawn("w", W, 1)
        view = w.slice(procs=slice(1, 3))
        async with meshio.monitor(view) as m:
            os.kill(s.old[0], signal.SIGKILL)  # not monitored
            await s.restarted(0)
            os.kill(s.old[2], signal.SIGKILL)
            down = await next_down(m)
            assert (down.rank, down.point) == (2, list(view)[1])


async def test_an_actor_already_down_is_reported_at_once_and_stop_ends_the_monitor() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        w = await procs.spawn("w", W, 1)
        pid = procs.pids[0]
        os.kill(pid, signal.SIGKILL)
        await asyncio.wait_for(procs.wait_failed(), DEADLINE)  # (nothing restarts it)
        async with meshio.monitor(w) as m:
            down = await next_down(m)
            assert (down.rank, down.pid) == (0, pid) and "SIGKILL" in down.cause
            stopping = asyncio.ensure_future(procs.stop())
            assert [d async for d in m] == []  # ends: the mesh is stopped
            await asyncio.wait_for(stopping, DEADLINE)


async def test_bad_targets_are_refused() -> None:
    with pytest.raises(TypeError, match="takes an actor mesh"):
        meshio.monitor(3)  # type: ignore[arg-type]
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        w = await procs.spawn("w", W, 1)
        reference = pickle.loads(pickle.dumps(w))  # as an actor holds it
        with pytest.raises(ValueError, match="did not spawn"):
            meshio.monitor(reference)
