"""``HostMesh`` and ``ProcMesh``: hosts, and the worker processes on them."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import weakref
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import replace
from typing import Any, ParamSpec, TypeGuard, TypeVar, cast, get_args, get_origin

import msgspec

from ._actor import Actor
from ._actor_mesh import ActorMesh
from ._cell import ActorCell, cell_of
from ._checks import check_count, check_seconds
from ._constants import MAX_PER_HOST, PARTITION_TIMEOUT
from ._context import Context, ProcInfo, _own
from ._exceptions import ActorError, SchemaError, SupervisionError, UnknownActorError
from ._extent import Extent, MeshShape, Point, Region
from ._keep_alive import KeptActor, KeptOptions, check_name, lookup, reattaching
from ._launcher import LocalLauncher, ProcLauncher, check_env
from ._proc_state import HEARTBEAT_INTERVAL, STOP_GRACE, ProcState, SpawnOptions, _ActorRecord
from ._stacks import STACKS_TIMEOUT, Stacks, gather
from ._transport._connection import Pending, ignore_result
from ._transport._messages import SpawnActor
from ._transport._runtime import Runtime, check_loop, on_loop_wait, runtime
from ._transport._serial import OutBuffers, Packer, dumps, loads, unpicklable_part
from ._util import utf8
from .endpoints._endpoint import combine_failures, endpoint
from .supervision._supervisor import RestartType, ShutdownPolicy, Supervisor

__all__ = ("HostMesh", "ProcMesh", "grow_hosts", "shrink_hosts", "this_host")

log = logging.getLogger("meshio")

A = TypeVar("A", bound=Actor)
P = ParamSpec("P")
#: the options of actors spawned without ``procs.options(...)``
DEFAULT_OPTIONS = SpawnOptions()
#: the values of ``RestartType``, for run-time checks
_RESTART_TYPES: tuple[RestartType, ...] = get_args(RestartType)
#: how errors name ``spawn_procs`` where they name the argument as ``f(arg=...)``
_SPAWN_PROCS = "HostMesh.spawn_procs"

class ProcMesh(MeshShape):
    """Worker processes, one per point, each running a uvloop event loop.

    Start one with ``this_host().spawn_procs(per_host={"gpus": 4})`` and
    either ``await`` it (then ``await procs.stop()``) or use it as
    ``async with ... as procs`` (stopped on exit, error or cancellation).
    The first ``await`` of what ``spawn_procs`` returned owns the start, as
    ``async with`` does: cancelled before the processes are up (a timeout
    around it), it stops them.  What ``spawn_procs`` returned that nothing
    awaited nor used (no ``spawn``, slice, ``options``...) stops them too
    once nothing refers to it: an await that never began (a task cancelled
    before its first step, as ``asyncio.wait_for`` with a timeout of 0 or
    less makes on Python 3.11), or the mesh dropped.  Once used, it is
    yours to stop.
    """

    def __init__(self, state: ProcState, region: Region | None,
                 options: SpawnOptions = DEFAULT_OPTIONS, *, fresh: bool = False) -> None:
        self._state = state
        #: the points of a slice (None: the whole mesh, whatever its shape now)
        self._view = region
        self._options = options
        #: what spawn_procs returned, not awaited yet: its first await owns the start
        self._fresh = fresh
        #: what spawn_procs returned, neither awaited nor used yet (:meth:`_held`):
        #: dropped so, nobody can stop the mesh, and this stops it
        self._unheld: weakref.finalize[[ProcState], ProcMesh] | None = None
        if fresh:
            self._unheld = weakref.finalize(self, _stop_unheld, state)
            self._unheld.atexit = False  # (the loop is gone then, and the runtime with it)

    @property
    def _region(self) -> Region:  # type: ignore[override]  # (read-only here)
        return self._state.region if self._view is None else self._view

    def _with_region(self, region: Region) -> ProcMesh:
        self._held()
        return ProcMesh(self._state, region, self._options)

    def _with_options(self, options: SpawnOptions) -> ProcMesh:
        self._held()
        return ProcMesh(self._state, self._view, options)

    def _held(self) -> None:
        """This is used (awaited, spawned on, sliced, passed on): dropped
        now, it leaves the mesh running for whoever holds it (a slice, an
        actor mesh, a reference) to stop."""
        if self._unheld is not None:
            self._unheld.detach()
            self._unheld = None

    def options(self, *, restart: RestartType | None = None,
                stall_after: float | None = None, max_queued: int | None = None) -> ProcMesh:
        """The same proc mesh (or slice) with options for the actors spawned on it
        (those not given stay as they are).

        ``procs.options(restart="transient").spawn("w", Worker, ...)``: the
        options are meshio's, kept apart from the constructor arguments of
        ``Worker`` (which ``spawn`` passes on untouched and type-checks).

        Args:
            restart: whether a supervisor rebuilds these actors when it
                replaces their process: ``"permanent"`` (always, the
                default), ``"transient"`` (unless the process exited
                normally) or ``"temporary"`` (never).
            stall_after: seconds a call may run before the actor reports it
                stalled (default 60): one warning line on the controller
                and, under a supervisor, one ``"stall"`` event, each naming
                actor, rank, endpoint, duration and the call's stack.
            max_queued: the bound of each actor's mailbox (default 10,000):
                how many calls one caller (one process) may have waiting in
                it.  A call beyond that waits in the caller for room (or,
                made with ``.options(on_full="raise")``, fails at once with
                :class:`~meshio.Overloaded`); ``broadcast`` too.  Each
                calling process has its own allowance, so an actor called
                from K processes holds at most K times ``max_queued`` calls.
                Not bounded: calls to ``concurrent`` endpoints (they never
                queue in the mailbox; those waiting for a slot of an
                ``@endpoint(concurrent=N)`` wait in the actor, and must not
                hold up the caller's calls to its other endpoints).

        Raises:
            TypeError: ``restart`` is not a str, ``stall_after`` is not a
                number (a str, a bool), or ``max_queued`` is not an int (a
                str, a float, a bool).
            ValueError: ``restart`` is not one of the three restart types,
                ``stall_after`` is not finite seconds > 0 (NaN, or an int
                no float holds), or ``max_queued`` is below 1.
        """
        options = self._options
        if restart is not None:
            _check_restart(restart, "options(restart=...)")
            options = replace(options, restart=restart)
        if stall_after is not None:
            options = replace(options, stall_after=check_seconds(
                stall_after, "ProcMesh.options", "stall_after", inf=False, also=" or None"))
        if max_queued is not None:
            options = replace(options, max_queued=check_count(
                max_queued, "ProcMesh.options(max_queued=...)", 1))
        return self._with_options(options)

    def __repr__(self) -> str:
        return f"<ProcMesh {self._state.name!r} {self.sizes}>"

    def __reduce__(self) -> tuple[Any, ...]:
        # A value like an actor mesh: elsewhere, a reference whose spawns go
        # through the controller owning the processes (which records them).
        self._held()
        e = self._region.extent
        return (_ProcMeshRef, (_service_for(self._state), self._state.id, self._state.name,
                               e.labels, e.sizes, self._region.ranks, self._options))

    def __await__(self) -> Generator[Any, None, ProcMesh]:
        if self._fresh:
            self._fresh = False
            return self._start_owned().__await__()
        return self._wait_ready().__await__()

    async def _wait_ready(self) -> ProcMesh:
        self._held()
        self._check_loop()
        await asyncio.shield(self._state.ready)
        return self

    def _check_loop(self) -> None:
        """Raise unless running on the loop of the runtime owning the
        processes (what every operation awaits, and ``stop``): the mesh
        belongs to it, and another loop would wait on its futures forever.

        Raises:
            RuntimeError: another loop, or a thread that runs none.
            ClosedResourceError: the owner's loop has ended.
        """
        check_loop(self._state.rt, f"proc mesh {self._state.name!r}")

    async def _start_owned(self) -> ProcMesh:
        """The first await of what ``spawn_procs`` returned: cancelled before
        the processes are up, or failing to start them, it stops the mesh
        (``await asyncio.wait_for(host.spawn_procs(...), 60)`` timing out
        leaves no process behind, a ``ProcessStartError`` nothing of the mesh
        in the runtime: nobody holds one to stop it)."""
        try:
            return await self._wait_ready()
        except BaseException:
            ready = self._state.ready
            if not ready.done() or ready.cancelled() or ready.exception() is not None:
                await self.stop()
            raise

    async def __aenter__(self) -> ProcMesh:
        self._check_loop()
        try:
            return await self._wait_ready()
        except BaseException:
            await self.stop()
            raise

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        await self.stop()
        sup = self._state.supervisor
        root = sup
        while root is not None and root.parent is not None:
            root = root.parent
        if exc_type is None and root is not None and root.failure is not None:
            failure = await root.wait_failed()  # once its hooks have run
            if not root._handled:  # else on_escalate or __supervise__ handled it
                raise failure

    @property
    def pids(self) -> list[int]:
        """Pid of each process of this view, in point order (after start).

        Raises:
            RuntimeError: the mesh is still starting (await it first).
        """
        workers = {w.rank: w for w in self._state.workers}
        if any(r not in workers for r in self._region.ranks):
            raise RuntimeError(f"proc mesh {self._state.name!r} is still starting: await it "
                               f"(procs = await host.spawn_procs(...), or the grow() under "
                               f"way) before reading its pids")
        return [workers[r].handle.pid for r in self._region.ranks]

    @property
    def stopped(self) -> bool:
        """Whether the whole mesh is stopped: by :meth:`stop` (also through a
        reference held by an actor), by leaving ``async with``, or by its
        supervisor giving up (until a parent supervisor restarts that one).
        Calls to its actors then fail with :class:`SupervisionError`."""
        return self._state.stopped

    async def spawn(self, name: str, cls: Callable[P, A], /, *args: P.args,
                    **kwargs: P.kwargs) -> A:
        """Spawn one actor of class ``cls`` in every process of this mesh.

        Constructor arguments are checked against ``cls.__init__`` (statically
        by type checkers, at run time by the receiving workers).  Returns the
        :class:`ActorMesh`, typed as ``cls`` so endpoints type-check (the
        library's one deliberate lie, :meth:`actors` tells it too).

        Every argument after ``cls`` goes to ``cls.__init__``; meshio's own
        options come before: ``procs.options(restart="transient").spawn(...)``
        (see :meth:`options`; default ``"permanent"``).

        Spawned inside an actor, the actor owns the new mesh: stopping the
        actor stops these actors first (see ``__cleanup__`` on :class:`Actor`).

        Raises:
            ActorError: a constructor raised (every failing rank listed).
            SchemaError: the arguments do not match ``cls.__init__``.
            TypeError: ``name`` is not a str, ``cls`` is not an
                :class:`Actor` subclass (the message says so where the
                class came first, as Ray's ``Cls.remote`` has it, or an
                instance was given), or ``cls`` cannot be pickled (a
                class of ``__main__`` shipped by value with a lock, a file
                or a socket its methods use: the message names it).
            ValueError: ``name`` is empty or has a ``/``.
        """
        mesh = await self._spawn(name, cls, *args, **kwargs)
        _own(mesh)
        return mesh

    async def _spawn(self, name: str, cls: Callable[P, A], /, *args: P.args,
                     **kwargs: P.kwargs) -> A:
        """:meth:`spawn`, owned by nobody (the proc mesh service spawns for others)."""
        if not _is_actor_class(cls):
            raise _not_an_actor_class(cls, name)
        if not isinstance(name, str) or not name or "/" in name or utf8(name) != name:
            raise (ValueError if isinstance(name, str) else TypeError)(
                f"spawn: actor mesh name must be a non-empty str without '/' that UTF-8 "
                f"can encode, got {type(name).__name__} {name!r}")
        schema = cls._meshio_ctor
        packer = Packer()
        try:
            body = schema.pack_call(args, kwargs, packer)
        except SchemaError as e:
            if "restart" in kwargs and not _takes_keyword(cls, "restart"):  # (spawn's old option)
                raise SchemaError(
                    f"{e}; restart is no argument of spawn any more: meshio's options come "
                    f"before it, procs.options(restart={kwargs['restart']!r}).spawn({name!r}, "
                    f"{cls.__qualname__}, ...)") from None
            raise
        return await self._spawn_packed(name, cls, body, packer)

    async def _spawn_packed(self, name: str, cls: type[A], body: bytes, out: OutBuffers) -> A:
        """:meth:`_spawn` with the constructor arguments packed already (a
        service's new replica gets those of the actors it copies)."""
        state = self._state
        await self._wait_ready()
        if state.stopped:
            raise SupervisionError(f"spawn {name!r}: proc mesh {state.name!r} was stopped; "
                                   f"spawn a new one", actor=state.name,
                                   cause="proc mesh stopped")
        if name in state.actor_names:
            raise ValueError(f"spawn: proc mesh {state.name!r} already has actors named {name!r}; "
                             f"stop them first (`await <that mesh>.stop()` frees the name) or "
                             f"spawn under another name")
        # Pickled before the name is taken: a class that cannot be pickled
        # (shipped by value with a lock it uses) leaves no trace.
        cls_blob = _dump_class(cls, name)
        target = state.new_target(name)
        addrs = [""] * state.region.extent.nelem
        for w in state.workers:
            addrs[w.rank] = w.addr
        mesh: ActorMesh[A] = ActorMesh(target, name, cls, self._region, addrs, self,
                                       per_host=state.per_host,
                                       max_queued=self._options.max_queued)
        # (spawned on the whole mesh, it grows and shrinks with it)
        mesh_blob = dumps(mesh)
        state.actor_names.add(name)
        # (kept alive, published before any process builds it: a controller
        # lost before the spawn returns leaves a record that says so)
        state.spawning.add(target)
        state.published()
        rt = state.rt
        labels, sizes = list(self.extent.labels), list(self.extent.sizes)
        futs: list[asyncio.Future[Any]] = []
        for index, (grank, point) in enumerate(zip(self._region.ranks, self._region.points())):
            fut: asyncio.Future[Any] = rt.loop.create_future()
            futs.append(fut)
            pending = Pending(fut, ignore_result, f"{cls.__qualname__}.__init__",
                              name, point)
            dead = rt.dead.get(addrs[grank])
            if dead is not None:
                fut.set_exception(dead(pending))
                continue
            conn = rt.connect(addrs[grank])
            req = conn.next_req(pending)
            conn.send_message(SpawnActor(req, target, name, cls_blob, index, labels, sizes,
                                         mesh_blob, msgspec.Raw(body), proc_rank=grank,
                                         stall_after=self._options.stall_after,
                                         max_queued=self._options.max_queued),
                              out)
        state.actors.append(_ActorRecord(name, target, cls_blob, mesh_blob, body, out,
                                         labels, sizes, self._region.ranks,
                                         self._options, mesh if self._view is None else None,
                                         (cls.__module__, cls.__qualname__)))
        try:
            try:
                await asyncio.wait(futs)
            except asyncio.CancelledError:
                # The caller gave up: each actor is stopped once built (a
                # constructor cannot be interrupted), the name is free at once
                # for a new spawn, and nothing waits on the answers.
                for fut in futs:
                    fut.cancel()
                mesh._stopping(tell=False)
                state.forget(name)
                raise
            failures = [(p, f.exception()) for p, f in zip(self, futs)
                        if f.exception() is not None]
            if failures:
                # (not waiting for a process that answers no heartbeat: the error says it)
                await mesh._stopping(tell=False)
                state.forget(name)  # stopped everywhere: the name is free again
                raise combine_failures(f"{cls.__qualname__}.__init__", mesh,
                                       cast(list[tuple[Any, BaseException]], failures))
        finally:
            state.spawning.discard(target)
            state.published()
        return cast(A, mesh)

    def actors(self, name: str, cls: type[A], /) -> A:
        """The actor mesh ``name`` (of class ``cls``) already running on this
        proc mesh: after ``this_host().reattach(...)``, the actors the lost
        controller spawned, with their state as they left it.
        ``trainers = procs.actors("trainers", Trainer)``.  Typed as ``cls``,
        as :meth:`spawn` returns it, so endpoints type-check
        (``trainers.train.call(...)``) and one function takes either.

        Raises:
            UnknownActorError: no actor mesh of that name on this proc mesh
                (the message lists those there are).
            TypeError: ``cls`` is not the class the actors were spawned with
                (the message names it).
        """
        state = self._state
        record = next((a for a in state.actors if a.name == name), None)
        if record is None:
            names = ", ".join(repr(a.name) for a in state.actors) or "none"
            why = (f"; its spawn was interrupted by the lost controller, which never got "
                   f"them, so the re-attach stopped them: spawn {name!r} again"
                   if name in state.interrupted else "")
            raise UnknownActorError(f"procs.actors({name!r}): proc mesh {state.name!r} has no "
                                    f"actors named {name!r} (its actor meshes: {names}){why}")
        module, qualname = record.cls_name
        if not _is_actor_class(cls) or cls.__qualname__ != qualname or (
                module != cls.__module__ and "__main__" not in (module, cls.__module__)):
            raise TypeError(f"procs.actors({name!r}, {getattr(cls, '__qualname__', cls)!r}): "
                            f"the actors {name!r} of proc mesh {state.name!r} are of class "
                            f"{module}.{qualname}")
        region = Region(Extent(record.labels, record.sizes), record.ranks)
        addrs = [""] * state.region.extent.nelem
        for w in state.workers:
            addrs[w.rank] = w.addr
        return cast(A, ActorMesh(record.target, name, cls, region, addrs, self,
                                 per_host=state.per_host))

    async def stacks(self, *, timeout: float = STACKS_TIMEOUT) -> Stacks:
        """What every actor in these processes is doing now: the current
        Python stacks of each (its tasks, and its thread while a ``def``
        endpoint runs), with the endpoint under way and for how long (see
        :meth:`ActorMesh.stacks`).  ``print(stacks)`` groups identical ones.

        Args:
            timeout: seconds to wait for each process; one that has not
                answered by then, or is gone, is listed in ``Stacks.errors``.

        Raises:
            TypeError: ``timeout`` is not a number (a str, a bool).
            ValueError: ``timeout`` is not seconds > 0 (NaN, or an int no
                float holds; ``math.inf``: no bound).
        """
        await self._wait_ready()
        state = self._state
        if state.stopped:
            return Stacks((), (f"proc mesh {state.name!r} was stopped",))
        return await gather(state.rt, [
            (state.worker(grank).addr, "", f"proc mesh {state.name!r}", point)
            for grank, point in zip(self._region.ranks, self._region.points())], timeout)

    async def stop(self) -> None:
        """Stop every process of the whole mesh (gracefully, then SIGKILL after
        a grace period), and forget it: calls to its actors then fail with
        :class:`SupervisionError` ("proc mesh ... was stopped").  Idempotent.
        Cancelled once begun, it kills the processes rather than waiting
        for them.  Like any coroutine it does nothing before it first runs:
        on Python 3.11 ``asyncio.wait_for(procs.stop(), 0)`` raises
        ``TimeoutError`` with the mesh still running.

        Raises:
            ValueError: this is a slice of the mesh (stop the whole mesh, as
                returned by ``spawn_procs``).
        """
        _check_whole(self._region, self._state.region, self._state.name)
        self._check_loop()
        await self._state.stop()
        self._state.release()

    async def ready(self) -> None:
        """Wait until every process of this mesh (or slice) is up: started,
        and after a failure restarted by its supervisor with its actors
        rebuilt (at once if they are).  A failure not detected yet (a
        process killed a moment ago) is not waited for: wait for its
        ``failure`` event first (``sup.events()``).

        Raises:
            SupervisionError: a process will not come back: it failed with
                nothing to restart it (no supervisor, its restart type), the
                supervisor gave up, or the mesh was stopped.
                :class:`ProcessStartError` if the mesh failed to start.
        """
        state = self._state
        await self._wait_ready()
        workers = [state.worker(grank) for grank in self._region.ranks]
        while waits := [w.ready for w in workers if not w.ready.done() or w.ready.exception()]:
            for fut in waits:  # each raises the error of a process that will not come back
                await asyncio.shield(fut)

    async def wait_failed(self) -> SupervisionError:
        """Wait until a process of this mesh (or slice) fails with nothing to
        restart it — without a supervisor its first exit or lost connection
        (also reported on stderr), with one when the supervisor gives up —
        and return that failure (already failed: at once).

        Raises:
            SupervisionError: the mesh was stopped before any of its processes
                failed.
        """
        state = self._state
        await self._wait_ready()
        while True:
            for rank in self._region.ranks:
                failure = state.failures.get(rank)
                if failure is not None:
                    return failure
            if state.stopped:
                raise SupervisionError(
                    f"proc mesh {state.name!r} was stopped before any of its processes "
                    f"failed", actor=state.name, cause="proc mesh stopped")
            await asyncio.shield(state._failed)


    # ------------------------------------------------------------ elastic

    @property
    def holes(self) -> list[Point]:
        """The points of this mesh (or slice) that are holes: their process
        died and nothing restarts it (no supervisor, or restart type
        ``temporary``; ``transient`` after a normal exit).  Calls skip them
        (``call()`` lists them in ``ValueMesh.holes``) until
        :meth:`replace` fills them.  A process its supervisor is restarting
        is not a hole."""
        state = self._state
        if state.stopped or not state.holes:
            return []
        return [p for p, r in zip(self._region.points(), self._region.ranks)
                if r in state.holes]

    async def replace(self, rank_or_point: int | Mapping[str, int], /) -> None:
        """Start a fresh process for one point and rebuild its actors there
        (same names, same constructor arguments, at the same coordinates;
        temporary ones too).  A hole is filled; a live process is stopped
        first (by the mesh's shutdown policy; its calls in flight fail with
        :class:`SupervisionError`); a restart under way is waited for.

        Args:
            rank_or_point: the point's index in this mesh (or slice), or its
                coordinates: a :class:`Point` (e.g. from :attr:`holes` or
                ``ValueMesh.holes``) or a ``{dim: index}`` mapping.

        Raises:
            IndexError: the rank or a coordinate is out of range.
            KeyError: the coordinates name an unknown dimension or miss one.
            TypeError: neither an int nor a mapping of coordinates.
            SupervisionError: the mesh was stopped (or its supervisor gave
                up), or the new process was lost while its actors were
                rebuilt (the point is a hole again).
            ProcessStartError: the new process did not start (the point is a
                hole then).
            ActorError: a constructor raised (the point is a hole then).
        """
        region = self._region
        if isinstance(rank_or_point, Mapping):
            index = region.index(rank_or_point)
        elif isinstance(rank_or_point, int) and not isinstance(rank_or_point, bool):
            index = rank_or_point
            if not 0 <= index < len(region.ranks):
                raise IndexError(f"replace({index}): proc mesh {self._state.name!r} "
                                 f"{self.sizes} has ranks 0-{len(region.ranks) - 1}")
        else:
            raise TypeError(f"replace: expected a rank (int) or a point's coordinates, got "
                            f"{type(rank_or_point).__name__} {rank_or_point!r}")
        await self._wait_ready()
        await self._state.replace(region.ranks[index])

    async def grow(self, /, **dim: int) -> None:
        """Add points along one dimension, in place: ``await procs.grow(gpus=2)``
        on ``{"gpus": 4}`` gives ``{"gpus": 6}``.  The new processes start
        as the others did (env, bootstrap, supervisor); every actor mesh
        spawned on the whole proc mesh gets an actor on each, built with its
        constructor arguments, and then takes the new shape (calls made
        after ``grow`` returns reach every point).  All or nothing: if a
        process does not start or a constructor raises, the new processes
        are stopped and the shape stays.  Existing processes and actors keep
        their ranks and coordinates.

        Only a dimension whose points come last in row-major order (every
        dimension before it of size 1), on a mesh on one host, can change
        size: the processes keep their ranks.

        Raises:
            TypeError: not exactly one dimension, or a count that is not an int.
            KeyError: an unknown dimension.
            ValueError: a count < 1, a slice (grow the whole mesh), or a
                dimension that cannot change size (the message says why).
            SupervisionError: the mesh was stopped.
            ProcessStartError: a new process did not start.
            ActorError: a constructor raised on a new process.
        """
        name, by = self._resize_arg("grow", dim)
        await self._wait_ready()
        await self._state.grow(name, by)

    async def shrink(self, /, **dim: int) -> None:
        """Remove points along one dimension, in place, from its end:
        ``await procs.shrink(gpus=2)`` on ``{"gpus": 6}`` gives
        ``{"gpus": 4}``.  The actor meshes spawned on the whole proc mesh
        take the new shape at once, then the processes removed are stopped
        (by the shutdown policy) and exit.  A supervisor treats this as a
        stop: nothing is restarted, no failure is counted, it reports a
        ``"stopped"`` event (cause ``"shrink"``) per process.

        Cancelled (a timeout around it) before it begins, while it waits
        for another ``replace``/``grow``/``shrink``, for the mesh's start or
        for a restart of a point it removes, it changes nothing.  Once
        begun it is not undone, unlike :meth:`grow`: the meshes keep the
        new shape (:attr:`sizes`, :attr:`pids`), the processes removed are
        killed rather than waited for (their actors' ``__cleanup__`` may
        not run), a supervisor still reports them stopped, and then the
        ``CancelledError`` (``TimeoutError`` from the timeout) is raised.

        Same dimensions as :meth:`grow`.

        Raises:
            TypeError: not exactly one dimension, or a count that is not an int.
            KeyError: an unknown dimension.
            ValueError: a count < 1 or that would leave the dimension below
                size 1, a slice, or a dimension that cannot change size.
            SupervisionError: the mesh was stopped.
        """
        name, by = self._resize_arg("shrink", dim)
        if by >= self._region.extent[name]:
            raise ValueError(f"shrink({name}={by}): proc mesh {self._state.name!r} has "
                             f"{name}={self._region.extent[name]}; a dimension keeps at least "
                             f"1 point (stop the mesh to remove every process)")
        await self._wait_ready()
        await self._state.shrink(name, by)

    def _resize_arg(self, what: str, dims: Mapping[str, int]) -> tuple[str, int]:
        """The dimension and count of ``grow``/``shrink``, checked."""
        state = self._state
        if len(dims) != 1:
            raise TypeError(f"{what}: give one dimension and a count, e.g. "
                            f"{what}({next(iter(self.sizes), 'gpus')}=2); got {dict(dims)}")
        ((name, by),) = dims.items()
        if self._view is not None:  # (first: a slice may have dropped the dimension)
            raise ValueError(f"{what}(): this is a slice of proc mesh {state.name!r} "
                             f"{self.sizes}; a proc mesh changes size as a whole: call "
                             f"{what}() on the mesh returned by spawn_procs")
        if name not in self._region.extent:
            raise KeyError(f"{what}: proc mesh {state.name!r} has no dimension {name!r} "
                           f"(dims {self.sizes})")
        if not isinstance(by, int) or isinstance(by, bool):
            raise TypeError(f"{what}({name}=...): expected an int, got {type(by).__name__} "
                            f"{by!r}")
        if by < 1:
            raise ValueError(f"{what}({name}={by}): the count must be >= 1")
        why = state.resizable(name)
        if why is not None:
            raise ValueError(f"{what}({name}={by}) on proc mesh {state.name!r} {self.sizes}: "
                             f"{why}")
        return name, by


def _stop_unheld(state: ProcState) -> None:
    """What ``spawn_procs`` returned was dropped before anything awaited or
    used it (:meth:`ProcMesh._held`): nobody can stop the mesh, so it is
    stopped here, on its loop (a finalizer may run in any thread).  Its
    name is free, its processes gone, as if its start had been cancelled."""
    rt = state.rt

    def stop() -> None:
        if not rt.closed and not state.released:
            rt.tasks.start(ProcMesh(state, None).stop(),
                           name=f"meshio: stop proc mesh {state.name!r}, dropped unawaited")

    try:
        rt.loop.call_soon_threadsafe(stop)
    except RuntimeError:  # (its loop is closed: its runtime, and the connections, went with it)
        pass


def _check_whole(region: Region, whole: Region, name: str) -> None:
    """Stopping is for a whole proc mesh, never a slice."""
    if sorted(region.ranks) != sorted(whole.ranks):
        raise ValueError(
            f"stop(): this is a slice of proc mesh {name!r} ({len(region.ranks)} of its "
            f"{len(whole.ranks)} processes); a proc mesh stops as a whole: call stop() on "
            f"the mesh returned by spawn_procs (or stop the actors on the slice with "
            f"actors.stop())")


class _ProcService(Actor):
    """One per controller, started when a proc mesh is first pickled: spawns
    and stops on its proc meshes for actors holding references to them, so
    the owner records every actor mesh its supervisors must rebuild."""

    TARGET = "meshio/proc-meshes"

    def __init__(self, mesh: ActorMesh[_ProcService]) -> None:
        self.mesh = mesh
        #: proc mesh id → its state, while not stopped by its owner
        self.meshes: dict[str, ProcState] = {}

    @classmethod
    def of(cls, rt: Runtime) -> _ProcService:
        """The service of ``rt`` (the controller's runtime), started on first use."""
        cell = cell_of(rt, cls.TARGET)
        if cell is None:
            region = Region.full((), ())
            mesh: ActorMesh[_ProcService] = ActorMesh(cls.TARGET, "proc meshes", cls, region,
                                                       [rt.addr])
            ctx = Context(region.point(0), "proc meshes",
                          ProcInfo(-1, os.getpid(), rt.host, rt.addr), mesh)
            cell = rt.actors[cls.TARGET] = ActorCell(rt, cls.TARGET, ctx, cls(mesh))
        return cast(_ProcService, cell.instance)

    def _view(self, mesh_id: str, name: str, labels: list[str], sizes: list[int],
              ranks: list[int]) -> ProcMesh:
        state = self.meshes.get(mesh_id)
        if state is None:
            raise SupervisionError(f"proc mesh {name!r} was stopped by its owner; ask it for a "
                                   f"new one", actor=name, cause="proc mesh stopped")
        region = Region(Extent(labels, sizes), ranks)
        whole = region.extent == state.region.extent and region.ranks == state.region.ranks
        return ProcMesh(state, None if whole else region)

    @endpoint(concurrent=True)
    async def spawn_on(self, where: tuple[str, str, list[str], list[int], list[int]],
                       options: SpawnOptions, name: str, cls: Any, args: Any,
                       kwargs: Any) -> Any:
        view = self._view(*where)._with_options(options)
        mesh: Any = await view._spawn(name, cls, *args, **kwargs)
        return mesh

    @endpoint(concurrent=True)
    async def stop_mesh(self, where: tuple[str, str, list[str], list[int], list[int]]) -> None:
        await self._view(*where).stop()


def _service_for(state: ProcState) -> ActorMesh[_ProcService]:
    """The controller-side actor that references to ``state``'s mesh held in
    other processes spawn through (the mesh stays registered with it until
    it is released)."""
    service = _ProcService.of(state.rt)
    if not state.released and state.id not in service.meshes:
        service.meshes[state.id] = state

        def forget() -> None:
            service.meshes.pop(state.id, None)

        state.on_release.append(forget)
    return service.mesh


class _ProcMeshRef(ProcMesh):
    """A proc mesh received in another process: spawns (and stop) go to the
    controller that owns the processes."""

    def __init__(self, service: ActorMesh[_ProcService], mesh_id: str, name: str,
                 labels: Sequence[str], sizes: Sequence[int], ranks: Sequence[int],
                 options: SpawnOptions = DEFAULT_OPTIONS) -> None:
        self._service = service
        self._id = mesh_id
        self._name = name
        self._view = Region(Extent(labels, sizes), ranks)
        self._options = options
        self._fresh = False
        self._unheld = None

    def _with_region(self, region: Region) -> _ProcMeshRef:
        e = region.extent
        return _ProcMeshRef(self._service, self._id, self._name, e.labels, e.sizes,
                            region.ranks, self._options)

    def _with_options(self, options: SpawnOptions) -> _ProcMeshRef:
        e = self._region.extent
        return _ProcMeshRef(self._service, self._id, self._name, e.labels, e.sizes,
                            self._region.ranks, options)

    def __repr__(self) -> str:
        return f"<ProcMesh {self._name!r} {self.sizes} (reference)>"

    def __reduce__(self) -> tuple[Any, ...]:
        e = self._region.extent
        return (_ProcMeshRef, (self._service, self._id, self._name, e.labels, e.sizes,
                               self._region.ranks, self._options))

    def _where(self) -> tuple[str, str, list[str], list[int], list[int]]:
        e = self._region.extent
        return self._id, self._name, list(e.labels), list(e.sizes), list(self._region.ranks)

    async def _wait_ready(self) -> ProcMesh:
        return self  # started before it could be passed on

    def _check_loop(self) -> None:
        pass  # (its calls to the owner's service check theirs)

    @property
    def pids(self) -> list[int]:
        raise RuntimeError(f"proc mesh {self._name!r}: pids are known only to the "
                           "controller that started the processes")

    @property
    def stopped(self) -> bool:
        raise RuntimeError(f"proc mesh {self._name!r}: whether it is stopped is known only "
                           "to the controller that started the processes")

    def actors(self, name: str, cls: type[A], /) -> A:
        raise RuntimeError(f"proc mesh {self._name!r}: its actor meshes are known by name "
                           "only to the controller that started the processes")

    async def stacks(self, *, timeout: float = STACKS_TIMEOUT) -> Stacks:
        raise RuntimeError(f"proc mesh {self._name!r}: stacks() is available in the "
                           "controller that started the processes")

    async def spawn(self, name: str, cls: Callable[P, A], /, *args: P.args,
                    **kwargs: P.kwargs) -> A:
        """Spawn through the controller owning the processes (see
        :meth:`ProcMesh.spawn`)."""
        if not _is_actor_class(cls):
            raise _not_an_actor_class(cls, name)
        try:
            mesh: A = await self._service.spawn_on.call_one(self._where(), self._options,
                                                            name, cls, args, kwargs)
        except ActorError as e:
            raise _as_local(e) from e
        _own(mesh)
        return mesh

    async def stop(self) -> None:
        """Stop the whole mesh, through the controller owning it."""
        try:
            await self._service.stop_mesh.call_one(self._where())
        except ActorError as e:
            raise _as_local(e) from e

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        await self.stop()

    async def ready(self) -> None:
        raise RuntimeError(f"proc mesh {self._name!r}: ready() is available in the "
                           "controller that started the processes")

    async def wait_failed(self) -> SupervisionError:
        raise RuntimeError(f"proc mesh {self._name!r}: wait_failed() is available in the "
                           "controller that started the processes")

    @property
    def holes(self) -> list[Point]:
        raise RuntimeError(f"proc mesh {self._name!r}: its holes are known only to the "
                           "controller that started the processes")

    async def replace(self, rank_or_point: int | Mapping[str, int], /) -> None:
        raise RuntimeError(f"proc mesh {self._name!r}: replace() is available in the "
                           "controller that started the processes")

    async def grow(self, /, **dim: int) -> None:
        raise RuntimeError(f"proc mesh {self._name!r}: grow() is available in the "
                           "controller that started the processes")

    async def shrink(self, /, **dim: int) -> None:
        raise RuntimeError(f"proc mesh {self._name!r}: shrink() is available in the "
                           "controller that started the processes")


#: errors of the owner's ``ProcMesh.spawn``/``stop`` raised as they are by a reference
_LOCAL_ERRORS: dict[str, Callable[[str], Exception]] = {
    "ValueError": ValueError, "TypeError": TypeError, "meshio.SchemaError": SchemaError,
    "meshio.SupervisionError": lambda m: SupervisionError(m, cause="proc mesh stopped"),
}


def _as_local(e: ActorError) -> Exception:
    """What the owning controller's ``spawn``/``stop`` raised, as the same type
    here (so ``except ValueError`` works the same on a reference)."""
    make = _LOCAL_ERRORS.get(e.remote_type)
    return e if make is None else make(e.remote_message)


def _check_restart(restart: object, what: str) -> None:
    """``restart`` checked as a restart type (``what``: the argument, as the
    message names it).

    Raises:
        TypeError: not a str.
        ValueError: not one of the three restart types.
    """
    if restart not in _RESTART_TYPES:
        raise (ValueError if isinstance(restart, str) else TypeError)(
            f"{what} must be 'permanent', 'transient' or 'temporary', got "
            f"{type(restart).__name__} {restart!r}")


def _not_an_actor_class(cls: object, name: object) -> TypeError:
    """The error of ``spawn`` of ``name`` given ``cls``, which is no actor class."""
    if isinstance(name, type) and issubclass(name, Actor):  # (Ray's order, the name forgotten)
        return TypeError(f"spawn: the name of the actor mesh comes first, then the class: "
                         f"spawn('name', {name.__qualname__}, ...) (got {name.__qualname__} "
                         f"where the name goes)")
    if isinstance(cls, Actor):
        kind = type(cls).__qualname__
        return TypeError(f"spawn {name!r}: got an instance of {kind}; pass the class itself, "
                         f"then its constructor's arguments: spawn({name!r}, {kind}, ...)")
    origin = get_origin(cls)
    if isinstance(origin, type) and issubclass(origin, Actor):  # (G[int] of a generic G)
        name = origin.__qualname__
        return TypeError(f"spawn: {cls!r} is a parametrized alias of the actor class {name}; "
                         f"spawn {name} itself (type arguments are for type checkers: "
                         f"annotate the mesh instead, mesh: {name}[...] = await "
                         f"procs.spawn(..., {name}, ...))")
    return TypeError(f"spawn: {cls!r} is not a subclass of meshio.Actor")


def _dump_class(cls: type, name: str) -> bytes:
    """``cls`` pickled for :meth:`ProcMesh.spawn` of ``name``.

    Raises:
        TypeError: it cannot be pickled (shipped by value, it refers to a
            lock, a file, a socket...): the message names the class, where
            it is defined, the value that fails and what to do.
    """
    try:
        return dumps(cls)
    except Exception as e:
        where = ("__main__ (a script or a notebook)" if cls.__module__ == "__main__"
                 else "a function" if "<locals>" in cls.__qualname__
                 else f"module {cls.__module__}, registered to be pickled by value")
        part = unpicklable_part(cls) or "a value it refers to"
        raise TypeError(
            f"spawn {name!r}: class {cls.__qualname__} is defined in {where}, so it is sent "
            f"to the workers by value, with what its methods use, and {part} cannot be "
            f"pickled ({type(e).__name__}: {e}); create such a value where it is used (in "
            f"__init__: self.lock = threading.Lock()), reach it through a module the workers "
            f"import (mymodule.LOCK), or define the class in such a module") from None


def _is_actor_class(cls: Callable[..., A]) -> TypeGuard[type[A]]:
    """``cls`` is a subclass of :class:`Actor` (for mypy: ``type[A]``, not a mere callable)."""
    return isinstance(cls, type) and issubclass(cls, Actor)


class _Hosts:
    """The hosts of a host mesh, shared with its slices: a job's ``resize``
    adds or removes some (:func:`grow_hosts`, :func:`shrink_hosts`)."""

    def __init__(self, launchers: Sequence[ProcLauncher], region: Region) -> None:
        self.launchers: list[ProcLauncher] = list(launchers)
        self.region = region
        #: the proc meshes spawned with ``elastic=True`` on the whole mesh
        self.elastic: list[ProcState] = []
        #: one resize at a time
        self.resizing = asyncio.Lock()


def _check_bootstrap(bootstrap: Callable[..., object]) -> None:
    """Refuse a ``bootstrap`` each process could not run as given: one that
    needs arguments, or a generator function (calling it runs nothing)."""
    if inspect.isgeneratorfunction(bootstrap) or inspect.isasyncgenfunction(bootstrap):
        raise TypeError(f"spawn_procs: bootstrap {bootstrap!r} is a generator function: "
                        "calling it would run none of its body; make it a plain (or async) "
                        "function")
    try:
        inspect.signature(bootstrap).bind()
    except ValueError:  # (no signature to read: a builtin, called as it is)
        return
    except TypeError as e:
        raise TypeError(f"spawn_procs: bootstrap {bootstrap!r} must be callable with no "
                        f"arguments ({e}); bind them first, e.g. functools.partial") from None


class HostMesh(MeshShape):
    """Hosts that can run worker processes.  ``this_host()`` is the
    controller's own host (a mesh with no dims and a single point); a job's
    ``await job.state()`` gives one per mesh name, which its
    ``job.resize(name, hosts=n)`` grows or shrinks in place."""

    def __init__(self, launchers: Sequence[ProcLauncher], region: Region) -> None:
        self._hosts = _Hosts(launchers, region)
        #: the points of a slice (None: the whole mesh, whatever its size now)
        self._view: Region | None = None

    @property
    def _region(self) -> Region:  # type: ignore[override]  # (read-only here)
        return self._hosts.region if self._view is None else self._view

    @property
    def _launchers(self) -> list[ProcLauncher]:
        return self._hosts.launchers

    def _with_region(self, region: Region) -> HostMesh:
        mesh = HostMesh.__new__(HostMesh)
        mesh._hosts, mesh._view = self._hosts, region
        return mesh

    def __repr__(self) -> str:
        hosts = [self._launchers[r].host for r in self._region.ranks]
        shown = ", ".join(hosts[:4]) + (f", ... ({len(hosts)} hosts)" if len(hosts) > 4 else "")
        return f"<HostMesh {self.sizes} on {shown}>"

    def spawn_procs(self, per_host: Mapping[str, int] | None = None, *,
                    name: str = "procs", supervisor: Supervisor | None = None,
                    restart: RestartType | None = None,
                    shutdown: ShutdownPolicy = STOP_GRACE,
                    heartbeat_interval: float = HEARTBEAT_INTERVAL,
                    heartbeat_timeout: float | None = None,
                    partition_timeout: float = PARTITION_TIMEOUT,
                    env: Mapping[str, str] | None = None,
                    bootstrap: Callable[[], object] | None = None,
                    log_records: bool = True,
                    log_dir: str | os.PathLike[str] | None = None,
                    elastic: bool = False,
                    keep_alive: float | None = None) -> ProcMesh:
        """Start worker processes: ``per_host`` gives the dims added on every
        host (``{"gpus": 4}``: 4 processes per host, one GPU each when the
        dim is called ``gpus``).  Await the result or use it with ``async with``
        (the processes start at once; what is returned and never awaited nor
        used stops them once dropped: see :class:`ProcMesh`).

        Every new process (a supervisor's replacement too) starts with
        ``env`` in its environment and runs ``bootstrap()`` before anything
        else: before it connects to anyone and before any actor class (or
        anything it imports) is loaded.

        Args:
            env: environment variables of every process, on top of the
                controller's.  A ``gpus`` dim gives each process the device
                at its index among those ``CUDA_VISIBLE_DEVICES`` lists (in
                ``env``, else in its host's environment; none listed: the
                index itself); ``MESHIO_*`` may not be set.
            bootstrap: a function of no arguments every process calls first,
                in its main thread (NCCL/vLLM-style set-up that must precede
                imports).  Pickled like an actor class: by value when defined
                in ``__main__``, a notebook or a function.  A coroutine
                function is run to completion on an asyncio loop of its own,
                closed before the worker's loop starts.  If it raises, its
                traceback goes to the process's stderr and the start fails
                with :class:`ProcessStartError` naming it and the exception.
            supervisor: the :class:`~meshio.Supervisor` owning these processes
                (declared as its next child); without one, failures are
                reported and nothing restarts.
            restart: restart type of the processes (default: the most
                permanent of their actor meshes' types).
            shutdown: ``"brutal_kill"`` or seconds of grace after a graceful
                shutdown request before SIGKILL (stop and strategy restarts).
            heartbeat_interval: without a supervisor, seconds between
                heartbeats to each process (with one, the supervisor's apply).
            heartbeat_timeout: without a supervisor, a process that leaves a
                heartbeat unanswered this long (default 3 intervals) is not
                responding: calls to it fail with :class:`SupervisionError`
                until it answers again; it is not killed.
            partition_timeout: seconds a host reached through its agent
                (``meshio.attach``, jobs) may be unreachable before it is
                *downed*: its processes of this mesh count as failed (cause
                ``"partitioned"``; a supervisor restarts them once the host
                is back, or gives up; without one they are holes), and the
                host's agent, having lost the controller as long, kills
                them itself, so a healed partition never leaves two
                incarnations of a rank.  A shorter partition downs nothing.
                Processes on the controller's own host have no agent and
                ignore it.
            log_records: the processes' ``logging`` records (any logger, at
                the levels their logging lets through: WARNING and up
                unless configured, e.g. in ``bootstrap``) reach the
                controller's ``logging`` as records, re-emitted through the
                logger of the same name with the attributes ``actor``,
                ``rank``, ``mesh``, ``host`` and ``pid`` (the default).
                False: their logging is left alone (it writes to their
                stderr, forwarded as text like any output).
            log_dir: instead of sending them, each process writes its
                records to ``<log_dir>/<name>-<rank>.log`` on its own host
                (the directory is made if missing; a restarted process
                appends to its predecessor's file).
            elastic: the proc mesh follows its host mesh: when the job
                resizes it (``await job.resize("workers", hosts=n)``), new
                hosts get their processes (``per_host`` of them, started as
                the others were) and the actor meshes spawned on the whole
                proc mesh an actor on each, built with their constructor
                arguments; removed hosts' processes are stopped first, as
                :meth:`ProcMesh.shrink` does.  Only on a whole host mesh
                (of one dimension, ``hosts``, as jobs give; on ``this_host()``
                it never changes), not on a slice.
            keep_alive: seconds the processes outlive a lost controller
                (killed, crashed, a notebook kernel restarted), serving each
                other with their actors' state intact, so that a new
                controller can re-attach by ``name``
                (``await this_host().reattach(name)``); after that long
                without one they exit.  None (the default): they exit as
                soon as the controller is lost.  The mesh is published for
                this user only while it runs; stopping it removes that.

        Raises:
            TypeError: an argument has the wrong type, e.g. ``per_host``
                not a mapping of str to int, ``restart`` not a str, seconds
                (``shutdown``, ``heartbeat_interval``, ``heartbeat_timeout``,
                ``partition_timeout``, ``keep_alive``) given as a ``str`` or
                a ``bool``, an ``env`` value that is not a ``str``, or
                ``bootstrap`` is not callable or cannot be pickled.
            RuntimeError: called in an actor of the in-process transport
                (:func:`meshio.testing.in_process_host`) on this host,
                where no process can be started.
            ValueError: an argument has a wrong value, e.g. seconds out of
                range (0 or less, ``shutdown`` below 0, NaN, an int no float
                holds, ``math.inf`` for ``partition_timeout`` or
                ``keep_alive``), an ``env`` key
                that is empty, has ``=`` or starts with ``MESHIO_``,
                ``log_dir`` with ``log_records=False``, ``keep_alive``
                with the ``name`` of another kept-alive proc mesh (one
                still being started too), a
                ``name`` too long for its workers' Unix socket addresses
                (46 bytes fit, as the message says), or, on the in-process
                transport (:func:`meshio.testing.in_process_host`), a
                non-empty ``env`` or a ``bootstrap``.
        """
        if keep_alive is not None:
            keep_alive = check_seconds(keep_alive, _SPAWN_PROCS, "keep_alive", inf=False,
                                       also=" or None")
        _check_supervisor(supervisor, "spawn_procs")
        if restart is not None:
            _check_restart(restart, "spawn_procs: restart")
        if isinstance(shutdown, str):  # (a str is of its type: a wrong one is a wrong value)
            if shutdown != "brutal_kill":
                raise ValueError(f"{_SPAWN_PROCS}(shutdown=...) must be seconds >= 0 or "
                                 f"'brutal_kill', got {shutdown!r}")
        else:
            shutdown = check_seconds(shutdown, _SPAWN_PROCS, "shutdown", zero=True,
                                     also=" or 'brutal_kill'")
        heartbeat_interval = check_seconds(heartbeat_interval, _SPAWN_PROCS, "heartbeat_interval")
        if heartbeat_timeout is None:
            heartbeat_timeout = 3 * heartbeat_interval
        else:
            heartbeat_timeout = check_seconds(heartbeat_timeout, _SPAWN_PROCS, "heartbeat_timeout",
                                              also=" or None")
        partition_timeout = check_seconds(partition_timeout, _SPAWN_PROCS, "partition_timeout",
                                          inf=False)
        env = check_env({} if env is None else env)
        if not isinstance(log_records, bool):
            raise TypeError(f"spawn_procs: log_records must be True or False, got "
                            f"{type(log_records).__name__} {log_records!r}")
        if log_dir is not None:
            if not isinstance(log_dir, (str, os.PathLike)):
                raise TypeError(f"spawn_procs: log_dir must be a path (str or os.PathLike), "
                                f"got {type(log_dir).__name__} {log_dir!r}")
            if not log_records:
                raise ValueError("spawn_procs: log_dir=... writes the log records to files; "
                                 "it cannot go with log_records=False (which leaves the "
                                 "processes' logging alone)")
            log_dir = os.path.abspath(os.fspath(log_dir))
        blob = b""
        if bootstrap is not None:
            if not callable(bootstrap):
                raise TypeError(f"spawn_procs: bootstrap must be a function of no arguments, "
                                f"got {type(bootstrap).__name__} {bootstrap!r}")
            _check_bootstrap(bootstrap)
            try:
                blob = dumps(bootstrap)
            except Exception as e:
                raise TypeError(f"spawn_procs: bootstrap {bootstrap!r} cannot be pickled to "
                                f"send it to the new processes ({type(e).__name__}: {e}); "
                                f"make it a module-level function, or capture only "
                                f"picklable values") from e
        if per_host is not None and not isinstance(per_host, Mapping):
            raise TypeError(f"spawn_procs: per_host must be a mapping of dim names (str) to "
                            f"ints >= 1, e.g. {{'gpus': 4}}, got {type(per_host).__name__} "
                            f"{per_host!r}")
        per_host = dict(per_host or {"procs": 1})
        for k, v in per_host.items():
            if not isinstance(k, str) or not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"spawn_procs: per_host must map dim names (str) to ints >= 1, "
                                f"got {k!r}: {v!r} ({type(v).__name__})")
            if v < 1:
                raise ValueError(f"spawn_procs: per_host must map dim names to ints >= 1, "
                                 f"got {k!r}: {v!r}")
        try:  # (names slice() can take: checked before anything starts)
            Extent(tuple(per_host), tuple(per_host.values()))
        except ValueError as e:
            why = str(e).removeprefix("extent: ")
            raise ValueError(f"spawn_procs: per_host {per_host}: {why}") from None
        clash = set(per_host) & set(self.extent.labels)
        if clash:
            raise ValueError(f"spawn_procs: per_host dims {sorted(clash)} clash with host dims")
        if math.prod(per_host.values()) > MAX_PER_HOST:
            raise ValueError(f"spawn_procs: per_host {per_host} is {math.prod(per_host.values())} "
                             f"processes on each host; at most {MAX_PER_HOST} can be started "
                             "on one")
        if not isinstance(elastic, bool):
            raise TypeError(f"spawn_procs: elastic must be True or False, got "
                            f"{type(elastic).__name__} {elastic!r}")
        if elastic and (self._view is not None or len(self.extent) > 1):
            raise ValueError(
                f"spawn_procs(elastic=True): only a proc mesh on a whole host mesh of one "
                f"dimension follows its resizes; this host mesh is "
                f"{'a slice ' if self._view is not None else ''}{self.sizes} (spawn on the "
                f"host mesh from job.state(), e.g. state.workers)")
        if any(r >= len(self._launchers) for r in self._region.ranks):
            raise ValueError(f"spawn_procs: this slice {self.sizes} of a host mesh names hosts "
                             f"that the job's resize removed; it has {len(self._launchers)} "
                             f"hosts now (slice it again)")
        # (after the other checks: a runtime is made for it, as for the processes)
        rt = runtime()
        name = check_name(name, "spawn_procs", rt.namespace, kept=keep_alive is not None)
        launchers = [self._launchers[r] for r in self._region.ranks]
        if rt.in_process and any(isinstance(launcher, LocalLauncher) for launcher in launchers):
            # (its runtime listens on no socket: a new process could not reach it)
            raise RuntimeError(
                f"spawn_procs: worker {rt.worker!r} is a worker of the in-process transport "
                f"(meshio.testing.in_process_host()), which starts no processes; an actor "
                f"there cannot start worker processes with this_host().spawn_procs(). Run "
                f"this test on the 'processes' transport "
                f"(pytest.mark.meshio_transports(\"processes\"))")
        if any(launcher.in_process for launcher in launchers):
            _refuse_in_process(env, bootstrap)
        n = math.prod(per_host.values())
        region = Region.full([*self.extent.labels, *per_host],
                             [*self.extent.sizes, *per_host.values()])
        state = on_loop_wait(  # (it starts tasks: from an actor's thread, on its loop)
            ProcState, name, launchers, region, n, supervisor, restart, shutdown,
            (heartbeat_interval, heartbeat_timeout), env, blob, self.extent.labels,
            log_records, log_dir, float(partition_timeout), keep_alive)
        if elastic:
            hosts = self._hosts
            hosts.elastic.append(state)
            state.on_release.append(lambda: hosts.elastic.remove(state))
        return ProcMesh(state, None, fresh=True)

    async def reattach(self, name: str, *, supervisor: Supervisor | None = None) -> ProcMesh:
        """The proc mesh ``name`` that a controller now gone spawned here with
        ``spawn_procs(name=name, keep_alive=...)``, its processes and actors
        as they are: this controller serves them from now on (a later
        :meth:`ProcMesh.stop` stops them; losing this controller starts
        their ``keep_alive`` wait again).  Get the actors back with
        ``procs.actors("trainers", Trainer)``.  The mesh keeps the options
        it was spawned with (``restart``, ``shutdown``, the heartbeats,
        ``partition_timeout``).  The actors of a spawn the lost controller
        did not finish are stopped (nobody got them): their name is free
        for a new ``procs.spawn``.  Re-attaches of one mesh take turns
        (those of other controllers on this machine too): one that waited
        for another that succeeded raises :class:`ProcMeshTakenError`.
        One given up (cancelled: ``asyncio.wait_for`` running out) at any
        point re-attaches nothing: the workers wait on for another try.

        Args:
            supervisor: watches the processes from now on (declared as its
                next child), restarting them and rebuilding their actors
                with their constructor arguments (its heartbeat settings
                apply); without one, failures are reported and nothing
                restarts (as for ``spawn_procs``).

        Raises:
            TypeError: ``name`` is not a ``str``.
            UnknownProcMeshError: no proc mesh of that name is kept alive on
                this host (the message lists those that are).
            ProcMeshTakenError: the mesh serves another controller: one
                that re-attached to it (before, or while this re-attach
                waited for it), or the one that spawned it, still
                connected (or still starting it).  Nothing is re-attached.
            SupervisionError: a process could not be re-attached (it is
                alive but out of reach, its host cut off: after the connect
                timeout, 60 s, naming it), or every one is gone.  Nothing is
                re-attached then (its workers wait on, for another try).
                One gone meanwhile (its process exited) fails as if after
                the re-attach: the supervisor restarts it, else it is a hole.
            ValueError: this host mesh is not the one (the same hosts, in the
                same order) the proc mesh was spawned on, or this process is
                that mesh's controller (it spawned it or re-attached to it);
                or ``name`` is none that
                ``spawn_procs(name=..., keep_alive=...)`` takes (too long,
                empty, with ``/`` or NUL, or a leading dot).
        """
        name = check_name(name, "reattach", runtime().namespace, kept=True)
        _check_supervisor(supervisor, "reattach")
        record = lookup(name)
        if record.controller_pid == os.getpid():
            raise ValueError(f"reattach({name!r}): this process is the controller of proc mesh "
                             f"{name!r} already; use the ProcMesh it has (the one "
                             f"spawn_procs or reattach returned)")
        launchers = [self._launchers[r] for r in self._region.ranks]
        host_dims = list(self.extent.labels)
        if record.labels[:len(host_dims)] != host_dims or record.sizes[:len(host_dims)] != list(
                self.extent.sizes):
            raise ValueError(f"reattach({name!r}): proc mesh {name!r} has dims "
                             f"{dict(zip(record.labels, record.sizes))}; re-attach on the host "
                             f"mesh it was spawned on (dims {self.sizes})")
        region = Region.full(record.labels, record.sizes)
        # one re-attach of the mesh at a time: another under way (another
        # controller's, or this one's) leaves it taken, or failed and left it
        async with reattaching(record) as record:
            options = record.options or KeptOptions(None, STOP_GRACE, HEARTBEAT_INTERVAL,
                                                    3 * HEARTBEAT_INTERVAL, PARTITION_TIMEOUT)
            state = ProcState(record.name, launchers, region,
                              region.extent.nelem // len(launchers), supervisor,
                              cast(RestartType | None, options.restart),
                              cast(ShutdownPolicy, options.shutdown),
                              (options.heartbeat_interval, options.heartbeat_timeout),
                              record.env, record.bootstrap, host_dims, record.log_records,
                              record.log_dir, options.partition_timeout,
                              keep_alive=record.keep_alive, adopt=record)
            procs = ProcMesh(state, None)
            try:
                await procs
            except BaseException:
                await state.abandon()
                raise
            state.actors = [_rebuild_record(procs, kept) for kept in record.actors]
            state.fail_gone()
            state.published()
        return procs


def _takes_keyword(cls: type[Actor], name: str) -> bool:
    """Whether ``cls.__init__`` takes an argument ``name`` by keyword (a
    parameter of that name, or ``**kwargs``)."""
    return any(p.kind is p.VAR_KEYWORD or (p.name == name and p.kind is not p.POSITIONAL_ONLY)
               for p in inspect.signature(cls.__init__).parameters.values())


def _refuse_in_process(env: Mapping[str, str], bootstrap: Callable[[], object] | None) -> None:
    """Refuse the ``spawn_procs`` options the in-process transport cannot
    honour (it starts no process): ignored, a test would pass there and
    fail on processes, or the reverse."""
    given = [what for what, set_ in (("env", bool(env)), ("bootstrap", bootstrap is not None))
             if set_]
    if given:
        raise ValueError(
            f"spawn_procs({', '.join(f'{what}=...' for what in given)}): the in-process "
            f"transport (meshio.testing.in_process_host()) starts no processes and cannot "
            f"honour {' or '.join(_IN_PROCESS_LACKS[what] for what in given)}; test this on "
            f"the 'processes' transport (pytest.mark.meshio_transports(\"processes\"))")


#: what the in-process transport cannot honour, per option it refuses
_IN_PROCESS_LACKS = {
    "env": "an environment per worker (its workers share this process's os.environ)",
    "bootstrap": "a bootstrap (run first in each new process)",
}


def _check_supervisor(supervisor: object, where: str) -> None:
    """Refuse a ``supervisor=`` that is no Supervisor (it failed later, with
    an ``AttributeError``)."""
    if supervisor is not None and not isinstance(supervisor, Supervisor):
        raise TypeError(f"{where}: supervisor must be a meshio.Supervisor or None, got "
                        f"{type(supervisor).__name__} {supervisor!r}")


def _rebuild_record(procs: ProcMesh, kept: KeptActor) -> _ActorRecord:
    """What rebuilds the actors of the actor mesh ``kept`` (listed in the
    record of a re-attached proc mesh) when a supervisor replaces a process."""
    state = procs._state
    # constructor arguments that held out-of-band buffers (tensors) are not in
    # the record: those actors are not rebuilt, as temporary ones are not
    restart = cast(RestartType, kept.restart if kept.body is not None else "temporary")
    record = _ActorRecord(kept.name, kept.target, kept.cls, b"", kept.body or b"", [],
                          kept.labels, kept.sizes, kept.ranks,
                          SpawnOptions(restart, kept.stall_after),
                          cls_name=(kept.module, kept.qualname))
    try:
        cls = loads(kept.cls, [], 0)
    except Exception as e:  # its module is not importable here
        log.warning("meshio: reattach(%r): the actors %r (%s.%s) cannot be rebuilt after a "
                    "restart: their class does not load here (%s: %s)", state.name,
                    kept.name, kept.module, kept.qualname, type(e).__name__, e)
        record.options = replace(record.options, restart="temporary")
        return record
    region = Region(Extent(kept.labels, kept.sizes), kept.ranks)
    addrs = [""] * state.region.extent.nelem
    for w in state.workers:
        addrs[w.rank] = w.addr
    whole = kept.ranks == list(state.region.ranks)
    mesh: ActorMesh[Any] = ActorMesh(kept.target, kept.name, cls, region, addrs,
                                     procs if whole else procs._with_region(region),
                                     per_host=state.per_host)
    record.mesh_blob = dumps(mesh)
    record.mesh = mesh if whole else None
    return record


async def grow_hosts(mesh: HostMesh, added: HostMesh) -> None:
    """Add the hosts of ``added`` to the end of ``mesh`` (a whole host mesh
    of one dimension), in place; then its elastic proc meshes grow onto
    them (all at once).  A job's ``resize``.

    Raises:
        the first error of a proc mesh that did not grow (it keeps its
        shape; the others grew, and so did the host mesh).
    """
    hosts = mesh._hosts
    async with hosts.resizing:
        (dim,) = hosts.region.extent.labels
        new = [added._launchers[r] for r in added._region.ranks]
        hosts.launchers.extend(new)
        hosts.region = Region.full((dim,), (len(hosts.launchers),))
        following = [s for s in hosts.elastic if not s.stopped]
        results = await asyncio.gather(*(s.grow(dim, len(new), new) for s in following),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result


async def shrink_hosts(mesh: HostMesh, by: int) -> None:
    """Remove the last ``by`` hosts of ``mesh`` (a whole host mesh of one
    dimension), in place, once its elastic proc meshes have stopped their
    processes there (as ``ProcMesh.shrink`` does).  A job's ``resize``."""
    hosts = mesh._hosts
    async with hosts.resizing:
        (dim,) = hosts.region.extent.labels
        following = [s for s in hosts.elastic if not s.stopped]
        # (each stops its processes on those hosts to the end, whatever the others do)
        results = await asyncio.gather(*(s.shrink(dim, by) for s in following),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        del hosts.launchers[len(hosts.launchers) - by:]
        hosts.region = Region.full((dim,), (len(hosts.launchers),))


def this_host() -> HostMesh:
    """The host the controller runs on."""
    return HostMesh([LocalLauncher()], Region.full((), ()))
