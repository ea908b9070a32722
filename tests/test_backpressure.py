"""Bounded mailboxes (issue 18 item 4), with real worker processes: a caller
waits for room in a full mailbox (or gets ``Overloaded`` at once with
``on_full="raise"``), ``broadcast`` too, the mailbox never holds more than
``max_queued`` calls of one caller, and a dead callee releases the waiters.

Nothing here sleeps to wait for something: the slow actor is held by a gate
the test opens, and the test waits on call futures and on ``stacks()``.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import Awaitable
from typing import Any

import pytest

import meshio
from meshio import (
    Actor,
    CallTimeout,
    DeadlockError,
    Overloaded,
    SupervisionError,
    context,
    endpoint,
)

#: generous bound on any single wait on a loaded machine
GUARD = 30.0
#: the bound of the slow actor's mailbox in these tests
BOUND = 4


class Slow(Actor):
    """Takes one call at a time, and none while its gate is closed."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.seen: list[int] = []

    @endpoint
    async def take(self, i: int) -> int:
        await self.gate.wait()
        self.seen.append(i)
        return i

    @endpoint(concurrent=True)
    async def open_gate(self) -> None:
        self.gate.set()

    @endpoint(concurrent=True)
    async def taken(self) -> list[int]:
        return self.seen

    @endpoint(concurrent=True)
    async def pid(self) -> int:
        return os.getpid()


async def slow(procs: meshio.ProcMesh, max_queued: int = BOUND) -> Slow:
    return await procs.slice(procs=0).options(max_queued=max_queued).spawn("slow", Slow)


async def queued(s: Actor) -> int:
    """The calls waiting in the actor's mailbox now (one sample)."""
    (actor,) = (await asyncio.wait_for(s.stacks(), GUARD)).actors
    return actor.queued


async def until_full(s: Actor, bound: int = BOUND) -> list[int]:
    """Sample the actor's mailbox until it holds ``bound`` calls (as the
    credits of the calls it took come back); every sample is returned."""
    samples = [await queued(s)]
    async with asyncio.timeout(GUARD):
        while samples[-1] < bound:
            samples.append(await queued(s))
    return samples


async def test_callers_wait_for_room_and_every_call_completes_in_order(
        procs: meshio.ProcMesh) -> None:
    s = await slow(procs)
    calls = [asyncio.ensure_future(s.take.call_one(i)) for i in range(40)]
    samples = await until_full(s)
    assert max(samples) == BOUND
    assert not any(c.done() for c in calls)  # one runs (held), four queued, the rest wait here
    await s.open_gate.call_one()
    # drained while sampled: the mailbox never holds more than the bound
    while not all(c.done() for c in calls):
        samples.append(await queued(s))
    assert max(samples) == BOUND
    assert await asyncio.wait_for(asyncio.gather(*calls), GUARD) == list(range(40))
    assert await s.taken.call_one() == list(range(40))


async def test_the_bound_holds_for_every_adverb_and_broadcast(procs: meshio.ProcMesh) -> None:
    """Calls of several adverbs and awaited broadcasts, interleaved, from
    one caller: in order, and never more than the bound in the mailbox."""
    s = await slow(procs)
    calls: list[asyncio.Future[Any]] = []
    for i in range(0, 60, 3):
        calls.append(asyncio.ensure_future(s.take.call_one(i)))
        calls.append(asyncio.ensure_future(s.take.choose(i + 1)))
        calls.append(asyncio.ensure_future(s.take.call(i + 2)))
    samples = await until_full(s)
    sender = asyncio.ensure_future(broadcasts(s, range(60, 80)))
    await s.open_gate.call_one()
    while not (sender.done() and all(c.done() for c in calls)):
        samples.append(await queued(s))
    await sender
    assert max(samples) == BOUND
    await asyncio.wait_for(asyncio.gather(*calls), GUARD)
    async with asyncio.timeout(GUARD):  # (the last broadcasts may still be queued)
        while len(await s.taken.call_one()) < 80:
            pass
    assert await s.taken.call_one() == list(range(80))


async def broadcasts(s: Slow, values: range) -> None:
    for i in values:
        await s.take.broadcast(i)


async def test_on_full_raise_fails_at_once_and_sends_nothing(procs: meshio.ProcMesh) -> None:
    s = await slow(procs)
    calls = [asyncio.ensure_future(s.take.call_one(i)) for i in range(BOUND + 1)]
    await until_full(s)
    now = s.take.options(on_full="raise").options(timeout=GUARD)  # (kept)
    with pytest.raises(Overloaded) as info:
        now.call_one(100)
    assert info.value.actor == "slow" and info.value.rank == 0
    assert info.value.max_queued == BOUND
    assert "max_queued=4" in str(info.value) and "'slow'" in str(info.value)
    with pytest.raises(Overloaded):
        now.call(101)
    with pytest.raises(Overloaded):
        now.choose(102)
    with pytest.raises(Overloaded):
        now.broadcast(103)
    with pytest.raises(Overloaded):
        async for _ in now.stream(104):
            pass
    # concurrent endpoints never queue: not bounded
    assert await s.taken.options(on_full="raise").call_one() == []
    await s.open_gate.call_one()
    assert await asyncio.wait_for(asyncio.gather(*calls), GUARD) == list(range(BOUND + 1))
    assert await now.call_one(105) == 105  # room again
    assert await s.taken.call_one() == [*range(BOUND + 1), 105]


async def test_a_service_route_honours_the_bound(procs: meshio.ProcMesh) -> None:
    s = await slow(procs)
    service = meshio.Service(s)
    calls = [asyncio.ensure_future(service.take.route(i)) for i in range(BOUND + 1)]
    await until_full(s)
    with pytest.raises(Overloaded):
        await service.take.options(on_full="raise").route(100)
    waiting = asyncio.ensure_future(service.take.route(101))
    await s.open_gate.call_one()
    assert await asyncio.wait_for(asyncio.gather(*calls, waiting), GUARD) == [
        *range(BOUND + 1), 101]


async def test_a_broadcast_waits_for_room(procs: meshio.ProcMesh) -> None:
    s = await slow(procs)
    calls = [asyncio.ensure_future(s.take.call_one(i)) for i in range(BOUND + 1)]
    await until_full(s)
    sent = s.take.broadcast(100)
    # (what a notebook cell ending with it shows: what it is, not a private class)
    assert repr(sent) == ("<broadcast of Slow.take on 'slow': 1 of its actors had no room for "
                          "it yet; awaiting it waits until it went to them>")
    waiting = asyncio.ensure_future(awaited(sent))
    # a bug would finish it at once; a correct one never does before the gate opens
    done, _ = await asyncio.wait([waiting], timeout=0.2)
    assert not done
    assert await queued(s) == BOUND
    await s.open_gate.call_one()
    await asyncio.wait_for(waiting, GUARD)
    assert repr(sent) == "<broadcast of Slow.take on 'slow' sent: awaiting it returns at once>"
    await asyncio.wait_for(asyncio.gather(*calls), GUARD)
    assert await s.take.call_one(101) == 101  # behind the broadcast
    assert await s.taken.call_one() == [*range(BOUND + 1), 100, 101]
    # with room, a broadcast goes at once: its awaitable is already done
    at_once = s.take.broadcast(102)
    assert repr(at_once) == "<broadcast sent: awaiting it returns at once>"
    await asyncio.wait_for(awaited(at_once), GUARD)


async def awaited(a: Awaitable[None]) -> None:
    await a


async def all_taken(s: Slow, n: int) -> list[int]:
    """Open the gate; what the actor took, once it has taken ``n`` calls."""
    await s.open_gate.call_one()
    async with asyncio.timeout(GUARD):
        while len(taken := await s.taken.call_one()) < n:
            pass
    return taken


async def test_broadcasts_nobody_awaits_stop_at_the_bound(procs: meshio.ProcMesh) -> None:
    """A loop of broadcasts not awaited, to an actor that takes none: once
    its mailbox is full and as many again wait for room in the caller, the
    next one raises Overloaded (memory stays bounded) and is not sent; those
    before it all arrive, in order, once the actor takes them."""
    s = await slow(procs)
    sent = 0
    with pytest.raises(Overloaded) as ei:
        for i in range(100 * BOUND):
            last = s.take.broadcast(i)
            sent += 1
    # BOUND in the mailbox (one more may have left it, held at the gate) and
    # BOUND waiting here
    assert sent in (2 * BOUND, 2 * BOUND + 1)
    assert "await what an earlier broadcast() returned" in str(ei.value)
    assert f"{BOUND} broadcasts of this process that nobody awaits already wait" in str(ei.value)
    assert ei.value.max_queued == BOUND
    # pushed back: the last one sent, awaited, returns once it went (the
    # actor took calls), and then there is room again
    went = asyncio.ensure_future(awaited(last))
    await s.open_gate.call_one()
    await asyncio.wait_for(went, GUARD)
    s.take.broadcast(sent)
    assert await all_taken(s, sent + 1) == list(range(sent + 1))


async def test_awaited_broadcasts_of_many_tasks_wait_their_turn(
        procs: meshio.ProcMesh) -> None:
    """Producer tasks each awaiting its broadcasts, more of them than the
    bound: every broadcast waits for room, however many wait already (only
    those nobody awaits are bounded); all go, in order (before, once
    ``max_queued`` awaited broadcasts waited, the next raised Overloaded)."""
    s = await slow(procs)
    calls = [asyncio.ensure_future(s.take.call_one(i)) for i in range(BOUND + 1)]
    await until_full(s)
    n = 3 * BOUND

    async def produce(i: int) -> None:
        await s.take.broadcast(100 + i)

    producers = [asyncio.ensure_future(produce(i)) for i in range(n)]
    await asyncio.sleep(0)  # (one turn of the loop: each made its broadcast and awaits it)
    assert not [p for p in producers if p.done()]  # (before: Overloaded)
    assert await all_taken(s, BOUND + 1 + n) == [*range(BOUND + 1), *range(100, 100 + n)]
    await asyncio.wait_for(asyncio.gather(*producers, *calls), GUARD)


async def test_cancelling_the_await_of_a_waiting_broadcast_withdraws_it(
        procs: meshio.ProcMesh) -> None:
    """A broadcast waiting for room whose awaiting task is cancelled never
    goes (nor does one whose deadline passed); one made after it waits for
    room as any (before, it went once there was room, and, awaited by
    nobody now, counted against the bound)."""
    s = await slow(procs)
    calls = [asyncio.ensure_future(s.take.call_one(i)) for i in range(BOUND + 1)]
    await until_full(s)
    waiting = [asyncio.ensure_future(awaited(s.take.broadcast(100 + i))) for i in range(BOUND)]
    await asyncio.sleep(0)  # (one turn of the loop: each is awaited)
    for w in waiting:
        w.cancel()
    for w in waiting:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(w, GUARD)
    last = asyncio.ensure_future(awaited(s.take.broadcast(200)))
    await asyncio.sleep(0)
    assert not last.done()  # (before: Overloaded, the withdrawn ones counted)
    assert await all_taken(s, BOUND + 2) == [*range(BOUND + 1), 200]
    await asyncio.wait_for(asyncio.gather(last, *calls), GUARD)


async def test_an_endpoint_awaiting_a_broadcast_is_cancelled_by_its_deadline(
        procs: meshio.ProcMesh) -> None:
    """An endpoint awaiting a broadcast that waits for room when the
    deadline it inherited passes is cancelled (docs/howto/deadlines.md: it
    cannot catch the CallTimeout and go on), and the message does not go
    (before, the endpoint got CallTimeout: caught, "fallback").  Sent as a
    broadcast, which no caller cancels: only the deadline can."""
    s = await slow(procs)
    feeder = await procs.slice(procs=1).spawn("feeder", Feeder)
    values = list(range(BOUND + 2))  # (one held at the gate, BOUND queued: the last waits)
    await feeder.feed.options(timeout=0.3).broadcast(s, values)
    assert await asyncio.wait_for(feeder.how_it_ended.call_one(), GUARD) == "CancelledError"
    await s.open_gate.call_one()
    assert await asyncio.wait_for(s.take.call_one(99), GUARD) == 99
    # (those queued carried the deadline too: dropped there, as it passed)
    assert values[-1] not in await s.taken.call_one()


async def test_a_deadline_bounds_the_wait_for_room(procs: meshio.ProcMesh) -> None:
    s = await slow(procs)
    calls = [asyncio.ensure_future(s.take.call_one(i)) for i in range(BOUND + 1)]
    await until_full(s)
    with pytest.raises(CallTimeout, match=r"no answer within 0\.3s"):
        await asyncio.wait_for(s.take.options(timeout=0.3).call_one(100), GUARD)
    with pytest.raises(CallTimeout, match=r"no room in their mailbox before the deadline"):
        await asyncio.wait_for(awaited(s.take.options(timeout=0.3).broadcast(101)), GUARD)
    await s.open_gate.call_one()
    await asyncio.wait_for(asyncio.gather(*calls), GUARD)
    assert await s.take.call_one(102) == 102
    assert await s.taken.call_one() == [*range(BOUND + 1), 102]  # neither ran


async def test_a_killed_callee_releases_the_waiters(procs: meshio.ProcMesh) -> None:
    s = await slow(procs)
    pid = await s.pid.call_one()
    calls = [asyncio.ensure_future(s.take.call_one(i)) for i in range(BOUND + 1)]
    await until_full(s)
    waiting = [asyncio.ensure_future(s.take.call_one(i)) for i in range(10, 13)]
    gathered = asyncio.ensure_future(s.take.call(20))
    sent = asyncio.ensure_future(awaited(s.take.broadcast(30)))
    os.kill(pid, signal.SIGKILL)
    released: list[Awaitable[object]] = [*calls, *waiting, sent]
    for f in released:
        with pytest.raises(SupervisionError):
            await asyncio.wait_for(f, GUARD)
    # (call() on the whole mesh: an actor dead for good is a hole, not an error)
    assert [p.rank for p in (await asyncio.wait_for(gathered, GUARD)).holes] == [0]


async def test_each_caller_has_its_own_allowance(procs: meshio.ProcMesh) -> None:
    """The bound is per calling process: the controller and another actor,
    each with the mailbox full of its calls, hold twice the bound."""
    s = await slow(procs)
    relay = await procs.slice(procs=1).spawn("relay", Relay)
    mine = [asyncio.ensure_future(s.take.call_one(i)) for i in range(BOUND + 1)]
    await until_full(s)
    theirs = asyncio.ensure_future(relay.send.call_one(s, list(range(100, 110))))
    samples = await until_full(s, 2 * BOUND)
    assert max(samples) == 2 * BOUND
    await s.open_gate.call_one()
    assert await asyncio.wait_for(asyncio.gather(*mine), GUARD) == list(range(BOUND + 1))
    assert await asyncio.wait_for(theirs, GUARD) == list(range(100, 110))


class Relay(Actor):
    @endpoint
    async def send(self, to: Slow, values: list[int]) -> list[int]:
        return list(await asyncio.gather(*(to.take.call_one(i) for i in values)))

    @endpoint
    def flood(self, to: Slow) -> tuple[int, str]:
        """From the actor's thread: broadcast with on_full="raise" until the
        mailbox is full; how many went, and the error."""
        sent = 0
        while True:
            try:
                to.take.options(on_full="raise").broadcast(sent)
            except Overloaded as e:
                return sent, str(e)
            sent += 1


class Feeder(Actor):
    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.ended = ""

    @endpoint
    async def feed(self, to: Slow, values: list[int]) -> str:
        """Broadcast ``values`` to ``to``, awaiting only the last; fall back
        on its CallTimeout.  How it ended: :meth:`how_it_ended`."""
        for i in values[:-1]:
            to.take.broadcast(i)
        try:
            await to.take.broadcast(values[-1])
        except CallTimeout:
            self.ended = "CallTimeout"
            return "fallback"
        except asyncio.CancelledError:
            self.ended = "CancelledError"
            raise
        finally:
            self.done.set()
        return "sent"

    @endpoint(concurrent=True)
    async def how_it_ended(self) -> str:
        await self.done.wait()
        return self.ended


async def test_a_broadcast_from_a_def_endpoint_honours_the_bound(
        procs: meshio.ProcMesh) -> None:
    s = await slow(procs)
    relay = await procs.slice(procs=1).spawn("relay", Relay)
    sent, error = await asyncio.wait_for(relay.flood.call_one(s), GUARD)
    # one taken out to run (held at the gate), BOUND queued; its credit may
    # or may not have come back before the mailbox was found full
    assert sent in (BOUND, BOUND + 1)
    assert "Slow.take on 'slow'" in error and "max_queued=4" in error
    assert await all_taken(s, sent) == list(range(sent))


async def test_bad_options_are_clear_errors(procs: meshio.ProcMesh) -> None:
    for low in (0, -1):
        with pytest.raises(ValueError, match=r"^ProcMesh\.options\(max_queued=...\) must be "
                                             rf"an int >= 1, got {low}$"):
            procs.options(max_queued=low)
    for bad in (1.5, 3.0, True, "10", [3]):  # a wrong type, as options(timeout="5") says
        with pytest.raises(TypeError, match=r"^ProcMesh\.options\(max_queued=...\) must be "
                                            rf"an int >= 1, got {type(bad).__name__} "
                                            rf"{re.escape(repr(bad))}$"):
            procs.options(max_queued=bad)  # type: ignore[arg-type]
    s = await slow(procs)
    with pytest.raises(ValueError, match=r"^Endpoint\.options\(on_full=...\) must be 'wait' "
                                         r"or 'raise', got 'drop'$"):
        s.take.options(on_full="drop")  # type: ignore[arg-type]
    for wrong in (1, 1.5, b"wait"):  # a wrong type, as options(timeout="5") says
        with pytest.raises(TypeError, match=r"^Endpoint\.options\(on_full=...\) must be "
                                            rf"'wait' or 'raise', got {type(wrong).__name__} "):
            s.take.options(on_full=wrong)  # type: ignore[arg-type]


# ------------------------------------- awaiting room that only the caller can make


class Announcer(Actor):
    """Broadcasts to its own mesh (every rank, itself included), awaiting
    each broadcast, as README's loop does."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.seen: list[int] = []

    @endpoint
    async def announce(self, n: int) -> str:
        return await announce(context(Announcer).mesh, n)

    @endpoint(concurrent=True)
    async def announce_aside(self, n: int) -> str:
        """As :meth:`announce`, holding no mailbox: it waits for room."""
        return await announce(context(Announcer).mesh, n)

    @endpoint
    async def ask(self, other: Announcer, n: int) -> str:
        """Have ``other`` announce ``n`` times to this actor, and wait."""
        me = context(Announcer).mesh.slice(**dict(context().point))
        return await other.announce_to.call_one(me, n)

    @endpoint
    async def announce_to(self, to: Announcer, n: int) -> str:
        return await announce(to, n)

    @endpoint
    async def note(self, i: int) -> None:
        self.seen.append(i)

    @endpoint(concurrent=True)
    async def noted(self) -> list[int]:
        return self.seen

    @endpoint
    async def hold(self) -> None:
        await self.gate.wait()

    @endpoint(concurrent=True)
    async def open_gate(self) -> None:
        self.gate.set()


async def announce(to: Announcer, n: int) -> str:
    try:
        for i in range(n):
            await to.note.broadcast(i)
    except DeadlockError as e:
        return f"DeadlockError: {e}"
    return "sent"


async def noted(a: Announcer, n: int) -> list[int]:
    """What ``a`` noted, once it has noted ``n`` (messages from another
    process may come after a call of the controller's made later)."""
    async with asyncio.timeout(GUARD):
        while len(seen := await a.noted.call_one()) < n:
            pass
    return seen


@pytest.mark.meshio_transports()
async def test_awaiting_room_in_its_own_mailbox_fails_at_once(procs: meshio.ProcMesh) -> None:
    """A normal endpoint awaiting a broadcast to its own mesh once its own
    mailbox is full would wait forever (nothing leaves the mailbox until the
    call returns): DeadlockError instead, and the message does not go to
    the actors it had not reached.  On one actor and on two (the other has
    room: the broadcast waits only for the caller's own mailbox)."""
    for where in (procs.slice(procs=slice(0, 1)), procs):
        a = await where.options(max_queued=BOUND).spawn("a", Announcer)
        got = await asyncio.wait_for(a.slice(procs=0).announce.call_one(3 * BOUND), GUARD)
        assert got.startswith("DeadlockError: awaited broadcast would deadlock: "
                              "a[0] -> a[0]: this broadcast of Announcer.note waits for "
                              "room in the mailbox of a[0] (max_queued=4), and a[0] is busy "
                              "with Announcer.announce, the call awaiting it"), got
        # The actor serves on (once it took those that went: they queued
        # behind its next call); the message it waited with went nowhere
        # in a[0]: the next one from a[0] comes right after those.
        assert await noted(a.slice(procs=0), BOUND) == list(range(BOUND))
        assert await asyncio.wait_for(a.slice(procs=0).announce.call_one(1), GUARD) == "sent"
        assert await noted(a.slice(procs=0), BOUND + 1) == [*range(BOUND), 0]
        await a.stop()


@pytest.mark.meshio_transports()
async def test_awaiting_room_held_by_a_caller_in_this_process_fails_at_once(
        procs: meshio.ProcMesh) -> None:
    """``a`` waits for ``b``, which awaits broadcasts to ``a`` (in the same
    process: the bound is that process's): once ``a``'s mailbox is full,
    DeadlockError naming the chain."""
    a = await procs.slice(procs=0).options(max_queued=BOUND).spawn("a", Announcer)
    b = await procs.slice(procs=0).spawn("b", Announcer)
    got = await asyncio.wait_for(a.ask.call_one(b, 3 * BOUND), GUARD)
    assert got.startswith("DeadlockError: awaited broadcast would deadlock: "
                          "a[0] -> b[0] -> a[0]: "), got
    assert ("a[0] is busy with Announcer.ask, which waits (through this chain) for the "
            "call awaiting it") in got, got
    assert await noted(a, BOUND) == list(range(BOUND))
    assert await asyncio.wait_for(b.announce_to.call_one(a, 1), GUARD) == "sent"
    assert await noted(a, BOUND + 1) == [*range(BOUND), 0]


async def test_awaiting_room_held_by_an_unrelated_call_waits(procs: meshio.ProcMesh) -> None:
    """A concurrent call awaiting room in its own actor's mailbox, held by
    a call that does not wait for it, is no deadlock: it waits, and goes on
    once that call returns."""
    a = await procs.slice(procs=0).options(max_queued=BOUND).spawn("a", Announcer)
    held = a.hold.call_one()
    aside = a.announce_aside.call_one(BOUND + 2)
    assert await until_full(a)
    assert not aside.done()
    await a.open_gate.call_one()
    assert await asyncio.wait_for(aside, GUARD) == "sent"
    await asyncio.wait_for(held, GUARD)
    assert await noted(a, BOUND + 2) == list(range(BOUND + 2))


async def test_awaiting_room_whose_credit_is_on_its_way_waits(procs: meshio.ProcMesh) -> None:
    """The calls that filled the mailbox were taken just before the call
    that awaits room there (in one go: their credit is still on its way
    back): no deadlock; the broadcast goes once the credit is in."""
    a = await procs.slice(procs=0).options(max_queued=BOUND).spawn("a", Announcer)
    held = a.hold.call_one()
    assert await asyncio.wait_for(a.announce_aside.call_one(BOUND), GUARD) == "sent"
    await until_full(a)
    after = a.announce.call_one(1)
    await until_full(a, BOUND + 1)  # (queued behind those it sent)
    await a.open_gate.call_one()
    assert await asyncio.wait_for(after, GUARD) == "sent"
    await asyncio.wait_for(held, GUARD)
    assert await noted(a, BOUND + 1) == [*range(BOUND), 0]
