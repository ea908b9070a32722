"""Shared pieces of the supervision tests: the worker actor most tests
supervise, a supervisor's event stream read in order, and the scenario most
tests repeat (a supervised proc mesh loses a rank; the rank's failure, then
its restart, replaces exactly that process).

Nothing here sleeps to wait for something to happen: helpers wait on the
supervisor's event stream, on pidfds and on the loop, each under a generous
``asyncio.wait_for`` guard so that a regression fails instead of hanging.
Heartbeats run on a :class:`~meshio.supervision.ManualClock` unless a test is
about them, so a loaded machine cannot make a healthy worker look hung.

Test modules outside this folder import this one too (``pythonpath`` in
pyproject.toml puts the folder on ``sys.path``).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import resource
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import meshio
import meshio._transport._runtime
from meshio import Actor, endpoint
from meshio.supervision import ManualClock, Strategy, SupervisionEvent
from meshio.testing import wait_exited

#: generous bound on any single wait on a loaded machine
DEADLINE = 30.0
HOST = socket.gethostname()


class W(Actor):
    """The supervised worker: reports where it runs, and fails on request."""

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


class Events:
    """A supervisor's event stream, consumed in order by one test.

    Every event read is kept in :attr:`seen`, in order, so a test can check
    the whole sequence; ``async with`` closes the stream on exit.
    """

    def __init__(self, sup: meshio.Supervisor, timeout: float = DEADLINE) -> None:
        self._it = sup.events()
        self._timeout = timeout
        self.seen: list[SupervisionEvent] = []

    async def __aenter__(self) -> Events:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def until(self, pred: Callable[[SupervisionEvent], bool],
                    timeout: float | None = None) -> SupervisionEvent:
        """The next event for which ``pred`` holds (others are only recorded)."""
        async def scan() -> SupervisionEvent:
            while True:
                ev = await self._it.__anext__()
                self.seen.append(ev)
                if pred(ev):
                    return ev

        return await asyncio.wait_for(scan(), self._timeout if timeout is None else timeout)

    async def next(self, kind: str, rank: int | None = None, mesh: str | None = None,
                   timeout: float | None = None) -> SupervisionEvent:
        """The next event of ``kind`` (and ``rank``, ``mesh`` when given)."""
        return await self.until(lambda e: e.kind == kind and (rank is None or e.rank == rank)
                                and (mesh is None or e.mesh == mesh), timeout)

    def kinds(self) -> list[tuple[str, str, int]]:
        return [(e.kind, e.mesh, e.rank) for e in self.seen]

    async def aclose(self) -> None:
        await self._it.aclose()


async def next_event(sup: meshio.Supervisor, kind: str, rank: int | None = None,
                     mesh: str | None = None, timeout: float = DEADLINE) -> SupervisionEvent:
    """The supervisor's first event of ``kind`` (and ``rank``, ``mesh`` when
    given), from its history or, failing that, live (on a stream of its own)."""
    async with Events(sup, timeout) as events:
        return await events.next(kind, rank, mesh)


def check_event(ev: SupervisionEvent, kind: str, mesh: str, rank: int) -> None:
    assert ev.kind == kind
    assert ev.mesh == mesh
    assert ev.rank == rank
    assert isinstance(ev.timestamp, float) and abs(ev.timestamp - time.time()) < DEADLINE
    assert isinstance(ev.cause, str) and ev.cause


def manual_sup(strategy: Strategy = "one_for_one",
               **kw: Any) -> tuple[meshio.Supervisor, ManualClock]:
    """A supervisor on a manual clock (3 restarts in 60 s unless told)."""
    clock = ManualClock()
    kw.setdefault("max_restarts", 3)
    kw.setdefault("within", 60.0)
    return meshio.Supervisor(strategy, clock=clock, **kw), clock


@dataclass
class Supervised:
    """A supervised proc mesh, as :func:`supervised` yields it."""

    sup: meshio.Supervisor
    events: Events
    procs: meshio.ProcMesh
    #: the processes' pids as spawned
    old: list[int]

    @property
    def clock(self) -> ManualClock:
        """The supervisor's manual clock (not for ``real_clock=True``)."""
        assert isinstance(self.sup.clock, ManualClock)
        return self.sup.clock

    async def restarted(self, rank: int, *,
                        alone: bool = True) -> tuple[SupervisionEvent, SupervisionEvent]:
        """Wait for ``rank``'s failure, then its restart, and check them.

        Both events are checked (mesh, rank, host, timestamp, the old pid
        failed, a new one replaced it) and so are the mesh's pids: only
        ``rank``'s changed.  With ``alone`` (the default) they must also be
        the next two events of the supervisor: nothing else failed, stopped
        or restarted meanwhile.  Without it (real clocks, where a loaded
        machine may make another rank look hung) only ``rank``'s events and
        pid are looked at.

        Returns:
            The failure and the restart event.
        """
        start = len(self.events.seen)
        failure = await self.events.next("failure", rank=None if alone else rank)
        check_event(failure, "failure", "procs", rank)
        assert failure.pid == self.old[rank] and failure.host == HOST
        restart = await self.events.next("restart", rank=None if alone else rank)
        check_event(restart, "restart", "procs", rank)
        assert restart.pid not in self.old and restart.host == HOST
        if alone:
            assert self.events.seen[start:] == [failure, restart]
            assert self.procs.pids == [
                restart.pid if r == rank else pid for r, pid in enumerate(self.old)]
        else:
            assert self.procs.pids[rank] == restart.pid
        return failure, restart


@asynccontextmanager
async def supervised(n: int = 2, strategy: Strategy = "one_for_one", *,
                     real_clock: bool = False, **sup_kw: Any) -> AsyncIterator[Supervised]:
    """``n`` worker processes (proc mesh ``procs``) under a new
    :func:`manual_sup` supervisor (``sup_kw`` go to it; ``real_clock``: the
    same on the monotonic clock), with its event stream; on exit the
    processes are stopped, then the stream closed."""
    if real_clock:
        sup = meshio.Supervisor(strategy, **{"max_restarts": 3, "within": 60.0, **sup_kw})
    else:
        sup, _ = manual_sup(strategy, **sup_kw)
    async with Events(sup) as events, \
            meshio.this_host().spawn_procs(per_host={"procs": n}, supervisor=sup) as procs:
        yield Supervised(sup, events, procs, procs.pids)


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


def next_pong(addr: str) -> asyncio.Future[None]:
    """Resolved by the next heartbeat answer of the process at ``addr`` (an
    actor's ``context().proc.addr``).  No public event says so: this hooks
    the controller runtime's own table (internals)."""
    rt = meshio._transport._runtime.runtime()
    fut: asyncio.Future[None] = rt.loop.create_future()
    orig = rt.watch.on_pong[addr]

    def hook() -> None:
        orig()
        if not fut.done():
            fut.set_result(None)

    rt.watch.on_pong[addr] = hook
    return fut
