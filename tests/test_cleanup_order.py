"""What an actor owns is stopped before it: the actor meshes it spawned
(newest first, their ``__cleanup__`` runs) and the proc meshes it started,
then its own ``__cleanup__`` (issue 7 item 15).

Cleanup order is recorded in a file (appends from several processes keep
their order); tests wait on call futures, ports and pidfds, never sleep.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

import meshio
from meshio import Actor, Channel, Port, endpoint
from meshio._cell import CLEANUP_TIMEOUT, OWNED_STOP_TIMEOUT
from meshio.testing import child_pids, wait_exited

#: generous bound on any single wait on a loaded machine
GUARD = 20.0


def note(log: str, text: str) -> None:
    with open(log, "a") as f:
        f.write(text + "\n")


class Child(Actor):
    def __init__(self, log: str, tag: str) -> None:
        self.log, self.tag = log, tag

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    async def __cleanup__(self, exc: BaseException | None) -> None:
        await asyncio.sleep(0)
        note(self.log, f"child {self.tag} {exc!r}")


class Parent(Actor):
    """Starts its own proc mesh and spawns two child meshes there."""

    def __init__(self, log: str, done: Port[str] | None = None) -> None:
        self.log, self.done = log, done

    @endpoint
    async def start(self, shutdown: float = 5.0) -> list[int]:
        self.procs = await meshio.this_host().spawn_procs(per_host={"procs": 1}, name="inner",
                                                          shutdown=shutdown)
        await self.procs.spawn("c1", Child, self.log, "1")
        await self.procs.spawn("c2", Child, self.log, "2")
        return self.procs.pids

    @endpoint
    async def spawn_on(self, procs: meshio.ProcMesh) -> int:
        """Spawn on a proc mesh of the controller's (through a reference)."""
        child = await procs.spawn("r", Child, self.log, "r")
        return await child.pid.call_one()

    @endpoint
    async def exit(self) -> None:
        raise SystemExit(7)

    def __cleanup__(self, exc: BaseException | None) -> None:
        note(self.log, f"parent {exc!r}")
        if self.done is not None:
            self.done.send("done")


async def test_actor_mesh_stop_cleans_up_owned_actors_first_newest_first(
        procs: meshio.ProcMesh, tmp_path: Path) -> None:
    """issue 7 item 15: ActorMesh.stop of an actor stops the actor meshes it
    spawned first, newest first (one through a reference to the controller's
    proc mesh), then the proc mesh it started (its process is gone), then
    runs the actor's own __cleanup__."""
    log = tmp_path / "log"
    parent = await procs.slice(procs=0).spawn("parent", Parent, str(log))
    inner = await asyncio.wait_for(parent.start.call_one(), GUARD)
    ref_pid = await asyncio.wait_for(parent.spawn_on.call_one(procs.slice(procs=1)), GUARD)
    assert ref_pid == procs.pids[1]
    fds = [os.pidfd_open(p) for p in inner]
    try:
        await asyncio.wait_for(parent.stop(), GUARD)
        assert log.read_text().splitlines() == [
            "child r None", "child 2 None", "child 1 None", "parent None"]
        for fd in fds:
            await wait_exited(fd, GUARD)
    finally:
        for fd in fds:
            os.close(fd)


async def test_controller_proc_mesh_stop_cleans_up_owned_first(tmp_path: Path) -> None:
    """issue 7 item 15: stopping the controller's proc mesh (the owner's
    worker shuts down) runs the owned actors' __cleanup__ newest first, stops
    the owner's own proc mesh, then runs the owner's __cleanup__."""
    log = tmp_path / "log"
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        parent = await procs.spawn("parent", Parent, str(log))
        inner = await asyncio.wait_for(parent.start.call_one(), GUARD)
        fds = [os.pidfd_open(p) for p in inner]
    try:
        assert log.read_text().splitlines() == ["child 2 None", "child 1 None", "parent None"]
        for fd in fds:
            await wait_exited(fd, GUARD)
    finally:
        for fd in fds:
            os.close(fd)


async def test_system_exit_cleans_up_owned_first(procs: meshio.ProcMesh,
                                                 tmp_path: Path) -> None:
    """issue 7 item 15: an actor ended by SystemExit from an endpoint stops
    what it owns (children newest first, its proc mesh) before its own
    __cleanup__(SystemExit)."""
    log = tmp_path / "log"
    port, done = Channel[str].open()
    parent = await procs.slice(procs=0).spawn("parent", Parent, str(log), port)
    inner = await asyncio.wait_for(parent.start.call_one(), GUARD)
    fds = [os.pidfd_open(p) for p in inner]
    try:
        with pytest.raises(meshio.ActorError):
            await asyncio.wait_for(parent.exit.call_one(), GUARD)
        assert await asyncio.wait_for(done.recv(), GUARD) == "done"
        assert log.read_text().splitlines() == [
            "child 2 None", "child 1 None", "parent SystemExit(7)"]
        for fd in fds:
            await wait_exited(fd, GUARD)
    finally:
        for fd in fds:
            os.close(fd)


async def test_stuck_owned_proc_mesh_does_not_hang_the_stop(
        procs: meshio.ProcMesh, tmp_path: Path) -> None:
    """issue 7 item 15: the owner's stop is bounded when the process of its
    proc mesh is stuck (SIGSTOP: its actors never answer the stop): the
    owner's __cleanup__ still runs and that process is killed."""
    log = tmp_path / "log"
    parent = await procs.slice(procs=0).spawn("parent", Parent, str(log))
    inner = await asyncio.wait_for(parent.start.call_one(0.5), GUARD)
    fds = [os.pidfd_open(p) for p in inner]
    try:
        for p in inner:
            os.kill(p, signal.SIGSTOP)
        start = time.monotonic()
        await asyncio.wait_for(parent.stop(), GUARD)
        took = time.monotonic() - start
        assert log.read_text().splitlines()[-1] == "parent None"
        for fd in fds:
            await wait_exited(fd, GUARD)
        assert took < OWNED_STOP_TIMEOUT + 0.5 + CLEANUP_TIMEOUT + 5  # + slack for load
    finally:
        for fd in fds:
            os.close(fd)


class Doomed(Actor):
    """Starts a proc mesh in its constructor, then fails."""

    def __init__(self) -> None:
        self.procs = meshio.this_host().spawn_procs(per_host={"procs": 1}, name="doomed")
        raise RuntimeError("constructor failed after starting a proc mesh")


class Probe(Actor):
    @endpoint
    async def children(self) -> list[int]:
        return sorted(child_pids())


async def test_failed_constructor_stops_the_proc_mesh_it_started(
        procs: meshio.ProcMesh) -> None:
    """issue 7 item 15: a constructor that started a proc mesh and then
    raised fails the spawn only once that proc mesh is stopped (no process
    of it is left in the worker)."""
    one = procs.slice(procs=0)
    probe = await one.spawn("probe", Probe)
    with pytest.raises(meshio.ActorError, match="after starting a proc mesh"):
        await asyncio.wait_for(one.spawn("doomed", Doomed), GUARD)
    assert await asyncio.wait_for(probe.children.call_one(), GUARD) == []
