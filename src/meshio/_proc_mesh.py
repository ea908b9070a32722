"""``HostMesh`` and ``ProcMesh``: hosts, and the worker processes on them."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar, cast

from ._actor import Actor
from ._actor_mesh import ActorMesh
from ._endpoint import combine_failures
from ._exceptions import MeshioError, SupervisionError
from ._extent import MeshShape, Region
from ._launcher import LocalLauncher, ProcHandle, ProcLauncher, WorkerSpec, describe_exit
from ._messages import Shutdown, SpawnActor
from ._runtime import Connection, Pending, Runtime, runtime
from ._serial import Packer, dumps

__all__ = ("HostMesh", "ProcMesh", "this_host")

A = TypeVar("A", bound=Actor)
P = ParamSpec("P")

#: seconds a worker gets to say hello before spawn_procs fails
START_TIMEOUT = 60.0
#: seconds a worker gets to exit after Shutdown before it is killed
STOP_GRACE = 5.0
#: seconds to wait for an exit status after a worker's connection drops
EXIT_STATUS_WAIT = 1.0


class _Worker:
    __slots__ = ("addr", "conn", "handle", "rank")

    def __init__(self, rank: int, addr: str, handle: ProcHandle) -> None:
        self.rank = rank
        self.addr = addr
        self.handle = handle
        self.conn: Connection | None = None


class _ProcState:
    """Shared by a proc mesh and all its slices."""

    def __init__(self, name: str, launchers: Sequence[ProcLauncher], region: Region,
                 per_host: int) -> None:
        self.id = f"{name}-{uuid.uuid4().hex[:8]}"
        self.name = name
        self.launchers = launchers
        self.region = region
        self.per_host = per_host
        self.workers: list[_Worker] = []
        self.actor_names: set[str] = set()
        self.stopped = False
        self.rt: Runtime = runtime()
        self.ready: asyncio.Task[None] = self.rt.loop.create_task(self._start())

    async def _start(self) -> None:
        rt = self.rt
        labels = self.region.extent.labels
        waits = []
        for grank, point in zip(self.region.ranks, self.region.points()):
            worker_id = f"{self.id}-{grank}"
            addr = os.path.join(rt.sockdir, f"{worker_id}.sock")
            env = {"MESHIO_WORKER": worker_id}
            if "gpus" in labels:
                env["CUDA_VISIBLE_DEVICES"] = str(point["gpus"])
            waiter: asyncio.Future[Connection] = rt.loop.create_future()
            rt.hello_waiters[worker_id] = waiter
            launcher = self.launchers[grank // self.per_host]
            handle = await launcher.launch(WorkerSpec(worker_id, addr, rt.addr, env))
            worker = _Worker(grank, addr, handle)
            self.workers.append(worker)
            waits.append(self._hello(worker, waiter))
        try:
            await asyncio.gather(*waits)
        except BaseException:
            self.kill()
            raise

    async def _hello(self, worker: _Worker, waiter: asyncio.Future[Connection]) -> None:
        exited = asyncio.ensure_future(worker.handle.wait())
        done, _ = await asyncio.wait([waiter, exited], timeout=START_TIMEOUT,
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
        self.rt.on_lost[worker.addr] = lambda conn, w=worker: self._lost(w, conn)

    def _lost(self, worker: _Worker, conn: Connection) -> None:
        self.rt.loop.create_task(self._fail_calls(worker, conn))

    async def _fail_calls(self, worker: _Worker, conn: Connection) -> None:
        handle = worker.handle
        if not self.stopped:
            try:
                await asyncio.wait_for(handle.wait(), EXIT_STATUS_WAIT)
            except asyncio.TimeoutError:
                pass
        cause = "proc mesh stopped" if self.stopped else describe_exit(handle.returncode)

        def error(p: Pending) -> SupervisionError:
            return SupervisionError(
                f"{p.mesh} {p.point!r} on proc mesh {self.name!r} rank {worker.rank}: process "
                f"{handle.pid} on {handle.host} {cause} while {p.endpoint} was in flight",
                actor=p.mesh, rank=p.point.rank, host=handle.host, pid=handle.pid, cause=cause)

        self.rt.dead[worker.addr] = error
        conn.fail_all(error)

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
            for w in self.workers:
                if w.conn is not None and not w.conn.closed:
                    w.conn.send_message(Shutdown())
            waits = [w.handle.wait() for w in self.workers]
            if waits:
                _, pending = await asyncio.wait([asyncio.ensure_future(x) for x in waits],
                                                timeout=STOP_GRACE)
                if pending:
                    self.kill()
                    await asyncio.wait(pending)
        except BaseException:
            self.kill()
            raise
        finally:
            for w in self.workers:
                self.rt.on_lost.pop(w.addr, None)
                self.rt.dead.setdefault(w.addr, self._stopped_error(w))

    def _stopped_error(self, w: _Worker) -> Callable[[Pending], SupervisionError]:
        def error(p: Pending) -> SupervisionError:
            return SupervisionError(
                f"{p.mesh} {p.point!r}: proc mesh {self.name!r} was stopped; spawn a new one",
                actor=p.mesh, rank=p.point.rank, host=w.handle.host, pid=w.handle.pid,
                cause="proc mesh stopped")
        return error


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

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

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

        Raises:
            ActorError: a constructor raised (every failing rank listed).
            SchemaError: the arguments do not match ``cls.__init__``.
        """
        state = self._state
        if not (isinstance(cls, type) and issubclass(cls, Actor)):
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
            pending = Pending(fut, lambda raw, bufs: None, f"{cls.__qualname__}.__init__",
                              name, point)
            dead = rt.dead.get(addrs[grank])
            if dead is not None:
                fut.set_exception(dead(pending))
                continue
            conn = rt.connect(addrs[grank])
            req = conn.next_req(pending)
            conn.send_message(SpawnActor(req, target, name, cls_blob, index, labels, sizes,
                                         mesh_blob, _raw(body)), packer.out)
        await asyncio.wait(futs)
        failures = [(p, f.exception()) for p, f in zip(self, futs) if f.exception() is not None]
        if failures:
            await mesh.stop()
            raise combine_failures(f"{cls.__qualname__}.__init__", mesh,
                                   cast(list[tuple[Any, BaseException]], failures))
        return cast(A, mesh)

    async def stop(self) -> None:
        """Stop every process of the whole mesh (gracefully, then SIGKILL after
        a grace period).  Idempotent."""
        await self._state.stop()


def _raw(body: bytes) -> Any:
    import msgspec

    return msgspec.Raw(body)


class HostMesh(MeshShape):
    """Hosts that can run worker processes.  ``this_host()`` is the
    controller's own host (a mesh with no dims and a single point)."""

    def __init__(self, launchers: Sequence[ProcLauncher], region: Region) -> None:
        self._launchers = tuple(launchers)
        self._region = region

    def _with_region(self, region: Region) -> HostMesh:
        return HostMesh(self._launchers, region)

    def spawn_procs(self, per_host: Mapping[str, int] | None = None, *,
                    name: str = "procs") -> ProcMesh:
        """Start worker processes: ``per_host`` gives the dims added on every
        host (``{"gpus": 4}``: 4 processes per host, one GPU each when the
        dim is called ``gpus``).  Await the result or use it with ``async with``.
        """
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
        state = _ProcState(name, launchers, region, n)
        return ProcMesh(state, region)


def this_host() -> HostMesh:
    """The host the controller runs on."""
    return HostMesh([LocalLauncher()], Region.full((), ()))
