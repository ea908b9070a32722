"""A reader of a WeightStore in another process that dies (SIGKILL) while
its reads wait for a version (``read(at_least=...)``, ``read_into``,
``versions()``) or hold one leaves nothing at the store's owner: its
waiters and leases go once its connection is lost, not at the next
publish.  A reader whose actor is stopped while its process lives on
gives up the waits of its calls, as a cancelled read does (the stop
cancels them)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest
import torch

import meshio
import meshio.store._store as store_impl
from meshio import Actor, endpoint
from meshio.store import WeightStore

#: below the per-test timeout: a waiter still held then fails the test here
GUARD = 30.0
#: waits of each kind a reader parks
N = 20


def state(version: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((100, 4), float(version))}


async def follow(store: WeightStore) -> None:
    async for _ in store.versions():
        pass


class Reader(Actor):
    """Waits for versions of a store, in calls and in tasks of its own."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Future[Any]] = []

    @endpoint
    async def park(self, store: WeightStore, n: int) -> None:
        """``n`` reads, ``n`` read_intos and ``n`` versions() loops, each
        waiting for a version the store does not have yet."""
        self.tasks = ([asyncio.ensure_future(store.read(at_least=2)) for _ in range(n)]
                      + [asyncio.ensure_future(store.read_into(state(0), at_least=2))
                         for _ in range(n)]
                      + [asyncio.ensure_future(follow(store)) for _ in range(n)])

    @endpoint
    async def read(self, store: WeightStore, at_least: int) -> float:
        return float((await store.read(at_least=at_least))["w"][0, 0])

    @endpoint
    async def read_and_die(self, store: WeightStore) -> None:
        """Die in the middle of a read, holding its lease (the shard
        function runs while the version is leased)."""
        def die(name: str, t: torch.Tensor) -> torch.Tensor:
            os.kill(os.getpid(), signal.SIGKILL)
            return t

        await store.read(shard=die)

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


@pytest.fixture
async def owned() -> AsyncIterator[tuple[WeightStore, Any]]:
    """A store of this process with version 1, and its owner's state, whose
    waiters (each reader's wait) and leases (each version being copied)
    the test counts."""
    store = WeightStore("policy", keep=1)
    await store.publish(state(1), version=1)
    yield store, store_impl._Owner.of(store)


async def until(owner: Any, waiting: int) -> None:
    """Until ``waiting`` reads wait at ``owner``: each wait parked and each
    one dropped sets an event."""
    changed = asyncio.Event()
    wait, drop = owner.wait, owner.drop

    def waited(*args: Any) -> Any:
        changed.set()
        return wait(*args)

    def dropped(*args: Any) -> Any:
        changed.set()
        return drop(*args)

    owner.wait, owner.drop = waited, dropped
    try:
        while len(owner.waiters) != waiting:
            await changed.wait()
            changed.clear()
    finally:
        owner.wait, owner.drop = wait, drop


async def test_a_killed_readers_waits_and_lease_go_with_its_connection(
        owned: tuple[WeightStore, Any]) -> None:
    store, owner = owned
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        readers = await procs.spawn("readers", Reader)
        doomed, other = readers.slice(procs=0), readers.slice(procs=1)
        for _ in range(2):  # (what the first round left would show in the second)
            await doomed.park.call_one(store, N)
            await asyncio.wait_for(until(owner, 3 * N), GUARD)
            with pytest.raises(meshio.SupervisionError, match="SIGKILL"):
                await asyncio.wait_for(doomed.read_and_die.call_one(store), GUARD)
            await asyncio.wait_for(until(owner, 0), GUARD)  # not once version 2 comes
            assert owner.leases == {}  # its lease went with it too
            await procs.replace(0)  # (a new process in its place, for the next round)
        # a reader that lives on is served as before
        read = asyncio.ensure_future(other.read.call_one(store, 2))
        await asyncio.wait_for(until(owner, 1), GUARD)
        await store.publish(state(2), version=2)
        assert await asyncio.wait_for(read, GUARD) == 2.0
        assert owner.waiters == {} and owner.leases == {}
        assert store.kept == (2,)


async def test_a_stopped_readers_waits_go_while_its_process_lives(
        owned: tuple[WeightStore, Any]) -> None:
    store, owner = owned
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        reader = await procs.spawn("reader", Reader)
        pid = await reader.pid.call_one()
        called = asyncio.ensure_future(reader.read.call_one(store, 2))
        await asyncio.wait_for(until(owner, 1), GUARD)
        await asyncio.wait_for(reader.stop(), GUARD)
        with pytest.raises(meshio.SupervisionError):
            await asyncio.wait_for(called, GUARD)
        await asyncio.wait_for(until(owner, 0), GUARD)
        # its process lives on, and reads for an actor spawned there
        again = await procs.spawn("reader-again", Reader)
        assert await again.pid.call_one() == pid
        read = asyncio.ensure_future(again.read.call_one(store, 2))
        await asyncio.wait_for(until(owner, 1), GUARD)
        await store.publish(state(2), version=2)
        assert await asyncio.wait_for(read, GUARD) == 2.0
        assert owner.waiters == {} and owner.leases == {}
