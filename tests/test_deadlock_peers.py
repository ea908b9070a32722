"""Two calls each waiting for a call to the other's actor: peers of one
mesh calling each other (the README's deadline example, an exchange with
the next rank), or two actors calling each other's normal endpoints.  No
single call's chain holds the cycle (each call has its own root), yet the
calls would wait forever, each queued behind the other: the actor a call
reaches sees that the call it serves waits for an actor of the new
call's chain, and fails the new call with ``DeadlockError`` at once.  A
call that only once waited for that actor (its answer in) is no deadlock
and queues as always."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import meshio
from meshio import Actor, context, endpoint

GUARD = 60.0


@pytest.fixture
async def procs() -> AsyncIterator[meshio.ProcMesh]:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        yield procs


class Peer(Actor):
    def __init__(self) -> None:
        self.release = asyncio.Event()

    @endpoint
    async def score(self) -> int:
        return context().point.rank

    @endpoint
    async def step(self, peers: Peer) -> list[int]:
        """Every peer's score (this one's own included), as README's
        deadline example asks them."""
        return list((await peers.score.call()).values())

    @endpoint
    async def ring(self, peers: Peer) -> int:
        """The next rank's score only."""
        nxt = (context().point.rank + 1) % 2
        return await peers.slice(procs=nxt).score.call_one()

    @endpoint
    async def ask_then_hold(self, other: Peer, told: meshio.Port[str]) -> int:
        """Wait for ``other`` (answered), say so, then stay busy until
        released: waiting for nobody."""
        got = await other.score.call_one()
        told.send("asked")
        await self.release.wait()
        return got

    @endpoint(concurrent=True)
    async def go(self) -> None:
        self.release.set()

    @endpoint
    async def ask(self, other: Peer) -> int:
        return await other.score.call_one()

    @endpoint
    async def hold_then_ask(self, other: Peer, told: meshio.Port[str]) -> int:
        """Say it is serving, wait until released, then ask ``other``."""
        told.send("in")
        await self.release.wait()
        return await other.score.call_one()


def deadlocks(e: BaseException) -> list[str]:
    """The deadlock errors ``e`` carries: itself, or its ranks' failures
    (an endpoint that let one through fails with it, as an ActorError)."""
    failures: Any = getattr(e, "failures", None) or {}
    found = [e, *(failures.values() if isinstance(failures, dict) else failures)]
    return [str(f) for f in found if "would deadlock" in str(f)]


async def test_peers_asking_every_peer_fail_at_once_not_at_the_deadline(
        procs: meshio.ProcMesh) -> None:
    """README's example: each rank's ``step`` asks every peer's ``score``;
    each waits behind the other's ``step``.  The call fails with
    DeadlockError long before its 60 s deadline (it was a CallTimeout)."""
    peers = await procs.spawn("peers", Peer)
    with pytest.raises(Exception) as caught:
        await asyncio.wait_for(peers.step.options(timeout=GUARD).call(peers), GUARD + 5)
    assert not isinstance(caught.value, (TimeoutError, meshio.CallTimeout)), caught.value
    assert deadlocks(caught.value), repr(caught.value)
    # the actors serve on
    assert sorted((await asyncio.wait_for(peers.score.call(), GUARD)).values()) == [0, 1]


async def test_a_ring_exchange_fails_at_once_rather_than_hanging(
        procs: meshio.ProcMesh) -> None:
    """Each rank asks only the next one: no call reaches its own actor, and
    the last of the two to arrive fails with DeadlockError, naming both."""
    peers = await procs.spawn("peers", Peer)
    with pytest.raises(Exception) as caught:
        await asyncio.wait_for(peers.ring.options(timeout=GUARD).call(peers), GUARD + 5)
    found = deadlocks(caught.value)
    assert found, repr(caught.value)
    assert any("call would deadlock" in m and "Peer.ring" in m and "Peer.score" in m
               for m in found), found


async def test_two_actors_calling_each_other_fail_at_once(procs: meshio.ProcMesh) -> None:
    """Each is inside the call that asks the other before either asks (on a
    loaded machine one could otherwise finish before the other began: no
    deadlock at all)."""
    a = await procs.slice(procs=0).spawn("a", Peer)
    b = await procs.slice(procs=1).spawn("b", Peer)
    port, told = meshio.Channel[str].open()
    calls = asyncio.gather(a.hold_then_ask.options(timeout=GUARD).call_one(b, port),
                           b.hold_then_ask.options(timeout=GUARD).call_one(a, port),
                           return_exceptions=True)
    for _ in range(2):
        assert await asyncio.wait_for(told.recv(), GUARD) == "in"
    await asyncio.gather(a.go.call_one(), b.go.call_one())
    results = await asyncio.wait_for(calls, GUARD)
    assert [m for r in results if isinstance(r, BaseException) for m in deadlocks(r)], results
    assert not any(isinstance(r, meshio.CallTimeout) for r in results), results


async def test_a_call_that_only_once_waited_for_the_caller_is_no_deadlock(
        procs: meshio.ProcMesh) -> None:
    """``a`` asked ``b`` (answered) and is busy with nothing ``b`` does;
    ``b`` then asks ``a``: that call queues and is served once ``a`` is
    done, not failed."""
    a = await procs.slice(procs=0).spawn("a", Peer)
    b = await procs.slice(procs=1).spawn("b", Peer)
    port, told = meshio.Channel[str].open()
    held = a.ask_then_hold.call_one(b, port)
    assert await asyncio.wait_for(told.recv(), GUARD) == "asked"
    asked = b.ask.call_one(a)  # queues behind ask_then_hold on a
    await a.go.call_one()
    assert await asyncio.wait_for(held, GUARD) == 0  # (b is rank 0 of its mesh)
    assert await asyncio.wait_for(asked, GUARD) == 0
