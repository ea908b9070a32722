"""A start given up before anyone awaited what ``spawn_procs`` returned,
and a stop given up before or after it began.

``spawn_procs()`` starts the processes when it is called; the first await
of what it returned owns the start (cancelled, it stops them).  An await
that never began left them running, held by nobody: ``asyncio.wait_for``
with a budget of 0 or less (Python 3.11 wraps the mesh in a task cancelled
before its first step), a task made with ``ensure_future`` and cancelled at
once, or the mesh dropped unawaited.  Kept alive, its name stayed taken and
its workers outlived the controller.  Such a mesh is stopped now, once
nothing refers to it; one that is used without being awaited (Monarch's
``procs = host.spawn_procs(...)`` then ``await procs.spawn(...)``) is not.

A stop is a coroutine like any: given up before its first step (on Python
3.11, ``asyncio.wait_for(procs.stop(), 0)``), it stops nothing; once begun,
cancelled, it kills the processes rather than waiting for them.

Nothing here sleeps to wait: tests wait on the tasks of the mesh to end,
on pidfds and on FIFO gates (each under a generous guard), and then look for
processes and records.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
from pathlib import Path

import pytest

import meshio
from fifo_gate import Gate
from meshio import Actor, endpoint
from meshio.testing import child_pids, proc_mesh, wait_exited
from test_elastic import HeldAtCleanup

#: generous bound on any single wait on a loaded machine
DEADLINE = 30.0
NAME = "given-up"


class W(Actor):
    @endpoint
    async def pid(self) -> int:
        return os.getpid()


@pytest.fixture(autouse=True)
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's directory of kept-alive records (its names meet no other test's)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return tmp_path / "meshio" / "procs"


async def give_up(host: meshio.HostMesh, how: str) -> None:
    """Start a kept-alive mesh named NAME and give it up ``how``, before
    anything awaited it."""
    def start() -> meshio.ProcMesh:
        return host.spawn_procs(per_host={"procs": 2}, name=NAME, keep_alive=60)

    if how == "wait_for 0":
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(start(), 0)
    elif how == "wait_for -1":  # (a deadline passed: `deadline - loop.time()`)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(start(), -1)
    elif how == "ensure_future, cancelled":
        task = asyncio.ensure_future(start())
        task.cancel()  # (before its first step)
        with pytest.raises(asyncio.CancelledError):
            await task
        del task
    else:
        assert how == "dropped"
        start()


async def tasks_ended(before: set[asyncio.Task[object]], what: str) -> None:
    """Wait until every task started since ``before`` has ended (what a
    stop starts on its way too)."""
    deadline = time.monotonic() + DEADLINE
    while left := asyncio.all_tasks() - before - {asyncio.current_task()}:
        _, pending = await asyncio.wait(left, timeout=max(deadline - time.monotonic(), 0))
        assert not pending, f"{what}: tasks still running after {DEADLINE} s: {pending}"


async def test_a_start_given_up_before_its_first_await_stops_its_processes(
        records: Path) -> None:
    host = meshio.this_host()
    async with host.spawn_procs(per_host={"procs": 1}):
        pass  # (the runtime's own tasks, started by a first mesh, stay)
    pids, tasks = child_pids(), asyncio.all_tasks()
    for how in ("wait_for 0", "wait_for -1", "ensure_future, cancelled", "dropped"):
        await give_up(host, how)
        gc.collect()  # (a cancelled task refers to itself through its error)
        await tasks_ended(tasks, how)
        assert child_pids() == pids, f"{how}: worker processes left running"
        assert not (records / f"{NAME}.json").exists(), f"{how}: the mesh is still published"
    async with host.spawn_procs(per_host={"procs": 1}, name=NAME, keep_alive=60):
        pass  # the name is free


async def test_a_mesh_used_without_being_awaited_is_not_stopped() -> None:
    """Monarch's way: ``procs = host.spawn_procs(...)`` then ``await
    procs.spawn(...)``, or a slice or ``options`` of it, or an actor mesh
    spawned on it, are held: the mesh is not stopped when what
    ``spawn_procs`` returned is no longer referred to."""
    host = meshio.this_host()
    pids = child_pids()
    procs = host.spawn_procs(per_host={"procs": 2})
    gc.collect()
    w = await asyncio.wait_for(procs.spawn("w", W), DEADLINE)
    assert set((await asyncio.wait_for(w.pid.call(), DEADLINE)).values()) == set(procs.pids)
    del w
    await procs.stop()

    actors = await asyncio.wait_for(host.spawn_procs(per_host={"procs": 1}).spawn("w", W),
                                    DEADLINE)
    # (a slice of every point: stop() takes it as the whole mesh)
    sliced = host.spawn_procs(per_host={"procs": 1}).slice(procs=0)
    held = host.spawn_procs(per_host={"procs": 1}).options(restart="transient")
    gc.collect()
    assert await asyncio.wait_for(actors.pid.call_one(), DEADLINE) == proc_mesh(actors).pids[0]
    on_slice = await asyncio.wait_for(sliced.spawn("w", W), DEADLINE)
    assert await asyncio.wait_for(on_slice.pid.call_one(), DEADLINE) == sliced.pids[0]
    await asyncio.wait_for(held.ready(), DEADLINE)
    assert not held.stopped
    for mesh in (proc_mesh(actors), sliced, held):
        await mesh.stop()
    assert child_pids() == pids


async def test_a_stop_does_nothing_before_it_begins_and_kills_once_begun(
        tmp_path: Path) -> None:
    gate = Gate(tmp_path)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1},
                                              shutdown=10 * DEADLINE) as procs:
        held = await procs.spawn("held", HeldAtCleanup, str(tmp_path), 0)
        stopping = asyncio.ensure_future(procs.stop())
        stopping.cancel()  # (before its first step)
        with pytest.raises(asyncio.CancelledError):
            await stopping
        if sys.version_info < (3, 12):  # (later, wait_for runs the first step)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(procs.stop(), 0)
        assert not procs.stopped
        pid = await asyncio.wait_for(held.pid.call_one(), DEADLINE)
        fd = os.pidfd_open(pid)
        try:
            stopping = asyncio.ensure_future(procs.stop())
            await gate.wait_held(DEADLINE)  # its actor's cleanup holds: the stop waits its grace
            stopping.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(stopping, DEADLINE)
            await wait_exited(fd, DEADLINE)  # killed, not waited for
        finally:
            os.close(fd)
        assert procs.stopped
