"""Supervision with real faults: processes killed, exiting, crashing, hung
(SIGSTOP) or cut off, actors raising in broadcasts or failing to rebuild.

Nothing here sleeps to wait for something to happen: tests wait on the
supervisor's event stream, on call futures, on pidfds and on the manual
clock's sleepers, each under a generous ``asyncio.wait_for`` guard so that a
regression fails instead of hanging.  Heartbeats run on a
:class:`~meshio.supervision.ManualClock` unless a test is about them, so a
loaded machine cannot make a healthy worker look hung.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import resource
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import meshio
from meshio import Actor, endpoint
from meshio.supervision import ManualClock, SupervisionEvent
from meshio.testing import wait_exited

#: generous bound on any single wait on a loaded machine
DEADLINE = 30.0
HOST = socket.gethostname()


# ------------------------------------------------------------------ actors


class W(Actor):
    def __init__(self, k: int, tag: str = "") -> None:
        self.k = k
        self.tag = tag
        self.restarts = 0

    def on_restart(self) -> None:
        self.restarts += 1

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def info(self) -> tuple[int, str, int, int, int, int]:
        """(k, tag, rank, procs coordinate, on_restart runs, pid)"""
        point = meshio.current_rank()
        return (self.k, self.tag, point.rank, point["procs"], self.restarts, os.getpid())

    @endpoint
    async def echo(self, x: int) -> tuple[int, int]:
        return (meshio.current_rank().rank, x)

    @endpoint
    async def hang_on(self, rank: int) -> int:
        """Never answers on ``rank``; answers at once elsewhere."""
        if meshio.current_rank().rank == rank:
            await asyncio.Event().wait()
        return os.getpid()

    @endpoint(concurrent=True)  # runs even while the actor is busy (hang_on)
    async def exit(self, code: int) -> None:
        os._exit(code)

    @endpoint
    async def segfault(self) -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
        ctypes.string_at(0)

    @endpoint
    async def boom_on(self, rank: int) -> None:
        if meshio.current_rank().rank == rank:
            raise ValueError(f"boom in rank {rank}")

    @endpoint
    async def record_then_exit(self, path: str) -> int:
        """Not retryable: record this execution, then die mid-call."""
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")
        os._exit(7)

    @endpoint(retryable=True)
    async def record_retryable(self, path: str) -> int:
        """Retryable: the first execution dies mid-call, later ones answer."""
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")
        if len(Path(path).read_text().split()) == 1:
            os._exit(7)
        return os.getpid()

    @endpoint(retryable=True)
    async def ident(self, x: int) -> int:
        return x


class Fragile(Actor):
    """Fails to construct while ``flag`` exists (e.g. only when rebuilt)."""

    def __init__(self, flag: str) -> None:
        if os.path.exists(flag):
            raise RuntimeError(f"refusing to start: {flag} exists")

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Doomed(Actor):
    """Its process exits while being rebuilt once ``flag`` exists."""

    def __init__(self, flag: str) -> None:
        if os.path.exists(flag):
            os._exit(1)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Gated(Actor):
    """Its rebuild after a restart blocks until the test writes to ``gate``."""

    def __init__(self, gate: str) -> None:
        self.gate = gate
        self.restarted = False

    def on_restart(self) -> None:
        with open(self.gate, "rb") as f:  # a FIFO: blocks until the test says go
            f.read(1)
        self.restarted = True

    @endpoint
    def state(self) -> tuple[int, bool, int]:
        return (meshio.current_rank().rank, self.restarted, os.getpid())


class Relay(Actor):
    """Holds a reference to another actor mesh and calls it directly."""

    def __init__(self, target: W) -> None:
        self.target = target

    @endpoint
    async def pid_of(self, rank: int) -> int:
        return await self.target.slice(procs=rank).pid.call_one()


class Boss(Actor):
    """Owns a supervisor (created in an endpoint) over its own proc mesh;
    ``__supervise__`` handles the escalation on rank 0 only."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.hook_calls = 0
        self.seen: asyncio.Future[str] | None = None
        self.procs: meshio.ProcMesh | None = None

    def __supervise__(self, error: meshio.SupervisionError) -> bool:
        assert isinstance(error, meshio.SupervisionError)
        self.errors.append(str(error))
        if self.seen is not None and not self.seen.done():
            self.seen.set_result(str(error))
        return self.rank == 0

    @endpoint
    async def start(self) -> int:
        self.rank = meshio.current_rank().rank
        self.seen = asyncio.get_running_loop().create_future()

        def hook(error: meshio.SupervisionError) -> None:
            self.hook_calls += 1

        sup = meshio.Supervisor("one_for_one", max_restarts=0, within=60.0, name="inner",
                                clock=ManualClock(), on_escalate=hook)
        self.sup = sup
        self.procs = await meshio.this_host().spawn_procs(
            per_host={"procs": 1}, supervisor=sup, name="inner")
        self.w = await self.procs.spawn("w", W, 5)
        return await self.w.pid.call_one()

    @endpoint
    async def supervised(self) -> tuple[str, int, str]:
        assert self.seen is not None
        error = await asyncio.wait_for(asyncio.shield(self.seen), DEADLINE)
        failed = await asyncio.wait_for(self.sup.wait_failed(), DEADLINE)
        return (error, self.hook_calls, str(failed))

    @endpoint
    async def stop_inner(self) -> None:
        if self.procs is not None:
            await self.procs.stop()


# ----------------------------------------------------------------- helpers


class Events:
    """A supervisor's event stream, consumed in order by one test."""

    def __init__(self, sup: meshio.Supervisor) -> None:
        self._it = sup.events()
        self.seen: list[SupervisionEvent] = []

    async def until(self, pred: Callable[[SupervisionEvent], bool],
                    timeout: float = DEADLINE) -> SupervisionEvent:
        async def scan() -> SupervisionEvent:
            while True:
                ev = await self._it.__anext__()
                self.seen.append(ev)
                if pred(ev):
                    return ev

        return await asyncio.wait_for(scan(), timeout)

    async def next(self, kind: str, rank: int | None = None, mesh: str | None = None,
                   timeout: float = DEADLINE) -> SupervisionEvent:
        return await self.until(lambda e: e.kind == kind and (rank is None or e.rank == rank)
                                and (mesh is None or e.mesh == mesh), timeout)

    def kinds(self) -> list[tuple[str, str, int]]:
        return [(e.kind, e.mesh, e.rank) for e in self.seen]

    async def aclose(self) -> None:
        await self._it.aclose()


def check_event(ev: SupervisionEvent, kind: str, mesh: str, rank: int) -> None:
    assert ev.kind == kind
    assert ev.mesh == mesh
    assert ev.rank == rank
    assert isinstance(ev.timestamp, float) and abs(ev.timestamp - time.time()) < DEADLINE
    assert isinstance(ev.cause, str) and ev.cause


def manual_sup(strategy: str = "one_for_one", **kw: Any) -> tuple[meshio.Supervisor, ManualClock]:
    clock = ManualClock()
    kw.setdefault("max_restarts", 3)
    kw.setdefault("within", 60.0)
    return meshio.Supervisor(strategy, clock=clock, **kw), clock  # type: ignore[arg-type]


async def until(pred: Callable[[], bool], timeout: float = DEADLINE) -> None:
    """Yield to the loop until ``pred()`` holds (for state with no event)."""
    async def spin() -> None:
        while not pred():
            await asyncio.sleep(0)

    await asyncio.wait_for(spin(), timeout)


async def wait_pidfds(fds: list[int], timeout: float = DEADLINE) -> None:
    """Wait (on the loop) until every pidfd says its process exited."""
    for fd in fds:
        try:
            await wait_exited(fd, timeout)
        finally:
            os.close(fd)


# ----------------------------------------------------- failure detection


async def test_sigkill_restarts_process_and_rebuilds_actors() -> None:
    sup, _ = manual_sup()
    events = Events(sup)
    async with meshio.this_host().spawn_procs(per_host={"procs": 3}, supervisor=sup) as procs:
        w = await procs.spawn("w", W, 7, tag="seven")
        before = (await w.info.call()).values()
        assert [(k, t, r, c, n) for k, t, r, c, n, _ in before] == [
            (7, "seven", r, r, 0) for r in range(3)]
        old = [pid for *_, pid in before]
        assert old == procs.pids
        os.kill(old[1], signal.SIGKILL)
        failure = await events.next("failure")
        check_event(failure, "failure", "procs", 1)
        assert "SIGKILL" in failure.cause
        assert failure.pid == old[1] and failure.host == HOST
        restart = await events.next("restart")
        check_event(restart, "restart", "procs", 1)
        assert restart.pid not in old and restart.host == HOST
        after = (await w.info.call()).values()
        # same coordinates, original constructor arguments, on_restart ran once on rank 1
        assert [(k, t, r, c, n) for k, t, r, c, n, _ in after] == [
            (7, "seven", 0, 0, 0), (7, "seven", 1, 1, 1), (7, "seven", 2, 2, 0)]
        assert [pid for *_, pid in after] == [old[0], restart.pid, old[2]] == procs.pids
        assert sup.failure is None
    await events.aclose()


async def test_os_exit_fails_in_flight_call_with_exit_code() -> None:
    sup, _ = manual_sup()
    events = Events(sup)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        w = await procs.spawn("w", W, 1)
        old = procs.pids
        hanging = w.hang_on.call(1)  # rank 0 answers, rank 1 is in flight when it dies
        w.slice(procs=1).exit.broadcast(3)
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(hanging, DEADLINE)
        err = ei.value
        assert (err.actor, err.rank, err.host, err.pid) == ("w", 1, HOST, old[1])
        assert err.cause == "exited with code 3"
        assert "'procs'" in str(err) and "rank 1" in str(err) and "hang_on" in str(err)
        failure = await events.next("failure")
        check_event(failure, "failure", "procs", 1)
        assert failure.cause == "exited with code 3"
        restart = await events.next("restart", rank=1)
        assert procs.pids == [old[0], restart.pid] and restart.pid != old[1]
        assert (await w.echo.call(5)).values() == [(0, 5), (1, 5)]
    await events.aclose()


async def test_segfault_is_detected_and_restarted() -> None:
    sup, _ = manual_sup()
    events = Events(sup)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        w = await procs.spawn("w", W, 1)
        old = procs.pids
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(w.slice(procs=0).segfault.call_one(), DEADLINE)
        assert "SIGSEGV" in ei.value.cause and ei.value.pid == old[0]
        failure = await events.next("failure")
        check_event(failure, "failure", "procs", 0)
        assert "SIGSEGV" in failure.cause
        restart = await events.next("restart", rank=0)
        assert procs.pids == [restart.pid, old[1]] and restart.pid != old[0]
        assert (await w.info.call()).values()[0][:5] == (1, "", 0, 0, 1)
    await events.aclose()


async def test_exception_escaping_broadcast_restarts_that_process() -> None:
    sup, _ = manual_sup()
    events = Events(sup)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        w = await procs.spawn("w", W, 1)
        old = procs.pids
        w.boom_on.broadcast(1)  # nobody to tell: a supervision event
        failure = await events.next("failure")
        check_event(failure, "failure", "procs", 1)
        assert "ValueError: boom in rank 1" in failure.cause and failure.pid == old[1]
        restart = await events.next("restart")
        check_event(restart, "restart", "procs", 1)
        assert procs.pids == [old[0], restart.pid] and restart.pid != old[1]
        assert [i[4] for i in (await w.info.call()).values()] == [0, 1]
    await events.aclose()


async def test_constructor_failing_on_rebuild_counts_as_failure_and_escalates(
        tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    sup, _ = manual_sup(max_restarts=2)
    events = Events(sup)
    with pytest.raises(meshio.SupervisionError) as ei:
        async with meshio.this_host().spawn_procs(per_host={"procs": 2},
                                                  supervisor=sup) as procs:
            f = await procs.spawn("f", Fragile, str(flag))
            old = procs.pids
            flag.touch()  # from now on every rebuild of Fragile fails
            os.kill(old[1], signal.SIGKILL)
            escalation = await events.next("escalation")
            failures = [e for e in events.seen if e.kind == "failure"]
            assert [e.rank for e in failures] == [1, 1, 1]
            assert "SIGKILL" in failures[0].cause
            for e in failures[1:]:
                assert e.cause.startswith("restart failed")
                assert f"refusing to start: {flag} exists" in e.cause
            assert not [e for e in events.seen if e.kind == "restart"]
            assert escalation.rank == -1 and escalation.cause.endswith(
                "after 2 restarts in the last 60.0s; max_restarts=2 within 60.0s allows no more")
            assert await asyncio.wait_for(sup.wait_failed(), DEADLINE) is sup.failure
            # the children were stopped: no live process, calls fail
            assert all(w.handle.returncode is not None for w in procs._state.workers)
            with pytest.raises(meshio.SupervisionError):
                await asyncio.wait_for(f.pid.call(), DEADLINE)
    assert ei.value is sup.failure
    await events.aclose()


async def test_process_dying_during_its_rebuild_counts_once(tmp_path: Path) -> None:
    sup, _ = manual_sup(max_restarts=2, within=60.0)
    events = Events(sup)
    flag = tmp_path / "die"
    with pytest.raises(meshio.SupervisionError):
        async with meshio.this_host().spawn_procs(per_host={"procs": 2},
                                                  supervisor=sup) as procs:
            await procs.spawn("d", Doomed, str(flag))
            flag.touch()  # every rebuild now kills its own process
            os.kill(procs.pids[1], signal.SIGKILL)
            await events.next("escalation")
            failures = [e for e in events.seen if e.kind == "failure"]
            # one failure per dead process: the kill, then two rebuilds that died
            assert [e.cause for e in failures] == [
                "killed by signal SIGKILL", "exited with code 1", "exited with code 1"]
            assert len({e.pid for e in failures}) == 3
    await events.aclose()


async def test_hung_process_missing_heartbeats_is_killed_and_restarted() -> None:
    sup, clock = manual_sup(heartbeat_interval=1.0)  # timeout: 3 intervals
    assert sup.heartbeat_timeout == 3.0
    events = Events(sup)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        w = await procs.spawn("w", W, 1)
        old = procs.pids
        await until(lambda: clock.sleepers == 1)  # the heartbeat loop waits on the clock
        os.kill(old[1], signal.SIGSTOP)
        in_flight = w.hang_on.call(-1)  # rank 1 cannot answer: it is stopped
        ticks = 0
        while not in_flight.done():
            assert ticks < 200, "the hung process was never declared hung"
            clock.advance(1.0)
            ticks += 1
            await until(lambda: clock.sleepers == 1 or in_flight.done())
            # rank 0's pong for this tick arrives before this reply (same connection)
            assert await asyncio.wait_for(w.slice(procs=0).pid.call_one(), DEADLINE) == old[0]
        with pytest.raises(meshio.SupervisionError) as ei:
            await in_flight
        assert ei.value.rank == 1 and ei.value.pid == old[1]
        # killed at the first tick where it had been silent for more than 3 s
        assert "hung: no heartbeat answer for 4.0s" in ei.value.cause
        failure = await events.next("failure")
        check_event(failure, "failure", "procs", 1)
        assert "hung" in failure.cause and "heartbeat_timeout=3.0s" in failure.cause
        restart = await events.next("restart", rank=1)
        assert procs.pids == [old[0], restart.pid] and restart.pid != old[1]
        assert (await w.echo.call(2)).values() == [(0, 2), (1, 2)]
    await events.aclose()


async def test_hung_process_detected_with_real_clock() -> None:
    sup = meshio.Supervisor(strategy="one_for_one", max_restarts=3, within=60.0,
                            heartbeat_interval=0.2, heartbeat_timeout=2.0)
    events = Events(sup)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        w = await procs.spawn("w", W, 1)
        old = procs.pids
        fd = os.pidfd_open(old[1])
        os.kill(old[1], signal.SIGSTOP)
        failure = await events.next("failure", rank=1)
        assert "hung" in failure.cause and failure.pid == old[1]
        restart = await events.next("restart", rank=1)
        assert restart.pid != old[1] and procs.pids[1] == restart.pid
        await wait_pidfds([fd])  # the stopped process was killed
        assert (await w.slice(procs=1).echo.call_one(9)) == (1, 9)
    await events.aclose()


async def test_lost_connection_is_a_failure() -> None:
    sup, _ = manual_sup()
    events = Events(sup)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        w = await procs.spawn("w", W, 1)
        old = procs.pids
        in_flight = w.hang_on.call(1)
        conn = procs._state.workers[1].conn
        assert conn is not None
        conn.abort()  # cut the controller's socket to the worker
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(in_flight, DEADLINE)
        assert ei.value.rank == 1 and ei.value.pid == old[1]
        failure = await events.next("failure")
        check_event(failure, "failure", "procs", 1)
        # the worker exits when it loses the controller; if slow, it is killed
        assert failure.cause in ("exited with code 1",
                                 "connection lost (process still running; killed)")
        restart = await events.next("restart", rank=1)
        assert procs.pids == [old[0], restart.pid] and restart.pid != old[1]
        assert (await w.echo.call(3)).values() == [(0, 3), (1, 3)]
    await events.aclose()


async def test_lost_connection_to_hung_process_kills_it_retryable_call_waits() -> None:
    sup, _ = manual_sup()
    events = Events(sup)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        w = await procs.spawn("w", W, 1)
        old = procs.pids
        os.kill(old[1], signal.SIGSTOP)  # cannot notice the cut, cannot exit by itself
        conn = procs._state.workers[1].conn
        assert conn is not None
        conn.abort()
        # a round trip elsewhere: the controller has seen the loss by now
        assert await w.slice(procs=0).pid.call_one() == old[0]
        # issued while the controller still waits for an exit status: it must
        # wait for the restart (not spin, not fail) and run on the new process
        answer = w.slice(procs=1).ident.call_one(5)
        plain = w.slice(procs=1).pid.call_one()
        with pytest.raises(meshio.SupervisionError):
            await asyncio.wait_for(plain, DEADLINE)
        assert await asyncio.wait_for(answer, DEADLINE) == 5
        failure = await events.next("failure")
        check_event(failure, "failure", "procs", 1)
        assert failure.cause == "connection lost (process still running; killed)"
        restart = await events.next("restart", rank=1)
        assert procs.pids == [old[0], restart.pid] and restart.pid != old[1]
        assert events.kinds() == [("failure", "procs", 1), ("restart", "procs", 1)]
    await events.aclose()


async def test_without_supervisor_nothing_restarts() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        w = await procs.spawn("w", W, 1)
        old = procs.pids
        in_flight = w.hang_on.call(1)
        fd = os.pidfd_open(old[1])
        os.kill(old[1], signal.SIGKILL)
        await wait_pidfds([fd])
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(in_flight, DEADLINE)
        assert "SIGKILL" in ei.value.cause
        # nothing waits for a restart that will not come, retryable or not
        with pytest.raises(meshio.SupervisionError):
            await asyncio.wait_for(procs._state.wait_ready(1), DEADLINE)
        with pytest.raises(meshio.SupervisionError):
            await asyncio.wait_for(w.slice(procs=1).ident.call_one(1), DEADLINE)
        assert procs.pids == old
        assert await w.slice(procs=0).ident.call_one(4) == 4


# ------------------------------------------------- what a restart keeps


async def test_references_held_by_controller_and_other_actors_reach_new_incarnation() -> None:
    sup, _ = manual_sup()
    events = Events(sup)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs, \
            meshio.this_host().spawn_procs(per_host={"procs": 1}, name="helper") as helper:
        w = await procs.spawn("w", W, 1)
        relay = await helper.spawn("relay", Relay, w)
        one = w.slice(procs=1)  # a slice taken before the restart
        old = procs.pids
        assert await relay.pid_of.call_one(1) == old[1]
        os.kill(old[1], signal.SIGKILL)
        restart = await events.next("restart", rank=1)
        assert await relay.pid_of.call_one(1) == restart.pid
        assert await relay.pid_of.call_one(0) == old[0]
        assert await one.pid.call_one() == restart.pid
        assert (await w.pid.call()).values() == [old[0], restart.pid]
    await events.aclose()


async def test_in_flight_calls_are_not_reexecuted(tmp_path: Path) -> None:
    path = tmp_path / "runs"
    sup, _ = manual_sup()
    events = Events(sup)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        w = await procs.spawn("w", W, 1)
        old = procs.pids
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(w.slice(procs=1).record_then_exit.call_one(str(path)),
                                   DEADLINE)
        assert ei.value.cause == "exited with code 7" and ei.value.pid == old[1]
        assert ei.value.rank == 1  # its rank in the mesh as spawned, through a slice too
        restart = await events.next("restart", rank=1)
        # a round trip to the new incarnation: anything resent would have run by now
        assert await w.slice(procs=1).pid.call_one() == restart.pid
        assert path.read_text().split() == [str(old[1])]
    await events.aclose()


async def test_retryable_call_completes_on_new_incarnation(tmp_path: Path) -> None:
    path = tmp_path / "runs"
    sup, _ = manual_sup()
    events = Events(sup)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        w = await procs.spawn("w", W, 1)
        old = procs.pids
        answer = await asyncio.wait_for(
            w.slice(procs=1).record_retryable.call_one(str(path)), DEADLINE)
        restart = await events.next("restart", rank=1)
        assert answer == restart.pid == procs.pids[1] != old[1]
        # executed twice: by the incarnation that died, then by the new one
        assert path.read_text().split() == [str(old[1]), str(restart.pid)]
    await events.aclose()


async def test_slices_without_the_failed_rank_work_while_it_restarts(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    gate_fd = os.open(gate, os.O_RDWR)  # never blocks; holds the FIFO open
    sup, _ = manual_sup()
    events = Events(sup)
    try:
        async with meshio.this_host().spawn_procs(per_host={"procs": 3},
                                                  supervisor=sup) as procs:
            g = await procs.spawn("g", Gated, str(gate))
            old = procs.pids
            os.kill(old[1], signal.SIGKILL)
            await events.next("failure", rank=1)
            # rank 1's rebuild is blocked on the gate: the others keep serving
            for _ in range(3):
                assert await g.slice(procs=0).state.call_one() == (0, False, old[0])
                assert await g.slice(procs=2).state.call_one() == (2, False, old[2])
                assert (await g.slice(procs=slice(0, 3, 2)).state.call()).values() == [
                    (0, False, old[0]), (2, False, old[2])]
                with pytest.raises(meshio.SupervisionError) as ei:
                    await asyncio.wait_for(g.slice(procs=1).state.call_one(), DEADLINE)
                assert "SIGKILL" in ei.value.cause and ei.value.rank == 1
            with pytest.raises(meshio.SupervisionError):
                await asyncio.wait_for(g.state.call(), DEADLINE)
            assert not [e for e in events.seen if e.kind == "restart"]
            os.write(gate_fd, b"x")  # let the rebuild finish
            restart = await events.next("restart", rank=1)
            assert (await g.state.call()).values() == [
                (0, False, old[0]), (1, True, restart.pid), (2, False, old[2])]
    finally:
        os.close(gate_fd)
    await events.aclose()


# ------------------------------------------------------------ strategies


async def test_one_for_all_restarts_every_process() -> None:
    sup, _ = manual_sup("one_for_all")
    events = Events(sup)
    async with meshio.this_host().spawn_procs(per_host={"procs": 3}, supervisor=sup) as procs:
        w = await procs.spawn("w", W, 2)
        old = procs.pids
        os.kill(old[1], signal.SIGKILL)
        await events.until(lambda e: e.kind == "restart" and e.rank == 2)
        # the others stopped in reverse order, then all started in order
        assert events.kinds() == [
            ("failure", "procs", 1), ("stopped", "procs", 2), ("stopped", "procs", 0),
            ("restart", "procs", 0), ("restart", "procs", 1), ("restart", "procs", 2)]
        new = procs.pids
        assert not set(new) & set(old)
        assert [e.pid for e in events.seen if e.kind == "restart"] == new
        info = (await w.info.call()).values()
        assert [(k, r, n, pid) for k, _, r, _, n, pid in info] == [
            (2, r, 1, new[r]) for r in range(3)]
    await events.aclose()


async def test_rest_for_one_restarts_failed_and_later_children() -> None:
    sup, _ = manual_sup("rest_for_one", max_restarts=10)
    events = Events(sup)
    host = meshio.this_host()
    async with host.spawn_procs(per_host={"procs": 2}, supervisor=sup, name="a") as a, \
            host.spawn_procs(per_host={"procs": 2}, supervisor=sup, name="b") as b:
        wa = await a.spawn("wa", W, 1)
        wb = await b.spawn("wb", W, 2)
        a0, b0 = a.pids, b.pids

        # a failure in the first mesh restarts it and the one declared after it
        os.kill(a0[0], signal.SIGKILL)
        await events.next("restart", rank=1, mesh="b")
        assert events.kinds() == [
            ("failure", "a", 0), ("stopped", "b", 1), ("stopped", "b", 0), ("stopped", "a", 1),
            ("restart", "a", 0), ("restart", "a", 1), ("restart", "b", 0), ("restart", "b", 1)]
        a1, b1 = a.pids, b.pids
        assert not set(a1) & set(a0) and not set(b1) & set(b0)

        # a failure in the second restarts only the second (from that rank on)
        del events.seen[:]
        os.kill(b1[0], signal.SIGKILL)
        await events.next("restart", rank=1, mesh="b")
        assert events.kinds() == [("failure", "b", 0), ("stopped", "b", 1),
                                  ("restart", "b", 0), ("restart", "b", 1)]
        assert a.pids == a1 and not set(b.pids) & set(b1)

        # the last one: only itself
        del events.seen[:]
        b2 = b.pids
        os.kill(b2[1], signal.SIGKILL)
        await events.next("restart", rank=1, mesh="b")
        assert events.kinds() == [("failure", "b", 1), ("restart", "b", 1)]
        assert a.pids == a1 and b.pids[0] == b2[0] and b.pids[1] != b2[1]
        assert (await wa.echo.call(1)).values() == [(0, 1), (1, 1)]
        assert (await wb.echo.call(2)).values() == [(0, 2), (1, 2)]
    await events.aclose()


# --------------------------------------------------------- restart types


async def test_transient_restarts_only_abnormal_exits() -> None:
    sup, _ = manual_sup()
    events = Events(sup)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        w = await procs.spawn("w", W, 1, restart="transient")  # type: ignore[call-arg]
        old = procs.pids
        w.slice(procs=0).exit.broadcast(0)  # normal exit: not restarted
        failure = await events.next("failure")
        assert failure.rank == 0 and failure.cause == "exited normally"
        with pytest.raises(meshio.SupervisionError):  # nothing to wait for
            await asyncio.wait_for(procs._state.wait_ready(0), DEADLINE)
        with pytest.raises(meshio.SupervisionError):
            await asyncio.wait_for(w.slice(procs=0).ident.call_one(1), DEADLINE)
        w.slice(procs=1).exit.broadcast(3)  # abnormal exit: restarted
        restart = await events.next("restart")
        assert restart.rank == 1 and restart.pid != old[1]
        # rank 0's failure came first: a restart of it would have come first too
        assert events.kinds() == [("failure", "procs", 0), ("failure", "procs", 1),
                                  ("restart", "procs", 1)]
        assert procs.pids == [old[0], restart.pid]
        assert await w.slice(procs=1).ident.call_one(2) == 2
        with pytest.raises(meshio.SupervisionError):
            await asyncio.wait_for(w.slice(procs=0).pid.call_one(), DEADLINE)
    await events.aclose()


async def test_temporary_is_never_restarted() -> None:
    sup, _ = manual_sup()
    events = Events(sup)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        w = await procs.spawn("w", W, 1, restart="temporary")  # type: ignore[call-arg]
        old = procs.pids
        os.kill(old[0], signal.SIGKILL)
        failure = await events.next("failure")
        assert failure.rank == 0 and "SIGKILL" in failure.cause
        for call in (w.slice(procs=0).pid.call_one, lambda: w.slice(procs=0).ident.call_one(1)):
            with pytest.raises(meshio.SupervisionError) as ei:
                await asyncio.wait_for(call(), DEADLINE)
            assert "SIGKILL" in ei.value.cause
            assert "restarts it" not in str(ei.value)
        assert procs.pids == old
        assert await w.slice(procs=1).ident.call_one(3) == 3
        assert events.kinds() == [("failure", "procs", 0)]
    await events.aclose()


async def test_temporary_actors_on_a_restarted_process_are_not_rebuilt() -> None:
    sup, _ = manual_sup()
    events = Events(sup)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        keep = await procs.spawn("keep", W, 1)  # permanent: the process is restarted
        temp = await procs.spawn("temp", W, 2, restart="temporary")  # type: ignore[call-arg]
        old = procs.pids
        os.kill(old[0], signal.SIGKILL)
        restart = await events.next("restart", rank=0)
        assert await keep.slice(procs=0).pid.call_one() == restart.pid
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(temp.slice(procs=0).pid.call_one(), DEADLINE)
        assert "temporary" in str(ei.value)
        assert await temp.slice(procs=1).pid.call_one() == old[1]
    await events.aclose()


# -------------------------------------------------------------- shutdown


@pytest.mark.parametrize("policy", ["brutal_kill", 30.0])
async def test_shutdown_policy_of_strategy_restarts(policy: Any) -> None:
    sup, _ = manual_sup("one_for_all")
    events = Events(sup)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup,
                                              shutdown=policy) as procs:
        await procs.spawn("w", W, 1)
        old = [w.handle for w in procs._state.workers]
        os.kill(old[1].pid, signal.SIGKILL)
        await events.next("restart", rank=1)
        # the healthy sibling: asked to exit (code 0) with a grace, killed if brutal
        expected = -signal.SIGKILL if policy == "brutal_kill" else 0
        assert old[0].returncode == expected
        assert old[1].returncode == -signal.SIGKILL
    await events.aclose()


@pytest.mark.parametrize("policy", ["brutal_kill", 3.0])
async def test_shutdown_grace_then_kill_for_a_stopped_worker(policy: Any) -> None:
    sup, _ = manual_sup()
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup,
                                                 shutdown=policy)
    try:
        await procs.spawn("w", W, 1)
        handles = [w.handle for w in procs._state.workers]
        os.kill(handles[1].pid, signal.SIGSTOP)  # cannot honour a shutdown request
    finally:
        await asyncio.wait_for(procs.stop(), DEADLINE)
    assert handles[1].returncode == -signal.SIGKILL  # killed (after the grace, if any)
    assert handles[0].returncode == (-signal.SIGKILL if policy == "brutal_kill" else 0)
    assert sup.failure is None


# ------------------------------------------------------------ escalation


async def test_restarts_spread_beyond_within_do_not_escalate_but_a_storm_does() -> None:
    escalated: list[meshio.SupervisionError] = []
    # a heartbeat interval longer than any advance: only the window moves
    sup, clock = manual_sup(max_restarts=2, within=10.0, heartbeat_interval=1000.0,
                            on_escalate=escalated.append)
    events = Events(sup)
    host = meshio.this_host()
    stops: list[str] = []
    with pytest.raises(meshio.SupervisionError) as ei:
        async with host.spawn_procs(per_host={"procs": 2}, supervisor=sup, name="a") as a, \
                host.spawn_procs(per_host={"procs": 1}, supervisor=sup, name="b") as b:
            for state in (a._state, b._state):
                def recording(orig: Any = state.stop, name: str = state.name) -> Any:
                    stops.append(name)
                    return orig()
                state.stop = recording  # type: ignore[method-assign]
            w = await a.spawn("w", W, 1)
            await b.spawn("w", W, 2)

            # five restarts, each more than `within` after the previous: no escalation
            for _ in range(5):
                pid = a.pids[0]
                os.kill(pid, signal.SIGKILL)
                ev = await events.next("restart", rank=0)
                assert ev.pid != pid
                clock.advance(11.0)
            assert sup.failure is None and not escalated
            assert len([e for e in events.seen if e.kind == "restart"]) == 5

            # three failures within the window: the third would need a third restart
            del events.seen[:]
            for n in range(3):
                pids = a.pids
                os.kill(pids[n % 2], signal.SIGKILL)
                ev = await events.until(lambda e: e.kind in ("restart", "escalation"))
                assert ev.kind == ("escalation" if n == 2 else "restart")
                clock.advance(1.0)
            check_event(ev, "escalation", "supervisor", -1)
            assert ev.cause == (
                "proc mesh 'a' rank 0 failed (killed by signal SIGKILL) after 2 restarts in "
                "the last 10.0s; max_restarts=2 within 10.0s allows no more")
            failed = await asyncio.wait_for(sup.wait_failed(), DEADLINE)
            assert failed is sup.failure and escalated == [failed]
            assert isinstance(failed, meshio.SupervisionError)
            # children stopped in reverse declaration order, every process gone
            assert stops == ["b", "a"]
            assert all(w.handle.returncode is not None
                       for s in (a._state, b._state) for w in s.workers)
            with pytest.raises(meshio.SupervisionError):
                await asyncio.wait_for(w.pid.call(), DEADLINE)
    assert ei.value is sup.failure  # the `async with` block raised it on exit
    await events.aclose()


async def test_nested_supervisor_escalates_to_parent_which_restarts_it() -> None:
    clock = ManualClock()
    root = meshio.Supervisor("one_for_one", max_restarts=1, within=60.0, name="root",
                             clock=clock)
    child = meshio.Supervisor("one_for_one", max_restarts=0, within=60.0, name="child",
                              parent=root, clock=clock)
    root_events, child_events = Events(root), Events(child)
    with pytest.raises(meshio.SupervisionError) as ei:
        async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=child,
                                                  name="inner") as procs:
            w = await procs.spawn("w", W, 3)
            old = procs.pids
            os.kill(old[0], signal.SIGKILL)
            esc = await child_events.next("escalation")
            assert esc.cause.endswith("after 0 restarts in the last 60.0s; max_restarts=0 "
                                      "within 60.0s allows no more")
            failure = await root_events.next("failure")
            check_event(failure, "failure", "child", -1)
            restart = await root_events.next("restart")
            check_event(restart, "restart", "child", -1)
            new = procs.pids
            assert not set(new) & set(old)
            assert child.failure is None and root.failure is None
            assert [i[:5] for i in (await w.info.call()).values()] == [
                (3, "", 0, 0, 1), (3, "", 1, 1, 1)]

            # the restarted child still detects failures; a second escalation
            # exceeds the root's intensity: the root gives up
            os.kill(new[1], signal.SIGKILL)
            await child_events.next("escalation")
            root_esc = await root_events.next("escalation")
            assert root_esc.cause.startswith("child supervisor 'child' failed (")
            assert root_esc.cause.endswith("after 1 restart in the last 60.0s; "
                                           "max_restarts=1 within 60.0s allows no more")
            assert await asyncio.wait_for(root.wait_failed(), DEADLINE) is root.failure
            assert all(w.handle.returncode is not None for w in procs._state.workers)
    assert ei.value is root.failure
    await root_events.aclose()
    await child_events.aclose()


async def test_supervise_hook_of_owning_actor_handles_escalation() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, name="bosses") as procs:
        boss = await procs.spawn("boss", Boss)
        inner = (await asyncio.wait_for(boss.start.call(), DEADLINE)).values()
        assert len(set(inner)) == 2 and not set(inner) & set(procs.pids)
        for pid in inner:
            os.kill(pid, signal.SIGKILL)
        results = (await asyncio.wait_for(boss.supervised.call(), DEADLINE)).values()
        for rank, (error, hook_calls, failed) in enumerate(results):
            assert "supervisor 'inner' gave up" in error and "SIGKILL" in error
            assert error == failed
            # __supervise__ returning True (rank 0) stops the escalation there
            assert hook_calls == (0 if rank == 0 else 1)
        await boss.stop_inner.call()
