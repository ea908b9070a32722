"""The process-slot state machine behind a proc mesh (shared by the mesh
and all its slices): starting workers, heartbeats, failures, restarts and
their rebuilt actors, shutdown."""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import os
import select
import signal
import socket
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from ._actor_mesh import ActorMesh
from ._cell import stall_line
from ._constants import MAX_QUEUED, MSGPACK_NIL, PARTITION_TIMEOUT, STALL_AFTER
from ._context import Context, _context
from ._debug import debug_link
from ._exceptions import ProcessStartError, ProcMeshTakenError, SupervisionError
from ._extent import Extent, Point, Region
from ._inspect import Inspection
from ._keep_alive import KeptActor, KeptMesh, KeptOptions, KeptWorker, claim, publish, started_at
from ._keep_alive import forget as forget_record
from ._launcher import (
    GPU_ENV,
    LaunchRefused,
    ProcHandle,
    ProcLauncher,
    WorkerSpec,
    describe_exit,
    say,
)
from ._logs import LOGS_ENV, logs_env
from ._transport._connection import (
    Connection,
    Pending,
    blocked_loop,
    ignore_result,
    not_responding,
)
from ._transport._credentials import Credentials
from ._transport._messages import (
    ActorStopped,
    Adopt,
    ErrorInfo,
    LoopHeld,
    Moved,
    PeerDown,
    PeerUp,
    Ping,
    Reply,
    Reshaped,
    Restored,
    Shutdown,
    SpawnActor,
    Stalled,
    StopActor,
)
from ._transport._runtime import Runtime, fault_report, register_handler, runtime
from ._transport._serial import Buffers, dumps
from ._transport._sockets import tcp_endpoint
from ._transport._tasks import awaited, together, within
from .endpoints._endpoint import combine_failures, rank_ranges
from .supervision._clocks import Clock, MonotonicClock
from .supervision._supervisor import RestartType, ShutdownPolicy, Supervisor

log = logging.getLogger("meshio")

#: seconds a worker gets to say hello before spawn_procs fails (and a
#: restart's launch gets, waiting for its host agent included)
START_TIMEOUT = 60.0
#: seconds before a restart dials a host agent it could not reach again,
#: doubling up to AGENT_RETRY_MOST (for up to START_TIMEOUT in all)
AGENT_RETRY = 0.1
AGENT_RETRY_MOST = 2.0
#: causes of a dial's SupervisionError that mean its host agent is not
#: there (yet): killed and being restarted, its host rebooting or cut off
_AGENT_AWAY = ("connection refused", "connect timed out", "connect failed")
#: default seconds a worker gets to exit after a shutdown request before it is killed
STOP_GRACE = 5.0
#: seconds to wait for an exit status after a worker's connection drops
EXIT_STATUS_WAIT = 1.0
#: seconds to wait for a killed worker's exit before giving up on it (a worker
#: on a host cut off by a partition: its exit is not heard of until the heal)
KILL_WAIT = 10.0
#: seconds a proc mesh holds the faults of its actors after the first one
#: (:meth:`ProcState._fault`), so that those of a broadcast failing on many
#: ranks, coming in apart, are printed as one report
FAULT_WINDOW = 0.1
#: heartbeats of a proc mesh without a supervisor (``spawn_procs(heartbeat_interval=...,
#: heartbeat_timeout=...)``; a supervisor's own settings apply to its meshes)
HEARTBEAT_INTERVAL = 1.0
HEARTBEAT_TIMEOUT = 3.0
#: while a constructor runs in a process, or meshio's first ``import torch``
#: holds its loop (they may hold the GIL for long: loading a model), it is
#: judged after this many heartbeat timeouts (5 minutes by default), not
#: one: a process stopped or hung then fails the spawn, never waits forever
HELD_TIMEOUTS = 100


class SlotState(enum.Enum):
    """Where a process slot (:class:`_Worker`) is in its life; the moves
    between states the code may make are :data:`TRANSITIONS`."""

    #: an incarnation was launched and has not said hello (or rebuilt its actors) yet
    STARTING = "starting"
    #: its incarnation serves calls
    SERVING = "serving"
    #: (no supervisor) it left heartbeats unanswered: its calls fail until it answers
    NOT_RESPONDING = "not responding"
    #: its supervisor kills it (a fault, or hung); its loss is on the way
    KILLING = "killing"
    #: its incarnation is gone; the verdict (restart or not) is being made
    LOST = "lost"
    #: taken down on purpose (a supervisor's strategy, ``replace``); a restart follows
    STOPPING = "stopping"
    #: killed for a restart: its next incarnation is being launched
    RESTARTING = "restarting"
    #: down, and nothing restarts it by design: a hole until ``procs.replace(rank)``
    HOLE = "hole"
    #: a hole whose replacement is starting (``procs.replace``): a hole until it serves
    REFILLING = "refilling"
    #: down, and its supervisor gave up on it
    FAILED = "failed"
    #: removed by a shrink (or a grow that failed): for good
    REMOVED = "removed"
    #: its proc mesh was stopped (a parent supervisor may restart it: ``reopen``)
    STOPPED = "stopped"


_S = SlotState
_LIVE = (_S.STARTING, _S.SERVING, _S.NOT_RESPONDING, _S.KILLING)
#: every move a slot may make, (from, to); :meth:`_Worker.move` refuses any other
TRANSITIONS: frozenset[tuple[SlotState, SlotState]] = frozenset({
    (_S.STARTING, _S.SERVING),  # said hello, actors (re)built
    (_S.SERVING, _S.NOT_RESPONDING), (_S.NOT_RESPONDING, _S.SERVING),  # no supervisor
    (_S.STARTING, _S.KILLING), (_S.SERVING, _S.KILLING),  # a fault, or hung
    *((s, _S.LOST) for s in (*_LIVE, _S.REFILLING)),  # its connection dropped
    *((s, _S.STOPPING) for s in (*_LIVE, _S.LOST)),  # a strategy's stop, replace()
    # a supervisor restarts any rank it covers (a failed start, a reopened mesh too)
    *((s, _S.RESTARTING) for s in _S if s not in (_S.RESTARTING, _S.REMOVED)),
    (_S.RESTARTING, _S.STARTING),  # launched again
    (_S.HOLE, _S.REFILLING), (_S.REFILLING, _S.SERVING),  # a hole replaced
    (_S.LOST, _S.HOLE), (_S.LOST, _S.FAILED),  # the verdict: not restarted
    # replace() failed, or was cancelled (stopping the process it replaces too)
    *((s, _S.HOLE) for s in (_S.STARTING, _S.RESTARTING, _S.REFILLING, _S.STOPPING)),
    *((s, _S.REMOVED) for s in (*_LIVE, _S.LOST, _S.HOLE, _S.REFILLING)),  # shrink
    *((s, _S.STOPPED) for s in _S if s not in (_S.STOPPED, _S.REMOVED)),  # stop()
})


class _Worker:
    """One process slot of a proc mesh; survives restarts (same rank, same
    address: each incarnation listens on a name of its own, and answers to
    the slot's), ``handle``/``conn`` are the current incarnation's."""

    __slots__ = ("addr", "cause", "conn", "handle", "held", "held_what", "hung",
                 "incarnation", "moved", "rank", "ready", "spec", "state", "unanswered")

    def __init__(self, rank: int, addr: str, handle: ProcHandle, spec: WorkerSpec,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.rank: int = rank
        self.addr: str = addr
        self.handle: ProcHandle = handle
        self.spec: WorkerSpec = spec
        self.conn: Connection | None = None
        self.incarnation: int = 0
        self.state: SlotState = SlotState.STARTING
        #: why this incarnation is being taken down (overrides the exit status)
        self.cause: str | None = None
        #: resolved when the current incarnation serves calls (retryable calls wait on it)
        self.ready: asyncio.Future[None] = loop.create_future()
        #: clock time of the oldest heartbeat not answered yet (None: all answered)
        self.unanswered: float | None = None
        #: (bytes received from it, times writing to it resumed, bytes
        #: waiting to be sent to it) at the last heartbeat (:func:`_moved`)
        self.moved: tuple[int, int, int] = (0, 0, 0)
        #: while NOT_RESPONDING: its callers' error
        self.hung: Callable[[Pending], SupervisionError] | None = None
        #: what its incarnation said may hold its loop and has not ended
        #: (:class:`LoopHeld`): constructors (in their actors' threads, but one
        #: that holds the GIL, or the decoding of its arguments, can starve the
        #: loop), meshio's first ``import torch``; heartbeats wait meanwhile.
        #: Said by the process itself once it read the spawn: a process stopped
        #: before it did is judged as any other.
        self.held: int = 0
        #: what the last of them was (``"w.__init__"``, ``"import torch"``)
        self.held_what: str = ""

    def move(self, to: SlotState) -> None:
        """Go to state ``to`` (staying is not a move).

        Raises:
            RuntimeError: ``TRANSITIONS`` has no such move (a bug in meshio).
        """
        if to is self.state:
            return
        if (self.state, to) not in TRANSITIONS:
            raise RuntimeError(f"meshio bug: process slot rank {self.rank} ({self.addr}) "
                               f"cannot go from {self.state.value} to {to.value}")
        self.state = to

    def started(self) -> None:
        """Its first incarnation serves calls (unless lost meanwhile)."""
        if self.state is SlotState.STARTING:
            self.move(SlotState.SERVING)
            self.ready.set_result(None)

    @property
    def on_purpose(self) -> bool:
        """Taken down on purpose (not a failure): its loss is expected."""
        return self.state in (SlotState.STOPPING, SlotState.RESTARTING)


@dataclass(frozen=True)
class SpawnOptions:
    """meshio's options for the actors spawned on a proc mesh
    (``procs.options(...)``): ``restart``, their restart type, and
    ``stall_after``, seconds a call may run before it is reported as
    stalled; ``max_queued``, the bound of each actor's mailbox (per caller)."""

    restart: RestartType = "permanent"
    stall_after: float = STALL_AFTER
    max_queued: int = MAX_QUEUED


class _ActorRecord:
    """What it takes to rebuild an actor mesh's actors after a restart (or
    to build them on the processes a ``grow`` adds)."""

    __slots__ = ("body", "cls_blob", "cls_name", "labels", "mesh", "mesh_blob", "name",
                 "options", "out", "ranks", "sizes", "stopped", "target")

    def __init__(self, name: str, target: str, cls_blob: bytes, mesh_blob: bytes, body: bytes,
                 out: Any, labels: list[str], sizes: list[int], ranks: Sequence[int],
                 options: SpawnOptions, mesh: ActorMesh[Any] | None = None,
                 cls_name: tuple[str, str] = ("", "")) -> None:
        self.name, self.target = name, target
        #: the class's ``__module__`` and ``__qualname__`` (a kept-alive mesh's record)
        self.cls_name = cls_name
        self.cls_blob, self.mesh_blob, self.body, self.out = cls_blob, mesh_blob, body, out
        self.labels, self.sizes, self.ranks, self.options = labels, sizes, tuple(ranks), options
        #: the actor mesh as spawned on the whole proc mesh, which grows and
        #: shrinks with it (None: spawned on a slice, its points stay as they are)
        self.mesh = mesh
        #: the ranks whose actor was stopped (``actors.stop()`` on a slice):
        #: not rebuilt; once every rank's is, the mesh is forgotten
        self.stopped: set[int] = set()

    def spawn(self, w: _Worker, grank: int, restart: bool) -> asyncio.Future[Any]:
        """Build this mesh's actor at ``grank`` in ``w``'s process (its
        current incarnation); the future of its constructor's answer."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        index = self.ranks.index(grank)
        assert w.conn is not None
        ctor = f"{self.cls_name[1] or self.name}.__init__"  # (the class's, as spawn names it)
        req = w.conn.next_req(Pending(fut, ignore_result, ctor, self.name,
                                      Region(Extent(self.labels, self.sizes), self.ranks)
                                      .point(index)))
        w.conn.send_message(SpawnActor(req, self.target, self.name, self.cls_blob, index,
                                       self.labels, self.sizes, self.mesh_blob,
                                       msgspec.Raw(self.body), restart, grank,
                                       self.options.stall_after, self.options.max_queued),
                            self.out)
        return fut


class ProcState:
    """Shared by a proc mesh and all its slices."""

    def __init__(self, name: str, launchers: Sequence[ProcLauncher], region: Region,
                 per_host: int, supervisor: Supervisor | None = None,
                 restart: RestartType | None = None,
                 shutdown: ShutdownPolicy = STOP_GRACE,
                 heartbeat: tuple[float, float] = (HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT),
                 env: Mapping[str, str] | None = None, bootstrap: bytes = b"",
                 host_dims: Sequence[str] = (), log_records: bool = True,
                 log_dir: str | None = None,
                 partition_timeout: float = PARTITION_TIMEOUT, keep_alive: float | None = None,
                 adopt: KeptMesh | None = None) -> None:
        self.id: str = f"{name}-{uuid.uuid4().hex[:8]}" if adopt is None else adopt.id
        #: re-attached to a gone controller's processes (not started here)
        self.adopted: bool = adopt is not None
        #: ``spawn_procs(keep_alive=...)``: seconds its workers outlive a lost
        #: controller; the mesh is published for ``reattach`` (:mod:`._keep_alive`)
        self.keep_alive: float | None = keep_alive
        #: the dims that come from the host mesh (the others are per host)
        self.host_dims: tuple[str, ...] = tuple(host_dims)
        #: ``spawn_procs(env=..., bootstrap=...)``, for every process it starts
        self.env: Mapping[str, str] = env or {}
        self.bootstrap: bytes = bootstrap
        #: ``spawn_procs(log_records=..., log_dir=...)``: where its processes'
        #: ``logging`` records go (:mod:`._logs`)
        self.log_records: bool = log_records
        self.log_dir: str | None = log_dir
        #: ``spawn_procs(partition_timeout=...)``: seconds a host may be
        #: unreachable before its processes are downed (by the launcher and
        #: the host's agent, :mod:`meshio.jobs._remote`)
        self.partition_timeout: float = partition_timeout
        #: called with the ranks a supervisor restarts together: environment
        #: variables their replacements get on top of ``env``, per rank
        #: (``setup_torch_distributed``'s settings)
        self.restart_env: list[Callable[[Sequence[int]], Mapping[int, Mapping[str, str]]]] = []
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
        #: actor meshes spawned so far (kept-alive: by every controller):
        #: each spawn's target has its number (:meth:`new_target`)
        self.spawns: int = 0 if adopt is None else adopt.spawns
        #: workers found dead on re-attaching, failed once their actors are known
        self.gone: list[_Worker] = []
        #: the targets of the actor meshes whose spawn is under way (kept
        #: alive, the record lists them: :meth:`_adopt` stops their actors)
        self.spawning: set[str] = set()
        #: re-attached: the names of the actor meshes whose spawn the lost
        #: controller did not finish (their actors stopped; the names free)
        self.interrupted: list[str] = []
        self.stopped: bool = False
        #: done once the stop under way has stopped every process (:meth:`stop`)
        self._stop_done: asyncio.Future[None] | None = None
        #: stopped by its owner for good: nothing of it is left in the runtime
        self.released: bool = False
        #: called once it is released (the proc-mesh service forgets it)
        self.on_release: list[Callable[[], None]] = []
        self.rt: Runtime = runtime()
        #: the job secret of its processes, and where they reach this
        #: controller: the runtime's own, or, re-attached to a mesh another
        #: controller started, that one's secret and a listener for it
        self.secret: bytes = self.rt.secret
        self.controller: str = self.rt.addr
        if adopt is not None:
            self.secret = bytes.fromhex(adopt.secret)
            self.controller = self.rt.sockets.listen_job(Credentials(self.secret))  # (this host's)
        #: re-attached: the record taken over, until this controller has
        #: published its own (:meth:`published`)
        self._replacing: KeptMesh | None = adopt
        self.clock: Clock = MonotonicClock() if supervisor is None else supervisor.clock
        self.heartbeat_interval: float
        self.heartbeat_timeout: float
        self.heartbeat_interval, self.heartbeat_timeout = (
            heartbeat if supervisor is None
            else (supervisor.heartbeat_interval, supervisor.heartbeat_timeout))
        self._beating: asyncio.Task[None] | None = None
        #: rank → why that process failed with nothing to restart it (wait_failed)
        self.failures: dict[int, SupervisionError] = {}
        #: per actor mesh (target) the ranks where its actor is gone for good
        #: while the process serves: a temporary actor a restart did not
        #: rebuild, one ended by what an endpoint raised with nothing to restart
        #: it; each rank with why (what a call to it fails with: :meth:`actor_hole`)
        self.lost_actors: dict[str, dict[int, str]] = {}
        #: the errors given to the calls of a hole's process (see :meth:`of_hole`)
        self.hole_errors: weakref.WeakSet[SupervisionError] = weakref.WeakSet()
        #: changes with what :meth:`out_of_service` answers, or ``stopped``
        #: (``choose`` keeps the actors that serve calls until then)
        self.version: int = 0
        #: replace/grow/shrink, one at a time
        self.reshaping: asyncio.Lock = asyncio.Lock()
        #: how many times the mesh grew: the processes of a grow get new worker ids
        self.generation: int = 0
        #: addresses of the processes shrinks removed (their callers' errors)
        self.removed: list[str] = []
        #: rank → redeliveries in flight of calls that killed its process
        #: (a death meanwhile does not count against the supervisor's intensity)
        self.redelivering: dict[int, int] = {}
        #: told of each process found dead, as (rank, incarnation, the error),
        #: and of the stop (None), by :func:`meshio.monitor`
        self.monitors: set[Callable[[tuple[int, int, SupervisionError] | None], None]] = set()
        #: ranks lost whose calls are not failed yet, and the failures waiting
        #: for them to be printed in one line (processes that died together);
        #: the same for the faults of actors (:meth:`_fault`) as (what the
        #: actor raised, its pid, what happens now), also held for
        #: FAULT_WINDOW seconds after the first (a broadcast failing on many
        #: ranks), until ``_fault_window`` ends
        self._failing: set[int] = set()
        self._unreported: list[SupervisionError] = []
        self._faults: list[tuple[ErrorInfo, int, str]] = []
        self._fault_window: asyncio.TimerHandle | None = None
        self._failed: asyncio.Future[None] = self.rt.loop.create_future()
        if keep_alive is not None and adopt is None:
            self.published(claiming=True)  # (refused, nothing of it stays anywhere)
        if supervisor is not None:
            supervisor.children.append(self)
        #: the context of the actor that started this mesh (None: the
        #: controller's code); the actor's stop stops it
        self.owner: Context[Any] | None = _context.get(None)
        if self.owner is not None:
            self.owner._owned.append(self)
        if self.rt.controller is None:  # a controller's (not a worker's): `meshio stacks` sees it
            self.rt.state(Inspection).watch(self)
        self.ready: asyncio.Task[None] = self.rt.tasks.start(
            self._start() if adopt is None else self._adopt(adopt))

    @property
    def restart_type(self) -> RestartType:
        """The proc mesh's own, or the most permanent of its actor meshes'."""
        if self.restart is not None:
            return self.restart
        kinds = {a.options.restart for a in self.actors}
        for kind in ("permanent", "transient", "temporary"):
            if kind in kinds:
                return kind
        return "permanent"

    @property
    def holes(self) -> set[int]:
        """The ranks that are holes (see :meth:`hole`), until a replacement
        serves calls."""
        return {w.rank for w in self.workers if w.state in (SlotState.HOLE, SlotState.REFILLING)}

    def hole(self, grank: int, target: str, error: BaseException | None = None) -> bool:
        """Whether the actor of ``target`` at ``grank`` is a hole: its process
        died and nothing restarts it by design (no supervisor; restart type
        ``temporary``, or ``transient`` and it exited normally), it is a
        temporary actor a restart did not rebuild, or, with no supervisor, an
        endpoint's ``SystemExit``/``KeyboardInterrupt`` ended it.  A process being
        restarted, or given up on by its supervisor (which then stops the
        mesh), is not a hole; nor is anything of a stopped mesh.

        ``error``: what a call to it failed with; given to a call of a hole's
        process (:meth:`of_hole`), it was a hole's failure even if
        ``procs.replace`` filled the hole before the call's other answers came."""
        return not self.stopped and (grank in self.holes
                                     or grank in self.lost_actors.get(target, ())
                                     or error in self.hole_errors)

    def of_hole(self, make: Callable[[Pending], SupervisionError]
                ) -> Callable[[Pending], SupervisionError]:
        """``make``, the errors it makes for the calls of a hole's process
        remembered as a hole's (:meth:`hole`): a call is judged once all its
        answers are in, and the hole may be filled by then."""
        def made(p: Pending) -> SupervisionError:
            error = make(p)
            self.hole_errors.add(error)
            return error
        return made

    def actor_hole(self, target: str, grank: int) -> Callable[[Pending], SupervisionError] | None:
        """The error of a call to the actor of ``target`` at ``grank`` while it
        is a hole though its process serves (:attr:`lost_actors`): not sent,
        and a hole's (:meth:`of_hole`) even once ``procs.replace`` filled it;
        None while it serves."""
        why = self.lost_actors.get(target, {}).get(grank)
        if why is None:
            return None
        return self.of_hole(lambda p: SupervisionError(
            f"{p.who}: {why}; it is a hole until procs.replace({grank}); {p.endpoint} was not "
            f"sent", actor=p.mesh, rank=p.rank, cause="actor lost"))

    def _actor_back(self, target: str, grank: int) -> None:
        """The actor of ``target`` at ``grank`` is no hole (any more); a mesh
        with none left leaves :attr:`lost_actors`, so that calls (which look
        there while it is not empty) go the quick way again."""
        ranks = self.lost_actors.get(target)
        if ranks is not None:
            ranks.pop(grank, None)
            if not ranks:
                del self.lost_actors[target]

    def out_of_service(self, target: str) -> dict[int, str]:
        """The ranks where the actor of mesh ``target`` serves no calls, each
        with why, beyond what ``rt.dead`` says of their processes: the holes
        (:meth:`hole`) and the actors stopped (``actors.stop()`` on a slice
        holding them).  It changes only with :attr:`version`."""
        record = next((a for a in self.actors if a.target == target), None)
        out = dict.fromkeys(record.stopped if record is not None else (),
                            "its actor was stopped (actors.stop() on a slice holding it)")
        out.update(self.lost_actors.get(target, {}))
        for grank in self.holes:
            out[grank] = f"its process is a hole until procs.replace({grank})"
        return out

    def new_target(self, name: str) -> str:
        """The target of a new actor mesh ``name``: this mesh's id, then the
        spawn's number, so that a reference to a stopped mesh never reaches
        a newer one of the same name (its actors are rebuilt under the same
        target: a restart, ``replace`` or ``grow`` keeps it)."""
        self.spawns += 1
        return f"{self.id}/{self.spawns}/{name}"

    def forget(self, name: str) -> None:
        """Forget the actor mesh ``name`` (stopped everywhere, or never
        built): a restart does not rebuild it, and the name is free again."""
        self.version += 1
        for a in self.actors:
            if a.name == name:
                self.lost_actors.pop(a.target, None)
        self.actors = [a for a in self.actors if a.name != name]
        self.actor_names.discard(name)

    def stopped_actors(self, target: str, ranks: Sequence[int]) -> bool:
        """The actors of mesh ``target`` at ``ranks`` are stopped (by
        ``actors.stop()`` on the mesh or a slice): a restart does not
        rebuild them, and once every rank's is stopped, in one stop or
        slice by slice, the mesh is forgotten (its name free): True then.
        A mesh forgotten already (a stale reference, its name perhaps taken
        by a newer mesh): nothing."""
        record = next((a for a in self.actors if a.target == target), None)
        if record is None:
            return False
        record.stopped.update(ranks)
        self.version += 1
        if not record.stopped.issuperset(record.ranks):
            return False
        self.forget(record.name)
        return True

    def _spec(self, grank: int, point: Point) -> WorkerSpec:
        # (a worker reads its proc mesh's id back from it: Incarnation.mesh)
        worker_id = f"{self.id}-{grank}" + (f"g{self.generation}" if self.generation else "")
        env = {**self.env, "MESHIO_WORKER": worker_id}  # meshio's own win
        if "gpus" in self.region.extent.labels:
            env[GPU_ENV] = str(point["gpus"])
        coords = " ".join(f"{k}={v}" for k, v in point.items())
        label = f"[{self.name} {coords}]".replace(" ]", "]")
        env[LOGS_ENV] = logs_env(self.log_records, self.log_dir, self.name, grank, label)
        namespace = self.rt.namespace if self.controller == self.rt.addr else \
            self.controller.rpartition("/")[0]
        return WorkerSpec(worker_id, f"{namespace}/{worker_id}", self.controller, env,
                          label=label, secret=self.secret, bootstrap=self.bootstrap,
                          partition_timeout=self.partition_timeout, keep_alive=self.keep_alive)

    async def _launch(self, grank: int, spec: WorkerSpec, *, wait_agent: bool = False
                      ) -> tuple[ProcHandle, asyncio.Future[Connection]]:
        """Start the process of ``spec`` at ``grank`` through its host's
        launcher, within :data:`START_TIMEOUT` (``wait_agent``, a restart's:
        a host agent not there is waited for, :meth:`_agent_back`); its handle
        and the future its hello resolves."""
        waiter: asyncio.Future[Connection] = self.rt.loop.create_future()
        self.rt.watch.hello_waiters[spec.worker] = waiter
        launcher = self.launchers[grank // self.per_host]
        try:
            launch = self._agent_back(grank, launcher, spec) if wait_agent \
                else launcher.launch(spec)
            # a host agent cut off by a partition never answers: no waiting forever
            return await within(launch, START_TIMEOUT), waiter
        except BaseException as e:
            self.rt.watch.hello_waiters.pop(spec.worker, None)
            if isinstance(e, LaunchRefused):
                raise self._not_started(grank, launcher.host, str(e)) from None
            if not isinstance(e, TimeoutError):
                raise
            raise self._not_started(
                grank, launcher.host,
                f"its host's launcher did not start it within {START_TIMEOUT}s") from None

    async def _agent_back(self, grank: int, launcher: ProcLauncher, spec: WorkerSpec
                          ) -> ProcHandle:
        """``launcher.launch(spec)`` for a restart, waiting for a host agent
        that is not there (killed and restarted at the same address, as
        systemd or a pod's ``restartPolicy`` does; its host rebooting): its
        dial is retried with backoff (:data:`AGENT_RETRY` doubling to
        :data:`AGENT_RETRY_MOST`), a refusal no failure of its own, for up
        to :data:`START_TIMEOUT` (the bound of any start); then it fails
        once, naming the agent and how long it was waited for."""
        loop = self.rt.loop
        start, delay = loop.time(), AGENT_RETRY
        while True:
            try:
                return await launcher.launch(spec)
            except SupervisionError as e:
                if e.cause not in _AGENT_AWAY or self.stopped:
                    raise
                waited = loop.time() - start
                # the last dial comes AGENT_RETRY before the bound (which bounds a dial too)
                pause = min(delay, START_TIMEOUT - AGENT_RETRY - waited)
                if pause <= 0:
                    raise self._not_started(
                        grank, launcher.host,
                        f"its host agent could not be reached for {waited:.1f} s (a restart "
                        f"waits up to {START_TIMEOUT:g} s for it): {e}") from e
                if delay == AGENT_RETRY:
                    log.warning("meshio: proc mesh %r rank %d: %s; its restart waits for the "
                                "agent, dialling it again for up to %g s", self.name, grank, e,
                                START_TIMEOUT)
                await asyncio.sleep(pause)
                delay = min(2 * delay, AGENT_RETRY_MOST)

    def _not_started(self, grank: int, host: str, why: str) -> ProcessStartError:
        """The error of the process at ``grank`` (on ``host``) that its
        launcher did not start, for the reason ``why``."""
        return ProcessStartError(
            f"proc mesh {self.name!r}: worker rank {grank} on {host} failed to start: {why}",
            actor=self.name, rank=grank, host=host, cause=why)

    async def _start(self) -> None:
        waits: list[Coroutine[Any, Any, None]] = []
        try:
            for grank, point in zip(self.region.ranks, self.region.points()):
                spec = self._spec(grank, point)
                handle, waiter = await self._launch(grank, spec)
                worker = _Worker(grank, spec.listen, handle, spec, self.rt.loop)
                self.workers.append(worker)
                waits.append(self._hello(worker, waiter))
            # (its workers, launched, in the record: this controller killed
            # while they say hello, a re-attach finds them)
            self.published()
            await together(waits)
        except BaseException:
            for w in waits:
                w.close()  # never awaited when a later launch failed
            self.kill()
            raise
        for worker in self.workers:
            worker.started()
        self._beating = self.rt.tasks.start(self._heartbeats())
        self.published()

    async def _adopt(self, record: KeptMesh) -> None:
        """Re-attach to the workers of the kept-alive mesh ``record`` (their
        controller is gone): dial each proving its job's secret, tell it
        this controller serves it now (:class:`Adopt`), then watch it as if
        this controller had started it."""
        rt = self.rt
        kept_workers = sorted(record.workers, key=lambda k: k.rank)
        launchers = [self.launchers[kept.rank // self.per_host] for kept in kept_workers]
        for kept, launcher in zip(kept_workers, launchers):
            if kept.host != launcher.host:
                raise ValueError(f"reattach({self.name!r}): its rank {kept.rank} runs on "
                                 f"{kept.host}, but this host mesh's host for it is "
                                 f"{launcher.host}; re-attach on the same hosts")
        # each one's watch first (a host agent refuses it while another
        # controller watches it), so that a refusal comes before any Adopt
        for kept, launcher in zip(kept_workers, launchers):
            spec = replace(self._spec(kept.rank, self.region.point(kept.rank)),
                           worker=kept.worker, listen=kept.addr)
            self.workers.append(_Worker(kept.rank, kept.addr,
                                        await launcher.adopt(spec, kept.pid), spec, rt.loop))
        futs: list[asyncio.Future[Any]] = []
        for kept, launcher, w in zip(kept_workers, launchers, self.workers):
            creds, controller = launcher.reach(self.secret)
            rt.peer_jobs[kept.addr] = creds
            if kept.listen != kept.addr:
                rt.routes[kept.addr] = kept.listen
            if tcp_endpoint(kept.listen) is None:
                rt.pids[kept.listen] = kept.pid
            w.conn = rt.connect(kept.addr)
            fut: asyncio.Future[Any] = rt.loop.create_future()
            futs.append(fut)
            req = w.conn.next_req(Pending(fut, ignore_result, "reattach", self.name,
                                          self.region.point(kept.rank)))
            w.conn.send_message(Adopt(req, rt.addr, controller))
        # (given up, gather cancels the answers still awaited: nobody will read them)
        answers = await asyncio.gather(*futs, return_exceptions=True)
        failed = [(w, e) for w, e in zip(self.workers, answers) if isinstance(e, BaseException)]
        # A worker that died since its controller went fails as if after the
        # re-attach (:meth:`fail_gone`: restarted by a supervisor, or a
        # hole), and the others are served; one alive but out of reach, or
        # serving another controller, or every one gone: nothing is
        # re-attached (the first says why; one serving another first).
        alive = sorted((e for w, e in failed if w.handle.returncode is None),
                       key=lambda e: not isinstance(e, ProcMeshTakenError))
        self.gone = [w for w, _ in failed if w.handle.returncode is not None]
        if alive or (self.gone and len(self.gone) == len(self.workers)):
            raise (alive or [failed[0][1]])[0]
        for w in self.workers:
            assert w.conn is not None
            self._watch(w, w.conn)
            w.started()
        self.actor_names = {a.name for a in record.actors}
        self._beating = rt.tasks.start(self._heartbeats())
        # The actors of a spawn the lost controller did not finish were never
        # anyone's: stopped (once built, as a spawn given up on does), so that
        # their names are free; each process stops those it has.
        for target in record.spawning:
            for w in self.workers:
                if w not in self.gone:
                    assert w.conn is not None
                    w.conn.send_message(StopActor(0, target, whole=True))
        self.interrupted = [target.rpartition("/")[2] for target in record.spawning]
        if self.interrupted:
            log.warning("meshio: reattach(%r): the spawn of actor mesh(es) %s was interrupted "
                        "by the lost controller: their actors are stopped; spawn them again",
                        self.name, ", ".join(map(repr, self.interrupted)))

    async def abandon(self) -> None:
        """Give up a re-attach (:meth:`_adopt` failed, or its caller gave
        up): its task ends first (cancelled where it still runs: nothing of
        it runs on), then nothing of the mesh stays here and the connections
        to its workers close, so that they see this controller gone and
        wait for another again (one still being dialled never sends its
        ``Adopt``).  Its processes are left be: nothing of them is ours."""
        self.ready.cancel()
        try:
            await asyncio.wait([self.ready])
        finally:
            self.stopped = True
            if self._beating is not None:  # (adopted before the caller gave up)
                self._beating.cancel()
            if self.rt.has_state(_Reports):
                for w in self.workers:
                    self.rt.state(_Reports).by_addr.pop(w.addr, None)
            self.release()

    def fail_gone(self) -> None:
        """Fail the workers found dead on re-attaching (:meth:`_adopt`), once
        the actors a supervisor rebuilds on a restart are known."""
        gone, self.gone = self.gone, []
        for w in gone:
            assert w.conn is not None
            self._lost(w, w.conn)

    def published(self, *, claiming: bool = False) -> None:
        """Publish (again) the record of a kept-alive mesh: what a new
        controller needs to re-attach to it as it is now; ``claiming``, the
        first, before its processes start: the name is the mesh's from then
        on (:func:`~._keep_alive.claim`).  A record another controller has
        the name of is left as it is (that one re-attached to the mesh).

        Raises:
            ValueError: ``claiming``, and another live proc mesh has the name.
        """
        if self.keep_alive is None or self.stopped:
            return
        pid = os.getpid()
        record = KeptMesh(
            self.name, self.id, self.secret.hex(), list(self.region.extent.labels),
            list(self.region.extent.sizes), self.keep_alive, dict(self.env),
            self.bootstrap, self.log_records, self.log_dir, pid, time.time(),
            [KeptWorker(w.rank, w.spec.worker, w.addr, self.rt.routes.get(w.addr, w.addr),
                        w.handle.pid, w.handle.host) for w in self.workers],
            [KeptActor(a.name, a.target, *a.cls_name, a.cls_blob,
                       None if a.out else a.body,
                       a.labels, a.sizes, list(a.ranks), a.options.restart,
                       a.options.stall_after)
             for a in self.actors if a.target not in self.spawning], self.spawns,
            KeptOptions(self.restart, self.shutdown, self.heartbeat_interval,
                        self.heartbeat_timeout, self.partition_timeout),
            sorted(self.spawning), started_at(pid) or 0)
        try:
            if claiming:
                claim(record)
                return
            other = publish(record, self._replacing)
        except OSError as e:  # the mesh works on; only reattach cannot find it
            log.warning("meshio: cannot publish proc mesh %r for reattach (%s)", self.name, e)
            return
        if other is None:
            self._replacing = None
        else:
            log.warning("meshio: proc mesh %r is not published for reattach any more: the "
                        "controller with pid %d re-attached to it or has its name now (its "
                        "record is left as it is)", self.name, other.controller_pid)

    def reopen(self) -> None:
        """Undo :meth:`stop` before a parent supervisor restarts this mesh's
        supervisor (its processes are then restarted one by one)."""
        if self.stopped and not self.released and self.supervisor is not None:
            self.stopped = False
            self.version += 1
            if self._beating is not None:
                self._beating.cancel()
            self._beating = self.rt.tasks.start(self._heartbeats())

    async def _hello(self, worker: _Worker, waiter: asyncio.Future[Connection]) -> None:
        exited = awaited(worker.handle.wait())
        racers: list[asyncio.Future[Any]] = [waiter, exited]
        done, _ = await asyncio.wait(racers, timeout=START_TIMEOUT,
                                     return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            exited.cancel()
            failure = worker.handle.start_failure if exited in done else None  # its bootstrap
            if failure is not None:
                why = failure
            elif exited in done:
                why = describe_exit(exited.result())
            else:
                why = f"no hello within {START_TIMEOUT}s"
            see = ("its traceback is in the process's stderr above" if failure is not None
                   else "its stderr above says why")
            raise ProcessStartError(
                f"proc mesh {self.name!r}: worker rank {worker.rank} (pid {worker.handle.pid} on "
                f"{worker.handle.host}) failed to start: {why}; {see}",
                actor=self.name, rank=worker.rank, host=worker.handle.host,
                pid=worker.handle.pid, cause=why)
        exited.cancel()
        worker.conn = waiter.result()
        if worker.conn.peer is not None and worker.conn.peer != worker.addr:
            # a worker on another host chose its TCP address; its replacements answer to it
            worker.addr = worker.conn.peer
        self._route(worker, worker.conn)
        self._watch(worker, worker.conn)

    def _watch(self, worker: _Worker, conn: Connection) -> None:
        """Watch the incarnation of ``worker`` at the other end of ``conn``:
        its loss (its connection's, or its process's exit), faults, stalls
        and heartbeats."""
        worker.unanswered, worker.held = None, 0
        self.rt.on_lost[worker.addr] = lambda conn: self._lost(worker, conn)
        self.rt.tasks.start(self._exited(worker.handle, weakref.ref(conn)))
        self.rt.watch.on_fault_from[worker.addr] = functools.partial(self._fault, worker)
        self.rt.state(_Reports).by_addr[worker.addr] = functools.partial(self._reported, worker)
        self.rt.watch.on_pong[worker.addr] = lambda: self._pong(worker)
        if self.rt.watch.down.pop(worker.addr, None) is not None:  # a downed one's replacement
            self._tell(PeerUp(worker.addr))
        for down in self.rt.watch.down.values():  # a new worker learns who is not responding
            conn.send_message(down())

    def _route(self, worker: _Worker, conn: Connection) -> None:
        """Where the incarnation of ``worker`` that said hello on ``conn``
        listens: this runtime dials it there (checking its pid on a Unix
        socket), tells every process connected to it where a replacement
        listens, and tells the new process where earlier replacements do."""
        rt = self.rt
        rt.pids.pop(rt.routes.pop(worker.addr, worker.addr), None)
        if tcp_endpoint(conn.listen) is None:
            rt.pids[conn.listen] = worker.handle.pid
        if conn.listen != worker.addr:
            rt.routes[worker.addr] = conn.listen
            self._tell(Moved(worker.addr, conn.listen, rt.pids.get(conn.listen, 0)))
        for addr, listen in rt.routes.items():
            if addr != worker.addr:
                conn.send_message(Moved(addr, listen, rt.pids.get(listen, 0)))

    # ------------------------------------------------------------ failures

    async def _exited(self, handle: ProcHandle, ref: weakref.ref[Connection]) -> None:
        """Once the process of ``handle`` has exited (its pidfd, or its host
        agent's report), its connection (``ref``) goes, and with it the
        process (:meth:`_lost`, as for any connection lost): a child that
        shares its sockets (``os.fork()``, a ``multiprocessing`` child that
        left its process group) would hold that connection open, and a dead
        process is not a silent one.  What it wrote before its exit is read
        first: where more of it may come (:func:`_may_follow`), the
        connection goes :data:`EXIT_STATUS_WAIT` seconds later if it is
        still open then.  (Holds no connection: a closed one is freed.)"""
        await handle.wait()
        conn = ref()
        if conn is None or conn.closed:
            return
        if _may_follow(conn):
            self.rt.loop.call_later(EXIT_STATUS_WAIT, _abort, ref)
        else:
            conn.abort()

    def _lost(self, worker: _Worker, conn: Connection) -> None:
        if conn is not worker.conn:  # an incarnation its supervisor is already replacing
            conn.fail_all(lambda p: SupervisionError(
                f"{p.who} on proc mesh {self.name!r} rank {worker.rank}: process "
                f"{conn.peer_pid} was stopped by its supervisor while {p.endpoint} was in "
                f"flight", actor=p.mesh, rank=p.rank, host=worker.handle.host,
                pid=conn.peer_pid, cause="stopped by its supervisor"))
            return
        # Until _fail_calls has the exit status, new calls fail at once with
        # what is known (not with a bare "connection refused" from a redial);
        # those errors are a hole's if that is the verdict (made: _fail_calls_of)
        handle = worker.handle
        made: weakref.WeakSet[SupervisionError] = weakref.WeakSet()

        def error(p: Pending) -> SupervisionError:
            cause, said = _exit_cause(handle)
            down = SupervisionError(
                f"{p.who} on proc mesh {self.name!r} rank {worker.rank}: process "
                f"{handle.pid} on {handle.host} is down ({said}); {p.endpoint} was not sent",
                actor=p.mesh, rank=p.rank, host=handle.host, pid=handle.pid, cause=cause)
            made.add(down)
            return down

        self.responds(worker)  # gone rather than hung: workers see the lost connection
        if worker.state in (*_LIVE, SlotState.REFILLING):  # (not on purpose, nor stopped)
            worker.move(SlotState.LOST)
        self._failing.add(worker.rank)
        if not self.stopped:
            self.rt.dead[worker.addr] = error
            if worker.ready.done():  # retryable calls wait for the restart, not spin
                worker.ready = self.rt.loop.create_future()
        self.rt.tasks.start(self._fail_calls(worker, conn, handle, made))

    async def _fail_calls(self, worker: _Worker, conn: Connection, handle: ProcHandle,
                          made: weakref.WeakSet[SupervisionError]) -> None:
        try:
            await self._fail_calls_of(worker, conn, handle, made)
        finally:
            self._failing.discard(worker.rank)
            if not self._failing and self._unreported:
                self._print_failures()
            self._print_faults()

    async def _fail_calls_of(self, worker: _Worker, conn: Connection, handle: ProcHandle,
                             made: weakref.WeakSet[SupervisionError]) -> None:
        """Fail the calls of ``worker``'s process, lost with ``conn``, once
        its exit status is known, and decide what comes of it; ``made``:
        the errors given meanwhile to the calls made after the loss
        (:meth:`_lost`), a hole's if it is one."""
        if not self.stopped:
            try:
                await within(handle.wait(), EXIT_STATUS_WAIT)
            except TimeoutError:
                pass
        # ``cause``: the errors' ``.cause``; ``said``: what their messages say
        if self.stopped:  # (as the calls made once it is stopped say: _stopped_error)
            why, cause = self._stopped_why()
            said = f"was stopped{why}"
        elif worker.cause is not None:
            cause = said = worker.cause
        elif handle.returncode is None:
            cause = said = "connection lost (process still running; killed)"
            handle.send_signal(signal.SIGKILL)
        else:
            cause, said = _exit_cause(handle)
        # replaced meanwhile, or being stopped by a strategy restart: on purpose
        stale = conn is not worker.conn
        restarting = stale or (worker.on_purpose and not self.stopped)
        if not restarting and self.supervisor is not None and not self.stopped:
            try:
                restarting = self.supervisor.child_failed(
                    self, worker.rank, cause, abnormal=handle.returncode != 0, pid=handle.pid,
                    host=handle.host, counted=not self.redelivering.get(worker.rank))
            except Exception:  # (its clock, a hook: user code) its calls still fail
                log.exception("meshio: supervisor %r could not decide on proc mesh %r rank %d; "
                              "it is not restarted", self.supervisor.name, self.name,
                              worker.rank)
        note = "; its supervisor is restarting it" if restarting else ""

        def error(p: Pending) -> SupervisionError:  # a call in flight when it died
            return SupervisionError(
                f"{p.who} on proc mesh {self.name!r} rank {worker.rank}: process "
                f"{handle.pid} on {handle.host} {said} while {p.endpoint} was in "
                f"flight{note}", actor=p.mesh, rank=p.rank, host=handle.host,
                pid=handle.pid, cause=cause)

        hole = False
        if restarting:
            what_now = ("its supervisor is restarting it: call again once it is back "
                        "(a retryable endpoint waits for it)")
        elif self.supervisor is None:
            what_now, hole = "nothing restarts it (no supervisor)", True
        elif (kind := self.restart_type) == "temporary" or (kind == "transient"
                                                             and handle.returncode == 0):
            what_now, hole = f"it is not restarted (restart={kind!r})", True
        else:
            what_now = f"its supervisor {self.supervisor.name!r} gave up on it"
        if hole:
            what_now += f"; it is a hole until procs.replace({worker.rank})"

        def error_after(p: Pending) -> SupervisionError:  # a call made after it died
            if self.stopped:
                return self._stopped_error(worker)(p)
            return SupervisionError(
                f"{p.who} on proc mesh {self.name!r} rank {worker.rank}: process "
                f"{handle.pid} on {handle.host} is down ({said}); {p.endpoint} was not sent: "
                f"{what_now}", actor=p.mesh, rank=p.rank, host=handle.host,
                pid=handle.pid, cause=cause)

        if cause == "partitioned" and not self.stopped:
            # the other workers' connections to it stay open (its host is cut
            # off): they drop them, and their calls to it fail until an
            # incarnation serves again (_watch)
            gone = PeerDown(worker.addr, self.name, worker.rank, handle.pid, handle.host, 0.0,
                            self.heartbeat_timeout, gone=said)
            self.rt.watch.down[worker.addr] = lambda: gone
            self._tell(gone)
        if stale:
            conn.fail_all(error)
            return
        self.rt.dead[worker.addr] = self.of_hole(error_after) if hole else error_after
        if hole:
            self.hole_errors.update(made)
        conn.fail_all(self.of_hole(error) if hole else error)
        if not self.stopped:
            down = SupervisionError(
                f"proc mesh {self.name!r} rank {worker.rank}: process {handle.pid} on "
                f"{handle.host} {said}", actor=self.name, rank=worker.rank, host=handle.host,
                pid=handle.pid, cause=cause)
            for tell in list(self.monitors):
                tell((worker.rank, worker.incarnation, down))
        if worker.ready.done():
            worker.ready = self.rt.loop.create_future()
        if not restarting:
            failure = SupervisionError(
                f"proc mesh {self.name!r} rank {worker.rank}: process {handle.pid} on "
                f"{handle.host} {said}{'; spawn a new one' if self.stopped else ''}",
                actor=self.name, rank=worker.rank, host=handle.host,
                pid=handle.pid, cause=cause)
            self._no_restart(worker, failure)
            if not self.stopped:
                worker.move(SlotState.HOLE if hole else SlotState.FAILED)
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
            say(line)

    def _fault_window_ended(self) -> None:
        self._fault_window = None
        self._print_faults()

    def _print_faults(self) -> None:
        """Print the faults of actors held (:meth:`_fault`), unless their
        window is still open (then as it ends) or a lost process's calls are
        still being failed (then with its failure)."""
        if self._fault_window is None and not self._failing:
            self.flush_faults()

    def flush_faults(self) -> None:
        """Print the faults of actors held (:meth:`_fault`) now, their window
        ended (the mesh is stopped or released, the runtime closes: no
        failure is printed after): one report for the ranks that raised the
        same error with the same outcome, with the first's traceback."""
        if self._fault_window is not None:
            self._fault_window.cancel()
            self._fault_window = None
        if not self._faults:
            return
        self.rt.state(_HeldFaults).meshes.discard(self)
        faults, self._faults = self._faults, []
        alike: dict[tuple[str, str, str, str], dict[int, tuple[ErrorInfo, int]]] = {}
        for info, pid, what_now in faults:
            key = (info.actor, info.type_name, info.message, what_now)
            alike.setdefault(key, {}).setdefault(info.rank, (info, pid))
        for (_, _, _, what_now), by_rank in alike.items():
            ranks = sorted(by_rank)
            say(fault_report(by_rank[ranks[0]][0], [by_rank[r][1] for r in ranks], what_now,
                             rank_ranges(ranks)))

    def _wake(self) -> None:
        """Wake every :meth:`ProcMesh.wait_failed` to look again."""
        if not self._failed.done():
            self._failed.set_result(None)
        self._failed = self.rt.loop.create_future()

    def _no_restart(self, worker: _Worker, error: SupervisionError) -> None:
        if not worker.ready.done():
            worker.ready.set_exception(error)
            worker.ready.exception()  # nobody may be waiting: don't warn

    def _reported(self, worker: _Worker, msg: Stalled | LoopHeld | ActorStopped) -> None:
        """What ``worker`` reported of itself: a stalled call, its loop
        held by meshio's own work (or no longer), or one of its actors
        stopped through a reference held elsewhere."""
        if isinstance(msg, ActorStopped):
            self.stopped_actors(msg.target, (worker.rank,))
        elif isinstance(msg, LoopHeld):
            if msg.held:
                worker.held += 1
                worker.held_what = msg.what
            elif worker.held:  # (a controller re-attached meanwhile heard no start)
                worker.held -= 1
                worker.unanswered = None  # judged from now on, with one heartbeat timeout
        else:
            self._stalled(worker, msg)

    def _stalled(self, worker: _Worker, msg: Stalled) -> None:
        """A call of an actor of ``worker`` has run past its ``stall_after``:
        one warning line, and one "stall" event for the supervisor."""
        line = stall_line(msg)
        log.warning("%s", line)
        if self.supervisor is not None:
            self.supervisor.event("stall", self.name, worker.rank,
                                  line.removeprefix("meshio: "), worker.handle.pid,
                                  worker.handle.host)

    def _fault(self, worker: _Worker, info: ErrorInfo, stopped: bool) -> None:
        """An actor failed with nobody to tell (a broadcast, a hook) or was
        ended (``stopped``) by ``SystemExit``/``KeyboardInterrupt``: its
        process is killed at once where its supervisor restarts it; its
        report waits FAULT_WINDOW seconds from the first fault held, for
        those of the other ranks (:meth:`flush_faults`)."""
        sup = self.supervisor
        restarts = (sup is not None and not self.stopped
                    and worker.state in (SlotState.STARTING, SlotState.SERVING))
        if sup is None:
            what_now = "nothing restarts it (no supervisor)"
            if stopped:  # a hole, as a process that died would be
                for a in self.actors:
                    if a.name == info.actor:
                        self.lost_actors.setdefault(a.target, {})[worker.rank] = (
                            f"its actor (rank {info.rank}) was stopped by the "
                            f"{info.type_name} an endpoint raised: {info.message}")
                self.version += 1
        elif self.stopped:
            what_now = "its proc mesh is being stopped"
        elif not restarts:
            what_now = f"supervisor {sup.name!r} is already replacing the process"
        else:
            what_now = (f"the process is killed; supervisor {sup.name!r} restarts it unless "
                        f"max_restarts is exceeded")
        if not self._faults:
            self.rt.state(_HeldFaults).meshes.add(self)
        if self._fault_window is None:
            self._fault_window = self.rt.loop.call_later(FAULT_WINDOW, self._fault_window_ended)
        self._faults.append((info, worker.handle.pid, what_now))
        if restarts:
            worker.move(SlotState.KILLING)
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
                if conn is None or conn.closed or w.state not in (SlotState.SERVING,
                                                                  SlotState.NOT_RESPONDING):
                    continue
                # (reading paused: its answers wait unread on our side)
                moved = _moved(w, conn) or conn.reading_paused
                held = w.held
                if stalled or moved or w.unanswered is None:
                    w.unanswered = now
                elif now - w.unanswered > self.heartbeat_timeout * (HELD_TIMEOUTS if held else 1):
                    if self._hung(w, conn, now, now - w.unanswered):
                        continue  # killed
                conn.send_control(Ping(w.incarnation))
                link = debug_link(self.rt, w.addr)
                if link is not None:  # paused in pdb, perhaps holding its loop: it answers there
                    link.send_message(Ping(w.incarnation))

    def _hung(self, w: _Worker, conn: Connection, now: float, silent: float) -> bool:
        """``w`` has not answered heartbeats for ``silent`` seconds: a
        supervisor kills and restarts it (True); without one its callers
        fail (the process is left alone and serves calls again once it
        answers)."""
        timeout = self.heartbeat_timeout
        held = ("" if not w.held else
                f", {HELD_TIMEOUTS} times that while its constructor ran"
                if w.held_what.endswith(".__init__") else
                f", {HELD_TIMEOUTS} times that while meshio held its loop")
        if self.supervisor is not None:
            w.move(SlotState.KILLING)
            w.cause = (f"hung: no heartbeat answer for {silent:.1f}s "
                       f"(heartbeat_timeout={round(timeout, 6)}s{held}); killed")
            w.handle.send_signal(signal.SIGKILL)
            # Lost now, not once the kill closes the connection: a process on
            # a host cut off by a partition never closes it (nor does its
            # agent hear the kill), and its calls would hang until the heal.
            conn.abort()
            return True
        if w.state is SlotState.NOT_RESPONDING:
            return False
        w.move(SlotState.NOT_RESPONDING)
        handle, clock, since = w.handle, self.clock, now - silent
        down = PeerDown(w.addr, self.name, w.rank, handle.pid, handle.host, silent, timeout)
        w.hung = not_responding(down, clock.now, in_flight=False)
        # (the oldest actor call in flight from here is the first suspect)
        suspect = next((p.endpoint for p in conn.pending.values() if p.target), "")
        say(f"proc mesh {self.name!r} rank {w.rank} (pid {handle.pid} on {handle.host}) not "
            f"responding for {silent:.1f} s (heartbeat_timeout={round(timeout, 6)} s{held}); "
            f"its calls fail until it answers again"
            + ("" if w.held else f"; {blocked_loop(suspect)}"))
        self.rt.dead[w.addr] = w.hung
        self.rt.watch.down[w.addr] = lambda: msgspec.structs.replace(
            down, silent=clock.now() - since)
        # (and cancelled there: it reads that once it runs again)
        conn.fail_all(not_responding(down, clock.now, in_flight=True), cancel=True)
        self._tell(down)
        return False

    def _pong(self, w: _Worker) -> None:
        w.unanswered = None
        if w.state is SlotState.NOT_RESPONDING:  # it answers again: calls go through
            w.move(SlotState.SERVING)
            self.responds(w)
            say(f"proc mesh {self.name!r} rank {w.rank} (pid {w.handle.pid}) responds again")

    def responds(self, w: _Worker) -> None:
        """``w`` is no longer "not responding" (it answers, is gone, or is
        stopped): lift its callers' error here and in every worker."""
        if w.hung is None:
            return
        if self.rt.dead.get(w.addr) is w.hung:
            del self.rt.dead[w.addr]
        w.hung = None
        del self.rt.watch.down[w.addr]
        self._tell(PeerUp(w.addr))

    def _tell(self, msg: PeerDown | PeerUp | Moved) -> None:
        """Tell every process connected to this runtime (the workers of all
        its proc meshes) but ``msg.addr`` itself, so that their actors'
        calls to it fail, go through again, or go where it listens now, as
        the controller's do."""
        for conn in list(self.rt.all_conns):
            if not conn.closed and conn.peer != msg.addr:
                conn.send_message(msg)

    # ------------------------------------------------- restarts (supervisor)

    def worker(self, grank: int) -> _Worker:
        return next(w for w in self.workers if w.rank == grank)

    def running(self) -> list[tuple[int, int, str]]:
        """(rank, pid, host) of each process that runs (not lost, failed, a
        hole or stopped): what :meth:`stop` takes down."""
        return [(w.rank, w.handle.pid, w.handle.host) for w in self.workers if w.state in _LIVE]

    async def stop_ranks(self, granks: Sequence[int]) -> None:
        """Take processes down on purpose, together, by the shutdown policy."""
        workers = [self.worker(grank) for grank in granks]
        for w in workers:
            if w.state in (*_LIVE, SlotState.LOST):
                w.move(SlotState.STOPPING)
            if w.ready.done():  # retryable calls wait for the restart
                w.ready = self.rt.loop.create_future()
        await _shutdown(workers, self.shutdown)

    async def restart_ranks(self, granks: Sequence[int], everything: bool = False
                            ) -> list[tuple[int, str] | Exception | None]:
        """Replace processes, all at once: each at the same rank and address
        with what its predecessor had (``env``, ``bootstrap``, what
        :attr:`restart_env` adds), actors rebuilt with their constructor
        arguments at the same coordinates (``everything``: temporary actors
        too, as :meth:`replace` does).

        Returns:
            Per rank: its new pid and host; or why it did not come back, a
            failure to count (it did not start: :class:`ProcessStartError`,
            also for a launcher's error; a constructor raised); or None: the
            mesh was stopped, or the new process was lost while its actors
            were rebuilt (its loss was reported to the supervisor already).
        """
        extra: dict[int, dict[str, str]] = {grank: {} for grank in granks}
        for add in self.restart_env:
            for grank, env in add(granks).items():
                extra[grank].update(env)
        results: list[tuple[int, str] | Exception | None] = []
        for result in await asyncio.gather(
                *(self._restart_rank(grank, extra[grank], everything) for grank in granks),
                return_exceptions=True):
            if isinstance(result, Exception) or not isinstance(result, BaseException):
                results.append(result)
            else:
                raise result  # cancelled (and so were the others), interrupted
        return results

    async def _restart_rank(self, grank: int, env: Mapping[str, str],
                            everything: bool) -> tuple[int, str] | None:
        w = self.worker(grank)
        w.move(SlotState.REFILLING if w.state is SlotState.HOLE else SlotState.RESTARTING)
        if w.handle.returncode is None:
            w.handle.send_signal(signal.SIGKILL)
        # On a host cut off, the exit is heard of at the heal, or once the host
        # is downed (its agent has killed it by then): never two incarnations.
        wait = KILL_WAIT + self.partition_timeout
        try:
            await within(w.handle.wait(), wait)
        except TimeoutError:
            raise TimeoutError(
                f"proc mesh {self.name!r} rank {grank}: process {w.handle.pid} on "
                f"{w.handle.host} did not exit within {wait:g} s of SIGKILL; it is not "
                f"replaced while it may still hold its address") from None
        if w.conn is not None and not w.conn.closed:
            w.conn.abort()
        w.conn = None  # what happens on the old connection is the old incarnation's
        w.incarnation += 1
        if self.stopped:
            return None
        spec = w.spec.restarted(w.addr)
        launcher = self.launchers[grank // self.per_host]
        try:
            handle, waiter = await self._launch(grank, replace(spec, env={**spec.env, **env}),
                                                wait_agent=True)
        except ProcessStartError:
            raise
        except Exception as e:  # an agent that refuses it: a failed start
            raise self._not_started(
                grank, launcher.host,
                f"its host's launcher failed: {type(e).__name__}: {e}") from e
        w.handle, w.cause = handle, None
        if w.state is SlotState.RESTARTING:  # (a hole stays one until its replacement serves)
            w.move(SlotState.STARTING)
        try:
            await self._hello(w, waiter)
        except ProcessStartError:
            if self.stopped:  # killed below: not a failure
                return None
            raise
        finally:
            if self.stopped:  # stopped while this one started: it would be leaked
                handle.send_signal(signal.SIGKILL)
        if self.stopped:
            return None
        rt = self.rt
        mine = [a for a in self.actors if grank in a.ranks and grank not in a.stopped]
        lost = [a.target for a in mine if a.options.restart == "temporary" and not everything]
        futs = [a.spawn(w, grank, True) for a in mine if a.target not in lost]
        try:
            await asyncio.gather(*futs)
        except SupervisionError:  # lost while rebuilt (its loss was reported), or stopped
            return None
        assert w.conn is not None
        w.conn.send_message(Restored(lost))
        rt.dead.pop(w.addr, None)
        self.failures.pop(grank, None)  # restarted after all (by a parent supervisor)
        if w.state in (SlotState.STARTING, SlotState.REFILLING):  # (else lost or stopped)
            w.move(SlotState.SERVING)
        for a in mine:
            if a.target in lost:
                self.lost_actors.setdefault(a.target, {})[grank] = (
                    "its actor was temporary and not rebuilt after a restart")
            else:
                self._actor_back(a.target, grank)
        self.version += 1
        if w.ready.done():  # failed by a stop that this restart undoes
            w.ready = rt.loop.create_future()
        w.ready.set_result(None)
        self.published()
        return handle.pid, handle.host

    def restarting(self, grank: int) -> asyncio.Future[None] | None:
        """While the process at ``grank`` is down and may come back: the
        future its return resolves (or fails, if it will not come back);
        None while it serves calls or once nothing will restart it."""
        ready = self.worker(grank).ready
        return None if ready.done() or self.stopped else ready

    def like(self, name: str, host: int, dim: str) -> ProcState:
        """A new proc mesh ``name`` of one process (dim ``dim`` of size 1) on
        host ``host`` of this one, started with this one's options: its
        supervisor, restart type, shutdown, heartbeats, env, bootstrap and
        where its log records go."""
        return ProcState(name, [self.launchers[host]], Region.full((dim,), (1,)), 1,
                         self.supervisor, self.restart, self.shutdown,
                         (self.heartbeat_interval, self.heartbeat_timeout), self.env,
                         self.bootstrap, log_records=self.log_records, log_dir=self.log_dir,
                         partition_timeout=self.partition_timeout)

    async def wait_ready(self, grank: int) -> None:
        """Wait until the process at ``grank`` serves calls again (after a
        restart); raises SupervisionError if it will not."""
        await asyncio.shield(self.worker(grank).ready)

    # ------------------------------------------------- elastic (replace, grow, shrink)

    async def replace(self, grank: int) -> tuple[int, str]:
        """A fresh process at ``grank`` (a hole, or a live one, stopped first
        by the shutdown policy) with all its actors rebuilt, temporary ones
        too; a restart under way is waited for first.  Its new pid and host.

        Raises:
            SupervisionError: the mesh was stopped; or the new process was
                lost while its actors were rebuilt (its loss made the verdict:
                a hole again, with no supervisor).
            ProcessStartError, ActorError: the new process did not start, or
                a constructor raised: the point is a hole (again).
        """
        async with self.reshaping:
            if grank >= len(self.region.ranks):  # (through a slice taken before a shrink)
                raise IndexError(f"replace: rank {grank} of proc mesh {self.name!r} was "
                                 f"removed by a shrink; it has {len(self.region.ranks)} "
                                 f"processes now")
            w = self.worker(grank)
            while not w.ready.done() and not self.stopped:  # a restart (or its verdict)
                await asyncio.wait([asyncio.shield(w.ready)])
            self._check_open("replace")
            if w.state is not SlotState.HOLE and grank in self.failures:  # given up
                raise self.failures[grank]
            try:
                if w.state is not SlotState.HOLE:
                    await self.stop_ranks([grank])
                (result,) = await self.restart_ranks([grank], everything=True)
            except asyncio.CancelledError:
                if not self.stopped:  # (its process stopping or starting: a hole, to fill again)
                    await self._failed_replace(w, "replace cancelled")
                raise
            if isinstance(result, tuple):
                if self.supervisor is not None:
                    self.supervisor.event("restart", self.name, grank, "procs.replace()",
                                          *result)
                return result
            self._check_open("replace")
            if result is None:  # lost while its actors were rebuilt: the verdict is made
                handle = w.handle
                cause, said = _exit_cause(handle)
                what_now = ("it is a hole again: replace it again" if w.state is SlotState.HOLE
                            else "its supervisor decides what comes of it")
                raise SupervisionError(
                    f"replace: proc mesh {self.name!r} rank {grank}: its new process "
                    f"{handle.pid} on {handle.host} {said} while its actors were rebuilt; "
                    f"{what_now}", actor=self.name, rank=grank, host=handle.host,
                    pid=handle.pid, cause=cause)
            await self._failed_replace(w, f"replace failed: {type(result).__name__}: {result}")
            raise result

    async def _failed_replace(self, w: _Worker, cause: str) -> None:
        """Make ``w``'s rank a hole again after :meth:`replace` failed or was
        cancelled (``cause``): its process, old or new, is killed if it runs."""
        conn, w.conn = w.conn, None  # its loss is then not a failure to report
        w.move(SlotState.HOLE)
        if w.handle.returncode is None:
            w.handle.send_signal(signal.SIGKILL)
            await asyncio.wait([awaited(w.handle.wait())], timeout=KILL_WAIT)
        if conn is not None:
            conn.abort()
        handle = w.handle
        failure = SupervisionError(
            f"proc mesh {self.name!r} rank {w.rank}: {cause}", actor=self.name, rank=w.rank,
            host=handle.host, pid=handle.pid, cause=cause)
        self.rt.dead[w.addr] = self.of_hole(lambda p: SupervisionError(
            f"{p.who} on proc mesh {self.name!r} rank {w.rank}: {cause}; "
            f"{p.endpoint} was not sent: it is a hole until procs.replace({w.rank})",
            actor=p.mesh, rank=p.rank, host=handle.host, pid=handle.pid, cause=cause))
        self.failures[w.rank] = failure
        if w.ready.done():
            w.ready = self.rt.loop.create_future()
        self._no_restart(w, failure)

    def _check_open(self, what: str) -> None:
        if self.stopped:
            raise SupervisionError(f"{what}: proc mesh {self.name!r} was stopped; spawn a new "
                                   f"one", actor=self.name, cause="proc mesh stopped")

    def resizable(self, dim: str) -> str | None:
        """Why dimension ``dim`` cannot change size in place (None: it can).

        The processes keep their ranks: only a dim whose points come last in
        row-major order (every dim before it of size 1) can grow or shrink,
        and only on one host (more hosts: resize the host mesh's job)."""
        labels, sizes = self.region.extent.labels, self.region.extent.sizes
        if dim in self.host_dims:
            return (f"{dim!r} is a dimension of the host mesh: the processes of a host "
                    f"cannot be added or removed this way (resize the job)")
        if len(self.launchers) > 1:
            return (f"proc mesh {self.name!r} spans {len(self.launchers)} hosts; only a "
                    f"mesh on one host grows or shrinks in place")
        before = [k for k, n in zip(labels, sizes) if k != dim and n != 1][:1]
        if before and labels.index(before[0]) < labels.index(dim):
            return (f"dimension {before[0]!r} comes before {dim!r} and has size "
                    f"{sizes[labels.index(before[0])]}: changing {dim!r} would renumber the "
                    f"processes; only the first dimension of size > 1 can change size")
        return None

    async def grow(self, dim: str, by: int, hosts: Sequence[ProcLauncher] = ()) -> None:
        """``by`` more points along ``dim`` (checked by :meth:`resizable`, or
        the host dim with ``hosts``, the launchers of the ``by`` new hosts):
        new processes, the actors of the meshes spawned on the whole mesh
        built on them, then those meshes take the new shape.  All or nothing:
        if a process does not start or a constructor raises, the new
        processes are stopped and the shape stays."""
        async with self.reshaping:
            self._check_open("grow")
            await self.ready
            labels, sizes = self.region.extent.labels, list(self.region.extent.sizes)
            sizes[labels.index(dim)] += by
            region = Region.full(labels, sizes)
            old_n, n = len(self.region.ranks), region.extent.nelem
            self.generation += 1
            old_per_host, old_launchers = self.per_host, self.launchers
            if hosts:  # a host dim: per host as before, on more hosts
                self.launchers = [*self.launchers, *hosts]
            else:  # on its one host
                self.per_host = n
            per_host = self.per_host
            added: list[_Worker] = []
            hellos: list[Coroutine[Any, Any, None]] = []
            try:
                for grank in range(old_n, n):
                    spec = self._spec(grank, region.point(grank))
                    handle, waiter = await self._launch(grank, spec)
                    w = _Worker(grank, spec.listen, handle, spec, self.rt.loop)
                    added.append(w)
                    hellos.append(self._hello(w, waiter))
                await together(hellos)
                addrs = [w.addr for w in self.workers] + [w.addr for w in added]
                following = [(a, a.mesh) for a in self.actors if a.mesh is not None]
                built = [_ActorRecord(a.name, a.target, a.cls_blob,
                                      dumps(ActorMesh(a.target, a.name, mesh._cls, region, addrs,
                                                      per_host=per_host,
                                                      max_queued=a.options.max_queued)),
                                      a.body, a.out, list(labels), sizes, region.ranks,
                                      a.options)
                         for a, mesh in following]
                futs = [[b.spawn(w, w.rank, False) for w in added] for b in built]
                await asyncio.gather(*(f for fs in futs for f in fs), return_exceptions=True)
                for (_, mesh), fs in zip(following, futs):
                    errors = [(region.point(w.rank), e) for w, f in zip(added, fs)
                              if (e := f.exception()) is not None]
                    if errors:
                        raise combine_failures(f"{mesh._cls.__qualname__}.__init__", mesh,
                                               errors)
                self._check_open("grow")  # stopped meanwhile: the new processes go too
            except BaseException:
                for hello in hellos:
                    hello.close()  # never awaited when a later launch failed
                for w in added:
                    if w.conn is None:  # no Shutdown can reach it: killed, as by a start given up
                        w.handle.send_signal(signal.SIGKILL)
                self.per_host, self.launchers = old_per_host, old_launchers
                await self._remove(added, "grow failed")
                raise
            self.workers.extend(added)
            self.region = region
            for (a, mesh), b in zip(following, built):
                a.labels, a.sizes, a.ranks, a.mesh_blob = b.labels, b.sizes, b.ranks, b.mesh_blob
                mesh._reshape(region, addrs, region.ranks, per_host)
            self._tell_reshaped(old_n)
            for w in added:
                w.started()
            self.published()

    async def shrink(self, dim: str, by: int) -> None:
        """``by`` fewer points along ``dim`` (checked by :meth:`resizable`,
        or the host dim: the last ``by`` hosts go): the meshes spawned on the
        whole mesh take the new shape first, then the processes of the points
        removed are stopped by the shutdown policy; a supervisor sees a
        ``"stopped"`` event for each, not a failure.  Restarts under way are
        waited for first.  Cancelled before the meshes took the new shape,
        nothing changed; after, the shape stays and the processes removed
        are killed (:meth:`_remove`), reported stopped all the same."""
        async with self.reshaping:
            self._check_open("shrink")
            await self.ready
            labels, sizes = self.region.extent.labels, list(self.region.extent.sizes)
            sizes[labels.index(dim)] -= by
            region = Region.full(labels, sizes)
            n = region.extent.nelem
            removed = [w for w in self.workers if w.rank >= n]
            waits = [asyncio.shield(w.ready) for w in removed if not w.ready.done()]
            if waits:  # each comes back, or is a hole
                await asyncio.wait(waits)
            self._check_open("shrink")
            self.workers = [w for w in self.workers if w.rank < n]
            if dim in self.host_dims:
                self.launchers = self.launchers[:len(self.launchers) - by]
                cause = f"its host was removed by the job's resize to {dim}={sizes[0]}"
            else:
                self.per_host = n
                cause = f"removed by procs.shrink({dim}={by})"
            self.region, per_host = region, self.per_host
            addrs = [w.addr for w in self.workers]
            for a in self.actors:
                if a.mesh is not None:
                    a.labels, a.sizes, a.ranks = list(labels), sizes, region.ranks
                    a.stopped.intersection_update(region.ranks)  # (a later grow's are new)
                    a.mesh_blob = dumps(ActorMesh(a.target, a.name, a.mesh._cls, region, addrs,
                                                  per_host=per_host,
                                                  max_queued=a.options.max_queued))
                    a.mesh._reshape(region, addrs, region.ranks, per_host)
            self._tell_reshaped(n)
            self.published()
            for w in removed:
                self.failures.pop(w.rank, None)
                for target in list(self.lost_actors):
                    self._actor_back(target, w.rank)
            self.version += 1
            try:
                await self._remove(removed, cause)
            finally:
                if self.supervisor is not None:
                    for w in reversed(removed):
                        self.supervisor.event("stopped", self.name, w.rank, "shrink",
                                              w.handle.pid, w.handle.host)

    def _tell_reshaped(self, n: int) -> None:
        """Tell the actors of the meshes that follow the whole mesh, in its
        first ``n`` processes, their mesh's new shape (their context's)."""
        for a in self.actors:
            if a.mesh is None:
                continue
            for w in self.workers[:n]:
                if w.conn is not None and not w.conn.closed and w.rank in a.ranks:
                    w.conn.send_message(Reshaped(a.target, a.ranks.index(w.rank), a.labels,
                                                 a.sizes, a.mesh_blob))

    async def _remove(self, workers: Sequence[_Worker], cause: str) -> None:
        """Stop ``workers`` for good, on purpose (not failures: nothing
        restarts them), and forget them; calls still addressed to them (a
        slice, or a reference held elsewhere) fail with ``cause``.  Cancelled,
        it kills them rather than waiting for them (as :meth:`stop` does)."""
        rt = self.rt
        for w in workers:
            w.move(SlotState.REMOVED)
            for table in (rt.on_lost, rt.watch.on_fault_from, rt.watch.on_pong):
                table.pop(w.addr, None)
            if rt.has_state(_Reports):
                rt.state(_Reports).by_addr.pop(w.addr, None)
            self.responds(w)
            rt.dead[w.addr] = _removed_error(self.name, w, cause)
            self.removed.append(w.addr)
            self._no_restart(w, SupervisionError(
                f"proc mesh {self.name!r} rank {w.rank}: {cause}", actor=self.name,
                rank=w.rank, host=w.handle.host, pid=w.handle.pid, cause=cause))
        try:
            await _shutdown(workers, self.shutdown)
        except BaseException:
            # (cancelled: nothing else would end one that overruns its grace)
            for w in workers:
                w.handle.send_signal(signal.SIGKILL)
            raise
        finally:
            for w in workers:
                rt.pids.pop(rt.routes.pop(w.addr, w.addr), None)
                for conn in (rt.conns.pop(w.addr, None), w.conn):
                    if conn is not None:
                        conn.abort()
                w.conn = None

    # ----------------------------------------------------------------- stop

    def kill(self) -> None:
        for w in self.workers:
            w.handle.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        """Stop every process (gracefully, then SIGKILL: ``shutdown``) and
        wait for their exits.  A stop while one is under way (the owner's, as
        its supervisor gives up and stops its children) waits for that one:
        it returns only once every process has exited either way."""
        if self.stopped:
            if self._stop_done is not None:
                await asyncio.shield(self._stop_done)
            return
        self.stopped = True
        self.version += 1
        self._stop_done = done = self.rt.loop.create_future()
        for w in self.workers:
            w.move(SlotState.STOPPED)
        if self.keep_alive is not None:
            forget_record(self.name, self.id)
        if self._beating is not None:
            self._beating.cancel()
        self._wake()  # wait_failed: stopped, not failed
        for tell in list(self.monitors):
            tell(None)
        try:
            if not self.ready.done() and not self.adopted:
                self.ready.cancel()  # a start under way ends: it kills what it launched
            me = asyncio.current_task()
            cancels = me.cancelling() if me is not None else 0
            try:
                await self.ready
            except asyncio.CancelledError:
                if not self.ready.cancelled() or (me is not None and me.cancelling() > cancels):
                    raise  # (we are cancelled ourselves, not only the start)
            except Exception:
                pass
            await _shutdown(self.workers, self.shutdown)
        except BaseException:
            self.kill()
            raise
        finally:
            # (first: nothing here awaits, so a waiter runs after the rest
            # all the same, and an error below cannot leave it waiting)
            done.set_result(None)
            why, cause = self._stopped_why()
            for w in self.workers:
                self.rt.on_lost.pop(w.addr, None)
                self.rt.watch.on_fault_from.pop(w.addr, None)
                if self.rt.has_state(_Reports):
                    self.rt.state(_Reports).by_addr.pop(w.addr, None)
                self.rt.watch.on_pong.pop(w.addr, None)
                self.responds(w)
                self.rt.dead[w.addr] = self._stopped_error(w)
                self._no_restart(w, SupervisionError(
                    f"proc mesh {self.name!r} was stopped{why}", actor=self.name, rank=w.rank,
                    cause=cause))
            self.flush_faults()

    def release(self) -> None:
        """Forget this mesh (its owner stopped it for good): nothing of it
        stays in the runtime's tables or its supervisor; calls through old
        references fail with :meth:`stopped_error` (``ActorMesh`` asks its
        proc mesh), or as unreachable where a reference has no proc mesh."""
        if self.released:
            return
        self.released = True
        self.flush_faults()
        rt = self.rt
        for grank in self.region.ranks:
            rt.watch.hello_waiters.pop(f"{self.id}-{grank}", None)
        for addr in self.removed:
            rt.dead.pop(addr, None)
        for w in self.workers:
            rt.pids.pop(rt.routes.pop(w.addr, w.addr), None)
            rt.peer_jobs.pop(w.addr, None)
            for table in (rt.dead, rt.on_lost, rt.watch.on_fault_from, rt.watch.on_pong):
                table.pop(w.addr, None)
            for conn in (rt.conns.pop(w.addr, None), w.conn):
                if conn is not None:
                    conn.abort()
            w.conn = None
        sup = self.supervisor
        if sup is not None and self in sup.children:
            sup.children.remove(self)
        for forget in self.on_release:
            forget()
        self.on_release.clear()
        if self.owner is not None:  # nothing left for its owner to stop: this, its actors
            self.owner._owned[:] = [
                t for t in self.owner._owned if t is not self and not (
                    isinstance(t, ActorMesh) and t._procs is not None and t._procs._state is self)]
        self.actors.clear()  # constructor arguments: nothing will rebuild them now

    def stopped_error(self, p: Pending) -> SupervisionError:
        """The error of a call to an actor of this mesh once it is stopped."""
        return self._stopped_error(None)(p)

    def _stopped_why(self) -> tuple[str, str]:
        """Why this mesh was stopped, as its errors say it (`` after its
        supervisor gave up (...)``, or nothing), and their ``cause``."""
        sup = self.supervisor
        if sup is not None and sup.failure is not None:
            return f" after its supervisor gave up ({sup.failure.cause})", "supervisor gave up"
        return "", "proc mesh stopped"

    def _stopped_error(self, w: _Worker | None) -> Callable[[Pending], SupervisionError]:
        why, cause = self._stopped_why()

        def error(p: Pending) -> SupervisionError:
            return SupervisionError(
                f"{p.who}: proc mesh {self.name!r} was stopped{why}; spawn a new "
                f"one", actor=p.mesh, rank=p.rank, host="" if w is None else w.handle.host,
                pid=-1 if w is None else w.handle.pid, cause=cause)
        return error


def _removed_error(name: str, w: _Worker, cause: str) -> Callable[[Pending], SupervisionError]:
    """The error of a call to a process a shrink removed."""
    host, pid = w.handle.host, w.handle.pid

    def error(p: Pending) -> SupervisionError:
        return SupervisionError(
            f"{p.who} on proc mesh {name!r} rank {w.rank}: process {pid} on "
            f"{host} was {cause}; {p.endpoint} was not sent", actor=p.mesh, rank=p.rank,
            host=host, pid=pid, cause=cause)
    return error


def _exit_cause(handle: ProcHandle) -> tuple[str, str]:
    """Why a process that has exited is gone: the error's ``cause``, and
    what its message says (the same, but for a downed host: ``"partitioned"``
    and how long its host was unreachable)."""
    if handle.downed is not None:
        return "partitioned", handle.downed
    cause = describe_exit(handle.returncode)
    return cause, cause


def _may_follow(conn: Connection) -> bool:
    """Whether more of what the process at the other end of ``conn`` wrote
    before its exit, or its end's close, may still come.  On a Unix socket,
    its exit closed its end (unless another process shares it): what it
    wrote, and the end, are in our socket already, unread only if it is
    readable.  Over TCP (a worker on another host) they may be on their way."""
    sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
    if sock is None or sock.family != socket.AF_UNIX:
        return True
    poll = select.poll()
    poll.register(sock.fileno(), select.POLLIN)
    return bool(poll.poll(0))


def _abort(ref: weakref.ref[Connection]) -> None:
    conn = ref()
    if conn is not None:
        conn.abort()  # (closed meanwhile: nothing)


def _moved(w: _Worker, conn: Connection) -> bool:
    """Data moved between us and ``w`` since the last heartbeat (a large
    message): it is alive, though its pong may be queued behind that data
    (or our ping behind what we send it).  What we send moves when the
    transport resumed our writing (it had sent what it held: the peer
    reads) or its buffer shrank."""
    transport = conn.transport
    mark = (conn._rx, conn._resumed,
            transport.get_write_buffer_size() if transport is not None else 0)
    moved = mark[:2] != w.moved[:2] or mark[2] < w.moved[2]
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
    waits = [awaited(w.handle.wait()) for w in workers]
    if not waits:
        return
    _, pending = await asyncio.wait(waits, timeout=KILL_WAIT if policy == "brutal_kill"
                                    else policy)
    if pending and policy != "brutal_kill":
        for w in workers:
            w.handle.send_signal(signal.SIGKILL)
        _, pending = await asyncio.wait(pending, timeout=KILL_WAIT)
    for wait in pending:  # on a host cut off: its agent kills it once it hears
        wait.cancel()


class _HeldFaults:
    """Per runtime: the proc meshes holding faults of their actors
    (:meth:`ProcState._fault`), printed at once when the runtime closes."""

    def __init__(self, rt: Runtime) -> None:
        self.meshes: set[ProcState] = set()

    def close(self) -> None:
        for state in list(self.meshes):
            state.flush_faults()


class _Reports:
    """Per runtime: who to tell what a worker reports of itself (a stalled
    call, its loop held), by worker address (the proc mesh of that worker)."""

    def __init__(self, rt: Runtime) -> None:
        self.by_addr: dict[str, Callable[[Stalled | LoopHeld | ActorStopped], None]] = {}

    def close(self) -> None:
        self.by_addr.clear()


def _on_report(rt: Runtime, conn: Connection, msg: Stalled | LoopHeld | ActorStopped,
               bufs: Buffers) -> None:
    tell = rt.state(_Reports).by_addr.get(conn.peer or "")
    if tell is not None:
        tell(msg)
    elif isinstance(msg, Stalled):  # a worker of a mesh this runtime no longer watches
        log.warning("%s", stall_line(msg))
    if isinstance(msg, ActorStopped):  # noted
        conn.send_message(Reply(msg.req, MSGPACK_NIL))


register_handler(Stalled, _on_report)
register_handler(LoopHeld, _on_report)
register_handler(ActorStopped, _on_report)
