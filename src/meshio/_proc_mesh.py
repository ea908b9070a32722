"""``HostMesh`` and ``ProcMesh``: hosts, and the worker processes on them."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import Callable, Coroutine, Generator, Mapping, Sequence
from typing import Any, ParamSpec, TypeGuard, TypeVar, cast, get_args

import msgspec

from ._actor import Actor, Context, ProcInfo, _context, _own
from ._actor_mesh import ActorMesh
from ._cell import ActorCell, cell_of
from ._exceptions import ActorError, ProcessStartError, SchemaError, SupervisionError
from ._extent import Extent, MeshShape, Point, Region
from ._launcher import LocalLauncher, ProcHandle, ProcLauncher, WorkerSpec, describe_exit
from ._transport._messages import ErrorInfo, PeerDown, PeerUp, Ping, Restored, Shutdown, SpawnActor
from ._transport._runtime import (
    Connection,
    Pending,
    Runtime,
    ignore_result,
    not_responding,
    runtime,
)
from ._transport._serial import Packer, dumps
from .endpoints._endpoint import combine_failures, endpoint, rank_ranges
from .supervision._supervisor import Clock, MonotonicClock, RestartType, ShutdownPolicy, Supervisor

__all__ = ("HostMesh", "ProcMesh", "this_host")

A = TypeVar("A", bound=Actor)
P = ParamSpec("P")

#: seconds a worker gets to say hello before spawn_procs fails
START_TIMEOUT = 60.0
#: default seconds a worker gets to exit after a shutdown request before it is killed
STOP_GRACE = 5.0
#: seconds to wait for an exit status after a worker's connection drops
EXIT_STATUS_WAIT = 1.0
#: heartbeats of a proc mesh without a supervisor (``spawn_procs(heartbeat_interval=...,
#: heartbeat_timeout=...)``; a supervisor's own settings apply to its meshes)
HEARTBEAT_INTERVAL = 1.0
HEARTBEAT_TIMEOUT = 3.0
#: the values of ``RestartType``, for run-time checks
_RESTART_TYPES: tuple[RestartType, ...] = get_args(RestartType)


class _Worker:
    """One process slot of a proc mesh; survives restarts (same rank, same
    address), ``handle``/``conn`` are the current incarnation's."""

    __slots__ = ("addr", "cause", "conn", "constructing", "handle", "hung", "incarnation",
                 "moved", "rank", "ready", "spec", "stopping", "unanswered")

    def __init__(self, rank: int, addr: str, handle: ProcHandle, spec: WorkerSpec,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.rank: int = rank
        self.addr: str = addr
        self.handle: ProcHandle = handle
        self.spec: WorkerSpec = spec
        self.conn: Connection | None = None
        self.incarnation: int = 0
        #: why this incarnation is being taken down (overrides the exit status)
        self.cause: str | None = None
        #: taken down on purpose (stop or a strategy restart), not a failure
        self.stopping: bool = False
        #: resolved when the current incarnation serves calls (retryable calls wait on it)
        self.ready: asyncio.Future[None] = loop.create_future()
        #: clock time of the oldest heartbeat not answered yet (None: all answered)
        self.unanswered: float | None = None
        #: (bytes received from it, bytes waiting to be sent to it) at the last heartbeat
        self.moved: tuple[int, int] = (0, 0)
        #: without a supervisor, while it does not answer heartbeats: its callers' error
        self.hung: Callable[[Pending], SupervisionError] | None = None
        #: constructors in flight: they run on its loop, so heartbeats wait meanwhile
        self.constructing: int = 0

    def construct(self, fut: asyncio.Future[Any]) -> None:
        """A constructor runs until ``fut`` is done: heartbeats do not judge
        the process meanwhile (loading a model in ``__init__`` is not a hang)."""
        self.constructing += 1

        def done(_: asyncio.Future[Any]) -> None:
            self.constructing -= 1

        fut.add_done_callback(done)


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
                 shutdown: ShutdownPolicy = STOP_GRACE,
                 heartbeat: tuple[float, float] = (HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT)
                 ) -> None:
        self.id: str = f"{name}-{uuid.uuid4().hex[:8]}"
        self.name: str = name
        self.launchers: Sequence[ProcLauncher] = launchers
        self.region: Region = region
        self.per_host: int = per_host
        self.supervisor: Supervisor | None = supervisor
        self.restart: RestartType | None = restart
        self.shutdown: ShutdownPolicy = shutdown
        self.workers: list[_Worker] = []
        self.actors: list[_ActorRecord] = []
        self.actor_names: set[str] = set()
        self.stopped: bool = False
        #: stopped by its owner for good: nothing of it is left in the runtime
        self.released: bool = False
        self.rt: Runtime = runtime()
        self.clock: Clock = MonotonicClock() if supervisor is None else supervisor.clock
        self.heartbeat_interval: float
        self.heartbeat_timeout: float
        self.heartbeat_interval, self.heartbeat_timeout = (
            heartbeat if supervisor is None
            else (supervisor.heartbeat_interval, supervisor.heartbeat_timeout))
        self._beating: asyncio.Task[None] | None = None
        #: rank → why that process failed with nothing to restart it (wait_failed)
        self.failures: dict[int, SupervisionError] = {}
        #: ranks lost whose calls are not failed yet, and the failures waiting
        #: for them to be printed in one line (processes that died together)
        self._failing: set[int] = set()
        self._unreported: list[SupervisionError] = []
        self._failed: asyncio.Future[None] = self.rt.loop.create_future()
        if supervisor is not None:
            supervisor.children.append(self)
        #: the context of the actor that started this mesh (None: the
        #: controller's code); the actor's stop stops it
        self.owner: Context[Any] | None = _context.get(None)
        if self.owner is not None:
            self.owner._owned.append(self)
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
        return WorkerSpec(worker_id, f"{self.rt.namespace}/{worker_id}", self.rt.addr, env,
                          label=f"[{self.name} {coords}]".replace(" ]", "]"),
                          secret=self.rt.secret)

    async def _launch(self, grank: int, spec: WorkerSpec) -> tuple[ProcHandle,
                                                                   asyncio.Future[Connection]]:
        waiter: asyncio.Future[Connection] = self.rt.loop.create_future()
        self.rt.hello_waiters[spec.worker] = waiter
        launcher = self.launchers[grank // self.per_host]
        return await launcher.launch(spec), waiter

    async def _start(self) -> None:
        waits: list[Coroutine[Any, Any, None]] = []
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
        self._beating = self.rt.loop.create_task(self._heartbeats())

    def reopen(self) -> None:
        """Undo :meth:`stop` before a parent supervisor restarts this mesh's
        supervisor (its processes are then restarted one by one)."""
        if self.stopped and not self.released and self.supervisor is not None:
            self.stopped = False
            if self._beating is not None:
                self._beating.cancel()
            self._beating = self.rt.loop.create_task(self._heartbeats())

    async def _hello(self, worker: _Worker, waiter: asyncio.Future[Connection]) -> None:
        exited = asyncio.ensure_future(worker.handle.wait())
        racers: list[asyncio.Future[Any]] = [waiter, exited]
        done, _ = await asyncio.wait(racers, timeout=START_TIMEOUT,
                                     return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            exited.cancel()
            why = (describe_exit(exited.result()) if exited in done
                   else f"no hello within {START_TIMEOUT}s")
            raise ProcessStartError(
                f"proc mesh {self.name!r}: worker rank {worker.rank} (pid {worker.handle.pid} on "
                f"{worker.handle.host}) failed to start: {why}; its stderr above says why",
                actor=self.name, rank=worker.rank, host=worker.handle.host,
                pid=worker.handle.pid, cause=why)
        exited.cancel()
        worker.conn = waiter.result()
        worker.unanswered = None
        self.rt.on_lost[worker.addr] = lambda conn: self._lost(worker, conn)
        self.rt.on_fault_from[worker.addr] = lambda info: self._fault(worker, info)
        self.rt.on_pong[worker.addr] = lambda: self._pong(worker)
        for down in self.rt.down.values():  # a new worker learns who is not responding
            worker.conn.send_message(down())

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
                f"{handle.pid} on {handle.host} is down ({cause}); {p.endpoint} was not sent",
                actor=p.mesh, rank=p.rank, host=handle.host, pid=handle.pid, cause=cause)

        self._responds(worker)  # gone rather than hung: workers see the lost connection
        self._failing.add(worker.rank)
        if not self.stopped:
            self.rt.dead[worker.addr] = error
            if worker.ready.done():  # retryable calls wait for the restart, not spin
                worker.ready = self.rt.loop.create_future()
        self.rt.loop.create_task(self._fail_calls(worker, conn, handle))

    async def _fail_calls(self, worker: _Worker, conn: Connection, handle: ProcHandle) -> None:
        try:
            await self._fail_calls_of(worker, conn, handle)
        finally:
            self._failing.discard(worker.rank)
            if not self._failing and self._unreported:
                self._print_failures()

    async def _fail_calls_of(self, worker: _Worker, conn: Connection,
                             handle: ProcHandle) -> None:
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
        note = "; its supervisor is restarting it" if restarting else ""

        def error(p: Pending) -> SupervisionError:  # a call in flight when it died
            return SupervisionError(
                f"{p.mesh} {p.point!r} on proc mesh {self.name!r} rank {worker.rank}: process "
                f"{handle.pid} on {handle.host} {cause} while {p.endpoint} was in "
                f"flight{note}", actor=p.mesh, rank=p.rank, host=handle.host,
                pid=handle.pid, cause=cause)

        if restarting:
            what_now = ("its supervisor is restarting it: call again once it is back "
                        "(a retryable endpoint waits for it)")
        elif self.supervisor is None:
            what_now = "nothing restarts it (no supervisor)"
        elif (kind := self.restart_type) == "temporary" or (kind == "transient"
                                                             and handle.returncode == 0):
            what_now = f"it is not restarted (restart={kind!r})"
        else:
            what_now = f"its supervisor {self.supervisor.name!r} gave up on it"

        def error_after(p: Pending) -> SupervisionError:  # a call made after it died
            return SupervisionError(
                f"{p.mesh} {p.point!r} on proc mesh {self.name!r} rank {worker.rank}: process "
                f"{handle.pid} on {handle.host} is down ({cause}); {p.endpoint} was not sent: "
                f"{what_now}", actor=p.mesh, rank=p.rank, host=handle.host,
                pid=handle.pid, cause=cause)

        if stale:
            conn.fail_all(error)
            return
        self.rt.dead[worker.addr] = error_after
        conn.fail_all(error)
        if worker.ready.done():
            worker.ready = self.rt.loop.create_future()
        if not restarting:
            failure = SupervisionError(
                f"proc mesh {self.name!r} rank {worker.rank}: process {handle.pid} on "
                f"{handle.host} {cause}", actor=self.name, rank=worker.rank, host=handle.host,
                pid=handle.pid, cause=cause)
            self._no_restart(worker, failure)
            if not self.stopped:
                self._report_failure(worker, failure)

    def _report_failure(self, worker: _Worker, failure: SupervisionError) -> None:
        """A process failed and nothing restarts it: a line on stderr (when
        no supervisor reports it; processes lost together share one line per
        cause) and :meth:`ProcMesh.wait_failed` returns."""
        if self.supervisor is None:
            self._unreported.append(failure)
        self.failures.setdefault(worker.rank, failure)
        self._wake()

    def _print_failures(self) -> None:
        failures, self._unreported = self._unreported, []
        by_cause: dict[str, list[SupervisionError]] = {}
        for f in failures:
            by_cause.setdefault(f.cause, []).append(f)
        for cause, group in by_cause.items():
            if len(group) == 1:
                line = f"{group[0]}; no supervisor restarts it"
            else:
                group.sort(key=lambda f: f.rank)
                hosts = sorted({f.host for f in group})
                line = (f"proc mesh {self.name!r} ranks {rank_ranges([f.rank for f in group])}"
                        f": processes {', '.join(str(f.pid) for f in group)} on "
                        f"{', '.join(hosts)} {cause}; no supervisor restarts them")
            print(f"meshio: {line}", file=sys.stderr, flush=True)

    def _wake(self) -> None:
        """Wake every :meth:`ProcMesh.wait_failed` to look again."""
        if not self._failed.done():
            self._failed.set_result(None)
        self._failed = self.rt.loop.create_future()

    def _no_restart(self, worker: _Worker, error: SupervisionError) -> None:
        if not worker.ready.done():
            worker.ready.set_exception(error)
            worker.ready.exception()  # nobody may be waiting: don't warn

    def _fault(self, worker: _Worker, info: ErrorInfo) -> None:
        """An actor failed with nobody to tell (a broadcast, a hook) or was
        ended by ``SystemExit``/``KeyboardInterrupt``."""
        sup = self.supervisor
        restarts = sup is not None and not worker.stopping
        if sup is None:
            what_now = "nothing restarts it (no supervisor)"
        elif self.stopped:
            what_now = "its proc mesh is being stopped"
        elif worker.stopping:
            what_now = f"supervisor {sup.name!r} is already replacing the process"
        else:
            what_now = (f"the process is killed; supervisor {sup.name!r} restarts it unless "
                        f"max_restarts is exceeded")
        print(f"meshio: failure in {info.actor} rank {info.rank} (pid {worker.handle.pid}; "
              f"{what_now}): {info.type_name}: {info.message}\n{info.traceback}",
              file=sys.stderr, flush=True)
        if restarts:
            worker.cause = (f"{info.type_name}: {info.message} in {info.actor} rank "
                            f"{info.rank}\n{info.traceback}")
            worker.handle.send_signal(signal.SIGKILL)  # replaced with a fresh process

    async def _heartbeats(self) -> None:
        """Ping every live process each interval; one that leaves a ping
        unanswered for heartbeat_timeout is hung (with or without a supervisor)."""
        clock, interval = self.clock, self.heartbeat_interval
        last = clock.now()
        while not self.stopped:
            await clock.sleep(interval)
            now = clock.now()
            # Our own loop was blocked: pongs may be unread; judge nobody this round.
            stalled = now - last > interval + self.heartbeat_timeout
            last = now
            for w in self.workers:
                conn = w.conn
                if (conn is None or conn.closed or w.stopping or w.cause is not None
                        or not w.ready.done()):  # (cause: already being killed)
                    continue
                moved = _moved(w, conn)
                if stalled or moved or w.unanswered is None or w.constructing:
                    w.unanswered = now
                elif now - w.unanswered > self.heartbeat_timeout:
                    self._hung(w, conn, now, now - w.unanswered)
                    if w.cause is not None:
                        continue
                conn.send_message(Ping(w.incarnation))

    def _hung(self, w: _Worker, conn: Connection, now: float, silent: float) -> None:
        """``w`` has not answered heartbeats for ``silent`` seconds: a
        supervisor kills and restarts it; without one its callers fail (the
        process is left alone and serves calls again once it answers)."""
        timeout = self.heartbeat_timeout
        if self.supervisor is not None:
            w.cause = (f"hung: no heartbeat answer for {silent:.1f}s "
                       f"(heartbeat_timeout={timeout}s); killed")
            w.handle.send_signal(signal.SIGKILL)
            return
        if w.hung is not None:
            return
        handle, clock, since = w.handle, self.clock, now - silent
        down = PeerDown(w.addr, self.name, w.rank, handle.pid, handle.host, silent, timeout)
        w.hung = not_responding(down, clock.now, in_flight=False)
        print(f"meshio: proc mesh {self.name!r} rank {w.rank} (pid {handle.pid} on "
              f"{handle.host}) not responding for {silent:.1f} s; its calls fail until it "
              f"answers again", file=sys.stderr, flush=True)
        self.rt.dead[w.addr] = w.hung
        self.rt.down[w.addr] = lambda: msgspec.structs.replace(down, silent=clock.now() - since)
        conn.fail_all(not_responding(down, clock.now, in_flight=True))
        self._tell(down)

    def _pong(self, w: _Worker) -> None:
        w.unanswered = None
        if w.hung is not None:  # it answers again: calls go through
            self._responds(w)
            print(f"meshio: proc mesh {self.name!r} rank {w.rank} (pid {w.handle.pid}) "
                  f"responds again", file=sys.stderr, flush=True)

    def _responds(self, w: _Worker) -> None:
        """``w`` is no longer "not responding" (it answers, is gone, or is
        stopped): lift its callers' error here and in every worker."""
        if w.hung is None:
            return
        if self.rt.dead.get(w.addr) is w.hung:
            del self.rt.dead[w.addr]
        w.hung = None
        del self.rt.down[w.addr]
        self._tell(PeerUp(w.addr))

    def _tell(self, msg: PeerDown | PeerUp) -> None:
        """Tell every process connected to this runtime (the workers of all
        its proc meshes) but ``msg.addr`` itself, so that their actors'
        calls to it fail, or go through again, as the controller's do."""
        for conn in list(self.rt.all_conns):
            if not conn.closed and conn.peer != msg.addr:
                conn.send_message(msg)

    # ------------------------------------------------- restarts (supervisor)

    def worker(self, grank: int) -> _Worker:
        return next(w for w in self.workers if w.rank == grank)

    async def stop_rank(self, grank: int) -> None:
        """Take one process down on purpose, by the shutdown policy."""
        w = self.worker(grank)
        w.stopping = True
        if w.ready.done():  # retryable calls wait for restart_rank
            w.ready = self.rt.loop.create_future()
        await _shutdown([w], self.shutdown)

    async def restart_rank(self, grank: int) -> tuple[int, str]:
        """Replace one process: same rank and address, actors rebuilt with
        their constructor arguments at the same coordinates."""
        w = self.worker(grank)
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
                                           a.mesh_blob, msgspec.Raw(a.body), True, grank),
                                a.out)
            w.construct(fut)
            futs.append(fut)
        if futs:
            await asyncio.gather(*futs)
        assert w.conn is not None
        w.conn.send_message(Restored(lost))
        rt.dead.pop(w.addr, None)
        self.failures.pop(grank, None)  # restarted after all (by a parent supervisor)
        if w.ready.done():  # failed by a stop that this restart undoes
            w.ready = rt.loop.create_future()
        w.ready.set_result(None)
        return handle.pid, handle.host

    async def wait_ready(self, grank: int) -> None:
        """Wait until the process at ``grank`` serves calls again (after a
        restart); raises SupervisionError if it will not."""
        await asyncio.shield(self.worker(grank).ready)

    # ----------------------------------------------------------------- stop

    def kill(self) -> None:
        for w in self.workers:
            w.handle.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if self._beating is not None:
            self._beating.cancel()
        self._wake()  # wait_failed: stopped, not failed
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
                self._responds(w)
                self.rt.dead[w.addr] = self._stopped_error(w)
                self._no_restart(w, SupervisionError(
                    f"proc mesh {self.name!r} was stopped", actor=self.name, rank=w.rank,
                    cause="proc mesh stopped"))

    def service(self) -> ActorMesh[_ProcService]:
        """The controller-side actor that references to this mesh held in
        other processes spawn through (this mesh is registered with it)."""
        service = _ProcService.of(self.rt)
        if not self.released:
            service.meshes[self.id] = self
        return service.mesh

    def release(self) -> None:
        """Forget this mesh (its owner stopped it for good): nothing of it
        stays in the runtime's tables or its supervisor; calls through old
        references fail with :meth:`stopped_error` (``ActorMesh`` asks its
        proc mesh), or as unreachable where a reference has no proc mesh."""
        if self.released:
            return
        self.released = True
        rt = self.rt
        for grank in self.region.ranks:
            rt.hello_waiters.pop(f"{self.id}-{grank}", None)
        for w in self.workers:
            for table in (rt.dead, rt.on_lost, rt.on_fault_from, rt.on_pong):
                table.pop(w.addr, None)
            for conn in (rt.conns.pop(w.addr, None), w.conn):
                if conn is not None:
                    conn.abort()
            w.conn = None
        sup = self.supervisor
        if sup is not None and self in sup.children:
            sup.children.remove(self)
        cell = cell_of(rt, _ProcService.TARGET)
        if cell is not None:
            cast(_ProcService, cell.instance).meshes.pop(self.id, None)
        if self.owner is not None:  # nothing left for its owner to stop: this, its actors
            self.owner._owned[:] = [
                t for t in self.owner._owned if t is not self and not (
                    isinstance(t, ActorMesh) and t._procs is not None and t._procs._state is self)]
        self.actors.clear()  # constructor arguments: nothing will rebuild them now

    def stopped_error(self, p: Pending) -> SupervisionError:
        """The error of a call to an actor of this mesh once it is stopped."""
        return self._stopped_error(None)(p)

    def _stopped_error(self, w: _Worker | None) -> Callable[[Pending], SupervisionError]:
        sup = self.supervisor
        why = (f" after its supervisor gave up ({sup.failure.cause})"
               if sup is not None and sup.failure is not None else "")
        cause = "supervisor gave up" if sup is not None and sup.failure is not None \
            else "proc mesh stopped"

        def error(p: Pending) -> SupervisionError:
            return SupervisionError(
                f"{p.mesh} {p.point!r}: proc mesh {self.name!r} was stopped{why}; spawn a new "
                f"one", actor=p.mesh, rank=p.rank, host="" if w is None else w.handle.host,
                pid=-1 if w is None else w.handle.pid, cause=cause)
        return error


def _moved(w: _Worker, conn: Connection) -> bool:
    """Data moved between us and ``w`` since the last heartbeat (a large
    message): it is alive, though its pong may be queued behind that data."""
    transport = conn.transport
    mark = (conn._rx, transport.get_write_buffer_size() if transport is not None else 0)
    moved = mark[0] != w.moved[0] or mark[1] < w.moved[1]
    w.moved = mark
    return moved


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


class ProcMesh(MeshShape):
    """Worker processes, one per point, each running a uvloop event loop.

    Start one with ``this_host().spawn_procs(per_host={"gpus": 4})`` and
    either ``await`` it (then ``await procs.stop()``) or use it as
    ``async with ... as procs`` (stopped on exit, error or cancellation).
    """

    def __init__(self, state: _ProcState, region: Region,
                 restart: RestartType = "permanent") -> None:
        self._state = state
        self._region = region
        self._restart: RestartType = restart

    def _with_region(self, region: Region) -> ProcMesh:
        return ProcMesh(self._state, region, self._restart)

    def _with_restart(self, restart: RestartType) -> ProcMesh:
        return ProcMesh(self._state, self._region, restart)

    def options(self, *, restart: RestartType = "permanent") -> ProcMesh:
        """The same proc mesh (or slice) with options for the actors spawned on it.

        ``procs.options(restart="transient").spawn("w", Worker, ...)``: the
        options are meshio's, kept apart from the constructor arguments of
        ``Worker`` (which ``spawn`` passes on untouched and type-checks).

        Args:
            restart: whether a supervisor rebuilds these actors when it
                replaces their process: ``"permanent"`` (always, the
                default), ``"transient"`` (unless the process exited
                normally) or ``"temporary"`` (never).

        Raises:
            ValueError: ``restart`` is not one of the three restart types.
        """
        if restart not in _RESTART_TYPES:
            raise ValueError(f"options(restart=...) must be 'permanent', 'transient' or "
                             f"'temporary', got {restart!r}")
        return self._with_restart(restart)

    def __repr__(self) -> str:
        return f"<ProcMesh {self._state.name!r} {self.sizes}>"

    def __reduce__(self) -> tuple[Any, ...]:
        # A value like an actor mesh: elsewhere, a reference whose spawns go
        # through the controller owning the processes (which records them).
        e = self._region.extent
        return (_ProcMeshRef, (self._state.service(), self._state.id, self._state.name,
                               e.labels, e.sizes, self._region.ranks, self._restart))

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
            failure = await root.wait_failed()  # once its hooks have run
            if not root._handled:  # else on_escalate or __supervise__ handled it
                raise failure

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

        Every argument after ``cls`` goes to ``cls.__init__``; meshio's own
        options come before: ``procs.options(restart="transient").spawn(...)``
        (see :meth:`options`; default ``"permanent"``).

        Spawned inside an actor, the actor owns the new mesh: stopping the
        actor stops these actors first (see ``__cleanup__`` on :class:`Actor`).

        Raises:
            ActorError: a constructor raised (every failing rank listed).
            SchemaError: the arguments do not match ``cls.__init__``.
        """
        mesh = await self._spawn(name, cls, *args, **kwargs)
        _own(mesh)
        return mesh

    async def _spawn(self, name: str, cls: Callable[P, A], /, *args: P.args,
                     **kwargs: P.kwargs) -> A:
        """:meth:`spawn`, owned by nobody (the proc mesh service spawns for others)."""
        state = self._state
        if not _is_actor_class(cls):
            raise TypeError(f"spawn: {cls!r} is not a subclass of meshio.Actor")
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"spawn: actor mesh name must be a non-empty str without '/', "
                             f"got {name!r}")
        await self
        if state.stopped:
            raise SupervisionError(f"spawn {name!r}: proc mesh {state.name!r} was stopped; "
                                   f"spawn a new one", actor=state.name,
                                   cause="proc mesh stopped")
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
        cls_blob, mesh_blob = dumps(cls, None), dumps(mesh, None)
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
                                         mesh_blob, msgspec.Raw(body), proc_rank=grank),
                              packer.out)
            state.worker(grank).construct(fut)
        state.actors.append(_ActorRecord(name, target, cls_blob, mesh_blob, body, packer.out,
                                         labels, sizes, self._region.ranks,
                                         self._restart))
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
        a grace period), and forget it: calls to its actors then fail with
        :class:`SupervisionError` ("proc mesh ... was stopped").  Idempotent.

        Raises:
            ValueError: this is a slice of the mesh (stop the whole mesh, as
                returned by ``spawn_procs``).
        """
        _check_whole(self._region, self._state.region, self._state.name)
        await self._state.stop()
        self._state.release()

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
        await self
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
        self.meshes: dict[str, _ProcState] = {}

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
        return ProcMesh(state, Region(Extent(labels, sizes), ranks))

    @endpoint(concurrent=True)
    async def spawn_on(self, where: tuple[str, str, list[str], list[int], list[int]],
                       restart: RestartType, name: str, cls: Any, args: Any,
                       kwargs: Any) -> Any:
        view = self._view(*where)._with_restart(restart)
        mesh: Any = await view._spawn(name, cls, *args, **kwargs)
        return mesh

    @endpoint(concurrent=True)
    async def stop_mesh(self, where: tuple[str, str, list[str], list[int], list[int]]) -> None:
        await self._view(*where).stop()


class _ProcMeshRef(ProcMesh):
    """A proc mesh received in another process: spawns (and stop) go to the
    controller that owns the processes."""

    def __init__(self, service: ActorMesh[_ProcService], mesh_id: str, name: str,
                 labels: Sequence[str], sizes: Sequence[int], ranks: Sequence[int],
                 restart: RestartType = "permanent") -> None:
        self._service = service
        self._id = mesh_id
        self._name = name
        self._region = Region(Extent(labels, sizes), ranks)
        self._restart = restart

    def _with_region(self, region: Region) -> _ProcMeshRef:
        e = region.extent
        return _ProcMeshRef(self._service, self._id, self._name, e.labels, e.sizes,
                            region.ranks, self._restart)

    def _with_restart(self, restart: RestartType) -> _ProcMeshRef:
        e = self._region.extent
        return _ProcMeshRef(self._service, self._id, self._name, e.labels, e.sizes,
                            self._region.ranks, restart)

    def __repr__(self) -> str:
        return f"<ProcMesh {self._name!r} {self.sizes} (reference)>"

    def __reduce__(self) -> tuple[Any, ...]:
        e = self._region.extent
        return (_ProcMeshRef, (self._service, self._id, self._name, e.labels, e.sizes,
                               self._region.ranks, self._restart))

    def _where(self) -> tuple[str, str, list[str], list[int], list[int]]:
        e = self._region.extent
        return self._id, self._name, list(e.labels), list(e.sizes), list(self._region.ranks)

    async def _wait_ready(self) -> ProcMesh:
        return self  # started before it could be passed on

    @property
    def pids(self) -> list[int]:
        raise RuntimeError(f"proc mesh {self._name!r}: pids are known only to the "
                           "controller that started the processes")

    async def spawn(self, name: str, cls: Callable[P, A], /, *args: P.args,
                    **kwargs: P.kwargs) -> A:
        """Spawn through the controller owning the processes (see
        :meth:`ProcMesh.spawn`)."""
        if not _is_actor_class(cls):
            raise TypeError(f"spawn: {cls!r} is not a subclass of meshio.Actor")
        try:
            mesh: A = await self._service.spawn_on.call_one(self._where(), self._restart,
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

    async def wait_failed(self) -> SupervisionError:
        raise RuntimeError(f"proc mesh {self._name!r}: wait_failed() is available in the "
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
                    shutdown: ShutdownPolicy = STOP_GRACE,
                    heartbeat_interval: float = HEARTBEAT_INTERVAL,
                    heartbeat_timeout: float | None = None) -> ProcMesh:
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
            heartbeat_interval: without a supervisor, seconds between
                heartbeats to each process (with one, the supervisor's apply).
            heartbeat_timeout: without a supervisor, a process that leaves a
                heartbeat unanswered this long (default 3 intervals) is not
                responding: calls to it fail with :class:`SupervisionError`
                until it answers again; it is not killed.
        """
        if restart not in (None, "permanent", "transient", "temporary"):
            raise ValueError(f"spawn_procs: restart must be 'permanent', 'transient' or "
                             f"'temporary', got {restart!r}")
        if shutdown != "brutal_kill" and not (
                isinstance(shutdown, (int, float)) and shutdown >= 0):
            raise ValueError(f"spawn_procs: shutdown must be 'brutal_kill' or seconds >= 0, "
                             f"got {shutdown!r}")
        for arg, value in (("heartbeat_interval", heartbeat_interval),
                           ("heartbeat_timeout", heartbeat_timeout)):
            if (value is not None or arg == "heartbeat_interval") and (
                    isinstance(value, bool) or not isinstance(value, (int, float))):
                raise TypeError(f"spawn_procs: {arg} must be a number of seconds, "
                                f"got {type(value).__name__} {value!r}")
        if heartbeat_timeout is None:
            heartbeat_timeout = 3 * heartbeat_interval
        if not (heartbeat_interval > 0 and heartbeat_timeout > 0):
            raise ValueError(f"spawn_procs: heartbeat_interval and heartbeat_timeout must be "
                             f"> 0, got {heartbeat_interval!r} and {heartbeat_timeout!r}")
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
        state = _ProcState(name, launchers, region, n, supervisor, restart, shutdown,
                           (heartbeat_interval, heartbeat_timeout))
        return ProcMesh(state, region)


def this_host() -> HostMesh:
    """The host the controller runs on."""
    return HostMesh([LocalLauncher()], Region.full((), ()))
