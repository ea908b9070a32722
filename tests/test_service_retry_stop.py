"""``meshio.Service`` and what ends or fails a call without a process dying:
``route`` sends a call again as the endpoint's :class:`~meshio.Retry` says
(as ``call_one`` and ``choose`` do), and a replica whose actor the user
stopped (``actors.slice(...).stop()``) is out of rotation and not alive.

Nothing sleeps to wait: calls in flight are seen through a port, and every
wait is under a generous guard.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Hashable, Sequence

import pytest
from supervision_helpers import DEADLINE

import meshio
from meshio import Actor, Channel, Port, ReplicaStats, endpoint

BACKOFF = 0.05


class Flaky(Actor):
    """``flaky`` fails with ConnectionError as many times as ``fail_next``
    says, then answers its pid; every call of ``flaky`` and ``wrong`` is
    counted."""

    def __init__(self) -> None:
        self.failures = 0
        self.calls = 0

    @endpoint
    async def fail_next(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    @endpoint
    async def calls_made(self) -> int:
        return self.calls

    @endpoint(retry=meshio.Retry(attempts=3, on=(ConnectionError,), backoff=BACKOFF))
    async def flaky(self) -> int:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise ConnectionError("not up yet")
        return os.getpid()

    @endpoint(retry=meshio.Retry(attempts=3, on=(ConnectionError,), backoff=BACKOFF))
    async def wrong(self) -> int:
        self.calls += 1
        raise ValueError("not one the policy retries")


class Who(Actor):
    @endpoint
    async def whoami(self) -> int:
        return os.getpid()

    @endpoint(concurrent=True, retryable=True)
    async def hang_on(self, started: Port[int], pid: int) -> int:
        """Never answers in process ``pid``; at once elsewhere."""
        started.send(os.getpid())
        if os.getpid() == pid:
            await asyncio.Event().wait()
        return os.getpid()


def first(replicas: Sequence[ReplicaStats], session: Hashable | None) -> ReplicaStats:
    return replicas[0]


async def calls_made(flakies: Flaky) -> list[int]:
    return (await asyncio.wait_for(flakies.calls_made.call(), DEADLINE)).values()


# -------------------------------------------------------------------- retry


async def test_route_retries_as_the_endpoint_retry_policy_says(procs: meshio.ProcMesh) -> None:
    """The endpoint's own exception named in ``Retry.on`` is retried by
    ``route`` (before, it raised at the first failure, though ``call_one``
    and ``choose`` retried it): after the policy's backoff, doubled each
    time, on a sticky session's own replica; up to ``attempts``; an
    exception not in ``on`` is not retried."""
    flakies = await procs.spawn("flakies", Flaky)
    svc = meshio.Service(flakies, routing="sticky")
    await flakies.fail_next.call(2)
    start = time.monotonic()
    pid = await asyncio.wait_for(svc.flaky.route(session="s"), DEADLINE)
    assert time.monotonic() - start >= 2 * BACKOFF  # waited 0.05 s, then 0.1 s (some slack)
    assert await calls_made(flakies) == [3 if p == pid else 0 for p in procs.pids]

    await flakies.fail_next.call(3)  # one more than it has attempts
    with pytest.raises(meshio.ActorError, match="not up yet") as ei:
        await asyncio.wait_for(svc.flaky.route(session="s"), DEADLINE)
    assert ei.value.remote_type == "ConnectionError"
    assert await calls_made(flakies) == [3 if p == pid else 0 for p in procs.pids]

    await flakies.fail_next.call(0)
    with pytest.raises(meshio.ActorError, match="not one the policy retries"):
        await asyncio.wait_for(svc.wrong.route(session="s"), DEADLINE)
    assert await calls_made(flakies) == [1 if p == pid else 0 for p in procs.pids]


async def test_a_retried_route_is_routed_again(procs: meshio.ProcMesh) -> None:
    """Without a session, each attempt goes where the routing says then:
    round-robin, the second attempt reaches the other replica."""
    flakies = await procs.spawn("flakies", Flaky)
    svc = meshio.Service(flakies, routing="round_robin")
    await flakies.fail_next.call(1)
    assert await asyncio.wait_for(svc.flaky.route(), DEADLINE) == procs.pids[0]
    assert await calls_made(flakies) == [2, 1]  # 0 failed, 1 failed, 0 answered


# ----------------------------------------------------------------- stopped


@pytest.mark.meshio_procs(per_host={"procs": 3})
async def test_a_replica_whose_actor_was_stopped_leaves_rotation(
        procs: meshio.ProcMesh) -> None:
    """A replica whose actor the user stopped (its process serves on) is
    not alive and out of rotation, for ``route`` and ``choose``; its sticky
    sessions move.  (Before, it stayed alive and in rotation, and every call
    routed to it failed with SupervisionError "actor mesh ... was stopped".)
    Once every replica's actor is stopped, a call raises at once."""
    p0, p1, p2 = procs.pids
    gens = await procs.spawn("gens", Who)
    svc = meshio.Service(gens, routing="round_robin")
    sticky = meshio.Service(gens, routing="sticky")
    where = {s: await sticky.whoami.route(session=s) for s in "abc"}
    (on_1,) = [s for s, pid in where.items() if pid == p1]

    await asyncio.wait_for(gens.slice(procs=1).stop(), DEADLINE)
    assert [s.alive for s in svc.stats()] == [True, False, True]
    assert [await svc.whoami.route() for _ in range(6)] == [p0, p2] * 3
    assert {await svc.whoami.choose() for _ in range(4)} == {p0, p2}
    moved = await sticky.whoami.route(session=on_1)
    assert moved in (p0, p2)
    assert [await sticky.whoami.route(session=on_1) for _ in range(2)] == [moved] * 2

    await asyncio.wait_for(gens.stop(), DEADLINE)
    assert [s.alive for s in svc.stats()] == [False] * 3
    with pytest.raises(meshio.SupervisionError, match="their actor stopped") as ei:
        await asyncio.wait_for(svc.whoami.route(), DEADLINE)
    assert ei.value.cause == "no live replica"


async def test_a_retryable_call_in_flight_to_a_stopped_actor_fails_over(
        procs: meshio.ProcMesh) -> None:
    """A call in flight to a replica whose actor is stopped fails there; a
    retryable one goes to another replica (before, it was sent to the
    stopped one again until its attempts ran out)."""
    p0, p1 = procs.pids
    gens = await procs.spawn("gens", Who)
    svc = meshio.Service(gens, routing=first)
    port, started = Channel[int].open()
    call = asyncio.create_task(svc.hang_on.route(port, p0))
    assert await asyncio.wait_for(started.recv(), DEADLINE) == p0
    await asyncio.wait_for(gens.slice(procs=0).stop(), DEADLINE)
    assert await asyncio.wait_for(call, DEADLINE) == p1
    assert await started.recv() == p1
    assert [s.alive for s in svc.stats()] == [False, True]
