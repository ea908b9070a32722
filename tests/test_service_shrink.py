"""``meshio.Service``: a shrinking ``scale`` that is cancelled, ``choose``
with no replica serving, and the ``CallTimeout`` of ``route``.

Nothing sleeps to wait: calls in flight are seen through a port, processes
gone through their pidfd, and every wait is under a generous guard.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Hashable, Sequence

import pytest
from supervision_helpers import DEADLINE

import meshio
from gone import wait_gone
from meshio import Actor, Channel, Port, ReplicaStats, endpoint


class Hung(Actor):
    @endpoint
    async def whoami(self) -> int:
        return os.getpid()

    @endpoint(concurrent=True)
    async def hang(self, started: Port[int]) -> int:
        """Says it started (its pid), then never answers."""
        started.send(os.getpid())
        await asyncio.Event().wait()
        return 0


class Gated(Actor):
    def __init__(self) -> None:
        self.gate = asyncio.Event()

    @endpoint(concurrent=True)
    async def held(self, started: Port[int]) -> int:
        """Says it started (its pid), then answers it once released."""
        started.send(os.getpid())
        await self.gate.wait()
        return os.getpid()

    @endpoint
    async def release(self) -> None:
        self.gate.set()


def last(replicas: Sequence[ReplicaStats], session: Hashable | None) -> ReplicaStats:
    return replicas[-1]


async def test_a_cancelled_shrink_puts_its_replicas_back(procs: meshio.ProcMesh) -> None:
    """A shrink waiting for a hung call on the replica it removes, cancelled
    (``asyncio.wait_for``), puts that replica back in rotation; ``stop()``
    then fails the call with SupervisionError and stops its process.
    (Before, nothing held the replica any more: the call never finished and
    its process outlived ``stop()``.)"""
    svc = meshio.Service(await procs.spawn("gens", Hung), routing=last)
    await asyncio.wait_for(svc.scale(replicas=3), DEADLINE)
    port, started = Channel[int].open()
    call = asyncio.create_task(svc.hang.route(port))
    pid = await asyncio.wait_for(started.recv(), DEADLINE)
    assert pid not in procs.pids  # the replica scale started

    with pytest.raises(TimeoutError):  # (it waits for the hung call)
        await asyncio.wait_for(svc.scale(replicas=2), 0.5)
    assert [s.replica for s in svc.stats()] == [0, 1, 2]
    assert [s.in_flight for s in svc.stats()] == [0, 0, 1]
    assert await asyncio.wait_for(svc.whoami.route(), DEADLINE) == pid  # in rotation

    await asyncio.wait_for(svc.stop(), DEADLINE)
    with pytest.raises(meshio.SupervisionError):
        await asyncio.wait_for(call, DEADLINE)
    await wait_gone([pid], DEADLINE)


async def test_choose_with_no_replica_serving_names_each(procs: meshio.ProcMesh) -> None:
    """With every replica's actor stopped, ``choose`` sends nothing and
    raises SupervisionError naming each replica's cause, as a mesh's
    ``choose`` does.  (Before, it sent to a stopped replica and raised
    about that one, by its internal id.)"""
    gens = await procs.spawn("gens", Hung)
    svc = meshio.Service(gens)
    await asyncio.wait_for(gens.stop(), DEADLINE)
    with pytest.raises(meshio.SupervisionError,
                       match="choose found no replica of service 'gens' that serves") as ei:
        await asyncio.wait_for(svc.whoami.choose(), DEADLINE)
    assert "ranks 0-1: SupervisionError: its actor was stopped" in str(ei.value)
    assert [p.rank for p, _ in ei.value.failures] == [0, 1]
    assert all(isinstance(e, meshio.SupervisionError) and e.cause == "its actor was stopped"
               for _, e in ei.value.failures)


async def test_a_route_timeout_names_the_replica(procs: meshio.ProcMesh) -> None:
    """The CallTimeout of ``route`` names the replica that did not answer,
    and its rank in ``ranks`` (before: ``ranks == ()``, no replica said)."""
    svc = meshio.Service(await procs.spawn("gens", Hung), routing=last)
    port, started = Channel[int].open()
    with pytest.raises(meshio.CallTimeout, match=r"from replica 1 \('gens' rank 1") as ei:
        await asyncio.wait_for(svc.hang.options(timeout=0.5).route(port), DEADLINE)
    assert ei.value.ranks == (1,)
    assert await started.recv() == procs.pids[1]


async def test_a_shrink_stops_a_replica_past_its_drain_timeout(procs: meshio.ProcMesh) -> None:
    """``scale(drain_timeout=...)`` bounds the wait for the calls routed to
    a replica it removes: past it the replica is stopped (its process
    gone), and a hung call fails with SupervisionError naming the drain
    timeout.  (Before, ``scale`` waited for the hung call forever.)"""
    svc = meshio.Service(await procs.spawn("gens", Hung), routing=last)
    await asyncio.wait_for(svc.scale(replicas=3), DEADLINE)
    port, started = Channel[int].open()
    call = asyncio.create_task(svc.hang.route(port))
    pid = await asyncio.wait_for(started.recv(), DEADLINE)
    assert pid not in procs.pids

    await asyncio.wait_for(svc.scale(replicas=2, drain_timeout=0.2), DEADLINE)
    with pytest.raises(meshio.SupervisionError, match=r"drain_timeout=0\.2s passed") as ei:
        await asyncio.wait_for(call, DEADLINE)
    assert ei.value.cause == "drain timeout"
    await wait_gone([pid], DEADLINE)
    assert [s.replica for s in svc.stats()] == [0, 1]
    assert await asyncio.wait_for(svc.whoami.route(), DEADLINE) == procs.pids[1]


async def test_a_call_in_flight_across_a_shrink_is_judged_by_its_replicas(
        procs: meshio.ProcMesh) -> None:
    """A ``call()`` to every replica, in flight while ``scale`` removes
    some: the removed ones fail it with SupervisionError naming them, as
    they were when called.  (Before, its answers were judged by the
    replicas left: an IndexError out of the call.)"""
    svc = meshio.Service(await procs.spawn("gens", Gated))
    await asyncio.wait_for(svc.scale(replicas=3), DEADLINE)
    port, started = Channel[int].open()
    call = asyncio.ensure_future(svc.held.call(port))
    pids = {await asyncio.wait_for(started.recv(), DEADLINE) for _ in range(3)}
    assert len(pids) == 3

    await asyncio.wait_for(svc.scale(replicas=1), DEADLINE)
    await asyncio.wait_for(svc.release.route(), DEADLINE)
    with pytest.raises(meshio.SupervisionError) as ei:
        await asyncio.wait_for(call, DEADLINE)
    text = str(ei.value)
    assert "{'replicas': 1}" in text and "{'replicas': 2}" in text, text
    assert "{'replicas': 0}" not in text, text
    assert len((await asyncio.wait_for(svc.release.call(), DEADLINE)).values()) == 1


@pytest.mark.parametrize(("bad", "error"), [(-1, ValueError), (float("nan"), ValueError),
                                            ("1", TypeError), (True, TypeError)])
async def test_drain_timeout_is_checked(procs: meshio.ProcMesh, bad: object,
                                        error: type[Exception]) -> None:
    """A drain_timeout that is no number of seconds >= 0 is refused before
    anything changes."""
    svc = meshio.Service(await procs.spawn("gens", Hung))
    with pytest.raises(error, match=r"scale\(drain_timeout=\.\.\.\)"):
        await svc.scale(replicas=1, drain_timeout=bad)  # type: ignore[arg-type]
    assert len(svc) == 2
