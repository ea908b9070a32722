"""``@endpoint(concurrent=N)``: at most N calls of an endpoint run at once in
one actor (Ray's ``max_concurrency``); the others wait their turn in arrival
order without holding up the actor's mailbox, count against its
``max_queued`` while they wait, and a call back to the endpoint that every
call holding a slot waits for (through its chain, or through calls of
separate roots waiting for a slot) fails with ``DeadlockError``, with real
worker processes.

Nothing here sleeps to wait for something: the actor counts the calls under
way and tells when the n-th one started (a condition it waits on); each wait
is under a generous guard.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

import meshio
from meshio import (
    Actor,
    ActorError,
    CallTimeout,
    DeadlockError,
    SupervisionError,
    context,
    endpoint,
)
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

    @endpoint
    async def release(self, i: int) -> None:
        self.gate(i).set()

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


# --------------------------------------- a call back waiting for its own slot

#: the deadline of a call back (it would wait for a slot until then if its
#: deadlock went unseen): shorter than GUARD, so such a failure is told
TRY = 5.0


class Nested(Actor):
    """``nest(depth)`` calls itself ``depth`` times deep; ``via`` calls back
    through another actor.  A held ``nest`` keeps its slot until opened."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.held = asyncio.Event()

    def me(self) -> Nested:
        return cast(Nested, context().mesh.slice(**dict(context().point)))

    @endpoint(concurrent=2)
    async def nest(self, depth: int, hold: bool = False) -> str:
        if hold:
            self.held.set()
            await self.gate.wait()
            return "held"
        if depth == 0:
            return "bottom"
        try:
            return await self.me().nest.options(timeout=TRY).call_one(depth - 1)
        except DeadlockError as e:
            assert isinstance(e, RuntimeError)
            return f"DeadlockError: {e}"

    @endpoint(concurrent=1)
    async def via(self, bouncer: Bouncer | None) -> str:
        if bouncer is None:
            return "back"
        return await bouncer.bounce.call_one(self.me())

    @endpoint(concurrent=True)
    async def until_held(self) -> None:
        await self.held.wait()

    @endpoint(concurrent=True)
    async def open(self) -> None:
        self.gate.set()


class Bouncer(Actor):
    @endpoint
    async def bounce(self, nested: Nested) -> str:
        try:
            return await nested.via.options(timeout=TRY).call_one(None)
        except DeadlockError as e:
            return f"DeadlockError: {e}"


async def queued_now() -> int:
    """The calls waiting in the one actor of the test (one sample)."""
    snapshot = await meshio.stats()
    [actor] = [a for pm in snapshot.proc_meshes for p in pm.processes for a in p.actors]
    return actor.queued


async def test_a_call_back_into_the_only_slot_fails_with_deadlock_error(
        procs: meshio.ProcMesh) -> None:
    """A call holding the only slot of a concurrent=1 endpoint that calls
    it back through another actor (another process) gets DeadlockError at
    once, naming the chain and the bound, as a reentrant mailbox call does;
    the slot is free again afterwards."""
    nested = await procs.slice(procs=0).spawn("nested", Nested)
    bouncer = await procs.slice(procs=1).spawn("bouncer", Bouncer)
    async with asyncio.timeout(GUARD):
        got = await nested.via.call_one(bouncer)
        assert got.startswith("DeadlockError: reentrant call would deadlock: "
                              "nested[0] -> bouncer[0] -> nested[0]"), got
        assert "Nested.via waits for a slot of @endpoint(concurrent=1)" in got, got
        assert "the call of Nested.via under way in nested[0]" in got, got
        assert await nested.via.call_one(None) == "back"


async def test_a_deadlock_is_told_only_once_every_slot_waits_for_the_call(
        procs: meshio.ProcMesh) -> None:
    """concurrent=2: a call back from one slot takes the other; one more
    level, both slots wait for it: DeadlockError naming both."""
    nested = await procs.slice(procs=0).spawn("nested", Nested)
    async with asyncio.timeout(GUARD):
        assert await nested.nest.call_one(1) == "bottom"
        got = await nested.nest.call_one(2)
    assert got.startswith("DeadlockError: reentrant call would deadlock: "
                          "nested[0] -> nested[0] -> nested[0]"), got
    assert "a slot of @endpoint(concurrent=2)" in got, got
    assert "each of the 2 calls of Nested.nest under way in nested[0]" in got, got


async def test_a_call_back_waits_for_a_slot_another_caller_holds(
        procs: meshio.ProcMesh) -> None:
    """concurrent=2 with one slot held by an unrelated call: a call back
    from the other slot is no deadlock: it waits, and runs once the
    unrelated call ends."""
    nested = await procs.slice(procs=0).spawn("nested", Nested)
    async with asyncio.timeout(GUARD):
        held = nested.nest.call_one(0, hold=True)
        await nested.until_held.call_one()
        back = nested.nest.call_one(1)
        while await queued_now() < 1:  # (sampled: its call back waits for a slot)
            pass
        assert not back.done()
        await nested.open.call_one()
        assert await held == "held"
        assert await back == "bottom"


async def test_calls_waiting_for_a_slot_do_not_hold_up_other_calls(
        procs: meshio.ProcMesh) -> None:
    """max_queued=4: 8 calls wait in the actor for one of the 2 slots of
    ``work``, more than the bound, and the caller's calls to the actor's
    mailbox still go at once (the one that frees a slot among them): slot
    calls are not counted in the caller's allowance, which they could fill
    with calls only such a call lets finish."""
    bounded = await procs.slice(procs=0).options(max_queued=4).spawn("bounded", Bounded)
    async with asyncio.timeout(GUARD):
        calls = [bounded.work.call_one(i) for i in range(10)]
        assert await bounded.until_started.call_one(2) == ([0, 1], 2, 2)
        assert await work_stats() == (2, 8, 8)
        assert await bounded.ping.options(on_full="raise").call_one() == "pong"
        for i in range(10):
            await bounded.release.call_one(i)  # (a mailbox endpoint)
        assert await asyncio.gather(*calls) == list(range(10))
        started, running, peak = await bounded.until_started.call_one(10)
    assert (started, running, peak) == (list(range(10)), 0, 2)


# ------------------------------- calls of separate roots holding every slot


class Work(Actor):
    """``work`` (two slots) calls itself back through ``Back`` once
    released: calls of separate roots, each holding a slot, whose calls
    back wait for one."""

    def __init__(self) -> None:
        self.started = 0
        self.changed = asyncio.Condition()
        self.go = asyncio.Event()
        self.held = asyncio.Event()

    @endpoint(concurrent=2)
    async def work(self, back: Back | None, hold: bool = False) -> str:
        async with self.changed:
            self.started += 1
            self.changed.notify_all()
        if hold:
            await self.held.wait()
            return "held"
        await self.go.wait()
        if back is None:
            return "bottom"
        return await back.x.call_one(cast(Work, context().mesh))

    @endpoint(concurrent=True)
    async def until_started(self, n: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.started >= n)

    @endpoint(concurrent=True)
    async def release(self) -> None:
        self.go.set()

    @endpoint(concurrent=True)
    async def release_held(self) -> None:
        self.held.set()


class Back(Actor):
    @endpoint(concurrent=True)
    async def x(self, work: Work) -> str:
        return await work.work.call_one(None)


async def queued_in(name: str) -> int:
    """The calls waiting in the one actor of mesh ``name`` (one sample)."""
    snapshot = await meshio.stats()
    [actor] = [a for pm in snapshot.proc_meshes for p in pm.processes for a in p.actors
               if a.actor == name]
    return actor.queued


@pytest.mark.parametrize("callers", [2, 3, 5])
async def test_calls_of_separate_roots_holding_every_slot_fail_not_hang(
        procs: meshio.ProcMesh, callers: int) -> None:
    """Each call holding one of the 2 slots calls back into the endpoint
    (through another actor); no one chain holds both, yet every holder
    waits for a call waiting for a slot: the call back that closes that
    fails with DeadlockError, its root then ends, and the next call gets
    the slot.  Of any number of such calls one completes, the others fail
    (each closes the cycle again); none hangs."""
    work = await procs.slice(procs=0).spawn("work", Work)
    back = await procs.slice(procs=1).spawn("back", Back)
    async with asyncio.timeout(GUARD):
        calls = [work.work.call_one(back) for _ in range(callers)]
        await work.until_started.call_one(2)  # both slots held: the others wait
        await work.release.call_one()
        results = await asyncio.gather(*calls, return_exceptions=True)
    assert results.count("bottom") == 1, results
    failed = [r for r in results if r != "bottom"]
    assert all(isinstance(r, ActorError) and r.remote_type == "meshio.DeadlockError"
               for r in failed), results
    message = str(failed[0])
    assert "call would deadlock: work[0] -> back[0] -> work[0]: this call to Work.work " \
        "waits for a slot of @endpoint(concurrent=2)" in message, message
    assert "each of the 2 calls of Work.work under way in work[0] waits (through its " \
        "chain) for this call or for another call waiting for a slot" in message, message


async def test_a_slot_held_by_a_call_that_waits_for_none_of_them_is_no_deadlock(
        procs: meshio.ProcMesh) -> None:
    """One slot's call calls back and waits for a slot; the other's waits
    for something else that ends: no deadlock, the call back runs then."""
    work = await procs.slice(procs=0).spawn("work", Work)
    back = await procs.slice(procs=1).spawn("back", Back)
    async with asyncio.timeout(GUARD):
        held = work.work.call_one(None, hold=True)
        await work.until_started.call_one(1)
        caller = work.work.call_one(back)
        await work.until_started.call_one(2)
        await work.release.call_one()
        while await queued_in("work") < 1:  # (sampled: its call back waits for a slot)
            pass
        assert not caller.done()
        await work.release_held.call_one()
        assert await held == "held"
        assert await caller == "bottom"
