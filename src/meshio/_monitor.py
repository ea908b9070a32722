"""``meshio.monitor``: be told when the actors of a mesh die, as OTP's
monitors tell a process (``async with meshio.monitor(mesh) as m: async for
down in m: ...``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import TracebackType
from typing import Any, cast

from ._actor import Actor
from ._actor_mesh import ActorMesh
from ._exceptions import SupervisionError
from ._extent import Point
from ._transport._connection import Pending, ignore_result

__all__ = ("ActorDown", "Monitor", "monitor")


@dataclass(frozen=True)
class ActorDown:
    """A monitored actor's process died (or stopped answering heartbeats).

    Attributes:
        rank: the actor's rank in its mesh as spawned.
        point: its point in the mesh (or slice) monitored.
        cause: what happened (``"killed by signal SIGKILL"``, ``"exited with code 3"``).
        pid: the process that died.
        host: where it ran.
    """

    rank: int
    point: Point
    cause: str
    pid: int
    host: str


class Monitor:
    """The deaths of the actors of one mesh, as they happen: ``async for
    down in m`` yields an :class:`ActorDown` for each (a restarted actor that
    dies again is reported again) and ends when the proc mesh is stopped.
    Made by :func:`monitor`; a context manager, which subscribes on entry
    (reporting at once the actors that are down then) and unsubscribes on
    exit."""

    def __init__(self, mesh: Actor | ActorMesh[Any]) -> None:
        if not isinstance(mesh, ActorMesh):
            raise TypeError(f"meshio.monitor() takes an actor mesh (or a slice of one), "
                            f"got {type(mesh).__name__}")
        procs = mesh._procs
        if procs is None:
            raise ValueError(
                f"meshio.monitor({mesh._name!r}): this process did not spawn that actor mesh "
                "(it is a reference passed here), so it does not watch its processes; "
                "monitor it where it was spawned")
        self._mesh = mesh
        self._state = procs._state
        #: global rank → index in the view
        self._index = {grank: i for i, grank in enumerate(mesh._region.ranks)}
        self._points = list(mesh)
        self._queue: asyncio.Queue[ActorDown | None] = asyncio.Queue()
        #: (global rank, incarnation) already reported
        self._reported: set[tuple[int, int]] = set()

    async def __aenter__(self) -> Monitor:
        state = self._state
        state.monitors.add(self._tell)
        if state.stopped:
            self._queue.put_nowait(None)
            return self
        for grank, i in self._index.items():
            worker = state.worker(grank)
            error = state.rt.dead.get(worker.addr)
            if error is not None:  # down already: told at once
                p = Pending(cast("Any", None), ignore_result, "", self._mesh._name,
                            self._points[i])
                self._tell((grank, worker.incarnation, error(p)))
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self._state.monitors.discard(self._tell)

    def __aiter__(self) -> Monitor:
        return self

    async def __anext__(self) -> ActorDown:
        down = await self._queue.get()
        if down is None:
            self._queue.put_nowait(None)  # (every later __anext__ ends too)
            raise StopAsyncIteration
        return down

    def _tell(self, down: tuple[int, int, SupervisionError] | None) -> None:
        if down is None:
            self._queue.put_nowait(None)
            return
        grank, incarnation, error = down
        i = self._index.get(grank)
        if i is None or (grank, incarnation) in self._reported:
            return
        self._reported.add((grank, incarnation))
        self._queue.put_nowait(ActorDown(self._mesh._site(i).rank, self._points[i],
                                         error.cause, error.pid, error.host))


def monitor(mesh: Actor | ActorMesh[Any]) -> Monitor:
    """Watch the actors of ``mesh`` (an actor mesh this process spawned, or
    a slice of it) die::

        async with meshio.monitor(trainers) as m:
            async for down in m:
                print(down.rank, down.point, down.cause)

    Each death is reported once, within about a heartbeat interval (a
    killed process: as soon as its connection drops); an actor already
    down when the monitor starts is reported at once.

    Raises:
        TypeError: ``mesh`` is not an actor mesh.
        ValueError: this process did not spawn it (a reference passed here).
    """
    return Monitor(mesh)
