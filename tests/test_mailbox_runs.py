"""Calls made in one turn of the caller's loop travel as one frame (a burst:
``Calls``, ~30 a frame); those that find their actor idle are served in one
go (``ActorCell.post_run``), each as if it had come alone: in order per
actor, each by its own actor, one that waits hands the rest of the burst to
the mailbox in order, a concurrent endpoint's starts at once, bad arguments
or an error fail only their own call, and a call that stops its actor ends
the burst there.  That it pays is measured in ``benchmarks/``, not here."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import meshio
from meshio import Actor, ActorError, SchemaError, SupervisionError, endpoint

GUARD = 30.0


class Noter(Actor):
    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    @endpoint
    async def note(self, i: int) -> int:
        self.seen.append(("note", i))
        return i

    @endpoint
    async def note_waiting(self, i: int) -> int:
        self.seen.append(("start", i))
        await asyncio.sleep(0)
        self.seen.append(("end", i))
        return i

    @endpoint(concurrent=True)
    async def peek(self, i: int) -> int:
        return i

    @endpoint
    async def fail(self, i: int) -> int:
        self.seen.append(("fail", i))
        raise ValueError(f"call {i} fails")

    @endpoint
    async def stop_me(self, i: int) -> int:
        self.seen.append(("stop", i))
        await meshio.context().mesh.stop()
        return i

    @endpoint(concurrent=True)
    async def until_noted(self, n: int) -> int:
        while len(self.seen) < n:
            await asyncio.sleep(0)  # (a busy wait on the actor's loop: what it waits for is on it)
        return n

    @endpoint
    async def history(self) -> list[tuple[str, int]]:
        return self.seen


def _burst(a: Any, b: Any, n: int) -> tuple[list[asyncio.Future[int]], dict[str, list[Any]]]:
    """``n`` calls made in one turn, to ``a`` and ``b`` in turn, of every
    kind; what each actor's mailbox should have run, in order."""
    calls: list[asyncio.Future[int]] = []
    want: dict[str, list[Any]] = {"a": [], "b": []}
    for i in range(n):
        name, actor = ("a", a) if i % 3 else ("b", b)
        if i % 7 == 0:
            calls.append(actor.note_waiting.call_one(i))
            want[name] += [("start", i), ("end", i)]
        elif i % 11 == 0:
            calls.append(actor.peek.call_one(i))  # (concurrent: in no mailbox's order)
        elif i % 13 == 0:
            calls.append(actor.fail.call_one(i))
            want[name].append(("fail", i))
        else:
            calls.append(actor.note.call_one(i))
            want[name].append(("note", i))
    return calls, want


@pytest.mark.meshio_transports("processes", "in-process")
async def test_a_burst_to_two_actors_of_one_process_is_served_in_order(
        procs: meshio.ProcMesh) -> None:
    a = (await procs.spawn("a", Noter)).slice(procs=0)
    b = (await procs.spawn("b", Noter)).slice(procs=0)
    for _ in range(3):  # (the first burst finds both idle; later ones too)
        calls, want = _burst(a, b, 300)
        got = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), GUARD)
        for i, value in enumerate(got):
            if i % 7 and i % 11 and i % 13 == 0:
                assert isinstance(value, ActorError) and value.remote_message == (
                    f"call {i} fails"), (i, value)
            else:
                assert value == i, (i, value)
        for name, actor in (("a", a), ("b", b)):
            seen = await asyncio.wait_for(actor.history.call_one(), GUARD)
            assert [tuple(x) for x in seen[-len(want[name]):]] == want[name], name


@pytest.mark.meshio_transports("processes", "in-process")
async def test_bad_arguments_in_a_burst_fail_only_their_call(procs: meshio.ProcMesh) -> None:
    a = (await procs.spawn("a", Noter)).slice(procs=0)
    bad: Any = "not an int"
    calls = [a.note.call_one(bad if i == 5 else i) for i in range(20)]
    got = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), GUARD)
    assert isinstance(got[5], SchemaError) and "note" in str(got[5]), got[5]
    assert [v for i, v in enumerate(got) if i != 5] == [i for i in range(20) if i != 5]
    seen = await asyncio.wait_for(a.history.call_one(), GUARD)
    assert [i for _, i in seen] == [i for i in range(20) if i != 5]


@pytest.mark.meshio_transports("processes", "in-process")
async def test_a_call_that_stops_its_actor_ends_the_burst(procs: meshio.ProcMesh) -> None:
    a = (await procs.spawn("a", Noter)).slice(procs=0)
    calls = [a.stop_me.call_one(i) if i == 4 else a.note.call_one(i) for i in range(12)]
    got = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), GUARD)
    assert got[:4] == [0, 1, 2, 3]
    for value in got[4:]:  # (the stop cancels its own call: it is stopped too)
        assert isinstance(value, SupervisionError) and "stopped" in str(value), value


@pytest.mark.meshio_transports("processes", "in-process")
async def test_a_concurrent_call_in_a_burst_does_not_hold_the_calls_after_it(
        procs: meshio.ProcMesh) -> None:
    """It waits for mailbox calls made after it in the same burst: served
    as a mailbox call, it would wait forever."""
    a = (await procs.spawn("a", Noter)).slice(procs=0)
    # (the first call of a turn goes alone, the others in one frame)
    calls = [a.note.call_one(0), a.note.call_one(1), a.until_noted.call_one(6),
             *(a.note.call_one(i) for i in range(2, 10))]
    got = await asyncio.wait_for(asyncio.gather(*calls), GUARD)
    assert got == [0, 1, 6, *range(2, 10)]
