"""A read (or ``versions()``) of a WeightStore cancelled while it waits
for a version (``asyncio.wait_for``, ``asyncio.timeout``, ``task.cancel()``)
leaves nothing behind: its waiter goes from the owner at once, in the
owner's process and for a reader of another process, whose own request
goes too.  A reader polling with a timeout of its own while the publisher
is quiet does not grow the owner, or itself, without bound."""

from __future__ import annotations

import asyncio
from typing import Any

from test_store_closed import follow, until_waiting
from test_weight_store import state

import meshio
import meshio._transport._runtime as runtime_impl
import meshio.store._store as store_impl
from meshio import Actor, endpoint
from meshio.store import WeightStore

GUARD = 30.0
#: waits of each kind cancelled
N = 50


def waiting(store: WeightStore, n: int) -> list[asyncio.Future[Any]]:
    """``n`` reads, ``n`` read_intos and ``n`` versions() loops, each
    waiting for version 2 (the store has 1)."""
    return ([asyncio.ensure_future(store.read(at_least=2)) for _ in range(n)]
            + [asyncio.ensure_future(store.read_into(state(0), at_least=2, timeout=GUARD))
               for _ in range(n)]
            + [asyncio.ensure_future(follow(store)) for _ in range(n)])


async def cancelled(tasks: list[asyncio.Future[Any]]) -> int:
    """Cancel ``tasks``; how many ended cancelled."""
    for t in tasks:
        t.cancel()
    await asyncio.wait(tasks, timeout=GUARD)
    return sum(t.cancelled() for t in tasks)


def in_flight() -> int:
    """Requests this process awaits an answer to, on all its connections."""
    return sum(len(c.pending) for c in runtime_impl.runtime().conns.values())


class Reader(Actor):
    """Waits for versions, then gives them up."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Future[Any]] = []

    @endpoint
    async def wait(self, store: WeightStore, n: int) -> None:
        self.tasks = waiting(store, n)

    @endpoint
    async def read(self, store: WeightStore, at_least: int) -> float:
        return float((await store.read(at_least=at_least))["w"][0, 0])

    @endpoint
    async def give_up(self, store: WeightStore) -> tuple[int, int]:
        """Cancel the waits; then, once a read answered at once came back
        on the same connection (after the owner's answers to the cancels),
        how many ended cancelled and how many requests remain in flight."""
        gave_up = await cancelled(self.tasks)
        assert set((await store.read(at_least=1))["w"].unique().tolist()) == {1.0}
        return gave_up, in_flight()


async def test_cancelled_waits_leave_no_waiter_in_the_owners_process() -> None:
    store = WeightStore("policy")
    await store.publish(state(1), version=1)
    owner = store_impl._Owner.of(store)
    tasks = waiting(store, N)
    await asyncio.wait_for(until_waiting(store, 3 * N), GUARD)
    assert len(owner.waiters) == 3 * N
    assert await cancelled(tasks) == 3 * N
    assert len(owner.waiters) == 0  # at once, not once version 2 comes
    # (a timer of a read's own timeout went with its waiter: none fires later)
    for _ in range(3):  # wait_for, as a reader polling with a timeout of its own does
        try:
            await asyncio.wait_for(store.read(at_least=2), 0.001)
        except TimeoutError:
            pass
        assert len(owner.waiters) == 0
    # waits not given up are as before
    later = asyncio.ensure_future(store.read(at_least=2))
    await asyncio.wait_for(until_waiting(store, 1), GUARD)
    await store.publish(state(2), version=2)
    assert set((await asyncio.wait_for(later, GUARD))["w"].unique().tolist()) == {2.0}
    assert len(owner.waiters) == 0


async def test_cancelled_waits_of_a_reader_of_another_process_leave_nothing() -> None:
    store = WeightStore("policy")
    await store.publish(state(1), version=1)
    owner = store_impl._Owner.of(store)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        reader = await procs.spawn("reader", Reader)
        for _ in range(2):  # (what the first round left would show in the second)
            await reader.wait.call_one(store, N)
            await asyncio.wait_for(until_waiting(store, 3 * N), GUARD)
            assert len(owner.waiters) == 3 * N
            gave_up, left = await asyncio.wait_for(reader.give_up.call_one(store), GUARD)
            assert gave_up == 3 * N
            assert left == 0  # the reader's requests got their answers
            assert len(owner.waiters) == 0  # and the owner let their waiters go
        # waits not given up are as before
        read = asyncio.ensure_future(reader.read.call_one(store, 2))
        await asyncio.wait_for(until_waiting(store, 1), GUARD)
        await store.publish(state(2), version=2)
        assert await asyncio.wait_for(read, GUARD) == 2.0
        assert len(owner.waiters) == 0
