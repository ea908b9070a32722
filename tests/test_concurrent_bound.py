"""``@endpoint(concurrent=N)``: at most N calls of an endpoint run at once in
one actor (Ray's ``max_concurrency``); the others wait their turn in arrival
order without holding up the actor's mailbox, with real worker processes.

Nothing here sleeps to wait for something: the actor counts the calls under
way and tells when the n-th one started (a condition it waits on); each wait
is under a generous guard.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import meshio
from meshio import Actor, ActorError, CallTimeout, SupervisionError, endpoint
from meshio.endpoints import EndpointDescriptor

#: generous bound on any single wait on a loaded machine
GUARD = 20.0


class Halt(BaseException):
    """Raised by an endpoint: no ``Exception``, yet the actor goes on."""


class Bounded(Actor):
    def __init__(self) -> None:
        self.gates: dict[int, asyncio.Event] = {}
        #: calls of ``work`` under way now, the most so far, and which
        #: started (in the order they did)
        self.running = 0
        self.peak = 0
        self.started: list[int] = []
        self.changed = asyncio.Condition()
        self.halts = 0

    def gate(self, i: int) -> asyncio.Event:
        return self.gates.setdefault(i, asyncio.Event())

    @endpoint(concurrent=2)
    async def work(self, i: int) -> int:
        async with self.changed:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.started.append(i)
            self.changed.notify_all()
        try:
            await self.gate(i).wait()
        finally:
            self.running -= 1  # (a cancelled call too)
        return i

    @endpoint(concurrent=True)
    async def open(self, i: int) -> None:
        self.gate(i).set()

    @endpoint(concurrent=True)
    async def until_started(self, n: int) -> tuple[list[int], int, int]:
        """Once ``n`` calls of ``work`` have started: which ones, how many
        run now and the most that ever ran at once."""
        async with self.changed:
            await self.changed.wait_for(lambda: len(self.started) >= n)
            return list(self.started), self.running, self.peak

    @endpoint
    async def ping(self) -> str:
        return "pong"

    @endpoint(concurrent=1)
    async def halt(self) -> None:
        self.halts += 1
        raise Halt(f"halt {self.halts}")


async def spawn(procs: meshio.ProcMesh) -> Bounded:
    return await procs.slice(procs=0).spawn("bounded", Bounded)


async def work_stats() -> tuple[int, int, int]:
    """(running, queued) of ``Bounded.work`` of the one actor, and its
    actor's ``queued`` (answered by the worker's loop, after the calls sent
    before on the same connection have arrived)."""
    snapshot = await meshio.stats()
    [actor] = [a for pm in snapshot.proc_meshes for p in pm.processes for a in p.actors]
    [work] = [e for e in actor.endpoints if e.endpoint == "Bounded.work"]
    return work.running, work.queued, actor.queued


async def test_at_most_n_run_and_the_others_start_in_order(procs: meshio.ProcMesh) -> None:
    bounded = await spawn(procs)
    async with asyncio.timeout(GUARD):
        calls = [bounded.work.call_one(i) for i in range(6)]
        assert await bounded.until_started.call_one(2) == ([0, 1], 2, 2)
        assert await work_stats() == (2, 4, 4)  # the 4 others wait, and are shown so
        # The actor still serves its mailbox (and other concurrent endpoints)
        # while 4 calls wait for a slot.
        assert await bounded.ping.call_one() == "pong"
        assert not any(c.done() for c in calls)
        for i in range(4):  # each call that ends lets the next waiting one start
            await bounded.open.call_one(i)
            assert await calls[i] == i
            started, running, _ = await bounded.until_started.call_one(3 + i)
            assert (started, running) == (list(range(3 + i)), 2)
        await bounded.open.call_one(4)
        await bounded.open.call_one(5)
        assert await asyncio.gather(*calls) == list(range(6))
        assert await bounded.until_started.call_one(6) == (list(range(6)), 0, 2)
        assert await work_stats() == (0, 0, 0)


async def test_a_waiting_call_given_up_takes_no_slot_a_running_one_frees_its_own(
        procs: meshio.ProcMesh) -> None:
    bounded = await spawn(procs)
    async with asyncio.timeout(GUARD):
        running = [bounded.work.call_one(i) for i in range(2)]
        assert await bounded.until_started.call_one(2) == ([0, 1], 2, 2)
        with pytest.raises(CallTimeout):  # its deadline passes while it waits
            await bounded.work.options(timeout=0.2).call_one(2)
        gone = bounded.work.call_one(3)
        assert await work_stats() == (2, 1, 1)
        gone.cancel()  # its caller gives up while it waits
        assert await work_stats() == (2, 0, 0)
        # Neither took a slot, so neither freed one: both new calls wait.
        later = [bounded.work.call_one(i) for i in (4, 5)]
        assert await work_stats() == (2, 2, 2)
        await bounded.open.call_one(0)
        assert await running[0] == 0
        assert await bounded.until_started.call_one(3) == ([0, 1, 4], 2, 2)
        running[1].cancel()  # a running call cancelled frees its slot
        assert await bounded.until_started.call_one(4) == ([0, 1, 4, 5], 2, 2)
        await bounded.open.call_one(4)
        await bounded.open.call_one(5)
        assert await asyncio.gather(*later) == [4, 5]
        assert await work_stats() == (0, 0, 0)
        snapshot = await meshio.stats()
        [actor] = [a for pm in snapshot.proc_meshes for p in pm.processes for a in p.actors]
        assert actor.expired == 1  # the call that timed out while it waited


async def test_an_endpoint_raising_a_base_exception_frees_its_slot(
        procs: meshio.ProcMesh) -> None:
    bounded = await spawn(procs)
    async with asyncio.timeout(GUARD):
        # concurrent=1: a slot kept by the first call would hold up the rest
        results = await asyncio.gather(*(bounded.halt.call_one() for _ in range(3)),
                                       return_exceptions=True)
    assert all(isinstance(r, ActorError) and "Halt" in str(r) for r in results), results
    assert sorted(str(r).split("halt ")[1][0] for r in results) == ["1", "2", "3"]


async def test_calls_waiting_when_the_actor_stops_fail(procs: meshio.ProcMesh) -> None:
    bounded = await spawn(procs)
    async with asyncio.timeout(GUARD):
        calls = [bounded.work.call_one(i) for i in range(4)]
        assert await bounded.until_started.call_one(2) == ([0, 1], 2, 2)
        assert await work_stats() == (2, 2, 2)
        await bounded.stop()
        results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, SupervisionError) for r in results), results
    assert all("before handling this call" in str(r) for r in results[2:]), results


@pytest.mark.parametrize(("value", "error"), [
    (0, ValueError), (-3, ValueError), (2.0, TypeError), ("8", TypeError), (None, TypeError)])
def test_a_bad_bound_is_refused_at_decoration(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error) as raised:
        class Bad(Actor):
            @endpoint(concurrent=value)
            async def step(self) -> None: ...
    message = str(raised.value)
    assert "Bad.step" in message and repr(value) in message and "int >= 1" in message


def test_a_bound_on_a_plain_def_is_refused() -> None:
    with pytest.raises(TypeError, match=r"concurrent=4.*Sync\.step.*only 'async def'"):
        class Sync(Actor):
            @endpoint(concurrent=4)
            def step(self) -> None: ...


def test_the_bound_is_kept_on_the_descriptor() -> None:
    work: EndpointDescriptor[Bounded, [int], int] = Bounded.work
    assert (work.concurrent, work.limit) == (True, 2)
    assert (Bounded.open.concurrent, Bounded.open.limit) == (True, None)
    assert (Bounded.ping.concurrent, Bounded.ping.limit) == (False, None)
