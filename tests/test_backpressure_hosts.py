"""Bounded mailboxes on an actor mesh spanning hosts (issue 18 item 4):
its calls go directly (one actor) and through the fan-out tree (all of
them); the caller's one gate per mesh keeps every actor's mailbox within
``max_queued`` calls of this caller, whatever the path, and the calls run
in the order they were made.  The actors' credit for tree calls comes back
up the tree.  Hosts are agents on loopback (ProcessJob): real processes and
TCP connections; a fan-out width of 2 over 3 hosts makes a relay pass calls
and credit on.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import meshio
from meshio import Overloaded
from meshio.jobs import ProcessJob
from test_backpressure import GUARD, Announcer, Slow, noted

HOSTS = 3
BOUND = 4


@pytest.fixture
async def procs(tmp_path: Path, width: int) -> AsyncIterator[meshio.ProcMesh]:
    job = ProcessJob(meshes={"hosts": HOSTS}, cache_dir=tmp_path / ".meshio")
    try:
        state = await job.state()
        async with state.hosts.spawn_procs(per_host={"procs": 1}) as procs:
            yield procs
    finally:
        await job.kill()


@pytest.fixture
async def slow(procs: meshio.ProcMesh) -> Slow:
    return await procs.options(max_queued=BOUND).spawn("slow", Slow)


async def queued(s: Slow) -> list[int]:
    """The calls waiting in each actor's mailbox now (one sample)."""
    stacks = await asyncio.wait_for(s.stacks(), GUARD)
    return [a.queued for a in sorted(stacks.actors, key=lambda a: a.rank)]


async def until_full(s: Slow, rank: int) -> list[list[int]]:
    """Sample the mailboxes until ``rank``'s holds ``BOUND`` calls."""
    samples = [await queued(s)]
    async with asyncio.timeout(GUARD):
        while samples[-1][rank] < BOUND:
            samples.append(await queued(s))
    return samples


async def test_tree_and_direct_calls_wait_for_room_in_order(slow: Slow) -> None:
    one = slow.slice(hosts=1)
    calls: list[asyncio.Future[Any]] = []
    for i in range(0, 30, 2):
        calls.append(asyncio.ensure_future(slow.take.call(i)))  # through the tree
        calls.append(asyncio.ensure_future(one.take.call_one(i + 1)))  # directly
    samples = await until_full(slow, 1)
    assert not any(c.done() for c in calls)  # held by the gate: the rest wait here
    await slow.open_gate.call()
    while not all(c.done() for c in calls):
        samples.append(await queued(slow))
    assert max(max(sample) for sample in samples) == BOUND  # never more, on any host
    results = await asyncio.wait_for(asyncio.gather(*calls), GUARD)
    assert [r.values() if i % 2 == 0 else r for i, r in enumerate(results)] == [
        [i] * HOSTS if i % 2 == 0 else i for i in range(30)]
    taken = await slow.taken.call()
    assert taken.values() == [list(range(0, 30, 2)), list(range(30)), list(range(0, 30, 2))]


async def test_on_full_raise_and_broadcasts_nobody_awaits(slow: Slow) -> None:
    calls = [asyncio.ensure_future(slow.take.call(i)) for i in range(BOUND + 1)]
    await until_full(slow, 2)
    with pytest.raises(Overloaded) as info:
        slow.take.options(on_full="raise").call(100)
    assert info.value.actor == "slow" and info.value.max_queued == BOUND
    with pytest.raises(Overloaded):
        slow.slice(hosts=2).take.options(on_full="raise").call_one(101)
    sent = [slow.take.broadcast(200 + i) for i in range(BOUND)]  # wait here, not awaited
    with pytest.raises(Overloaded, match="await what an earlier broadcast"):
        slow.take.broadcast(300)
    await slow.open_gate.call()
    await asyncio.wait_for(asyncio.gather(*calls), GUARD)
    for s in sent:
        await asyncio.wait_for(s, GUARD)
    async with asyncio.timeout(GUARD):  # (the last broadcasts may still be queued)
        while min(len(t) for t in (await slow.taken.call()).values()) < 2 * BOUND + 1:
            pass
    assert (await slow.taken.call()).values() == [
        [*range(BOUND + 1), *range(200, 200 + BOUND)]] * HOSTS


async def test_awaited_broadcasts_wait_and_a_withdrawn_one_lets_the_next_go(
        slow: Slow) -> None:
    """At the gate too, broadcasts awaited by many tasks all wait for room
    (only those nobody awaits are bounded), and cancelling the await of one
    withdraws it: the first in the gate's queue, it held up one behind it
    that has room now, which goes at once."""
    two, one = slow.slice(hosts=2), slow.slice(hosts=1)
    calls = [asyncio.ensure_future(two.take.call_one(i)) for i in range(BOUND + 1)]
    await until_full(slow, 2)

    async def produce(mesh: Slow, i: int) -> None:
        await mesh.take.broadcast(i)

    first = asyncio.ensure_future(produce(two, 100))
    behind = asyncio.ensure_future(produce(one, 200))  # (host 1 has room: held up by first)
    more = [asyncio.ensure_future(produce(slow, 300 + i)) for i in range(2 * BOUND)]
    await asyncio.sleep(0)  # (one turn of the loop: each made its broadcast and awaits it)
    assert not [p for p in (first, behind, *more) if p.done()]  # (before: Overloaded)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(first, GUARD)
    await asyncio.wait_for(behind, GUARD)  # (host 2's gate still closed)
    await slow.open_gate.call()
    await asyncio.wait_for(asyncio.gather(*calls, *more), GUARD)
    bulk = list(range(300, 300 + 2 * BOUND))
    async with asyncio.timeout(GUARD):  # (the last broadcasts may still be queued)
        while sum(len(t) for t in (await slow.taken.call()).values()) < \
                BOUND + 2 + 3 * len(bulk):
            pass
    assert (await slow.taken.call()).values() == [bulk, [200, *bulk], [*range(BOUND + 1), *bulk]]


async def test_a_lost_host_releases_the_calls_waiting_for_room_there(slow: Slow) -> None:
    calls = [asyncio.ensure_future(slow.take.call(i)) for i in range(3 * BOUND)]
    await until_full(slow, 2)
    pid = await slow.slice(hosts=2).pid.call_one()
    os.kill(pid, signal.SIGKILL)
    await slow.slice(hosts=slice(0, 2)).open_gate.call()
    _, pending = await asyncio.wait(calls, timeout=GUARD)
    assert not pending  # each answered (rank 2 a hole) or failed: none waits for room
    assert {type(c.exception()) for c in calls} <= {type(None), meshio.SupervisionError}
    assert (await slow.slice(hosts=0).taken.call_one()) == list(range(3 * BOUND))
    later = await slow.slice(hosts=slice(0, 2)).take.call(99)
    assert later.values() == [99, 99]


async def test_awaiting_room_in_its_own_mailbox_through_the_tree_fails_at_once(
        procs: meshio.ProcMesh) -> None:
    """A broadcast to the whole mesh goes through the tree, and waits at
    the caller's gate: awaiting room in the caller's own mailbox there
    fails at once too (its credit comes back up the tree)."""
    for host in (0, 2):
        a = await procs.options(max_queued=BOUND).spawn("a", Announcer)
        me = a.slice(hosts=host)
        got = await asyncio.wait_for(me.announce.call_one(3 * BOUND), GUARD)
        assert got.startswith("DeadlockError: awaited broadcast would deadlock: "
                              f"a[{host}] -> a[{host}]: "), got
        assert await noted(me, BOUND) == list(range(BOUND))
        assert await asyncio.wait_for(me.announce.call_one(1), GUARD) == "sent"
        assert await noted(me, BOUND + 1) == [*range(BOUND), 0]
        await a.stop()
