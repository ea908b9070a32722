"""Proc mesh lifecycle with real processes and real signals (issue 7): hung
workers without a supervisor, nothing left behind after stop, failures
reported without a supervisor, proc meshes as values, slices, escalation
hooks.

Nothing here sleeps to wait for something: tests wait on call futures,
heartbeat answers (the runtime's pong hook), supervisor events and
``wait_failed``, each under a generous ``asyncio.wait_for`` guard.
"""

from __future__ import annotations

import array
import asyncio
import functools
import gc
import inspect
import os
import re
import signal
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
from supervision_helpers import next_event, next_pong

import meshio
import meshio._transport._runtime
from fifo_gate import Gate, hold
from meshio import Actor, endpoint
from meshio._transport._messages import ErrorInfo
from meshio.supervision import ManualClock
from meshio.testing import child_pids

#: generous bound on any single wait on a loaded machine
DEADLINE = 30.0


class W(Actor):
    def __init__(self, blob: Any = None) -> None:
        self.blob = blob

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def where(self) -> tuple[int, int]:
        """(the process's rank in its proc mesh, the actor's rank in its mesh)"""
        ctx = meshio.context()
        return ctx.proc.rank, ctx.point.rank

    @endpoint
    async def addr(self) -> str:
        """The address of this actor's process."""
        return meshio.context().proc.addr

    @endpoint
    async def hold(self, fifo: str) -> None:
        """Block this process's event loop until the test writes to ``fifo``."""
        with open(fifo) as f:
            f.read()


class Spawner(Actor):
    """Gets a proc mesh from the controller and spawns on it."""

    @endpoint
    async def spawn_on(self, procs: meshio.ProcMesh, name: str) -> list[tuple[int, int]]:
        assert isinstance(procs, meshio.ProcMesh)
        self.seen = procs.sizes
        self.inner = await procs.spawn(name, W)
        return (await self.inner.where.call()).values()

    @endpoint
    async def sizes_seen(self) -> dict[str, int]:
        return self.seen

    @endpoint
    async def call_inner(self) -> list[tuple[int, int]]:
        return (await self.inner.where.call()).values()

    @endpoint
    async def stop_procs(self, procs: meshio.ProcMesh) -> None:
        await procs.stop()

    @endpoint
    async def local_errors(self, procs: meshio.ProcMesh) -> list[str]:
        """What the owner's spawn/stop refuse, as caught in this actor."""
        caught = []
        try:
            await procs.slice(procs=0).stop()
        except ValueError as e:
            caught.append(f"ValueError: {e}")
        try:
            await procs.spawn("s", W)  # the name of this actor mesh on the owner
        except ValueError as e:
            caught.append(f"ValueError: {e}")
        return caught

    @endpoint
    async def owner_only(self, procs: meshio.ProcMesh) -> list[str]:
        """What only the owner knows, asked of a reference: each error."""
        assert await procs is procs  # (started before it could be passed on)
        caught = []
        for ask in (lambda: procs.actors("inner", W), lambda: procs.pids,
                    lambda: procs.stopped, lambda: procs.holes):
            try:
                ask()
            except RuntimeError as e:
                caught.append(str(e))
        for wait in (procs.stacks, procs.ready, procs.wait_failed, procs.grow):
            try:
                await wait()
            except RuntimeError as e:
                caught.append(str(e))
        return caught


class Boss(Actor):
    """Owns a supervisor (created in an endpoint) over its own proc mesh;
    its ``__supervise__`` does not handle the escalation."""

    def __init__(self, verdict: str) -> None:
        self.verdict = verdict

    def __supervise__(self, error: meshio.SupervisionError) -> bool:
        if self.verdict == "raise":
            raise RuntimeError("boom in __supervise__")
        return False

    @endpoint
    async def start(self) -> int:
        sup = meshio.Supervisor("one_for_one", max_restarts=0, name="inner",
                                clock=ManualClock())
        self.procs = await meshio.this_host().spawn_procs(
            per_host={"procs": 1}, supervisor=sup, name="inner")
        self.w = await self.procs.spawn("w", W)
        return await self.w.pid.call_one()

    @endpoint
    async def addr(self) -> str:
        """The address of this actor's process."""
        return meshio.context().proc.addr


# ----------------------------------------------------------------- helpers
# No public event says "this process sent a fault report": this hooks the
# controller runtime's own table (internals), as supervision_helpers.next_pong.


def next_fault(addr: str) -> asyncio.Future[ErrorInfo]:
    """Resolved by the next Fault the process at ``addr`` (an actor's
    ``context().proc.addr``) sends the controller."""
    rt = meshio._transport._runtime.runtime()
    fut: asyncio.Future[ErrorInfo] = rt.loop.create_future()
    orig = rt.watch.on_fault_from[addr]

    def hook(info: ErrorInfo, stopped: bool) -> None:
        orig(info, stopped)
        if not fut.done():
            fut.set_result(info)

    rt.watch.on_fault_from[addr] = hook
    return fut


async def release_fifo(fifo: Path) -> None:
    def write() -> None:
        with open(fifo, "w") as f:
            f.write("go")

    await asyncio.wait_for(asyncio.to_thread(write), DEADLINE)


# ----------------------------------------------------- item 5: hung workers


async def test_call_to_sigstopped_worker_fails_with_default_heartbeats_then_works_again(
        capsys: pytest.CaptureFixture[str]) -> None:
    """issue 7 item 5: without a supervisor or a timeout, a call to a stopped
    (SIGSTOP) worker fails with SupervisionError "not responding for N s"
    within the default heartbeat timeout (3 s); the process is not killed, and
    after SIGCONT calls reach it again."""
    # the default heartbeat interval; the timeout (3 intervals) is in the error
    assert inspect.signature(meshio.HostMesh.spawn_procs).parameters[
        "heartbeat_interval"].default == 1.0
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        w = await procs.spawn("w", W)
        pid = procs.pids[1]
        one = w.slice(procs=1)
        addr = await one.addr.call_one()
        os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(meshio.SupervisionError) as ei:
                await asyncio.wait_for(one.pid.call_one(), DEADLINE)
            elapsed = time.monotonic() - t0
            assert ei.value.rank == 1 and ei.value.pid == pid
            assert ei.value.cause.startswith("not responding for ")
            assert "not responding for" in str(ei.value) and "not killed" in str(ei.value)
            assert "heartbeat_timeout=3.0 s" in str(ei.value)
            assert "while W.pid was in flight" in str(ei.value)
            # declared after one unanswered heartbeat older than the timeout
            assert 3.0 <= elapsed < 3.0 + 2 * 1.0 + DEADLINE / 3
            # calls made while it is hung fail at once; the other rank is fine
            with pytest.raises(meshio.SupervisionError,
                               match=r"not responding for \d+\.\d s .* so W.pid was not sent"):
                await asyncio.wait_for(one.pid.call_one(), DEADLINE)
            assert await asyncio.wait_for(w.slice(procs=0).pid.call_one(), DEADLINE) \
                == procs.pids[0]
            assert pid in child_pids()  # not killed
            answered = next_pong(addr)
        finally:
            os.kill(pid, signal.SIGCONT)
        await asyncio.wait_for(answered, DEADLINE)
        assert await asyncio.wait_for(one.pid.call_one(), DEADLINE) == pid
    err = capsys.readouterr().err
    assert f"rank 1 (pid {pid} on" in err and "not responding for" in err
    assert "responds again" in err


async def test_blocked_event_loop_counts_as_not_responding(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """issue 7 item 5: an async endpoint that blocks its process's loop
    makes the process not responding: its in-flight call fails with
    SupervisionError after heartbeat_timeout; once unblocked it serves calls.
    The error, and the controller's line, name the likely cause (the
    endpoint in flight blocks the loop) and the fix (a plain ``def``, or
    ``asyncio.to_thread``): they said "not responding" alone."""
    fifo = tmp_path / "gate"
    os.mkfifo(fifo)
    async with meshio.this_host().spawn_procs(
            per_host={"procs": 1}, heartbeat_interval=0.25, heartbeat_timeout=1.0) as procs:
        w = await procs.spawn("w", W)
        pid = procs.pids[0]
        addr = await w.addr.call_one()
        with pytest.raises(meshio.SupervisionError, match=r"not responding for \d+\.\d s") as ei:
            await asyncio.wait_for(w.hold.call_one(str(fifo)), DEADLINE)
        cause = ("its event loop is likely blocked by an `async def` endpoint that does not "
                 "await (W.hold, in flight there, if it is one): time.sleep, CPU-bound work "
                 "or a torch.distributed collective (DDP's constructor too) in one holds the "
                 "loop that answers heartbeats; make such an endpoint a plain `def` (it runs "
                 "in the actor's thread) or `await asyncio.to_thread(...)` its blocking part")
        assert str(ei.value).endswith(f"calls work again once it answers. If it runs, {cause}")
        with pytest.raises(meshio.SupervisionError) as later:  # (not sent: no suspect)
            await asyncio.wait_for(w.pid.call_one(), DEADLINE)
        assert "so W.pid was not sent" in str(later.value)
        assert "likely blocked by an `async def` endpoint that does not await: " in str(
            later.value)
        answered = next_pong(addr)
        await release_fifo(fifo)
        await asyncio.wait_for(answered, DEADLINE)
        assert await asyncio.wait_for(w.pid.call_one(), DEADLINE) == pid
    err = capsys.readouterr().err
    assert f"its calls fail until it answers again; {cause}" in err


# --------------------------------------------- item 8: nothing left behind


def _tables(rt: meshio._transport._runtime.Runtime) -> dict[str, int]:
    """Sizes of the runtime's tables (internals: they are what the test is about)."""
    gc.collect()
    return {"dead": len(rt.dead), "on_lost": len(rt.on_lost),
            "on_fault_from": len(rt.watch.on_fault_from), "on_pong": len(rt.watch.on_pong),
            "hello_waiters": len(rt.watch.hello_waiters), "conns": len(rt.conns),
            "all_conns": len(rt.all_conns), "actors": len(rt.actors), "ports": len(rt.ports)}


async def test_stopped_meshes_leave_nothing_in_the_runtime() -> None:
    """issue 7 item 8: after stop, nothing of a proc mesh stays in the
    controller's runtime or its supervisor (the tables are back to their
    size after N spawn/stop cycles, constructor arguments are freed), while
    calls through old actor mesh references fail with "was stopped"."""
    rt = meshio._transport._runtime.runtime()
    host = meshio.this_host()
    sup = meshio.Supervisor("one_for_one", clock=ManualClock())
    # the proc-mesh service starts on first pickling; it is one per controller
    async with host.spawn_procs(per_host={"procs": 1}) as warm:
        w = await warm.spawn("s", Spawner)
        await w.spawn_on.call_one(warm, "x")
    before = _tables(rt)
    refs = []
    old = []
    for i in range(4):
        arg = array.array("b", bytes(4096))
        refs.append(weakref.ref(arg))
        async with host.spawn_procs(per_host={"procs": 2},
                                    supervisor=sup if i % 2 else None) as procs:
            actors = await procs.spawn("w", W, memoryview(arg))
            spawner = await procs.slice(procs=0).spawn("s", Spawner)
            await spawner.spawn_on.call_one(procs, "inner")
            assert await actors.pid.call()
        del arg
        old.append(actors)
    assert _tables(rt) == before
    assert sup.children == []
    assert [r() for r in refs] == [None] * 4  # constructor arguments freed
    for actors in old:  # old references (and their proc mesh) still say what happened
        with pytest.raises(meshio.SupervisionError, match="proc mesh 'procs' was stopped"):
            await asyncio.wait_for(actors.pid.call(), DEADLINE)
    assert _tables(rt) == before  # nothing redialled either


# ------------------------------------------------ item 12: owned supervisor


async def test_owned_supervisor_giving_up_reaches_the_owners_supervisor() -> None:
    """issue 7 item 12: a supervisor created inside an actor gives up and
    the actor's ``__supervise__`` returns False: the failure reaches the
    supervisor of the actor's own proc mesh, which restarts its process."""
    outer = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0, name="outer",
                              clock=ManualClock())
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, supervisor=outer,
                                              name="bosses") as procs:
        boss = await procs.spawn("boss", Boss, "decline")
        boss_pid = procs.pids[0]
        inner_pid = await asyncio.wait_for(boss.start.call_one(), DEADLINE)
        os.kill(inner_pid, signal.SIGKILL)
        ev = await next_event(outer, "failure")
        assert ev.mesh == "bosses" and ev.rank == 0 and ev.pid == boss_pid
        assert "supervisor 'inner' gave up" in ev.cause and "SIGKILL" in ev.cause
        assert "owned by actor boss rank 0" in ev.cause
        assert "neither __supervise__ nor on_escalate handled it" in ev.cause
        assert (await next_event(outer, "restart")).pid != boss_pid
        assert outer.failure is None


async def test_owned_supervisor_whose_hook_raises_is_reported_to_the_controller(
        capsys: pytest.CaptureFixture[str]) -> None:
    """issue 7 item 12: the owning actor's ``__supervise__`` raises and its
    proc mesh has no supervisor: the failure reaches the controller (its
    stderr), with the hook's exception."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name="bosses") as procs:
        boss = await procs.spawn("boss", Boss, "raise")
        inner_pid = await asyncio.wait_for(boss.start.call_one(), DEADLINE)
        fault = next_fault(await boss.addr.call_one())
        os.kill(inner_pid, signal.SIGKILL)
        info = await asyncio.wait_for(fault, DEADLINE)
        assert info.actor == "boss" and info.rank == 0
        assert "supervisor 'inner' gave up" in info.message
        assert "RuntimeError: boom in __supervise__" in info.traceback
    err = capsys.readouterr().err
    assert "failure in boss rank 0" in err and "nothing restarts it" in err
    assert "supervisor 'inner' gave up" in err


# ------------------------------------------------ item 14: proc rank, slices


async def test_actor_on_a_slice_sees_its_process_rank() -> None:
    """issue 7 item 14: actors spawned on a slice see their process's rank in
    the proc mesh as ``context().proc.rank`` (their own rank is the index in
    the slice), also when a supervisor rebuilds them."""
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0, clock=ManualClock())
    async with meshio.this_host().spawn_procs(per_host={"procs": 3}, supervisor=sup) as procs:
        w = await procs.slice(procs=slice(1, 3)).spawn("w", W)
        assert (await w.where.call()).values() == [(1, 0), (2, 1)]
        os.kill(procs.pids[2], signal.SIGKILL)
        await next_event(sup, "restart")
        assert (await asyncio.wait_for(w.where.call(), DEADLINE)).values() == [(1, 0), (2, 1)]


# ------------------------------------------- item 16: proc meshes as values


async def test_actor_spawns_on_a_proc_mesh_it_was_given() -> None:
    """issue 7 item 16: a proc mesh (or a slice) passed to an actor is a
    working reference: the actor spawns on it (through the controller that
    owns the processes, so its supervisor rebuilds those actors) and calls
    them; it may stop the mesh too."""
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0, clock=ManualClock())
    host = meshio.this_host()
    async with host.spawn_procs(per_host={"procs": 1}, name="ctl") as ctl, \
            host.spawn_procs(per_host={"procs": 3}, supervisor=sup, name="pool") as pool:
        spawner = await ctl.spawn("s", Spawner)
        got = await asyncio.wait_for(
            spawner.spawn_on.call_one(pool.slice(procs=slice(1, 3)), "inner"), DEADLINE)
        assert got == [(1, 0), (2, 1)]
        assert await spawner.sizes_seen.call_one() == {"procs": 2}
        with pytest.raises(ValueError, match="already has actors named 'inner'"):
            await pool.spawn("inner", W)  # recorded by the owner
        await pool.spawn("s", W)
        caught = await asyncio.wait_for(spawner.local_errors.call_one(pool), DEADLINE)
        assert len(caught) == 2 and "is a slice of proc mesh 'pool'" in caught[0]
        assert "already has actors named 's'" in caught[1]
        os.kill(pool.pids[2], signal.SIGKILL)
        await next_event(sup, "restart")
        # rebuilt by the owner's supervisor: the actor's reference works again
        assert await asyncio.wait_for(spawner.call_inner.call_one(), DEADLINE) == [
            (1, 0), (2, 1)]
        await asyncio.wait_for(spawner.stop_procs.call_one(pool), DEADLINE)
        assert pool.stopped
        # and released: the owner forgot it, so a reference cannot spawn on it
        with pytest.raises(meshio.ActorError, match="proc mesh 'pool' was stopped by its owner"):
            await asyncio.wait_for(spawner.spawn_on.call_one(pool, "late"), DEADLINE)


async def test_what_only_the_owner_knows_is_a_clear_error_on_a_reference() -> None:
    """A proc mesh reference in an actor: what only the controller that
    started the processes knows or does (its actor meshes by name, stacks,
    pids, readiness, failures, resizing) is a RuntimeError saying so, for
    each (``actors()`` and ``stacks()`` were an AttributeError), and
    awaiting the reference gives it back."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name="ctl") as ctl, \
            meshio.this_host().spawn_procs(per_host={"procs": 1}, name="pool") as pool:
        spawner = await ctl.spawn("s", Spawner)
        caught = await asyncio.wait_for(spawner.owner_only.call_one(pool), DEADLINE)
        assert len(caught) == 8, caught
        for message in caught:
            assert message.startswith("proc mesh 'pool': ") and message.endswith(
                "the controller that started the processes"), message


# ------------------------------------- item 17: failure without supervisor


async def test_worker_death_without_supervisor_is_reported(
        capsys: pytest.CaptureFixture[str]) -> None:
    """issue 7 item 17: without a supervisor, a worker killed while no call
    is in flight is reported on the controller's stderr (one line: mesh,
    rank, pid, cause) and by ``procs.wait_failed()``."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, name="lone") as procs:
        await procs.spawn("w", W)
        pid = procs.pids[1]
        other = asyncio.ensure_future(procs.slice(procs=0).wait_failed())
        failed = asyncio.ensure_future(procs.wait_failed())
        os.kill(pid, signal.SIGKILL)
        error = await asyncio.wait_for(failed, DEADLINE)
        assert isinstance(error, meshio.SupervisionError)
        assert (error.rank, error.pid, error.cause) == (1, pid, "killed by signal SIGKILL")
        assert await asyncio.wait_for(procs.slice(procs=1).wait_failed(), DEADLINE) is error
        await asyncio.sleep(0)
        assert not other.done()  # rank 0 did not fail
    with pytest.raises(meshio.SupervisionError, match="stopped before any of its processes"):
        await asyncio.wait_for(other, DEADLINE)
    lines = [line for line in capsys.readouterr().err.splitlines() if f"process {pid} " in line]
    assert lines == [f"meshio: proc mesh 'lone' rank 1: process {pid} on "
                     f"{error.host} killed by signal SIGKILL; no supervisor restarts it"]


# --------------------------------------------------- item 19: slice stop


async def test_stopping_a_slice_is_refused() -> None:
    """issue 7 item 19: ``procs.slice(...).stop()`` raises ValueError and
    stops nothing; a view of the whole mesh stops it."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        w = await procs.spawn("w", W)
        with pytest.raises(ValueError, match=r"this is a slice of proc mesh 'procs' \(1 of"):
            await procs.slice(procs=1).stop()
        assert not procs.stopped
        assert len((await w.pid.call()).values()) == 2
        await procs.rename(procs="p").stop()
        assert procs.stopped


# ------------------------------------------------ item 21: on_escalate


@pytest.mark.parametrize("handled", [True, False, 1, "yes"])
async def test_on_escalate_returning_true_handles_the_escalation(handled: object) -> None:
    """issue 7 item 21: ``on_escalate`` returning True handles a root
    escalation: the ``async with`` block exits without raising (the failure
    stays readable); returning anything else (False, a merely truthy value)
    lets it raise."""
    seen: list[meshio.SupervisionError] = []

    async def hook(error: meshio.SupervisionError) -> object:
        seen.append(error)
        return handled

    sup = meshio.Supervisor("one_for_one", max_restarts=0, clock=ManualClock(),
                            on_escalate=hook)
    raised: BaseException | None = None
    try:
        async with meshio.this_host().spawn_procs(per_host={"procs": 1},
                                                  supervisor=sup) as procs:
            await procs.spawn("w", W)
            os.kill(procs.pids[0], signal.SIGKILL)
            failure = await asyncio.wait_for(sup.wait_failed(), DEADLINE)
    except meshio.SupervisionError as e:
        raised = e
    assert seen == [failure] and sup.failure is failure
    assert raised is (None if handled is True else failure)


# ------------------------------ item 5: actor-to-actor calls to hung workers

#: heartbeats of the tests below (kept short), and the bound on how long a
#: call to a hung worker may take to fail: detection (timeout, checked every
#: interval) plus a margin for a loaded machine
HEARTBEATS = {"heartbeat_interval": 0.2, "heartbeat_timeout": 1.0}
DETECTED_WITHIN = 1.0 + 2 * 0.2 + 4.0


class Caller(Actor):
    """Calls the one-actor mesh ``target`` from its own process."""

    def __init__(self, target: Any) -> None:
        self.target = target

    @endpoint
    async def call_target(self) -> tuple[str, str, int, str, float]:
        """(outcome, the error's cause, the callee's pid, the error message,
        seconds the call took); outcome is "ok" or the error's type."""
        t0 = time.monotonic()
        try:
            pid = await self.target.pid.call_one()
        except meshio.SupervisionError as e:
            return type(e).__name__, e.cause, e.pid, str(e), time.monotonic() - t0
        return "ok", "", pid, "", time.monotonic() - t0


def _not_responding(result: tuple[str, str, int, str, float], rank: int, pid: int,
                    within: float) -> None:
    outcome, cause, named, message, elapsed = result
    assert outcome == "SupervisionError" and cause.startswith("not responding for "), result
    assert named == pid and f"on proc mesh 'procs' rank {rank}: process {pid}" in message
    assert elapsed < within, result


async def test_actor_to_actor_calls_to_sigstopped_worker_fail_then_work_again() -> None:
    """issue 7 item 5: without a supervisor, actor-to-actor calls to a stopped
    (SIGSTOP) worker fail with SupervisionError "not responding for N s"
    naming its proc mesh, rank and pid within the heartbeat timeout: a call
    over an existing connection and a first call (dialling it) alike; while
    it is hung new calls fail at once; after SIGCONT the same calls go
    through."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 3}, **HEARTBEATS) as procs:
        b = await procs.slice(procs=1).spawn("b", W)
        c = await procs.slice(procs=2).spawn("c", W)
        a1 = await procs.slice(procs=0).spawn("a1", Caller, b)
        a2 = await procs.slice(procs=0).spawn("a2", Caller, c)
        bpid, cpid = procs.pids[1], procs.pids[2]
        baddr, caddr = await b.addr.call_one(), await c.addr.call_one()
        warm = await asyncio.wait_for(a1.call_target.call_one(), DEADLINE)  # a1 dials b
        assert warm[:3] == ("ok", "", bpid)
        os.kill(bpid, signal.SIGSTOP)
        os.kill(cpid, signal.SIGSTOP)
        try:
            r1, r2 = await asyncio.wait_for(asyncio.gather(
                a1.call_target.call_one(), a2.call_target.call_one()), DEADLINE)
            _not_responding(r1, 1, bpid, DETECTED_WITHIN)
            _not_responding(r2, 2, cpid, DETECTED_WITHIN)
            r1, r2 = await asyncio.wait_for(asyncio.gather(
                a1.call_target.call_one(), a2.call_target.call_one()), DEADLINE)
            _not_responding(r1, 1, bpid, 0.5)
            _not_responding(r2, 2, cpid, 0.5)
            answered = [next_pong(baddr), next_pong(caddr)]
        finally:
            os.kill(bpid, signal.SIGCONT)
            os.kill(cpid, signal.SIGCONT)
        await asyncio.wait_for(asyncio.gather(*answered), DEADLINE)
        r1, r2 = await asyncio.wait_for(asyncio.gather(
            a1.call_target.call_one(), a2.call_target.call_one()), DEADLINE)
        assert r1[:3] == ("ok", "", bpid) and r2[:3] == ("ok", "", cpid)


async def test_workers_of_other_proc_meshes_learn_of_a_hung_worker() -> None:
    """issue 7 item 5: the workers of the controller's other proc meshes
    learn of a hung worker too: a call from one already running fails with
    "not responding" within the heartbeat timeout, a call from one started
    while the worker is hung fails at once, and both go through after
    SIGCONT."""
    host = meshio.this_host()
    async with host.spawn_procs(per_host={"procs": 1}, **HEARTBEATS) as procs, \
            host.spawn_procs(per_host={"procs": 1}, name="other") as other:
        b = await procs.spawn("b", W)
        a = await other.spawn("a", Caller, b)
        pid = procs.pids[0]
        addr = await b.addr.call_one()
        assert (await asyncio.wait_for(a.call_target.call_one(), DEADLINE))[:3] \
            == ("ok", "", pid)
        os.kill(pid, signal.SIGSTOP)
        try:
            _not_responding(await asyncio.wait_for(a.call_target.call_one(), DEADLINE),
                            0, pid, DETECTED_WITHIN)
            async with host.spawn_procs(per_host={"procs": 1}, name="late") as late:
                a_late = await late.spawn("a", Caller, b)
                _not_responding(await asyncio.wait_for(a_late.call_target.call_one(),
                                                       DEADLINE), 0, pid, 0.5)
                answered = next_pong(addr)
                os.kill(pid, signal.SIGCONT)
                await asyncio.wait_for(answered, DEADLINE)
                assert (await asyncio.wait_for(a_late.call_target.call_one(), DEADLINE))[:3] \
                    == ("ok", "", pid)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert (await asyncio.wait_for(a.call_target.call_one(), DEADLINE))[:3] \
            == ("ok", "", pid)


class SlowInit(Actor):
    """A constructor that blocks for a while (loading a model, say)."""

    def __init__(self, seconds: float) -> None:
        time.sleep(seconds)

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


@pytest.mark.parametrize("supervised", [False, True])
async def test_slow_constructor_is_not_a_hang(
        supervised: bool, capsys: pytest.CaptureFixture[str]) -> None:
    """issue 7 items 5/18: a 1.5 s __init__ under a 0.6 s heartbeat timeout
    spawns, is not killed, and serves (a constructor runs in its actor's
    thread, and while one is in flight heartbeats do not judge its process)."""
    sup = (meshio.Supervisor("one_for_one", max_restarts=0, heartbeat_interval=0.2,
                             heartbeat_timeout=0.6) if supervised else None)
    async with meshio.this_host().spawn_procs(
            per_host={"procs": 1}, supervisor=sup, heartbeat_interval=0.2,
            heartbeat_timeout=0.6) as procs:
        pid = procs.pids[0]
        slow = await asyncio.wait_for(procs.spawn("slow", SlowInit, 1.5), DEADLINE)
        assert await asyncio.wait_for(slow.pid.call_one(), DEADLINE) == pid
        assert procs.pids == [pid]
    assert sup is None or sup.failure is None
    assert "not responding" not in capsys.readouterr().err


class GatedInit(Actor):
    """A constructor that waits at a gate (:func:`fifo_gate.hold`), in its
    actor's thread."""

    def __init__(self, ready: str, release: str) -> None:
        hold(ready, release)

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


async def test_a_process_stopped_in_a_constructor_fails_the_spawn(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A spawn waited forever on a process stopped (SIGSTOP; one hung alike)
    while its constructor ran: heartbeats did not judge a process then.  They
    do now, after 100 heartbeat timeouts (``HELD_TIMEOUTS``; a constructor
    may hold the GIL for long): the spawn fails naming the process and the
    constructor; continued, the process answers again."""
    gate = Gate(tmp_path)
    async with meshio.this_host().spawn_procs(
            per_host={"procs": 1}, heartbeat_interval=0.05, heartbeat_timeout=0.1) as procs:
        pid = procs.pids[0]
        spawning = asyncio.ensure_future(
            procs.spawn("gated", GatedInit, gate.ready, gate.release))
        await gate.wait_held(DEADLINE)  # its constructor runs
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(meshio.SupervisionError) as ei:
                await asyncio.wait_for(spawning, DEADLINE)
        finally:
            os.kill(pid, signal.SIGCONT)
        message = str(ei.value)
        assert f"process {pid} on" in message and "GatedInit.__init__ was in flight" in message
        silent = re.search(r"not responding for (\d+\.\d) s", message)
        assert silent is not None and float(silent.group(1)) >= 100 * 0.1, message
        await gate.open()
    err = capsys.readouterr().err
    assert "(heartbeat_timeout=0.1 s, 100 times that while its constructor ran)" in err


async def test_a_process_stopped_before_it_reads_a_spawn_is_judged_as_any(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A process stopped (SIGSTOP) before it read a spawn got the
    constructor's allowance all the same (100 heartbeat timeouts, 5 minutes
    by default) from the moment the spawn was sent: the spawn and every
    other call to it hung that long, where a stopped process fails its calls
    after one timeout.  The allowance now starts when the process says it
    read the spawn, so the spawn fails as any call does."""
    async with meshio.this_host().spawn_procs(
            per_host={"procs": 1}, heartbeat_interval=0.05, heartbeat_timeout=0.1) as procs:
        pid = procs.pids[0]
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(meshio.SupervisionError, match="not responding") as ei:
                await asyncio.wait_for(procs.spawn("late", SlowInit, 0.0), DEADLINE)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert f"process {pid} on" in str(ei.value) and "SlowInit.__init__" in str(ei.value)
    err = capsys.readouterr().err
    assert f"(pid {pid} on" in err and "(heartbeat_timeout=0.1 s)" in err, err
    assert "times that while" not in err, err


async def test_a_start_given_up_stops_its_processes(tmp_path: Path) -> None:
    """The first await of what spawn_procs returned owns the start: cancelled
    before the processes are up (``await asyncio.wait_for(host.spawn_procs(...),
    60)`` timing out, where nobody holds the mesh to stop it), it stops them.
    Before, they ran on until the controller exited, one more set per retry.
    A call that awaits the start on its own (a spawn) does not own it."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    gates = [Gate(tmp_path / "a"), Gate(tmp_path / "b")]
    host = meshio.this_host()

    def held(gate: Gate) -> meshio.ProcMesh:
        return host.spawn_procs(per_host={"procs": 1}, shutdown="brutal_kill",
                                bootstrap=functools.partial(hold, gate.ready, gate.release))

    procs = held(gates[0])
    starting = asyncio.ensure_future(asyncio.wait_for(procs, DEADLINE))
    await gates[0].wait_held(DEADLINE)  # its process runs the bootstrap: not up
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert procs.stopped and not child_pids()

    procs = held(gates[1])
    spawning = asyncio.ensure_future(procs.spawn("w", W))
    await gates[1].wait_held(DEADLINE)
    spawning.cancel()
    with pytest.raises(asyncio.CancelledError):
        await spawning
    assert not procs.stopped
    await gates[1].open()
    async with procs:
        w = await asyncio.wait_for(procs.spawn("w", W), DEADLINE)
        assert await asyncio.wait_for(w.pid.call_one(), DEADLINE) in set(procs.pids)
