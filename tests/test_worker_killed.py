"""A worker SIGKILLed through ``meshio.testing.worker_processes`` while a
call is in flight ends alike on both transports: the call fails with the
kill, the rank becomes a hole (``call()`` lists it, ``wait_failed`` returns
the failure) and the exit status reads ``-SIGKILL``.  (In-process, the
"kill" cancelled the worker's own serving task, whose cancellation reached
the controller's exit watchers: the call hung and nothing was recorded.)"""

from __future__ import annotations

import asyncio
import signal

import pytest

import meshio
from meshio import Actor, SupervisionError, endpoint
from meshio.testing import worker_processes

pytestmark = pytest.mark.meshio_transports()

GUARD = 30.0


class Sleeper(Actor):
    @endpoint
    async def hang(self) -> None:
        await asyncio.Event().wait()

    @endpoint
    async def rank(self) -> int:
        return meshio.current_rank().rank


async def test_a_worker_killed_with_a_call_in_flight_is_a_hole(
        meshio_procs: meshio.ProcMesh) -> None:
    sleepers = await meshio_procs.spawn("sleepers", Sleeper)
    other = await meshio_procs.spawn("other", Sleeper)
    stuck = sleepers.slice(procs=1).hang.call_one()
    # answered after the hang call was delivered (one connection per worker, in order)
    assert await asyncio.wait_for(other.slice(procs=1).rank.call_one(), GUARD) == 1
    worker = worker_processes(meshio_procs)[1]
    worker.send_signal(signal.SIGKILL)
    with pytest.raises(SupervisionError, match=r"killed by signal SIGKILL while Sleeper\.hang "
                                                r"was in flight"):
        await asyncio.wait_for(stuck, GUARD)
    failure = await asyncio.wait_for(meshio_procs.wait_failed(), GUARD)
    assert failure.rank == 1 and failure.cause == "killed by signal SIGKILL"
    assert worker.returncode == -signal.SIGKILL
    hole = meshio_procs.holes
    assert [p.rank for p in hole] == [1]
    ranks = await asyncio.wait_for(other.rank.call(), GUARD)
    assert ranks.holes == hole and ranks.values() == [0]
