"""``meshio.Service`` with real worker processes: routing policies, a
replica SIGKILLed under a supervisor (out of rotation while down, back once
restarted, failover of retryable calls in flight, sticky sessions moving),
scaling up and down, statistics and bad arguments.

Nothing sleeps to wait: tests wait on ports, FIFOs (a replacement process
held in its bootstrap while the test looks at the service) and the
supervisor's events, each under a generous guard.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from supervision_helpers import DEADLINE, Events, manual_sup

import meshio
from fifo_gate import Gate, hold
from gone import wait_gone
from meshio import Actor, Channel, Port, ReplicaStats, endpoint


class Gen(Actor):
    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.release = asyncio.Event()

    @endpoint
    async def whoami(self) -> int:
        return os.getpid()

    @endpoint
    async def interrupt(self) -> None:
        raise KeyboardInterrupt("ended by its own endpoint")

    @endpoint
    async def tag_of(self) -> tuple[int, str]:
        return os.getpid(), self.tag

    @endpoint(concurrent=True)
    async def hold(self, started: Port[int]) -> int:
        """Says it started, then answers once ``let_go`` is called."""
        started.send(os.getpid())
        await self.release.wait()
        return os.getpid()

    @endpoint
    async def hold_alone(self, started: Port[int]) -> int:
        """As ``hold``, not concurrent: the calls after it wait in the mailbox."""
        started.send(os.getpid())
        await self.release.wait()
        return os.getpid()

    @endpoint(concurrent=True)
    async def let_go(self) -> None:
        self.release.set()

    @endpoint
    def hold_in_thread(self, ready: str, release: str) -> int:
        """Blocks the actor's thread (not its loop) on the test's FIFO gate."""
        hold(ready, release)
        return os.getpid()

    @endpoint(concurrent=True)
    async def hang_on(self, started: Port[int], pid: int) -> int:
        """Never answers in process ``pid``; at once elsewhere."""
        started.send(os.getpid())
        if os.getpid() == pid:
            await asyncio.Event().wait()
        return os.getpid()

    @endpoint(concurrent=True, retryable=True)
    async def hang_on_retryable(self, started: Port[int], pid: int) -> int:
        """As ``hang_on``, declared retryable."""
        started.send(os.getpid())
        if os.getpid() == pid:
            await asyncio.Event().wait()
        return os.getpid()

    @endpoint
    async def greet(self, session: str) -> str:
        return session


def first(replicas: Sequence[ReplicaStats], session: Hashable | None) -> ReplicaStats:
    return replicas[0]


def newest(replicas: Sequence[ReplicaStats], session: Hashable | None) -> ReplicaStats:
    return max(replicas, key=lambda r: r.replica)


async def routed(svc: Gen, n: int, session: str | None = None) -> list[int]:
    if session is None:
        return [await svc.whoami.route() for _ in range(n)]
    return [await svc.whoami.route(session=session) for _ in range(n)]


# ------------------------------------------------------------------- routing


@pytest.mark.meshio_procs(per_host={"procs": 3})
async def test_round_robin_spreads_evenly(procs: meshio.ProcMesh) -> None:
    svc = meshio.Service(await procs.spawn("gens", Gen, "t"), routing="round_robin")
    assert (len(svc), svc.sizes) == (3, {"replicas": 3})
    pids = await routed(svc, 9)
    assert pids == procs.pids * 3
    # call() still reaches every replica, as on the mesh
    assert (await svc.whoami.call()).values() == procs.pids


async def test_least_loaded_prefers_idle_replicas(procs: meshio.ProcMesh) -> None:
    svc = meshio.Service(await procs.spawn("gens", Gen, "t"))  # least_loaded: the default
    port, started = Channel[int].open()
    held = asyncio.create_task(svc.hold.route(port))
    busy = await asyncio.wait_for(started.recv(), DEADLINE)
    idle = next(p for p in procs.pids if p != busy)
    assert await routed(svc, 6) == [idle] * 6  # never the busy one
    assert [s.in_flight for s in svc.stats()] == [int(p == busy) for p in procs.pids]
    await svc.let_go.call()
    assert await asyncio.wait_for(held, DEADLINE) == busy
    # both idle again: ties spread over both
    assert sorted(await routed(svc, 4)) == sorted(procs.pids * 2)


@pytest.mark.meshio_procs(per_host={"procs": 3})
async def test_sticky_session_reaches_the_same_replica(procs: meshio.ProcMesh) -> None:
    svc = meshio.Service(await procs.spawn("gens", Gen, "t"), routing="sticky")
    where = {s: await routed(svc, 4, session=s) for s in "abcdef"}
    for s, pids in where.items():
        assert len(set(pids)) == 1, (s, pids)
    assert {pids[0] for pids in where.values()} == set(procs.pids)  # new sessions spread
    assert await routed(svc, 3, session="a") == where["a"][:3]


@pytest.mark.meshio_procs(per_host={"procs": 3})
async def test_custom_routing_function(procs: meshio.ProcMesh) -> None:
    seen: list[tuple[list[int], Hashable | None]] = []

    def last(replicas: Sequence[ReplicaStats], session: Hashable | None) -> ReplicaStats:
        seen.append(([r.replica for r in replicas], session))
        return replicas[-1]

    svc = meshio.Service(await procs.spawn("gens", Gen, "t"), routing=last)
    assert await routed(svc, 2) + await routed(svc, 1, session="k") == [procs.pids[2]] * 3
    assert seen == [([0, 1, 2], None), ([0, 1, 2], None), ([0, 1, 2], "k")]


async def test_session_is_refused_by_routings_that_ignore_it(procs: meshio.ProcMesh) -> None:
    """``route(session=...)`` on a service whose routing would ignore the
    session (before, the call went out, silently not sticky) raises
    ValueError naming the routings that honour sessions; nothing is sent."""
    gens = await procs.spawn("gens", Gen, "t")
    for routing in ("least_loaded", "round_robin"):
        svc = meshio.Service(gens, routing=routing)
        with pytest.raises(ValueError, match=(
                rf"^Gen\.whoami\.route\(session='alice'\) on service 'gens': its routing "
                rf"'{routing}' ignores sessions; make the service with routing=\"sticky\" \(or "
                r"a routing function")):
            await svc.whoami.route(session="alice")
        assert [(s.in_flight, s.completed) for s in svc.stats()] == [(0, 0), (0, 0)]
        assert await svc.whoami.route(session=None) in procs.pids  # (no session: routed)


# ----------------------------------------------------------------- failures


def restart_gate() -> None:
    """Every process runs this first: one started while the test holds the
    gate (a supervisor's replacement) waits here, so its replica stays down."""
    gate = Path(os.environ["SVC_GATE"])
    if (gate / "armed").exists():
        hold(str(gate / "ready"), str(gate / "release"))


@asynccontextmanager
async def supervised_service(tmp_path: Path, routing: Any) -> AsyncIterator[
        tuple[Events, meshio.ProcMesh, Gen, Gate]]:
    """Two supervised replicas; the gate armed (replacements wait in it)."""
    sup, _ = manual_sup()
    gate = Gate(tmp_path)
    async with meshio.this_host().spawn_procs(
            per_host={"procs": 2}, supervisor=sup, env={"SVC_GATE": str(tmp_path)},
            bootstrap=restart_gate) as procs, Events(sup) as events:
        svc = meshio.Service(await procs.spawn("gens", Gen, "t"), routing=routing)
        (tmp_path / "armed").touch()
        yield events, procs, svc, gate


async def kill_and_hold(events: Events, gate: Gate, pid: int) -> None:
    """SIGKILL ``pid`` (rank 0); return once its replacement waits in the gate."""
    os.kill(pid, signal.SIGKILL)
    await events.next("failure", rank=0)
    await gate.wait_held(DEADLINE)


async def let_restart(events: Events, gate: Gate, tmp_path: Path) -> None:
    (tmp_path / "armed").unlink()
    await gate.open()
    await events.next("restart", rank=0)


@pytest.mark.meshio_procs(per_host={"procs": 2})
async def test_a_replica_whose_actor_an_endpoint_ended_leaves_rotation(
        procs: meshio.ProcMesh) -> None:
    """With no supervisor, a replica's actor ended by the KeyboardInterrupt
    its endpoint raised (its process serves on) is a hole: out of rotation,
    a hole of the mesh's ``call()``; the mesh stopped and spawned again under
    its name serves on every rank.  (Before, the replica stayed in rotation
    and every call routed to it failed with SupervisionError.)  The
    controller hears of it after the actor's stop, on its own: calls are made
    until then (each a real round trip)."""
    gens = await procs.spawn("gens", Gen, "t")
    svc = meshio.Service(gens, routing="round_robin")
    with pytest.raises(meshio.ActorError, match="KeyboardInterrupt"):
        await asyncio.wait_for(gens.slice(procs=1).interrupt.call_one(), DEADLINE)

    async def until_out() -> None:
        while svc.stats()[1].alive:
            with pytest.raises(meshio.SupervisionError, match="was stopped by the Keyboard"):
                await gens.slice(procs=1).whoami.call_one()

    await asyncio.wait_for(until_out(), DEADLINE)
    assert await routed(svc, 6) == [procs.pids[0]] * 6
    answers = await asyncio.wait_for(gens.whoami.call(), DEADLINE)
    assert [p.rank for p in answers.holes] == [1] and answers.values() == [procs.pids[0]]
    await asyncio.wait_for(gens.stop(), DEADLINE)
    again = await procs.spawn("gens", Gen, "t")
    assert (await asyncio.wait_for(again.whoami.call(), DEADLINE)).values() == procs.pids


async def test_dead_replica_out_of_rotation_until_restarted(tmp_path: Path) -> None:
    async with supervised_service(tmp_path, "round_robin") as (events, procs, svc, gate):
        p0, p1 = procs.pids
        assert sorted(await routed(svc, 4)) == sorted([p0, p1] * 2)
        await kill_and_hold(events, gate, p0)
        assert await routed(svc, 6) == [p1] * 6  # no call reaches (or fails on) replica 0
        assert [s.alive for s in svc.stats()] == [False, True]
        await let_restart(events, gate, tmp_path)
        new = procs.pids[0]
        assert new != p0
        assert sorted(await routed(svc, 4)) == sorted([new, p1] * 2)  # back in rotation
        assert [s.alive for s in svc.stats()] == [True, True]


async def test_retryable_call_in_flight_fails_over(tmp_path: Path) -> None:
    async with supervised_service(tmp_path, first) as (events, procs, svc, gate):
        p0, p1 = procs.pids
        port, started = Channel[int].open()
        call = asyncio.create_task(svc.hang_on_retryable.route(port, p0))
        assert await asyncio.wait_for(started.recv(), DEADLINE) == p0  # in replica 0
        await kill_and_hold(events, gate, p0)
        assert await asyncio.wait_for(call, DEADLINE) == p1  # answered by replica 1
        assert await started.recv() == p1
        await let_restart(events, gate, tmp_path)


async def test_non_retryable_call_in_flight_raises(tmp_path: Path) -> None:
    async with supervised_service(tmp_path, first) as (events, procs, svc, gate):
        p0, _ = procs.pids
        port, started = Channel[int].open()
        call = asyncio.create_task(svc.hang_on.route(port, p0))
        assert await asyncio.wait_for(started.recv(), DEADLINE) == p0
        await kill_and_hold(events, gate, p0)
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(call, DEADLINE)
        assert ei.value.pid == p0 and "SIGKILL" in ei.value.cause
        await let_restart(events, gate, tmp_path)


async def test_sticky_session_moves_off_a_dead_replica(tmp_path: Path) -> None:
    async with supervised_service(tmp_path, "sticky") as (events, procs, svc, gate):
        p0, p1 = procs.pids
        assert await routed(svc, 2, session="zero") == [p0] * 2  # first session: replica 0
        assert await routed(svc, 2, session="one") == [p1] * 2
        await kill_and_hold(events, gate, p0)
        assert await routed(svc, 2, session="zero") == [p1] * 2  # moved
        await let_restart(events, gate, tmp_path)
        assert await routed(svc, 2, session="zero") == [p1] * 2  # and stays


# ------------------------------------------------------------ scale, stats


async def test_scale_up_and_down(procs: meshio.ProcMesh, tmp_path: Path) -> None:
    svc = meshio.Service(await procs.spawn("gens", Gen, "seven"), routing=newest)
    await svc.scale(replicas=4)
    tags = (await svc.tag_of.call()).values()
    assert [t for _, t in tags] == ["seven"] * 4  # the same constructor arguments
    pids = [p for p, _ in tags]
    assert pids[:2] == procs.pids and len(set(pids)) == 4
    assert [s.replica for s in svc.stats()] == [0, 1, 2, 3]
    assert await routed(svc, 2) == [pids[3]] * 2
    # shrink while a call is in flight on the newest replica: it is out of
    # rotation at once, and stopped once the call is answered
    gate = Gate(tmp_path)
    held = asyncio.create_task(svc.hold_in_thread.route(gate.ready, gate.release))
    await gate.wait_held(DEADLINE)
    scaling = asyncio.create_task(svc.scale(replicas=2))
    await asyncio.sleep(0)  # (one turn of the loop: scale takes replicas out first)
    assert len(svc) == 2
    assert await routed(svc, 2) == [pids[1]] * 2
    assert not scaling.done()
    await gate.open()
    assert await asyncio.wait_for(held, DEADLINE) == pids[3]
    await asyncio.wait_for(scaling, DEADLINE)
    for pid in pids[2:]:  # the processes the service started are gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # below the mesh's own actors: the last one leaves, its process stays
    await svc.scale(replicas=1)
    assert (await svc.whoami.call()).values() == [pids[0]]
    os.kill(pids[1], 0)
    await svc.scale(replicas=2)  # a new process again
    assert (await svc.whoami.call()).values()[0] == pids[0]
    await svc.stop()
    with pytest.raises(meshio.SupervisionError, match="was stopped"):
        await svc.whoami.route()


# ------------------------------------------------------ stop, who owns what


async def turns_until(done: Callable[[], bool]) -> None:
    """Let the loop turn (no time passes) until ``done()``: tasks just made
    have run up to their first real wait (a routed call: sent, counted)."""
    for _ in range(1000):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError("not done after 1000 turns of the loop")


def held_start() -> None:
    """Every process runs this first: one started while the gate is armed
    (a replica ``scale`` adds) notes its pid and waits in the gate."""
    gate = Path(os.environ["SVC_GATE"])
    if (gate / "armed").exists():
        (gate / "pids" / str(os.getpid())).touch()
        hold(str(gate / "ready"), str(gate / "release"))


def held_pids(tmp_path: Path) -> list[int]:
    return [int(p.name) for p in (tmp_path / "pids").iterdir()]


@asynccontextmanager
async def held_scale(tmp_path: Path) -> AsyncIterator[tuple[meshio.ProcMesh, Gen,
                                                            asyncio.Task[None]]]:
    """A one-replica service growing to two: its new process waits in its
    bootstrap (the gate) while the test stops something."""
    gate = Gate(tmp_path)
    (tmp_path / "pids").mkdir()
    async with meshio.this_host().spawn_procs(
            per_host={"procs": 1}, env={"SVC_GATE": str(tmp_path)},
            bootstrap=held_start) as procs:
        svc = meshio.Service(await procs.spawn("gens", Gen, "t"))
        (tmp_path / "armed").touch()
        scaling = asyncio.create_task(svc.scale(replicas=2))
        await gate.wait_held(DEADLINE)
        yield procs, svc, scaling


async def test_stop_fails_calls_in_flight_and_queued(procs: meshio.ProcMesh) -> None:
    """Routed calls running in a replica and those queued behind them all
    fail with SupervisionError when the service stops (the queued ones got
    UnknownActorError)."""
    svc = meshio.Service(await procs.spawn("gens", Gen, "t"), routing="round_robin")
    port, started = Channel[int].open()
    running = [asyncio.create_task(svc.hold_alone.route(port)) for _ in range(2)]
    pids = [await asyncio.wait_for(started.recv(), DEADLINE) for _ in range(2)]
    assert sorted(pids) == sorted(procs.pids)  # both replicas busy
    queued = [asyncio.create_task(svc.whoami.route()) for _ in range(2)]
    await turns_until(lambda: [s.in_flight for s in svc.stats()] == [2, 2])
    await asyncio.wait_for(svc.stop(), DEADLINE)
    for call, when in zip(running + queued, ["while"] * 2 + ["before"] * 2):
        with pytest.raises(meshio.SupervisionError, match=f"stopped {when} handling"):
            await asyncio.wait_for(call, DEADLINE)


async def test_a_stopped_service_stays_stopped(procs: meshio.ProcMesh) -> None:
    """Every adverb and scale() of a stopped service raise SupervisionError
    (call() returned an empty ValueMesh, choose() a MeshShapeError,
    broadcast() nothing, and scale() started processes again)."""
    svc = meshio.Service(await procs.spawn("gens", Gen, "t"))
    await svc.scale(replicas=3)
    await svc.stop()
    await svc.stop()  # (again: nothing to do)
    stopped = "service 'gens' was stopped"
    with pytest.raises(meshio.SupervisionError, match=stopped):
        await svc.whoami.route()
    with pytest.raises(meshio.SupervisionError, match=stopped):
        await svc.whoami.call()
    with pytest.raises(meshio.SupervisionError, match=stopped):
        await svc.whoami.call_one()
    with pytest.raises(meshio.SupervisionError, match=stopped):
        await svc.whoami.choose()
    with pytest.raises(meshio.SupervisionError, match=stopped):
        await svc.whoami.broadcast()
    with pytest.raises(meshio.SupervisionError, match=stopped):
        [x async for x in svc.whoami.stream()]
    with pytest.raises(meshio.SupervisionError, match=stopped):
        await svc.scale(replicas=2)
    assert (len(svc), svc.stats()) == (0, [])  # and nothing started
    for pid in procs.pids:  # the proc mesh's own processes keep running
        os.kill(pid, 0)


async def test_stop_does_not_wait_for_a_shrink(procs: meshio.ProcMesh) -> None:
    """A shrink waits for the calls of the replicas it removes; stop()
    stops those now and fails their calls (it waited for the shrink, so
    for a call that never ends)."""
    svc = meshio.Service(await procs.spawn("gens", Gen, "t"), routing=newest)
    await svc.scale(replicas=3)
    leaving = (await svc.whoami.call()).values()[2]
    port, started = Channel[int].open()
    held = asyncio.create_task(svc.hang_on.route(port, leaving))
    assert await asyncio.wait_for(started.recv(), DEADLINE) == leaving
    scaling = asyncio.create_task(svc.scale(replicas=2))
    await turns_until(lambda: len(svc) == 2)
    await asyncio.wait_for(svc.stop(), DEADLINE)
    with pytest.raises(meshio.SupervisionError):
        await asyncio.wait_for(held, DEADLINE)
    await asyncio.wait_for(scaling, DEADLINE)
    await wait_gone([leaving], DEADLINE)


async def test_stop_while_scale_starts_replicas(tmp_path: Path) -> None:
    """stop() during a grow stops the process being started, and the grow
    raises SupervisionError (stop() waited for the grow, which waited for
    the process)."""
    async with held_scale(tmp_path) as (_, svc, scaling):
        await asyncio.wait_for(svc.stop(), DEADLINE)
        with pytest.raises(meshio.SupervisionError, match="service 'gens' was stopped"):
            await asyncio.wait_for(scaling, DEADLINE)
        await wait_gone(held_pids(tmp_path), DEADLINE)
        assert len(svc) == 0


@pytest.mark.parametrize("drop", [False, True], ids=["kept", "dropped"])
async def test_scaled_replicas_stop_with_their_proc_mesh(drop: bool) -> None:
    """The processes scale() started belong to the proc mesh of the service's
    actor mesh: leaving its ``async with`` stops them, whether the service
    is still held or was dropped; they are out of rotation at once (they ran
    on, and route() reached them)."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        svc = meshio.Service(await procs.spawn("gens", Gen, "t"))
        await svc.scale(replicas=3)
        added = (await svc.whoami.call()).values()[1:]
        assert len(set(added) - set(procs.pids)) == 2
        if drop:
            del svc
            gc.collect()
    assert procs.stopped
    if not drop:
        with pytest.raises(meshio.SupervisionError, match="'procs' they belong to was stopped"):
            await svc.whoami.route()
        assert [s.alive for s in svc.stats()] == [False] * 3
    await wait_gone(added, DEADLINE)


async def test_proc_mesh_stopped_while_scale_starts_replicas(tmp_path: Path) -> None:
    """The proc mesh stopped during a grow: the process being started is
    stopped with it, and the grow raises SupervisionError."""
    async with held_scale(tmp_path) as (procs, svc, scaling):
        await procs.stop()
        with pytest.raises(meshio.SupervisionError, match="while new replicas started"):
            await asyncio.wait_for(scaling, DEADLINE)
        await wait_gone(held_pids(tmp_path), DEADLINE)
        assert len(svc) == 1


async def test_stats(procs: meshio.ProcMesh) -> None:
    svc = meshio.Service(await procs.spawn("gens", Gen, "t"), routing="round_robin")
    assert svc.stats() == [ReplicaStats(i, True, 0, 0, None, None, None) for i in range(2)]
    await routed(svc, 6)
    stats = svc.stats()
    assert [(s.in_flight, s.completed) for s in stats] == [(0, 3), (0, 3)]
    for s in stats:
        assert s.latency_p50 is not None and s.latency_p90 is not None
        assert s.latency_p99 is not None
        assert 0 < s.latency_p50 <= s.latency_p90 <= s.latency_p99 < DEADLINE
    port, started = Channel[int].open()
    held = asyncio.create_task(svc.hold.route(port))
    await asyncio.wait_for(started.recv(), DEADLINE)
    assert [s.in_flight for s in svc.stats()] == [1, 0]
    # a routed call that times out is given up: not in flight, not completed
    with pytest.raises(meshio.CallTimeout, match=r"no answer within 0\.2s"):
        await svc.hold.options(timeout=0.2).route(port)
    assert [s.in_flight for s in svc.stats()] == [1, 0]
    await svc.let_go.call()
    await asyncio.wait_for(held, DEADLINE)
    assert [(s.in_flight, s.completed) for s in svc.stats()] == [(0, 4), (0, 3)]


async def test_the_mesh_adverbs_over_the_replicas(procs: meshio.ProcMesh) -> None:
    """``choose``, ``stream`` and ``call_one`` of a service go to its
    replicas by index (its route), each call counted in the replica's
    stats as a routed one is."""
    svc = meshio.Service(await procs.spawn("gens", Gen, "t"))
    assert await svc.whoami.choose() in procs.pids
    assert sorted([pid async for _, pid in svc.whoami.stream()]) == sorted(procs.pids)
    assert sum(s.completed for s in svc.stats()) == 1  # (only choose is routed to one)
    with pytest.raises(meshio.MeshShapeError, match="the mesh has 2 actors"):
        svc.whoami.call_one()
    one = meshio.Service(await procs.slice(procs=1).spawn("one", Gen, "t"))
    assert await one.whoami.call_one() == procs.pids[1]
    assert [(s.in_flight, s.completed) for s in one.stats()] == [(0, 1)]


class Other(Actor):
    @endpoint
    async def whoami(self) -> int:
        return 0


@pytest.mark.meshio_procs(per_host={"procs": 2})
async def test_call_and_stacks_over_the_replicas(procs: meshio.ProcMesh) -> None:
    """``svc.call(Gen.whoami)`` and ``svc.stacks()``, which type checkers
    allow on a service as on a mesh, reach every replica, a scaled one
    too: one entry per replica, at its place in the ``replicas`` dim."""
    svc = meshio.Service(await procs.spawn("gens", Gen, "t"))
    assert (await svc.call(Gen.whoami)).values() == procs.pids
    await svc.scale(replicas=3)
    pids = (await svc.call(Gen.whoami)).values()
    assert pids[:2] == procs.pids and len(set(pids)) == 3
    stacks = await svc.stacks()
    assert stacks.errors == ()
    assert [(a.actor, a.rank, a.point, a.pid) for a in stacks.actors] == [
        ("gens", i, {"replicas": i}, pid) for i, pid in enumerate(pids)]
    with pytest.raises(TypeError, match=r"service 'gens'\.call: 'whoami' is not an endpoint"):
        svc.call("whoami")  # type: ignore[arg-type]
    with pytest.raises(meshio.UnknownEndpointError, match="is not an endpoint of Gen"):
        svc.call(Other.whoami)
    with pytest.raises(ValueError, match="timeout"):
        await svc.stacks(timeout=0)
    await svc.stop()
    with pytest.raises(meshio.SupervisionError, match="was stopped"):
        await svc.stacks()
    with pytest.raises(meshio.SupervisionError, match="was stopped"):
        await svc.call(Gen.whoami)


async def test_bad_arguments(procs: meshio.ProcMesh) -> None:
    gens = await procs.spawn("gens", Gen, "t")
    with pytest.raises(TypeError, match="expected an actor mesh"):
        meshio.Service(procs)  # type: ignore[type-var]
    with pytest.raises(ValueError, match="round_robin"):
        meshio.Service(gens, routing="fastest")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="routing must be"):
        meshio.Service(gens, routing=3)  # type: ignore[arg-type]
    svc = meshio.Service(gens)
    with pytest.raises(ValueError, match=">= 1"):
        await svc.scale(replicas=0)
    with pytest.raises(TypeError, match="must be an int"):
        await svc.scale(replicas="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="service's adverb"):
        await gens.whoami.route()
    with pytest.raises(AttributeError, match=r"meshio\.Service"):
        gens.stats()
    with pytest.raises(AttributeError, match="no endpoint 'nope'"):
        svc.nope  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(TypeError, match="not sliced"):
        svc.slice(replicas=0)
    with pytest.raises(TypeError, match="parameter named 'session'"):
        await svc.greet.route("x")
    for routing in ("least_loaded", "sticky"):  # (whatever the routing)
        with pytest.raises(TypeError, match=r"^Gen\.whoami\.route\(session=\.\.\.\) must be "
                                            r"hashable .*, got list \['a'\]"):
            await meshio.Service(gens, routing=routing).whoami.route(session=["a"])  # type: ignore[call-overload]
    foreign = ReplicaStats(7, True, 0, 0, None, None, None)
    bad = meshio.Service(gens, routing=lambda replicas, session: foreign)
    with pytest.raises(ValueError, match="must return one of the ReplicaStats"):
        await bad.whoami.route()
