"""Two calls each waiting for a call to the other's actor: peers of one
mesh calling each other (the README's deadline example, an exchange with
the next rank), or two actors calling each other's normal endpoints.  No
single call's chain holds the cycle (each call has its own root), yet the
calls would wait forever, each queued behind the other: the actor a call
reaches sees that the call it serves waits for an actor of the new
call's chain, and fails the new call with ``DeadlockError`` at once.  A
call that only once waited for that actor (its answer in) is no deadlock
and queues as always.  Cycles of three actors or more (a ring over three
or four processes) are found by a probe that follows what each busy
actor's call waits for: one call of the cycle fails, the others go on."""

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


@pytest.fixture
async def four(meshio_host: meshio.HostMesh) -> AsyncIterator[meshio.ProcMesh]:
    """Four workers, on the transport the test is parametrised over."""
    async with meshio_host.spawn_procs(per_host={"procs": 4}) as procs:
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
        """Say it is serving, wait until released, then ask ``other`` (and
        say it asked: the call is sent)."""
        return await self.asking(other, told)

    @endpoint
    async def hold_then_ring(self, peers: Peer, told: meshio.Port[str]) -> int:
        """:meth:`hold_then_ask` the next rank of ``peers``."""
        nxt = (context().point.rank + 1) % len(peers)
        return await self.asking(peers.slice(procs=nxt), told)

    async def asking(self, other: Peer, told: meshio.Port[str]) -> int:
        told.send("in")
        await self.release.wait()
        asked = other.score.call_one()
        told.send("asked")
        return await asked

    @endpoint
    async def hold(self, told: meshio.Port[str]) -> int:
        """Say it is serving, wait until released: waiting for nobody."""
        told.send("in")
        await self.release.wait()
        return context().point.rank


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
    the last of the two to arrive fails with DeadlockError, naming both.
    (Each is inside its call before either asks: on a loaded machine one
    could otherwise finish before the other began, no deadlock at all.)"""
    peers = await procs.spawn("peers", Peer)
    port, told = meshio.Channel[str].open()
    calls = asyncio.gather(*(peers.slice(procs=r).hold_then_ring.options(timeout=GUARD)
                             .call_one(peers, port) for r in range(2)), return_exceptions=True)
    await release_in_turn([peers.slice(procs=r) for r in range(2)], told)
    results = await asyncio.wait_for(calls, GUARD + 5)
    found = [m for r in results if isinstance(r, BaseException) for m in deadlocks(r)]
    assert any("call would deadlock" in m and "Peer.hold_then_ring" in m and "Peer.score" in m
               for m in found), results
    assert not any(isinstance(r, meshio.CallTimeout) for r in results), results


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


def one_failed_naming(results: list[Any], ring: list[str], answers: list[int]) -> None:
    """One call of ``results`` failed with DeadlockError naming the cycle
    through ``ring`` (from the actor it reached, the last call to arrive),
    the busy endpoint and the one called; the others answered ``answers``."""
    failed = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
    assert len(failed) == 1, results
    cycles = {" -> ".join(ring[i:] + ring[:i + 1]) for i in range(len(ring))}
    assert any(f"a cycle of busy actors {cycle}:" in m and "Peer.hold_then_" in m
               and "Peer.score" in m for m in deadlocks(results[failed[0]])
               for cycle in cycles), results
    assert [r for i, r in enumerate(results) if i not in failed] == \
        [a for i, a in enumerate(answers) if i not in failed], results


async def release_in_turn(actors: list[Peer], told: meshio.PortReceiver[str]) -> None:
    """Once every actor is inside its call, release them one at a time, each
    once the one before has sent its call: each call reaches an actor
    still busy, and the last one closes the cycle."""
    for _ in actors:
        assert await asyncio.wait_for(told.recv(), GUARD) == "in"
    for actor in actors:
        await actor.go.call_one()
        assert await asyncio.wait_for(told.recv(), GUARD) == "asked"


@pytest.mark.meshio_transports()
async def test_three_actors_in_a_ring_of_separate_calls_fail_one_call(
        four: meshio.ProcMesh) -> None:
    """a asks b, b asks c, c asks a, each from a call of its own root: no
    two actors wait for each other, yet all three would wait forever.  The
    last call to reach its busy actor (c's, to a, unless a's first call to
    b's process came later) fails with DeadlockError naming the cycle; the
    other two then complete."""
    a, b, c = [await four.slice(procs=i).spawn(name, Peer) for i, name in enumerate("abc")]
    port, told = meshio.Channel[str].open()
    calls = asyncio.gather(*(x.hold_then_ask.options(timeout=GUARD).call_one(y, port)
                             for x, y in ((a, b), (b, c), (c, a))), return_exceptions=True)
    await release_in_turn([a, b, c], told)
    results = await asyncio.wait_for(calls, GUARD + 5)
    one_failed_naming(results, ["a[0]", "b[0]", "c[0]"], [0, 0])  # (each is rank 0 of its mesh)


@pytest.mark.meshio_transports()
async def test_a_ring_over_four_ranks_of_one_mesh_fails_one_rank(
        four: meshio.ProcMesh) -> None:
    """Each rank of one mesh asks the next one: the last call to reach a
    busy rank fails with DeadlockError; the others complete."""
    peers = await four.spawn("peers", Peer)
    port, told = meshio.Channel[str].open()
    calls = asyncio.gather(*(peers.slice(procs=r).hold_then_ring.options(timeout=GUARD)
                             .call_one(peers, port) for r in range(4)), return_exceptions=True)
    await release_in_turn([peers.slice(procs=r) for r in range(4)], told)
    results = await asyncio.wait_for(calls, GUARD + 5)
    one_failed_naming(results, [f"peers[{r}]" for r in range(4)],
                      [(r + 1) % 4 for r in range(4)])


@pytest.mark.meshio_transports()
async def test_a_chain_of_three_busy_actors_is_no_deadlock(four: meshio.ProcMesh) -> None:
    """a asks b while b's call waits for c (busy): a probe goes from b to
    c, whose call waits for nobody, and stops there; all three complete."""
    a, b, c = [await four.slice(procs=i).spawn(name, Peer) for i, name in enumerate("abc")]
    port, told = meshio.Channel[str].open()
    held = c.hold.options(timeout=GUARD).call_one(port)
    assert await asyncio.wait_for(told.recv(), GUARD) == "in"
    calls = asyncio.gather(b.hold_then_ask.options(timeout=GUARD).call_one(c, port),
                           a.hold_then_ask.options(timeout=GUARD).call_one(b, port))
    await release_in_turn([b, a], told)
    await c.go.call_one()
    assert await asyncio.wait_for(held, GUARD) == 0
    assert list(await asyncio.wait_for(calls, GUARD)) == [0, 0]


@pytest.mark.meshio_transports()
async def test_a_ring_whose_first_wait_was_answered_is_no_deadlock(
        four: meshio.ProcMesh) -> None:
    """a asked b (answered) and holds; then b asks c and c asks a: a
    waits for nobody now, so the calls queue and all complete."""
    a, b, c = [await four.slice(procs=i).spawn(name, Peer) for i, name in enumerate("abc")]
    port, told = meshio.Channel[str].open()
    held = a.ask_then_hold.options(timeout=GUARD).call_one(b, port)
    assert await asyncio.wait_for(told.recv(), GUARD) == "asked"
    calls = asyncio.gather(b.hold_then_ask.options(timeout=GUARD).call_one(c, port),
                           c.hold_then_ask.options(timeout=GUARD).call_one(a, port))
    await release_in_turn([b, c], told)
    await a.go.call_one()
    assert await asyncio.wait_for(held, GUARD) == 0
    assert list(await asyncio.wait_for(calls, GUARD)) == [0, 0]
