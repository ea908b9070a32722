"""``HostMesh`` and ``ProcMesh``: hosts, and the worker processes on them."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, ParamSpec, TypeGuard, TypeVar, cast

import msgspec

from ._actor import Actor
from ._actor_mesh import ActorMesh
from ._endpoint import combine_failures
from ._exceptions import MeshioError, SupervisionError
from ._extent import Extent, MeshShape, Point, Region
from ._launcher import LocalLauncher, ProcHandle, ProcLauncher, WorkerSpec, describe_exit
from ._messages import ErrorInfo, Ping, Restored, Shutdown, SpawnActor
from ._runtime import Connection, Pending, Runtime, ignore_result, runtime
from ._serial import Packer, dumps
from ._supervisor import RestartType, ShutdownPolicy, Supervisor

__all__ = ("HostMesh", "ProcMesh", "this_host")

A = TypeVar("A", bound=Actor)
P = ParamSpec("P")

#: seconds a worker gets to say hello before spawn_procs fails
START_TIMEOUT = 60.0
#: default seconds a worker gets to exit after a shutdown request before it is killed
STOP_GRACE = 5.0
#: seconds to wait for an exit status after a worker's connection drops
EXIT_STATUS_WAIT = 1.0


class _Worker:
    """One process slot of a proc mesh; survives restarts (same rank, same
    address), ``handle``/``conn`` are the current incarnation's."""

    __slots__ = ("addr", "cause", "conn", "handle", "incarnation", "rank", "ready", "spec",
                 "stopping")

    def __init__(self, rank: int, addr: str, handle: ProcHandle, spec: WorkerSpec,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.rank = rank
        self.addr = addr
        self.handle = handle
        self.spec = spec
        self.conn: Connection | None = None
        self.incarnation = 0
        #: why this incarnation is being taken down (overrides the exit status)
        self.cause: str | None = None
        #: taken down on purpose (stop or a strategy restart), not a failure
        self.stopping = False
        #: resolved when the current incarnation serves calls (retryable calls wait on it)
        self.ready: asyncio.Future[None] = loop.create_future()


class _ActorRecord:
    """What it takes to rebuild an actor mesh's actors after a restart."""

    __slots__ = ("body", "cls_blob", "labels", "mesh_blob", "name", "out", "ranks", "restart",
                 "sizes", "target")

    def __init__(self, name: str, target: str, cls_blob: bytes, mesh_blob: bytes, body: bytes,
                 out: Any, labels: list[str], sizes: list[int], ranks: Sequence[int],
                 restart: RestartType) -> None:
        self.name, self.target = name, target
        self.cls_blob, self.mesh_blob, self.body, self.out = cls_blob, mesh_blob, body, out
        self.labels, self.sizes, self.ranks, self.restart = labels, sizes, tuple(ranks), restart


class _ProcState:
    """Shared by a proc mesh and all its slices."""

    def __init__(self, name: str, launchers: Sequence[ProcLauncher], region: Region,
                 per_host: int, supervisor: Supervisor | None = None,
                 restart: RestartType | None = None,
                 shutdown: ShutdownPolicy = STOP_GRACE) -> None:
        self.id = f"{name}-{uuid.uuid4().hex[:8]}"
        self.name = name
        self.launchers = launchers
        self.region = region
        self.per_host = per_host
        self.supervisor = supervisor
        self.restart = restart
        self.shutdown = shutdown
        self.workers: list[_Worker] = []
        self.actors: list[_ActorRecord] = []
        self.actor_names: set[str] = set()
        self.stopped = False
        self.rt: Runtime = runtime()
        self._pongs: dict[str, float] = {}
        self._beating: asyncio.Task[None] | None = None
        if supervisor is not None:
            supervisor.children.append(self)
        self.ready: asyncio.Task[None] = self.rt.loop.create_task(self._start())

    @property
    def restart_type(self) -> RestartType:
        """The proc mesh's own, or the most permanent of its actor meshes'."""
        if self.restart is not None:
            return self.restart
        kinds = {a.restart for a in self.actors}
        for kind in ("permanent", "transient", "temporary"):
            if kind in kinds:
                return kind
        return "permanent"

    def _spec(self, grank: int, point: Point) -> WorkerSpec:
        worker_id = f"{self.id}-{grank}"
        env = {"MESHIO_WORKER": worker_id}
        if "gpus" in self.region.extent.labels:
            env["CUDA_VISIBLE_DEVICES"] = str(point["gpus"])
        coords = " ".join(f"{k}={v}" for k, v in point.items())
        return WorkerSpec(worker_id, os.path.join(self.rt.sockdir, f"{worker_id}.sock"),
                          self.rt.addr, env, label=f"[{self.name} {coords}]".replace(" ]", "]"))

    async def _launch(self, grank: int, spec: WorkerSpec) -> tuple[ProcHandle,
                                                                   asyncio.Future[Connection]]:
        waiter: asyncio.Future[Connection] = self.rt.loop.create_future()
        self.rt.hello_waiters[spec.worker] = waiter
        launcher = self.launchers[grank // self.per_host]
        return await launcher.launch(spec), waiter

    async def _start(self) -> None:
        waits = []
        for grank, point in zip(self.region.ranks, self.region.points()):
            spec = self._spec(grank, point)
            handle, waiter = await self._launch(grank, spec)
            worker = _Worker(grank, spec.listen, handle, spec, self.rt.loop)
            self.workers.append(worker)
            waits.append(self._hello(worker, waiter))
        try:
            await asyncio.gather(*waits)
        except BaseException:
            self.kill()
            raise
        for worker in self.workers:
            worker.ready.set_result(None)
        if self.supervisor is not None:
            self._beating = self.rt.loop.create_task(self._heartbeats(self.supervisor))

    def reopen(self) -> None:
        """Undo :meth:`stop` before a parent supervisor restarts this mesh's
        supervisor (its processes are then restarted one by one)."""
        if self.stopped and self.supervisor is not None:
            self.stopped = False
            if self._beating is not None:
                self._beating.cancel()
            self._beating = self.rt.loop.create_task(self._heartbeats(self.supervisor))

    async def _hello(self, worker: _Worker, waiter: asyncio.Future[Connection]) -> None:
        exited = asyncio.ensure_future(worker.handle.wait())
        racers: list[asyncio.Future[Any]] = [waiter, exited]
        done, _ = await asyncio.wait(racers, timeout=START_TIMEOUT,
                                     return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            exited.cancel()
            why = (describe_exit(exited.result()) if exited in done
                   else f"no hello within {START_TIMEOUT}s")
            raise MeshioError(
                f"proc mesh {self.name!r}: worker rank {worker.rank} (pid {worker.handle.pid} on "
                f"{worker.handle.host}) failed to start: {why}; its stderr above says why")
        exited.cancel()
        worker.conn = waiter.result()
        self._pongs[worker.addr] = self._now()
        self.rt.on_lost[worker.addr] = lambda conn: self._lost(worker, conn)
        self.rt.on_fault_from[worker.addr] = lambda info: self._fault(worker, info)
        self.rt.on_pong[worker.addr] = lambda: self.pong(worker.addr)

    def _now(self) -> float:
        return self.supervisor.clock.now() if self.supervisor is not None else 0.0

    # ------------------------------------------------------------ failures

    def _lost(self, worker: _Worker, conn: Connection) -> None:
        if conn is not worker.conn:  # an incarnation its supervisor is already replacing
            conn.fail_all(lambda p: SupervisionError(
                f"{p.mesh} {p.point!r} on proc mesh {self.name!r} rank {worker.rank}: process "
                f"{conn.peer_pid} was stopped by its supervisor while {p.endpoint} was in "
                f"flight", actor=p.mesh, rank=p.rank, host=worker.handle.host,
                pid=conn.peer_pid, cause="stopped by its supervisor"))
            return
        # Until _fail_calls has the exit status, new calls fail at once with
        # what is known (not with a bare "connection refused" from a redial).
        handle = worker.handle

        def error(p: Pending) -> SupervisionError:
            cause = describe_exit(handle.returncode)
            return SupervisionError(
                f"{p.mesh} {p.point!r} on proc mesh {self.name!r} rank {worker.rank}: process "
                f"{handle.pid} on {handle.host} {cause}", actor=p.mesh, rank=p.rank,
                host=handle.host, pid=handle.pid, cause=cause)

        if not self.stopped:
            self.rt.dead[worker.addr] = error
            if worker.ready.done():  # retryable calls wait for the restart, not spin
                worker.ready = self.rt.loop.create_future()
        self.rt.loop.create_task(self._fail_calls(worker, conn, handle))

    async def _fail_calls(self, worker: _Worker, conn: Connection, handle: ProcHandle) -> None:
        if not self.stopped:
            try:
                await asyncio.wait_for(handle.wait(), EXIT_STATUS_WAIT)
            except TimeoutError:
                pass
        if self.stopped:
            cause = "proc mesh stopped"
        elif worker.cause is not None:
            cause = worker.cause
        elif handle.returncode is None:
            cause = "connection lost (process still running; killed)"
            handle.send_signal(signal.SIGKILL)
        else:
            cause = describe_exit(handle.returncode)
        # replaced meanwhile, or being stopped by a strategy restart: on purpose
        stale = conn is not worker.conn
        restarting = stale or (worker.stopping and not self.stopped)
        if not restarting and self.supervisor is not None and not self.stopped:
            restarting = self.supervisor.child_failed(self, worker.rank, cause,
                                                      abnormal=handle.returncode != 0,
                                                      pid=handle.pid, host=handle.host)
        note = " (its supervisor restarts it)" if restarting else ""

        def error(p: Pending) -> SupervisionError:
            return SupervisionError(
                f"{p.mesh} {p.point!r} on proc mesh {self.name!r} rank {worker.rank}: process "
                f"{handle.pid} on {handle.host} {cause} while {p.endpoint} was in "
                f"flight{note}", actor=p.mesh, rank=p.rank, host=handle.host,
                pid=handle.pid, cause=cause)

        if stale:
            conn.fail_all(error)
            return
        self.rt.dead[worker.addr] = error
        conn.fail_all(error)
        if worker.ready.done():
            worker.ready = self.rt.loop.create_future()
        if not restarting:
            self._no_restart(worker, SupervisionError(
                f"proc mesh {self.name!r} rank {worker.rank}: {cause}", actor=self.name,
                rank=worker.rank, host=handle.host, pid=handle.pid, cause=cause))

    def _no_restart(self, worker: _Worker, error: SupervisionError) -> None:
        if not worker.ready.done():
            worker.ready.set_exception(error)
            worker.ready.exception()  # nobody may be waiting: don't warn

    def _fault(self, worker: _Worker, info: ErrorInfo) -> None:
        """An actor raised with nobody to tell (e.g. in a broadcast)."""
        _log_fault(worker, info)
        if self.supervisor is not None and not worker.stopping:
            worker.cause = (f"{info.type_name}: {info.message} escaped {info.actor} rank "
                            f"{info.rank} (no caller to tell)\n{info.traceback}")
            worker.handle.send_signal(signal.SIGKILL)  # replaced with a fresh process

    async def _heartbeats(self, sup: Supervisor) -> None:
        """Ping every live process; one silent for heartbeat_timeout is hung."""
        while not self.stopped:
            await sup.clock.sleep(sup.heartbeat_interval)
            now = sup.clock.now()
            for w in self.workers:
                conn = w.conn
                if (conn is None or conn.closed or w.stopping or w.cause is not None
                        or not w.ready.done()):  # (cause: already being killed)
                    continue
                last = self._pongs.get(w.addr, now)
                if now - last > sup.heartbeat_timeout:
                    w.cause = (f"hung: no heartbeat answer for {now - last:.1f}s "
                               f"(heartbeat_timeout={sup.heartbeat_timeout}s); killed")
                    w.handle.send_signal(signal.SIGKILL)
                else:
                    conn.send_message(Ping(w.incarnation))

    def pong(self, addr: str) -> None:
        self._pongs[addr] = self._now()

    # ------------------------------------------------- restarts (supervisor)

    def _worker(self, grank: int) -> _Worker:
        return next(w for w in self.workers if w.rank == grank)

    async def stop_rank(self, grank: int) -> None:
        """Take one process down on purpose, by the shutdown policy."""
        w = self._worker(grank)
        w.stopping = True
        if w.ready.done():  # retryable calls wait for restart_rank
            w.ready = self.rt.loop.create_future()
        await _shutdown([w], self.shutdown)

    async def restart_rank(self, grank: int) -> tuple[int, str]:
        """Replace one process: same rank and address, actors rebuilt with
        their constructor arguments at the same coordinates."""
        w = self._worker(grank)
        w.stopping = True
        if w.handle.returncode is None:
            w.handle.send_signal(signal.SIGKILL)
        await w.handle.wait()
        if w.conn is not None and not w.conn.closed:
            w.conn.abort()
        w.conn = None  # what happens on the old connection is the old incarnation's
        w.incarnation += 1
        if self.stopped:
            raise SupervisionError(f"proc mesh {self.name!r} was stopped", actor=self.name,
                                   rank=grank, cause="proc mesh stopped")
        handle, waiter = await self._launch(grank, w.spec.restarted())
        w.handle, w.cause, w.stopping = handle, None, False
        try:
            await self._hello(w, waiter)
        finally:
            if self.stopped:  # stopped while this one started: it would be leaked
                handle.send_signal(signal.SIGKILL)
        if self.stopped:
            raise SupervisionError(f"proc mesh {self.name!r} was stopped", actor=self.name,
                                   rank=grank, cause="proc mesh stopped")
        rt = self.rt
        lost = [a.target for a in self.actors if grank in a.ranks and a.restart == "temporary"]
        futs: list[asyncio.Future[Any]] = []
        for a in self.actors:
            if grank not in a.ranks or a.restart == "temporary":
                continue
            fut: asyncio.Future[Any] = rt.loop.create_future()
            assert w.conn is not None
            req = w.conn.next_req(Pending(fut, ignore_result, f"{a.name}.__init__", a.name,
                                          Region(Extent(a.labels, a.sizes), a.ranks)
                                          .point(a.ranks.index(grank))))
            w.conn.send_message(SpawnActor(req, a.target, a.name, a.cls_blob,
                                           a.ranks.index(grank), a.labels, a.sizes,
                                           a.mesh_blob, msgspec.Raw(a.body), True), a.out)
            futs.append(fut)
        if futs:
            await asyncio.gather(*futs)
        assert w.conn is not None
        w.conn.send_message(Restored(lost))
        rt.dead.pop(w.addr, None)
        if w.ready.done():  # failed by a stop that this restart undoes
            w.ready = rt.loop.create_future()
        w.ready.set_result(None)
        return handle.pid, handle.host

    async def wait_ready(self, grank: int) -> None:
        """Wait until the process at ``grank`` serves calls again (after a
        restart); raises SupervisionError if it will not."""
        await asyncio.shield(self._worker(grank).ready)

    # ----------------------------------------------------------------- stop

    def kill(self) -> None:
        for w in self.workers:
            w.handle.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        try:
            try:
                await self.ready
            except Exception:
                pass
            await _shutdown(self.workers, self.shutdown)
        except BaseException:
            self.kill()
            raise
        finally:
            for w in self.workers:
                self.rt.on_lost.pop(w.addr, None)
                self.rt.on_fault_from.pop(w.addr, None)
                self.rt.on_pong.pop(w.addr, None)
                self.rt.dead[w.addr] = self._stopped_error(w)
                self._no_restart(w, SupervisionError(
                    f"proc mesh {self.name!r} was stopped", actor=self.name, rank=w.rank,
                    cause="proc mesh stopped"))

    def _stopped_error(self, w: _Worker) -> Callable[[Pending], SupervisionError]:
        sup = self.supervisor
        why = (f"its supervisor gave up ({sup.failure.cause})"
               if sup is not None and sup.failure is not None else "it was stopped")
        cause = "supervisor gave up" if sup is not None and sup.failure is not None \
            else "proc mesh stopped"

        def error(p: Pending) -> SupervisionError:
            return SupervisionError(
                f"{p.mesh} {p.point!r}: proc mesh {self.name!r} is down: {why}; spawn a new one",
                actor=p.mesh, rank=p.rank, host=w.handle.host, pid=w.handle.pid,
                cause=cause)
        return error


async def _shutdown(workers: Sequence[_Worker], policy: ShutdownPolicy) -> None:
    """Stop processes: ``brutal_kill`` at once, else a graceful request and
    ``policy`` seconds of grace before SIGKILL."""
    if policy == "brutal_kill":
        for w in workers:
            w.handle.send_signal(signal.SIGKILL)
    else:
        for w in workers:
            if w.conn is not None and not w.conn.closed:
                w.conn.send_message(Shutdown())
    waits = [asyncio.ensure_future(w.handle.wait()) for w in workers]
    if not waits:
        return
    _, pending = await asyncio.wait(waits, timeout=None if policy == "brutal_kill" else policy)
    if pending:
        for w in workers:
            w.handle.send_signal(signal.SIGKILL)
        await asyncio.wait(pending)


def _log_fault(worker: _Worker, info: ErrorInfo) -> None:
    print(f"meshio: unhandled failure in {info.actor} rank {info.rank} "
          f"(pid {worker.handle.pid}): {info.type_name}: {info.message}\n{info.traceback}",
          file=sys.stderr, flush=True)


class ProcMesh(MeshShape):
    """Worker processes, one per point, each running a uvloop event loop.

    Start one with ``this_host().spawn_procs(per_host={"gpus": 4})`` and
    either ``await`` it (then ``await procs.stop()``) or use it as
    ``async with ... as procs`` (stopped on exit, error or cancellation).
    """

    def __init__(self, state: _ProcState, region: Region) -> None:
        self._state = state
        self._region = region

    def _with_region(self, region: Region) -> ProcMesh:
        return ProcMesh(self._state, region)

    def __repr__(self) -> str:
        return f"<ProcMesh {self._state.name!r} {self.sizes}>"

    def __await__(self) -> Generator[Any, None, ProcMesh]:
        return self._wait_ready().__await__()

    async def _wait_ready(self) -> ProcMesh:
        await asyncio.shield(self._state.ready)
        return self

    async def __aenter__(self) -> ProcMesh:
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
            raise root.failure

    @property
    def pids(self) -> list[int]:
        """Pid of each process of this view, in point order (after start)."""
        workers = {w.rank: w for w in self._state.workers}
        return [workers[r].handle.pid for r in self._region.ranks]

    async def spawn(self, name: str, cls: Callable[P, A], /, *args: P.args,
                    **kwargs: P.kwargs) -> A:
        """Spawn one actor of class ``cls`` in every process of this mesh.

        Constructor arguments are checked against ``cls.__init__`` (statically
        by type checkers, at run time by the receiving workers).  Returns the
        :class:`ActorMesh`, typed as ``cls`` so endpoints type-check (the one
        deliberate ``cast`` of the library).

        With a supervisor, ``restart="permanent" | "transient" | "temporary"``
        (a keyword reserved by meshio, not passed to ``cls``) says whether
        these actors are rebuilt when their process is replaced; default
        ``"permanent"``.

        Raises:
            ActorError: a constructor raised (every failing rank listed).
            SchemaError: the arguments do not match ``cls.__init__``.
        """
        restart = kwargs.pop("restart", "permanent")
        if restart not in ("permanent", "transient", "temporary"):
            raise ValueError(f"spawn: restart must be 'permanent', 'transient' or 'temporary', "
                             f"got {restart!r}")
        state = self._state
        if not _is_actor_class(cls):
            raise TypeError(f"spawn: {cls!r} is not a subclass of meshio.Actor")
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"spawn: actor mesh name must be a non-empty str without '/', "
                             f"got {name!r}")
        await self
        if state.stopped:
            raise MeshioError(f"spawn {name!r}: proc mesh {state.name!r} was stopped")
        if name in state.actor_names:
            raise ValueError(f"spawn: proc mesh {state.name!r} already has actors named {name!r}")
        schema = cls._meshio_ctor
        packer = Packer()
        body = schema.pack_args(schema.bind(args, kwargs), packer)
        state.actor_names.add(name)
        target = f"{state.id}/{name}"
        addrs = [""] * state.region.extent.nelem
        for w in state.workers:
            addrs[w.rank] = w.addr
        mesh: ActorMesh[A] = ActorMesh(target, name, cls, self._region, addrs, self)
        cls_blob, mesh_blob = dumps(cls, []), dumps(mesh, [])
        rt = state.rt
        labels, sizes = list(self.extent.labels), list(self.extent.sizes)
        futs = []
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
                                         mesh_blob, msgspec.Raw(body)), packer.out)
        state.actors.append(_ActorRecord(name, target, cls_blob, mesh_blob, body, packer.out,
                                         labels, sizes, self._region.ranks,
                                         restart))
        await asyncio.wait(futs)
        failures = [(p, f.exception()) for p, f in zip(self, futs) if f.exception() is not None]
        if failures:
            await mesh.stop()
            state.actors = [a for a in state.actors if a.target != target]
            state.actor_names.discard(name)  # stopped everywhere: the name is free again
            raise combine_failures(f"{cls.__qualname__}.__init__", mesh,
                                   cast(list[tuple[Any, BaseException]], failures))
        return cast(A, mesh)

    async def stop(self) -> None:
        """Stop every process of the whole mesh (gracefully, then SIGKILL after
        a grace period).  Idempotent."""
        await self._state.stop()


def _is_actor_class(cls: Callable[..., A]) -> TypeGuard[type[A]]:
    """``cls`` is a subclass of :class:`Actor` (for mypy: ``type[A]``, not a mere callable)."""
    return isinstance(cls, type) and issubclass(cls, Actor)


class HostMesh(MeshShape):
    """Hosts that can run worker processes.  ``this_host()`` is the
    controller's own host (a mesh with no dims and a single point)."""

    def __init__(self, launchers: Sequence[ProcLauncher], region: Region) -> None:
        self._launchers = tuple(launchers)
        self._region = region

    def _with_region(self, region: Region) -> HostMesh:
        return HostMesh(self._launchers, region)

    def spawn_procs(self, per_host: Mapping[str, int] | None = None, *,
                    name: str = "procs", supervisor: Supervisor | None = None,
                    restart: RestartType | None = None,
                    shutdown: ShutdownPolicy = STOP_GRACE) -> ProcMesh:
        """Start worker processes: ``per_host`` gives the dims added on every
        host (``{"gpus": 4}``: 4 processes per host, one GPU each when the
        dim is called ``gpus``).  Await the result or use it with ``async with``.

        Args:
            supervisor: the :class:`~meshio.Supervisor` owning these processes
                (declared as its next child); without one, failures are
                reported and nothing restarts.
            restart: restart type of the processes (default: the most
                permanent of their actor meshes' types).
            shutdown: ``"brutal_kill"`` or seconds of grace after a graceful
                shutdown request before SIGKILL (stop and strategy restarts).
        """
        if restart not in (None, "permanent", "transient", "temporary"):
            raise ValueError(f"spawn_procs: restart must be 'permanent', 'transient' or "
                             f"'temporary', got {restart!r}")
        if shutdown != "brutal_kill" and not (
                isinstance(shutdown, (int, float)) and shutdown >= 0):
            raise ValueError(f"spawn_procs: shutdown must be 'brutal_kill' or seconds >= 0, "
                             f"got {shutdown!r}")
        per_host = dict(per_host or {"procs": 1})
        for k, v in per_host.items():
            if not isinstance(k, str) or not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"spawn_procs: per_host must map dim names to ints >= 1, "
                                 f"got {k!r}: {v!r}")
        clash = set(per_host) & set(self.extent.labels)
        if clash:
            raise ValueError(f"spawn_procs: per_host dims {sorted(clash)} clash with host dims")
        launchers = [self._launchers[r] for r in self._region.ranks]
        n = 1
        for v in per_host.values():
            n *= v
        region = Region.full([*self.extent.labels, *per_host],
                             [*self.extent.sizes, *per_host.values()])
        state = _ProcState(name, launchers, region, n, supervisor, restart, shutdown)
        return ProcMesh(state, region)


def this_host() -> HostMesh:
    """The host the controller runs on."""
    return HostMesh([LocalLauncher()], Region.full((), ()))
