"""A call made while a rank is a hole has that rank among its holes even when
``procs.replace`` fills the hole before the other ranks answer (the pattern
of examples/ft_training.py: replace in the background while the survivors
keep calling); ``stream`` skips it the same way.  The hole-ness of a rank's
failure was judged when the call completed, by which time the rank served
again, so the call raised the hole's ``SupervisionError``.

Real processes and a real SIGKILL; nothing sleeps: the survivors' calls wait
on an event of their actor that the test sets only once ``replace`` returned.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from supervision_helpers import DEADLINE

import meshio
from gated_actor import Gated, answered_after_replace


@asynccontextmanager
async def gated() -> AsyncIterator[tuple[meshio.ProcMesh, Gated]]:
    async with meshio.this_host().spawn_procs(per_host={"gpus": 3}) as procs:
        yield procs, await procs.spawn("gated", Gated)


async def kill(procs: meshio.ProcMesh, rank: int) -> None:
    """SIGKILL ``rank`` (no supervisor) and wait until it is a hole."""
    os.kill(procs.pids[rank], signal.SIGKILL)
    failure = await asyncio.wait_for(procs.wait_failed(), DEADLINE)
    assert failure.rank == rank
    assert [p.rank for p in procs.holes] == [rank]


async def test_call_made_on_a_hole_keeps_it_a_hole_after_replace() -> None:
    async with gated() as (procs, g):
        await kill(procs, 1)
        pending = g.wait.call()  # rank 1 is a hole: its part fails at once
        values = await answered_after_replace(procs, g, pending)
        try:
            values.item(gpus=1)
        except meshio.SupervisionError as e:
            assert e.rank == 1 and "procs.replace(1)" in str(e)
        else:
            raise AssertionError("the hole's item() did not raise")


async def test_stream_skips_a_rank_that_died_in_flight_and_was_replaced() -> None:
    async with gated() as (procs, g):
        await g.slice(gpus=0).open.call_one()
        stream = g.wait.stream()
        first = await asyncio.wait_for(anext(stream), DEADLINE)
        assert (first[0].rank, first[1]) == (0, 0)
        await kill(procs, 1)  # its call was in flight: a hole's failure, not yet seen
        await asyncio.wait_for(procs.replace(1), DEADLINE)
        await g.slice(gpus=2).open.call_one()
        rest = [(p.rank, v) async for p, v in stream]
        assert rest == [(2, 2)]
