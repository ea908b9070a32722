"""A store closes when the actor that created it is stopped: readers
waiting for a version that will never come, in any process, are told so
(RDMAError naming the store) instead of waiting for ever; a store created
anew under the name is another store (in a process that replaced the
owner's too); and an old handle's ``latest`` says the closed store's last
version, never what freed memory holds."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import signal
from typing import Any

from test_weight_store import Learner as Publisher
from test_weight_store import state

import meshio
import meshio.store._store as store_impl
from meshio import Actor, endpoint
from meshio.store import WeightStore

#: below the per-test timeout: a read still waiting then fails the test here
GUARD = 30.0
CLOSED = r"WeightStore 'policy' of pid \d+ on .* is closed: the actor 'learner' \(rank 0\)"



async def until_waiting(store: WeightStore, n: int) -> None:
    """Until ``n`` reads wait for a version of ``store``, in the process that
    owns it (its runtime holds the waits of readers of every process and
    host): each new wait sets an event."""
    owner = store_impl._Owner.of(store)
    came = asyncio.Event()
    wait = owner.wait

    def counted(*args: Any) -> Any:
        key = wait(*args)
        came.set()
        return key

    owner.wait = counted  # type: ignore[method-assign]
    try:
        while len(owner.waiters) < n:
            await came.wait()
            came.clear()
    finally:
        owner.wait = wait  # type: ignore[method-assign]

class Learner(Publisher):
    """Its store's owner, which can also tell when readers wait."""

    @endpoint
    async def until_waiting(self, n: int) -> None:
        await until_waiting(self.store, n)

    @endpoint
    async def churn(self) -> int:
        """Allocate and free many small objects: memory freed in this
        process is taken by others."""
        junk = [bytearray(8) for _ in range(100_000)] + [[i, i << 40] for i in range(50_000)]
        gc.collect()
        return len(junk)


class Reader(Actor):
    """Its reads wait side by side (concurrent endpoints)."""

    @endpoint(concurrent=True)
    async def read(self, store: WeightStore, at_least: int) -> float:
        return float((await store.read(at_least=at_least))["w"][0, 0])

    @endpoint(concurrent=True)
    async def read_into(self, store: WeightStore, at_least: int) -> int:
        return await store.read_into(state(0), at_least=at_least)

    @endpoint(concurrent=True)
    async def watch(self, store: WeightStore) -> list[int]:
        return [v async for v in store.versions()]

    @endpoint(concurrent=True)
    async def latest(self, store: WeightStore) -> int | None:
        return store.latest


def assert_closed(e: BaseException | None) -> None:
    """``e`` is the closed store's RDMAError (raised in a reader's process,
    it arrives as the ActorError of its endpoint)."""
    if isinstance(e, meshio.ActorError):
        assert e.remote_type == "meshio.RDMAError", e
    else:
        assert isinstance(e, meshio.RDMAError), e
    assert re.search(CLOSED, str(e)), e


async def raised(aw: Any) -> BaseException | None:
    """What awaiting ``aw`` raised (bounded by GUARD)."""
    try:
        await asyncio.wait_for(aw, GUARD)
    except Exception as e:
        return e
    return None


async def follow(store: WeightStore) -> list[int]:
    seen = []
    async for v in store.versions():
        seen.append(v)
    return seen


async def learner_and_readers(procs: meshio.ProcMesh) -> tuple[Learner, Reader, Reader]:
    """The store's owner, a reader in its process, and one in the other."""
    return (await procs.slice(procs=0).spawn("learner", Learner),
            await procs.slice(procs=0).spawn("beside", Reader),
            await procs.slice(procs=1).spawn("other", Reader))


async def test_readers_waiting_on_a_stopped_owner_are_told_it_closed() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        learner, beside, other = await learner_and_readers(procs)
        store = await learner.handle.call_one()
        await learner.step.call_one(1)
        waiting: dict[str, asyncio.Future[Any]] = {
            "controller read": asyncio.ensure_future(store.read(at_least=2)),
            "controller versions": asyncio.ensure_future(follow(store)),
            "owner's process read": asyncio.ensure_future(beside.read.call_one(store, 2)),
            "owner's process versions": asyncio.ensure_future(beside.watch.call_one(store)),
            "other process read": asyncio.ensure_future(other.read.call_one(store, 2)),
            "other process read_into": asyncio.ensure_future(other.read_into.call_one(store, 2)),
            "other process versions": asyncio.ensure_future(other.watch.call_one(store)),
        }
        await asyncio.wait_for(learner.until_waiting.call_one(len(waiting)), GUARD)
        assert not any(f.done() for f in waiting.values())
        await learner.stop()
        _, pending = await asyncio.wait(waiting.values(), timeout=GUARD)
        stuck = [name for name, f in waiting.items() if f in pending]
        for f in pending:
            f.cancel()
        assert not stuck, f"still waiting {GUARD} s after the owner stopped: {stuck}"
        for f in waiting.values():
            assert_closed(f.exception())
        # later reads are told so at once, in every process
        assert_closed(await raised(store.read()))
        assert_closed(await raised(other.read.call_one(store, 0)))
        assert_closed(await raised(beside.read.call_one(store, 0)))


async def test_a_store_made_again_under_the_name_is_another_store() -> None:
    """The learner rebuilt in the same process creates "policy" again: the
    reads still waiting on the old store are told it closed, and the old
    handle never reads the new store's versions (they restart at 1 and are
    another model's); the new handle reads them."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        first = await procs.slice(procs=0).spawn("learner", Learner)
        other = await procs.slice(procs=1).spawn("other", Reader)
        old = await first.handle.call_one()
        await first.step.call_one(3)
        waiting = [asyncio.ensure_future(other.read.call_one(old, 4)),
                   asyncio.ensure_future(old.read(at_least=4))]
        await asyncio.wait_for(first.until_waiting.call_one(len(waiting)), GUARD)
        await first.stop()
        again = await procs.slice(procs=0).spawn("learner2", Learner)
        new = await again.handle.call_one()
        for v in (1, 2, 4):
            await again.step.call_one(v)
        for read in waiting:
            assert_closed(await raised(read))  # not the new store's 4
        assert await other.read.call_one(new, 4) == 4.0
        assert float((await new.read())["w"][0, 0]) == 4.0
        assert_closed(await raised(other.read.call_one(old, 0)))
        assert_closed(await raised(old.read()))


async def test_an_old_handle_keeps_its_last_version() -> None:
    """Once its store is closed and another took the name, an old handle's
    ``latest`` is the closed store's last version: in the owner's process,
    in another process of its host (which reads it from the owner's
    memory), and in the controller; never the new store's, never what
    freed memory holds."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        first, beside, other = await learner_and_readers(procs)
        old = await first.handle.call_one()
        await first.step.call_one(3)
        assert old.latest == 3 and await other.latest.call_one(old) == 3
        await first.stop()
        again = await procs.slice(procs=0).spawn("learner2", Learner)
        new = await again.handle.call_one()
        await again.step.call_one(1)
        await again.churn.call_one()  # (memory the old store freed would be taken)
        assert old.latest == 3 and new.latest == 1  # (read from the owner's memory)
        for reader in (other, beside):
            assert await reader.latest.call_one(old) == 3
            assert await reader.latest.call_one(new) == 1


async def test_an_old_handle_of_a_replaced_process_says_its_store_is_closed() -> None:
    """The learner's process SIGKILLed and replaced (``procs.replace``, at the
    same address), the rebuilt learner creates "policy" again: the old handle
    says its store is closed (RDMAError naming the old pid), in the
    controller and in another process, and never reads the new store.
    Before, the new process answered with a string that the reader's
    decoder turned into a SchemaError."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        learner = await procs.slice(procs=0).spawn("learner", Learner)
        other = await procs.slice(procs=1).spawn("other", Reader)
        old = await learner.handle.call_one()
        await learner.step.call_one(3)
        pid = procs.pids[0]
        os.kill(pid, signal.SIGKILL)
        await asyncio.wait_for(procs.wait_failed(), GUARD)
        await asyncio.wait_for(procs.replace(0), GUARD)
        new = await learner.handle.call_one()
        await learner.step.call_one(4)
        gone = (rf"WeightStore 'policy' of pid {pid} on .* is closed: its process is gone; "
                rf"pid {procs.pids[0]}, which took its address")
        for e in (await raised(old.read(at_least=4)), await raised(other.read.call_one(old, 0))):
            if isinstance(e, meshio.ActorError):
                assert e.remote_type == "meshio.RDMAError", e
            else:
                assert isinstance(e, meshio.RDMAError), e
            assert re.search(gone, str(e)), e
        assert await other.read.call_one(new, 4) == 4.0
