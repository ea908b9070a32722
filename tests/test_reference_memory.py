"""What an actor mesh reference holds: each actor of a spawned mesh gets a
reference to the whole mesh, so anything a reference keeps per point costs
N^2 over a mesh of N actors.  Its calls-in-flight counters (``choose``'s
least-loaded pick) are made by the first call through it, not by its
arrival."""

from __future__ import annotations

import asyncio
import pickle
import tracemalloc

import pytest

import meshio
from meshio import Actor, ActorMesh, current_rank, endpoint
from meshio._extent import Region

#: these tests hold on both transports: worker processes and in-process
pytestmark = pytest.mark.meshio_transports()

#: guard against hangs in tests that wait on remote events (a failure, not a wait)
GUARD = 30.0
POINTS = 4096


class Held(Actor):
    def __init__(self) -> None:
        self.gate = asyncio.Event()

    @endpoint
    async def hold(self) -> int:
        await self.gate.wait()
        return current_rank().rank

    @endpoint(concurrent=True)
    async def open_gate(self) -> None:
        self.gate.set()

    @endpoint
    async def rank(self) -> int:
        return current_rank().rank


class Chooser(Actor):
    @endpoint
    async def around_a_busy_one(self, held: Held, picks: int) -> tuple[int, list[int]]:
        """Through a reference that arrived here: one call stuck on an actor
        of ``held``, then ``picks`` choices one after another; the rank the
        stuck call went to, and the ranks chosen."""
        stuck = asyncio.ensure_future(held.hold.choose())
        chosen = [await held.rank.choose() for _ in range(picks)]
        await held.open_gate.call()
        return await asyncio.wait_for(stuck, GUARD), chosen


def test_a_reference_not_called_through_holds_nothing_per_point() -> None:
    """64 references to a mesh of 4,096 points, as 64 of its actors get
    theirs, hold a few hundred bytes each (their ranks and addresses are
    shared by the process); a counter per point was 32 KiB each."""
    mesh = ActorMesh("wide/1", "wide", Held, Region.full(["procs"], [POINTS]),
                     [f"mem:{rank}" for rank in range(POINTS)])
    wire = pickle.dumps(mesh)
    assert len(pickle.loads(wire)) == POINTS  # (the shared ranks and addresses made here)
    tracemalloc.start()
    try:
        refs = [pickle.loads(wire) for _ in range(64)]
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(len(ref) == POINTS for ref in refs)
    assert held / len(refs) < 4096, f"{held / len(refs):.0f} bytes per reference"


async def test_choose_through_a_reference_avoids_a_busy_actor(procs: meshio.ProcMesh) -> None:
    """The counters a reference makes at its first call count that call:
    while it is stuck on one actor, choose picks the other every time."""
    held = await procs.spawn("held", Held)
    chooser = await procs.slice(procs=0).spawn("chooser", Chooser)
    busy, chosen = await asyncio.wait_for(chooser.around_a_busy_one.call_one(held, 6), GUARD)
    assert chosen == [1 - busy] * 6
