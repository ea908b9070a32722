"""A runtime's state by role, apart from its sockets and its dispatch
(:class:`~._runtime.Runtime` holds one of each): :class:`Watch`, what a
runtime that starts workers (the controller, or an actor with proc meshes
of its own) knows of them; :class:`Incarnation`, what a worker knows of its
own restart; :class:`DeadTable`, what a runtime knows of the processes it
calls that are down."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import TypeVar, overload

from .._exceptions import SupervisionError
from ._connection import Connection, Pending
from ._messages import ErrorInfo, PeerDown

_T = TypeVar("_T")
_Error = Callable[[Pending], SupervisionError]

#: the versions of every dead table (one count: no two tables share a version)
_versions = itertools.count(1)


class DeadTable(dict[str, _Error]):
    """The addresses of the processes known down (gone, being restarted,
    answering no heartbeat, their proc mesh stopped) → the error their
    callers get (``Runtime.dead``).  :attr:`version` changes with each
    change, made through ``table[addr] = error``, ``del`` or ``pop`` (the
    only ones used), so that what is worked out from the table is kept
    until then (``choose``'s actors that serve calls)."""

    __slots__ = ("version",)

    def __init__(self) -> None:
        super().__init__()
        self.version: int = next(_versions)

    def __setitem__(self, addr: str, error: _Error, /) -> None:
        super().__setitem__(addr, error)
        self.version = next(_versions)

    def __delitem__(self, addr: str, /) -> None:
        super().__delitem__(addr)
        self.version = next(_versions)

    @overload
    def pop(self, addr: str, /) -> _Error: ...
    @overload
    def pop(self, addr: str, default: _Error, /) -> _Error: ...
    @overload
    def pop(self, addr: str, default: _T, /) -> _Error | _T: ...
    def pop(self, addr: str, /, *default: object) -> object:
        self.version = next(_versions)
        return super().pop(addr, *default)


class Watch:
    """The workers this runtime started, by worker id or address: the
    proc meshes (:mod:`meshio._proc_state`) fill it, the dispatch reads it."""

    __slots__ = ("down", "hello_waiters", "on_fault_from", "on_pong")

    def __init__(self) -> None:
        #: worker id → future of its Hello connection
        self.hello_waiters: dict[str, asyncio.Future[Connection]] = {}
        #: by worker address: what its faults (an actor failed with nobody
        #: to tell; ended by it: ``Fault.stopped``) and its heartbeat answers go to
        self.on_fault_from: dict[str, Callable[[ErrorInfo, bool], None]] = {}
        self.on_pong: dict[str, Callable[[], None]] = {}
        #: by worker address, the workers found not responding: their
        #: PeerDown as of now (told to each worker that connects)
        self.down: dict[str, Callable[[], PeerDown]] = {}


class Incarnation:
    """This worker process as one incarnation of its slot."""

    __slots__ = ("building", "failed", "lost", "mesh", "replacement", "restoring")

    def __init__(self, restart: bool = False, worker: str = "") -> None:
        #: this process replaces one that failed (its callers' numbered
        #: calls, ``Call.seq``, do not start at 1 here)
        self.replacement: bool = restart
        #: its actors are being rebuilt (until the controller's ``Restored``)
        self.restoring: bool = restart
        #: targets of the temporary actors not rebuilt after the restart
        self.lost: set[str] = set()
        #: actors ended by what an endpoint raised (``SystemExit``,
        #: ``KeyboardInterrupt``), until spawned again: target → why
        self.failed: dict[str, str] = {}
        #: what the targets of the actor meshes spawned on this worker's
        #: proc mesh begin with: the mesh's id and "/" (``worker``, its id
        #: as a worker, is ``<proc mesh id>-<rank>``); empty: no worker's
        self.mesh: str = worker.rpartition("-")[0] + "/" if worker else ""
        #: targets of the actors whose spawn is under way here
        self.building: set[str] = set()

    def missing(self, target: str) -> str | None:
        """Why the actor ``target`` is not here though it was (None: no
        restart explains it)."""
        if self.restoring:
            return "is being rebuilt after a restart"
        if target in self.lost:
            return "was temporary and not rebuilt after a restart"
        return self.failed.get(target)

    def stopped(self, target: str) -> bool:
        """Whether the actor ``target``, not here, was stopped (asked after
        :meth:`missing`): an actor mesh spawned on this worker's proc mesh
        (its target says so, and each spawn has a target of its own), not
        being built here.  A reference to it stays dead: a new spawn under
        its name is another actor mesh."""
        return bool(self.mesh) and target.startswith(self.mesh) and target not in self.building
