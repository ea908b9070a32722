"""A mailbox call that finds its actor idle runs in the loop callback that
brought it (``ActorCell._begin``), not after a wake-up of the mailbox task:
everything an endpoint can see must be as if it ran in that task.  It runs
as the task (``asyncio.current_task()``) in the task's context; one that
has to wait is taken over by the task, in mailbox order, and cancellations
(its caller's, its own ``asyncio.timeout``, the actor's stop) reach it
wherever it waits; one posted within a task queues for the mailbox task.
That it pays is measured in ``benchmarks/bench_small.py``, not here."""

from __future__ import annotations

import asyncio
import contextvars

import msgspec
import pytest

import meshio
from meshio import Actor, ActorError, SupervisionError, endpoint
from meshio._cell import ActorCell
from meshio._transport._connection import Pending
from meshio._transport._messages import Call
from meshio._transport._runtime import _local, runtime

GUARD = 30.0

remembered: contextvars.ContextVar[int] = contextvars.ContextVar("remembered", default=0)


class Served(Actor):
    def __init__(self) -> None:
        self.log: list[str] = []
        self.waiting = asyncio.Event()
        self.never = asyncio.Event()

    @endpoint
    async def task(self) -> tuple[int, str]:
        task = asyncio.current_task()
        assert task is not None
        return id(task), task.get_name()

    @endpoint
    async def task_after_waiting(self) -> tuple[int, int]:
        before = asyncio.current_task()
        await asyncio.sleep(0)
        return id(before), id(asyncio.current_task())

    @endpoint
    async def remember(self, x: int, wait: bool) -> None:
        if wait:
            await asyncio.sleep(0)
        remembered.set(x)

    @endpoint
    async def recall(self) -> int:
        return remembered.get()

    @endpoint
    async def hold(self, i: int) -> int:
        self.log.append(f"start {i}")
        for _ in range(3):
            await asyncio.sleep(0)
        self.log.append(f"end {i}")
        return i

    @endpoint
    async def history(self) -> list[str]:
        return self.log

    @endpoint
    async def timed_out(self, after: float) -> bool:
        try:
            async with asyncio.timeout(after):
                await self.never.wait()
        except TimeoutError:
            return True
        return False

    @endpoint
    async def wait_forever(self) -> None:
        self.waiting.set()
        try:
            await self.never.wait()
        except asyncio.CancelledError:
            self.log.append("cancelled")
            raise

    @endpoint(concurrent=True)
    async def until_waiting(self) -> None:
        await self.waiting.wait()


@pytest.mark.meshio_transports("processes", "in-process")
async def test_calls_run_as_the_mailbox_task_in_its_context(procs: meshio.ProcMesh) -> None:
    served = (await procs.spawn("served", Served)).slice(procs=0)
    first = await asyncio.wait_for(served.task.call_one(), GUARD)
    assert first[1] == "mailbox"
    assert await asyncio.wait_for(served.task.call_one(), GUARD) == first
    before, after = await asyncio.wait_for(served.task_after_waiting.call_one(), GUARD)
    assert before == after == first[0]
    # what one call sets in the task's context the next call sees, whether
    # it ran to its end at once or waited on the way
    await asyncio.wait_for(served.remember.call_one(5, False), GUARD)
    assert await asyncio.wait_for(served.recall.call_one(), GUARD) == 5
    await asyncio.wait_for(served.remember.call_one(7, True), GUARD)
    assert await asyncio.wait_for(served.recall.call_one(), GUARD) == 7


@pytest.mark.meshio_transports("processes", "in-process")
async def test_a_call_that_waits_is_taken_over_and_the_next_ones_wait_their_turn(
        procs: meshio.ProcMesh) -> None:
    served = (await procs.spawn("served", Served)).slice(procs=0)
    assert await asyncio.wait_for(
        asyncio.gather(*[served.hold.call_one(i) for i in range(4)]), GUARD) == [0, 1, 2, 3]
    assert await asyncio.wait_for(served.history.call_one(), GUARD) == [
        f"{what} {i}" for i in range(4) for what in ("start", "end")]


@pytest.mark.meshio_transports("processes", "in-process")
async def test_an_endpoints_own_timeout_reaches_it_wherever_it_waits(
        procs: meshio.ProcMesh) -> None:
    served = (await procs.spawn("served", Served)).slice(procs=0)
    # timeout(0) cancels the task before it has taken the call over
    assert await asyncio.wait_for(served.timed_out.call_one(0.0), GUARD) is True
    assert await asyncio.wait_for(served.timed_out.call_one(0.01), GUARD) is True
    assert await asyncio.wait_for(served.recall.call_one(), GUARD) == 0  # still serving


@pytest.mark.meshio_transports("processes", "in-process")
async def test_a_waiting_call_is_cancelled_by_its_caller(procs: meshio.ProcMesh) -> None:
    served = (await procs.spawn("served", Served)).slice(procs=0)
    call = asyncio.ensure_future(served.wait_forever.call_one())
    await asyncio.wait_for(served.until_waiting.call_one(), GUARD)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # the next mailbox call runs once the cancelled one has ended
    assert await asyncio.wait_for(served.history.call_one(), GUARD) == ["cancelled"]


@pytest.mark.meshio_transports("processes", "in-process")
async def test_stopping_the_actor_ends_a_waiting_call(procs: meshio.ProcMesh) -> None:
    actors = await procs.spawn("served", Served)
    served = actors.slice(procs=0)
    call = asyncio.ensure_future(served.wait_forever.call_one())
    await asyncio.wait_for(served.until_waiting.call_one(), GUARD)
    await asyncio.wait_for(actors.stop(), GUARD)
    with pytest.raises((SupervisionError, ActorError), match="stopped"):
        await asyncio.wait_for(call, GUARD)


@pytest.mark.meshio_transports("in-process")
async def test_a_call_posted_within_a_task_waits_for_the_mailbox_task(
        procs: meshio.ProcMesh) -> None:
    # Calls arrive in loop callbacks, outside any task; one posted within a
    # task (here the test's own, on the loop the in-process worker shares)
    # cannot run as the mailbox task there: it queues, and that task runs it.
    served = (await procs.spawn("served", Served)).slice(procs=0)
    assert await asyncio.wait_for(served.hold.call_one(0), GUARD) == 0  # idle again
    controller = runtime()
    worker = next(rt for rt in list(_local.values()) if rt is not controller and rt.actors)
    target, cell = next(iter(worker.actors.items()))
    assert isinstance(cell, ActorCell)
    desc = cell.endpoints["hold"]
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    up = controller.conns[worker.addr]
    req = up.next_req(Pending(fut, desc.unpack_result, "hold", "served", None))
    cell.post(worker.conns[controller.addr], Call(
        req, target, "hold", msgspec.Raw(msgspec.msgpack.encode({"i": 5}))), [])
    assert cell.serving is None and len(cell.mailbox) == 1  # not started here
    assert await asyncio.wait_for(fut, GUARD) == 5
    assert await asyncio.wait_for(served.history.call_one(), GUARD) == [
        "start 0", "end 0", "start 5", "end 5"]


class Parker(Actor):
    """Parks the mailbox in a call that waits forever; records the calls
    that start behind it."""

    def __init__(self) -> None:
        self.parked = 0
        self.changed = asyncio.Event()
        self.started: list[int] = []

    @endpoint
    async def park(self) -> None:
        self.parked += 1
        self.changed.set()
        await asyncio.Event().wait()

    @endpoint(concurrent=True)
    async def until_parked(self, n: int) -> None:
        while self.parked < n:
            self.changed.clear()
            await self.changed.wait()

    @endpoint
    async def work(self, i: int) -> None:
        self.started.append(i)

    @endpoint
    async def begun(self) -> list[int]:
        return self.started


@pytest.mark.meshio_transports("processes", "in-process")
async def test_calls_given_up_together_never_start(procs: meshio.ProcMesh) -> None:
    """A call under way and the calls queued behind it, cancelled together
    (``cancel()`` on each, in one turn of the caller's loop): none of the
    queued ones starts.  The first Cancel went out alone, at once (a turn's
    first frame), the others at the end of the turn: the actor started the
    next call before its Cancel came, about one time in three."""
    parker = (await procs.spawn("parker", Parker)).slice(procs=0)
    for n in range(1, 11):
        first = parker.park.call_one()
        await asyncio.wait_for(parker.until_parked.call_one(n), GUARD)
        queued = [parker.work.call_one(i) for i in range(3)]
        # (answered at once, after the three calls came: they are in the mailbox)
        await asyncio.wait_for(parker.until_parked.call_one(n), GUARD)
        for fut in (first, *queued):
            fut.cancel()
        assert await asyncio.wait_for(parker.begun.call_one(), GUARD) == [], n
        for fut in (first, *queued):
            with pytest.raises(asyncio.CancelledError):
                await fut


class StoppedAtOnce(Actor):
    @endpoint
    async def stopped_at_once(self) -> None:
        # As if the actor's stop came while the call's first step ran
        # inline: the mailbox task is cancelled, and the call ends raising
        # CancelledError at once (meshio's own code raises it on: stopping)
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        raise asyncio.CancelledError


@pytest.mark.meshio_transports("in-process")
async def test_a_call_that_ends_raising_on_its_first_step_ends_the_task_with_that_error(
        procs: meshio.ProcMesh) -> None:
    # The error its first step raised (inline) was thrown back into the
    # call's finished coroutine by the mailbox task, which then ended with
    # "RuntimeError: cannot reuse already awaited coroutine" instead
    actor = (await procs.spawn("stopped", StoppedAtOnce)).slice(procs=0)
    with pytest.raises(SupervisionError, match="stopped while handling this call"):
        await asyncio.wait_for(actor.stopped_at_once.call_one(), GUARD)
    controller = runtime()
    worker = next(rt for rt in list(_local.values()) if rt is not controller and rt.actors)
    cell = next(iter(worker.actors.values()))
    assert isinstance(cell, ActorCell)
    await asyncio.wait([cell.task], timeout=GUARD)
    assert cell.task.cancelled()
