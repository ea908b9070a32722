"""``Service``: the actors of an actor mesh used as interchangeable
replicas, with routing, failover to live replicas, scaling and statistics.

A service lives in the process that made it (the controller, or an actor):
it learns of its replicas' deaths and restarts from that process's runtime
and supervisors, so it is not a value passed to other actors.

Who owns the processes: the replicas ``scale`` starts (a proc mesh each)
belong to the proc mesh of the actor mesh the service was made from, as
its own processes do: they stop when it stops for good (``procs.stop()``,
leaving ``async with``, or the actor that started it stopping), when the
service is stopped, or when ``scale`` removes them.  Dropping the service
object stops nothing.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import inspect
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, NoReturn, ParamSpec, TypeVar, cast, get_args

from ._actor import Actor
from ._actor_mesh import ActorMesh, endpoint_named, endpoint_of
from ._checks import check_seconds
from ._exceptions import CallTimeout, DeadlockError, SupervisionError
from ._extent import MeshShape, Region
from ._proc_mesh import ProcMesh
from ._proc_state import ProcState, _ActorRecord
from ._stacks import STACKS_TIMEOUT, Stacks
from ._tracing import traced
from ._transport._connection import Gathering
from ._transport._credit import Waiting
from ._transport._runtime import check_loop
from ._transport._serial import OutBuffers, Unsendable
from ._transport._tasks import together
from ._value_mesh import ValueMesh
from .endpoints._endpoint import Endpoint, EndpointDescriptor, OnFull, Route, Site, combine_failures

__all__ = ("ReplicaStats", "Service")

A = TypeVar("A", bound=Actor)
P = ParamSpec("P")
R = TypeVar("R")

#: answered calls per replica whose latency the percentiles are taken over
LATENCY_WINDOW = 1000
#: sticky sessions remembered (the least recently used is forgotten beyond:
#: its next call is routed as a new session's)
SESSION_LIMIT = 100_000


@dataclass(frozen=True)
class ReplicaStats:
    """One replica of a :class:`Service`, as :meth:`Service.stats` reports it
    and a routing function sees the live ones.

    Attributes:
        replica: the replica's number in the service: ``0, 1, ...`` for the
            actors of the mesh it was made from (in point order), the next
            numbers for replicas ``scale`` adds (never reused).
        alive: it serves calls (its process is up and not being restarted,
            and its actor was not stopped nor ended for good).
        in_flight: calls routed to it (``route``, ``choose``, ``call_one``)
            not answered yet.
        completed: calls routed to it that were answered (with a result or
            the endpoint's own exception).
        latency_p50: median seconds from sending a call to its answer, over
            its last 1000 answered calls (None before the first).
        latency_p90: 90th percentile of the same.
        latency_p99: 99th percentile of the same.
    """

    replica: int
    alive: bool
    in_flight: int
    completed: int
    latency_p50: float | None
    latency_p90: float | None
    latency_p99: float | None


Policy = Literal["round_robin", "least_loaded", "sticky"]
#: a routing function: given the live replicas (never none) and the call's
#: session (None without one), the replica to call: one of those given
Router = Callable[[Sequence[ReplicaStats], Hashable | None], ReplicaStats]
_POLICIES: tuple[Policy, ...] = get_args(Policy)


class _Replica:
    """One replica: a one-actor view, the host it runs on, the proc mesh the
    service started for it (None: the user's) with the one it belongs to
    (``origin``, see :func:`_stops_with`), what its proc mesh keeps of its
    actor mesh (``record``: which actors were stopped), and its call
    statistics."""

    __slots__ = (
        "_sorted",
        "_window",
        "calls",
        "completed",
        "host",
        "id",
        "idle",
        "mesh",
        "origin",
        "procs",
        "record",
        "retired",
        "unhook",
    )

    def __init__(self, replica: int, mesh: ActorMesh[Any], host: int,
                 procs: ProcMesh | None = None, origin: ProcState | None = None,
                 unhook: Callable[[], None] | None = None) -> None:
        self.id = replica
        self.mesh = mesh
        self.host = host
        self.procs = procs
        self.origin = origin
        owner = mesh._procs
        #: None: a reference received from another process, whose stops
        #: (as its holes) only the process that spawned it knows of
        self.record: _ActorRecord | None = None if owner is None else next(
            (a for a in owner._state.actors if a.target == mesh._target), None)
        #: undoes :func:`_stops_with` (the replica is stopped by the service)
        self.unhook = unhook
        #: the calls routed to it not yet answered, each with its endpoint
        self.calls: dict[asyncio.Future[Any], EndpointDescriptor[Any, Any, Any]] = {}
        self.completed = 0
        #: set once no call is in flight, while the replica is being retired
        self.idle: asyncio.Event | None = None
        #: its stop began (:func:`_retire`): a cancelled shrink keeps it out
        self.retired = False
        self._window: deque[float] = deque()
        self._sorted: list[float] = []

    def up(self) -> bool:
        """It serves calls: not known dead, restarting or stopped (nor is the
        proc mesh it belongs to: its stop is under way), nor a hole (its
        actor ended for good: ``ProcState.hole``), nor is its actor stopped."""
        if (self.origin is not None and self.origin.stopped) or self.stopped():
            return False
        mesh = self.mesh
        route = mesh._route
        procs = mesh._procs
        return route.down(route.runtime(), 0) is None and not (
            procs is not None and procs._state.hole(mesh._region.ranks[0], mesh._target))

    def stopped(self) -> bool:
        """Its actor was stopped (``stop()`` on its actor mesh or a slice of
        it, ``Service.stop``): it never serves again, though its process
        may (a restart does not rebuild it)."""
        return self.record is not None and self.mesh._region.ranks[0] in self.record.stopped

    def back(self) -> asyncio.Future[None] | None:
        """While it is down and may come back: the future its restart resolves."""
        procs = self.mesh._procs
        if procs is None or self.stopped():
            return None
        return procs._state.restarting(self.mesh._region.ranks[0])

    def gone(self) -> bool:
        """It never serves again: it is not :meth:`up` and nothing brings it
        back (a hole, its actor stopped, its supervisor gave up, its proc
        mesh stopped).  A process just died whose proc mesh has not yet
        decided whether to restart it is not gone."""
        return not self.up() and self.back() is None

    @property
    def in_flight(self) -> int:
        """How many calls routed to it are not yet answered."""
        return len(self.calls)

    def track(self, fut: asyncio.Future[Any], desc: EndpointDescriptor[Any, Any, Any]) -> None:
        """Count the call of ``desc`` whose answer ``fut`` is, until it is settled."""
        start = time.perf_counter()  # (not the loop's clock: uvloop's counts milliseconds)
        self.calls[fut] = desc

        def done(f: asyncio.Future[Any]) -> None:
            del self.calls[f]
            if not f.cancelled() and not isinstance(f.exception(), SupervisionError):
                self._answered(time.perf_counter() - start)
            if self.idle is not None and not self.in_flight:
                self.idle.set()

        fut.add_done_callback(done)

    def _answered(self, seconds: float) -> None:
        self.completed += 1
        self._window.append(seconds)
        bisect.insort(self._sorted, seconds)
        if len(self._window) > LATENCY_WINDOW:
            del self._sorted[bisect.bisect_left(self._sorted, self._window.popleft())]

    def _percentile(self, q: float) -> float | None:
        s = self._sorted
        return s[max(0, math.ceil(q * len(s)) - 1)] if s else None  # nearest rank

    def stats(self, alive: bool) -> ReplicaStats:
        return ReplicaStats(self.id, alive, self.in_flight, self.completed,
                            self._percentile(0.5), self._percentile(0.9),
                            self._percentile(0.99))

    def cut_off(self, drain_timeout: float | None, service: str) -> None:
        """Fail the calls routed to it still in flight when a shrink's
        ``drain_timeout`` passed (see :func:`_retire`), each naming it, before
        it is stopped (``route``, ``choose`` and ``call_one`` alike)."""
        for fut, desc in list(self.calls.items()):
            fut.set_exception(SupervisionError(
                f"service {service!r}: {desc.qualname} to replica {self.id} had no answer when "
                f"scale() removed that replica and its drain_timeout={drain_timeout}s passed: "
                f"the replica is stopped with the call in flight; give scale() a longer "
                f"drain_timeout (or None) to let such calls finish", actor=service,
                cause="drain timeout"))

    def down(self, desc: EndpointDescriptor[Any, Any, Any]) -> SupervisionError:
        """Why it serves no calls (it is not :meth:`up`), as a call of
        ``desc`` to it would fail."""
        mesh = self.mesh
        origin = self.origin
        if origin is not None and origin.stopped:
            why = f"proc mesh {origin.name!r} it belongs to was stopped"
            cause = "proc mesh stopped"
        elif self.stopped():  # (its proc mesh may have forgotten it: the whole mesh stopped)
            why = "its actor was stopped (stop() on its actor mesh or a slice holding it)"
            cause = "its actor was stopped"
        else:  # (its process is down, or a hole: its proc mesh says why)
            return mesh._none_serves(mesh._route.runtime(), desc)
        rank = mesh._site(0).rank
        return SupervisionError(f"{mesh._name} rank {rank}: {why}; {desc.qualname} was not sent",
                                actor=mesh._name, rank=rank, cause=cause)


class Service(MeshShape):
    """The actors of an actor mesh (of any shape) as interchangeable
    replicas: ``svc = meshio.Service(generators, routing="least_loaded")``,
    then ``await svc.generate.route(prompt, session=...)`` calls one replica.
    The other adverbs reach every replica, as on the mesh
    (``svc.generate.call()``: a :class:`~meshio.ValueMesh` with one dim,
    ``replicas``).

    Routing (``routing=``):

    - ``"least_loaded"`` (the default): the live replica with the fewest
      calls in flight from this service; ties go round-robin.
    - ``"round_robin"``: the live replicas in turn.
    - ``"sticky"``: every call with the same ``session=`` key reaches the
      same replica while it lives; a new session (or one whose replica died
      or was removed: it moves) goes to the least loaded live replica and
      stays there.  Calls without a session are routed least-loaded.
    - a function ``router(replicas, session) -> replica``: given the
      :class:`ReplicaStats` of the live replicas and the call's session
      (None without one), it returns one of them.  It runs in the caller's
      loop for every call: keep it quick.

    ``route(..., session=...)`` with ``"least_loaded"`` or ``"round_robin"``
    raises ValueError (nothing sent): they would ignore the session.

    Failures: a replica whose process died is out of rotation as soon as
    this process learns of it (its connection drops), and back once its
    supervisor has restarted it and rebuilt its actor; one whose actor was
    stopped (``stop()`` on the actor mesh or a slice of it, its process
    serving on) or ended for good (a hole) is out of rotation for good,
    until :meth:`scale` replaces it.
    ``route`` sends a failed call again as the endpoint's retry policy says
    (``@endpoint(retry=meshio.Retry(...))``: its attempts, exception types,
    backoff and the call's deadline, as ``call_one`` does; ``retryable``
    retries :class:`~meshio.SupervisionError`), each time to the replica
    the routing picks then (a sticky session's own while it is alive): a
    call in flight to a replica that went out of rotation fails over to
    another live one at once, other failures are sent again after the
    backoff.  Without a policy that retries it, the failure is raised
    (:class:`~meshio.SupervisionError` for a replica gone).  While no
    replica is alive, calls wait for one being restarted; with none coming
    back they raise :class:`~meshio.SupervisionError`.

    Lifetime: the replicas :meth:`scale` starts belong to the proc mesh of
    the actor mesh the service was made from, as its own processes do: they
    stop when that proc mesh stops for good (``procs.stop()``, leaving its
    ``async with``, or the actor that started it stopping; its supervisor
    giving up stops them with it), and are out of rotation from the moment
    its stop begins.  :meth:`stop` stops them all at once; dropping the
    service object stops nothing.  A stopped service stays stopped: every
    adverb and :meth:`scale` raise :class:`~meshio.SupervisionError`.

    Type checkers see a service as its actor class (as a mesh from
    ``procs.spawn``), so ``svc.generate.route(...)`` has the endpoint's
    result type; :meth:`scale` and :meth:`stats` are declared there too.
    ``svc.call(Cls.endpoint, ...)`` and :meth:`stacks` work as on a mesh,
    over the replicas; ``slice``, ``flatten``, ``rename`` and ``split``
    raise TypeError (slice the mesh before making the service).

    Raises:
        TypeError: ``actor_mesh`` is not an actor mesh, or ``routing`` is
            neither a policy name nor callable.
        ValueError: ``routing`` is an unknown policy name, or the mesh is empty.
    """

    # The second typing lie, after ``spawn``'s: a service is typed as its
    # actor class, so endpoints (and their ``route``) type-check on it.  The
    # construction is in ``__new__`` (no ``__init__``: type checkers would
    # take the instance type from it).
    def __new__(  # type: ignore[misc]
            cls, actor_mesh: A, routing: Policy | Router = "least_loaded") -> A:
        self = super().__new__(cls)
        self._start_with(actor_mesh, routing)
        return cast(A, self)

    def _start_with(self, actor_mesh: Actor, routing: Policy | Router) -> None:
        if not isinstance(actor_mesh, ActorMesh):
            raise TypeError(
                f"Service: expected an actor mesh (as procs.spawn(...) returns), got "
                f"{type(actor_mesh).__name__} {actor_mesh!r}")
        if isinstance(routing, str):
            if routing not in _POLICIES:
                raise ValueError(f"Service: routing must be one of {_POLICIES} or a function "
                                 f"(replicas, session) -> replica, got {routing!r}")
        elif not callable(routing):
            raise TypeError(f"Service: routing must be one of {_POLICIES} or a function "
                            f"(replicas, session) -> replica, got {type(routing).__name__} "
                            f"{routing!r}")
        mesh: ActorMesh[Any] = actor_mesh
        if not len(mesh):
            raise ValueError(f"Service: actor mesh {mesh._name!r} is empty; a service needs "
                             f"at least one replica")
        self._mesh = mesh
        self._name: str = mesh._name
        self._cls: type[Any] = mesh._cls  # pyright: ignore[reportUnknownMemberType]
        self._routing: Policy | Router = routing
        per_host = mesh._per_host
        self._replicas: list[_Replica] = []
        self._region: Region = Region.full(("replicas",), (0,))
        self._set([_Replica(i, mesh.slice(**dict(point)), grank // per_host if per_host else 0,
                            None)
                   for i, (point, grank) in enumerate(zip(mesh, mesh._region.ranks))])
        self._next = len(self._replicas)
        self._rr = 0
        self._sessions: OrderedDict[Hashable, _Replica] = OrderedDict()
        self._scaling = asyncio.Lock()
        #: proc meshes a grow is starting (not replicas yet), and replicas a
        #: shrink took out that wait for their calls: stop() stops them too
        self._starting: set[ProcMesh] = set()
        self._leaving: set[_Replica] = set()
        #: set by stop(): done once its replicas are stopped
        self._stopped: asyncio.Future[None] | None = None

    def _set(self, replicas: list[_Replica]) -> None:
        self._replicas = replicas
        self._region = Region.full(("replicas",), (len(replicas),))

    def _check_open(self) -> None:
        """Raise if the service was stopped: what every use of it does then."""
        if self._stopped is not None:
            raise SupervisionError(
                f"service {self._name!r} was stopped (Service.stop()): it has no replicas and "
                f"serves no calls; make a new service of a live actor mesh",
                actor=self._name, cause="service stopped")

    def _check_loop(self) -> None:
        """Raise unless running on the event loop the service belongs to (its
        actor mesh's): what :meth:`stop` and :meth:`scale` ask first, before
        they change anything (its calls ask their replica's mesh)."""
        owner = self._mesh._route.owner()
        if owner is not None:  # (None: a reference not used yet, which any loop may take)
            check_loop(owner, f"service {self._name!r}")

    def _with_region(self, region: Region) -> NoReturn:
        raise TypeError(f"service {self._name!r}: a service's replicas are not sliced; slice "
                        f"the actor mesh before making a service of it")

    def __repr__(self) -> str:
        routing = self._routing if isinstance(self._routing, str) else repr(self._routing)
        return (f"<Service {self._name!r} of {self._cls.__qualname__}: "
                f"{len(self._replicas)} replicas, {routing}>")

    def __reduce__(self) -> NoReturn:
        raise Unsendable(self, f"service {self._name!r}", "it lives where it was made; pass "
                         "the actor mesh and make a service there")

    def __getattr__(self, name: str) -> _ServiceEndpoint[Any, Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        desc = endpoint_named(self._cls, name,
                              f"service {self._name!r} of {self._cls.__qualname__}")
        ep: _ServiceEndpoint[Any, Any] = _ServiceEndpoint(self, desc)
        self.__dict__[name] = ep  # later reads skip __getattr__
        return ep

    # ---------------------------------------------------------- operations

    def call(self, ep: EndpointDescriptor[Any, P, R], /, *args: P.args,
             **kwargs: P.kwargs) -> asyncio.Future[ValueMesh[R]]:
        """``svc.call(Generator.generate, prompt)``: same as
        ``svc.generate.call(prompt)`` (every replica), as on a mesh."""
        desc = endpoint_of(self._cls, ep, f"service {self._name!r}")
        return _ServiceEndpoint(self, desc).call(*args, **kwargs)

    async def stacks(self, *, timeout: float = STACKS_TIMEOUT) -> Stacks:
        """What the replicas are doing now, as ``ActorMesh.stacks`` says:
        one entry per replica, its ``point`` its place in the ``replicas``
        dim (as in ``svc.generate.call()``'s value mesh) and its ``rank``
        that index too; a replica that cannot answer is an error line.

        Raises:
            SupervisionError: the service was stopped.
            TypeError, ValueError: ``timeout`` is not seconds > 0.
        """
        self._check_open()
        timeout = check_seconds(timeout, "stacks", "timeout")
        parts = await together(r.mesh.stacks(timeout=timeout) for r in self._replicas)
        return Stacks(tuple(replace(a, rank=i, point={"replicas": i})
                            for i, part in enumerate(parts) for a in part.actors),
                      tuple(e for part in parts for e in part.errors))

    def stats(self) -> list[ReplicaStats]:
        """Per replica, in order: whether it is alive, its calls in flight
        and answered, and their latency percentiles (see :class:`ReplicaStats`)."""
        return [r.stats(r.up()) for r in self._replicas]

    async def scale(self, *, replicas: int, drain_timeout: float | None = None) -> None:
        """Grow or shrink the service to ``replicas`` replicas that serve
        calls, or will once their supervisor has restarted them (as Ray
        Serve aims at running replicas, counting those recovering).

        Replicas gone for good (not alive, and nothing restarts them: a
        process dead with no supervisor, a hole, an actor stopped) do not
        count: ``scale`` removes them and starts new replicas in their
        place (``scale(replicas=len(svc))`` only replaces them).  A
        replica whose process died counts while its supervisor restarts it
        (or while its proc mesh has not yet decided whether anything will):
        it serves again without ``scale``.

        Growing starts each new replica in a proc mesh of its own (one
        process, dim ``replicas``) on the hosts of the actor mesh's proc
        mesh (the host mesh or job it was spawned on), the least used host
        first, with that proc mesh's options (supervisor, restart type,
        shutdown, heartbeats, env, bootstrap), and spawns the same actor
        class there with the same constructor arguments.  New replicas are
        in rotation once all of them are up; if one fails to start, those
        started are stopped and the error is raised.

        Shrinking removes the replicas being restarted first, then the
        replicas ``scale`` added, newest first, then the mesh's own actors
        from the last point back.  A removed replica (also one gone for
        good) is out of rotation at once; it is stopped once the calls
        routed to it (``route``, ``choose``, ``call_one``) are answered
        (not those of ``call``, ``stream`` or ``broadcast`` to every
        replica: those fail for it with :class:`~meshio.SupervisionError`,
        as a proc mesh's ``shrink`` fails them for the points it removes):
        its proc mesh if the service started it, else its actor (the
        process belongs to the user's proc mesh and keeps running; a
        restart does not rebuild the actor).  ``scale`` returns then.
        ``drain_timeout`` (seconds, 0 included; None: no limit) bounds that
        wait: past it, the replica is stopped with its calls in flight,
        which fail with :class:`~meshio.SupervisionError` naming the
        replica and the drain timeout, ``cause="drain timeout"`` (for
        ``route``, ``choose`` and ``call_one`` alike; a ``route`` whose
        retry policy retries it goes to another replica instead).
        Cancelled while it waits for those calls (``asyncio.wait_for``), it
        puts the removed replicas whose stop had not begun back in rotation,
        as they were before (:meth:`stop` and the next ``scale`` count
        them); those whose stop had begun are stopped.

        The new replicas belong to the proc mesh of the actor mesh (see
        :class:`Service`): they stop when it stops for good.

        Scale calls run one after the other.

        Raises:
            TypeError: ``replicas`` is not an int, or ``drain_timeout`` is
                neither a number of seconds nor None.
            ValueError: ``replicas`` < 1, or ``drain_timeout`` < 0 or NaN.
            RuntimeError: growing a service whose actor mesh was received
                from another process (only the process that spawned it
                holds its proc mesh).
            WrongLoopError: called from another event loop than the one
                the service's actor mesh belongs to, or from a thread that
                runs none (:class:`~meshio.ClosedResourceError` once that
                loop has ended).
            SupervisionError: the service was stopped (before or while
                growing: nothing it started is left running); the proc mesh
                of the actor mesh was stopped (before or while growing: the
                same); or a new process failed to start
                (:class:`~meshio.ProcessStartError`).
        """
        if isinstance(replicas, bool) or not isinstance(replicas, int):
            raise TypeError(f"scale(replicas=...) must be an int, got "
                            f"{type(replicas).__name__} {replicas!r}")
        if replicas < 1:
            raise ValueError(f"scale(replicas=...) must be >= 1 (service {self._name!r}), "
                             f"got {replicas}; stop() stops every replica")
        drain = None if drain_timeout is None else check_seconds(
            drain_timeout, "scale", "drain_timeout", zero=True, also=" or None")
        self._check_loop()
        self._check_open()
        async with self._scaling:
            self._check_open()  # (stopped while an earlier scale ran)
            gone = [r for r in self._replicas if r.gone()]
            n = len(self._replicas) - len(gone)
            if replicas > n:
                await self._grow(replicas - n)
            # kept first: replicas that serve, the mesh's own, the oldest
            kept = sorted((r for r in self._replicas if r not in gone),
                          key=lambda r: (not r.up(), r.procs is not None, r.id))
            leaving = [*gone, *kept[replicas:]]
            if leaving:
                await self._shrink(leaving, None if drain == math.inf else drain)

    async def stop(self) -> None:
        """Stop every replica now: the proc meshes the service started (those
        a ``scale`` under way is starting, and those it is removing, too),
        and the actors of the mesh it was made from (their processes keep
        running).  Calls in flight or queued fail with
        :class:`~meshio.SupervisionError`; a ``scale`` under way raises it.
        The service stays stopped: later calls, and ``scale``, raise
        SupervisionError; ``len(svc)`` is 0 and ``stats()`` empty.
        Returns once every replica is stopped; a stop while one is under way
        waits for that one.

        Raises:
            WrongLoopError: called from another event loop than the one the
                service's actor mesh belongs to, or from a thread that runs
                none; nothing is stopped (:class:`~meshio.ClosedResourceError`
                once that loop has ended).
        """
        self._check_loop()
        if self._stopped is not None:
            await asyncio.shield(self._stopped)
            return
        self._stopped = done = asyncio.get_running_loop().create_future()
        replicas = [*self._replicas, *self._leaving]
        starting = list(self._starting)
        self._set([])
        self._sessions.clear()
        try:
            await asyncio.gather(*(_stop(r) for r in replicas),
                                 *(procs.stop() for procs in starting))
        finally:
            done.set_result(None)

    # ------------------------------------------------------------ scaling

    def _template(self) -> tuple[ProcState, _ActorRecord]:
        """The proc mesh of the mesh the service was made from, and what
        its actors were spawned with."""
        procs = self._mesh._procs
        if procs is None:
            raise RuntimeError(
                f"service {self._name!r}: scale() needs the proc mesh of actor mesh "
                f"{self._name!r}, which only the process that spawned it holds; make the "
                f"service there")
        state = procs._state
        record = next((a for a in state.actors if a.target == self._mesh._target), None)
        if record is None or state.stopped:
            raise SupervisionError(
                f"service {self._name!r}: cannot add replicas: proc mesh {state.name!r} of "
                f"actor mesh {self._name!r} was stopped", actor=self._name,
                cause="proc mesh stopped")
        return state, record

    async def _grow(self, k: int) -> None:
        state, record = self._template()
        load = [0] * len(state.launchers)
        for r in self._replicas:
            load[r.host] += 1
        hosts: list[int] = []
        for _ in range(k):
            host = load.index(min(load))
            load[host] += 1
            hosts.append(host)
        ids = range(self._next, self._next + k)
        self._next += k
        results = await asyncio.gather(
            *(self._start(i, host, state, record) for i, host in zip(ids, hosts)),
            return_exceptions=True)
        started = [r for r in results if isinstance(r, _Replica)]
        failures = [e for e in results if isinstance(e, BaseException)]
        if self._stopped is not None or state.stopped or failures:
            # (stopped meanwhile, the service or the proc mesh they belong
            # to: what was started would outlive it; a start that failed
            # then was cancelled by that stop, and says nothing useful)
            await asyncio.gather(*(_stop(r) for r in started))
            self._check_open()
            if state.stopped:
                raise SupervisionError(
                    f"service {self._name!r}: scale() stopped: proc mesh {state.name!r} of "
                    f"actor mesh {self._name!r} was stopped while new replicas started; "
                    f"they are stopped", actor=self._name, cause="proc mesh stopped")
            raise failures[0]
        self._set(self._replicas + started)

    async def _start(self, replica: int, host: int, state: ProcState,
                     record: _ActorRecord) -> _Replica:
        self._check_open()  # (stopped before this task ran: start nothing)
        procs = ProcMesh(state.like(f"{self._name}-replica-{replica}", host, "replicas"),
                         Region.full(("replicas",), (1,)), record.options)
        unhook = _stops_with(state, procs)
        self._starting.add(procs)
        try:
            mesh: ActorMesh[Any] = await procs._spawn_packed(self._name, self._cls,
                                                             record.body, record.out)
        except BaseException:
            unhook()
            await procs.stop()
            raise
        finally:
            self._starting.discard(procs)
        return _Replica(replica, mesh, host, procs, state, unhook)

    async def _shrink(self, leaving: list[_Replica], drain_timeout: float | None) -> None:
        self._set([r for r in self._replicas if r not in leaving])
        for session in [s for s, r in self._sessions.items() if r in leaving]:
            del self._sessions[session]
        self._leaving.update(leaving)
        try:
            await asyncio.gather(*(_retire(r, drain_timeout, self._name) for r in leaving))
        except asyncio.CancelledError:
            # (gather's tasks are done: each was cancelled waiting for its
            # calls, or its stop began, which a cancel does not undo)
            back = [r for r in leaving if not r.retired]
            for r in back:
                r.idle = None
            if self._stopped is None:  # (else stop() stopped them: they were leaving)
                self._set(sorted([*self._replicas, *back], key=lambda r: r.id))
            raise
        finally:
            self._leaving.difference_update(leaving)

    # ------------------------------------------------------------ routing

    async def _routed(self, desc: EndpointDescriptor[Any, Any, Any], body: bytes,
                      out: OutBuffers, session: Hashable | None, deadline: float | None,
                      on_full: OnFull = "wait", sent: list[_Replica] | None = None) -> Any:
        """Call one replica, sent again as the endpoint's retry policy says
        (:class:`~meshio.Retry`: its attempts, ``on`` types, backoff and the
        call's deadline), each time to the replica the routing picks then
        (a sticky session's own while it serves).  A replica out of rotation
        since the call failed on it (its process died, its actor stopped)
        is failed over at once; other failures wait the policy's backoff.
        ``on_full="raise"``: if the chosen replica's mailbox is full,
        :class:`~meshio.Overloaded`.  ``sent``: each replica it was sent
        to is appended there (for the caller's timeout message)."""
        policy = desc.retry
        attempt = 0
        while True:
            attempt += 1
            replica = await self._pick(session)
            if on_full == "raise":
                replica.mesh._check_room(desc)
            # (once: the retries are this loop's, to a replica routed anew)
            fut = replica.mesh._route.request(0, desc, body, out, deadline, True)
            replica.track(fut, desc)
            if sent is not None:
                sent.append(replica)
            try:
                return await fut
            except Exception as e:
                failover = isinstance(e, SupervisionError) and not replica.up()
                if policy is None or not policy.sends_again(
                        e, attempt, deadline, 0.0 if failover else policy.delay(attempt)):
                    raise
                if failover:
                    continue  # out of rotation now: another replica, at once
                await asyncio.sleep(policy.delay(attempt))

    async def _pick(self, session: Hashable | None) -> _Replica:
        """The live replica to call; while none is, wait for one coming back."""
        while True:
            self._check_open()
            live = [r for r in self._replicas if r.up()]
            if live:
                return self._choose(live, session)
            backs = [f for r in self._replicas if (f := r.back()) is not None]
            if not backs:
                procs = self._mesh._procs
                why = (f"proc mesh {procs._state.name!r} they belong to was stopped"
                       if procs is not None and procs._state.stopped else
                       "nothing restarts them (their actor stopped, no supervisor, their "
                       "restart type, or the supervisor gave up)")
                raise SupervisionError(
                    f"service {self._name!r}: no replica serves calls: its "
                    f"{len(self._replicas)} replicas are down and {why}",
                    actor=self._name, cause="no live replica")
            await asyncio.wait(backs, return_when=asyncio.FIRST_COMPLETED)

    def _choose(self, live: list[_Replica], session: Hashable | None) -> _Replica:
        routing = self._routing
        if callable(routing):
            views = [r.stats(True) for r in live]
            chosen = routing(views, session)
            for r, view in zip(live, views):
                if view is chosen:
                    return r
            raise ValueError(f"service {self._name!r}: routing function {routing!r} returned "
                             f"{chosen!r}; it must return one of the ReplicaStats it is given")
        if routing == "round_robin":
            self._rr += 1
            return live[(self._rr - 1) % len(live)]
        if routing == "least_loaded" or session is None:
            return self._least_loaded_of(live)
        sessions = self._sessions
        pinned = sessions.get(session)
        if pinned is None or pinned not in live:  # a new session, or its replica is down or gone
            pinned = sessions[session] = self._least_loaded_of(live)
        sessions.move_to_end(session)
        if len(sessions) > SESSION_LIMIT:
            sessions.popitem(last=False)
        return pinned

    def _least_loaded_of(self, live: list[_Replica]) -> _Replica:
        """Fewest calls in flight; ties go round-robin."""
        n = len(live)
        start = self._rr % n
        self._rr += 1
        best = live[start]
        for k in range(1, n):
            r = live[(start + k) % n]
            if r.in_flight < best.in_flight:
                best = r
        return best

    # -------------------------------------------------- the call target
    # What its endpoints' adverbs call (meshio.endpoints.CallTarget), by
    # index in the replicas.  Each adverb reads _route or calls one of the
    # others below _route before it sends anything (choose: see
    # _ServiceEndpoint): a stopped service raises there.

    @property
    def _route(self) -> _Replicas:
        self._check_open()
        return _Replicas(self)

    def _request_all(self, desc: EndpointDescriptor[Any, Any, Any], body: bytes,
                     out: OutBuffers, gather: bool, deadline: float | None = None
                     ) -> list[asyncio.Future[Any]]:
        self._check_open()
        return [r.mesh._route.request(0, desc, body, out, deadline) for r in self._replicas]

    def _gather_all(self, desc: EndpointDescriptor[Any, Any, Any], body: bytes,
                    out: OutBuffers, deadline: float | None = None) -> Gathering:
        self._check_open()
        parts = [r.mesh._gather_all(desc, body, out, deadline) for r in self._replicas]
        return _Joined(asyncio.get_running_loop(), parts, desc, self._name,
                       [r.mesh._site(0) for r in self._replicas])

    def _send_all(self, desc: EndpointDescriptor[Any, Any, Any], body: bytes,
                  out: OutBuffers, deadline: float | None = None) -> list[Waiting]:
        self._check_open()
        return [f for r in self._replicas for f in r.mesh._send_all(desc, body, out, deadline)]

    def _deadlocked(self, desc: EndpointDescriptor[Any, Any, Any],
                    sends: Sequence[Waiting]) -> DeadlockError | None:
        return next((e for r in self._replicas
                     if (e := r.mesh._deadlocked(desc, sends)) is not None), None)

    def _check_room(self, desc: EndpointDescriptor[Any, Any, Any],
                    indices: Sequence[int] | None = None, *, backlog: bool = False) -> None:
        self._check_open()
        for index in range(len(self._replicas)) if indices is None else indices:
            self._replicas[index].mesh._check_room(desc, backlog=backlog)

    def _site(self, index: int) -> Site:
        return self._replicas[index].mesh._site(0)

    def _least_loaded(self, desc: EndpointDescriptor[Any, Any, Any]) -> int:
        live = [r for r in self._replicas if r.up()]
        if not live:
            raise cast(SupervisionError, combine_failures(
                desc.qualname, self, [(p, r.down(desc)) for p, r in zip(self, self._replicas)],
                head=f"{desc.qualname}: choose found no replica of service {self._name!r} "
                     f"that serves calls"))
        return self._replicas.index(self._least_loaded_of(live))

    def _hole(self, index: int, error: BaseException) -> bool:
        return self._replicas[index].mesh._hole(0, error)

    def _as_called(self, route: Route) -> Service:
        assert isinstance(route, _Replicas)
        if route.replicas is self._replicas:
            return self
        called = object.__new__(Service)  # (scaled since: the replicas it was called on)
        called.__dict__.update(self.__dict__)
        called._set(route.replicas)
        return called


async def _retire(r: _Replica, drain_timeout: float | None, service: str) -> None:
    """Stop a replica taken out of rotation once its routed calls are
    answered, or ``drain_timeout`` seconds have passed (None: no limit; past
    it, those calls fail: :meth:`_Replica.cut_off`)."""
    if r.in_flight:
        r.idle = asyncio.Event()
        try:
            await asyncio.wait_for(r.idle.wait(), drain_timeout)
        except TimeoutError:
            r.cut_off(drain_timeout, service)
    r.retired = True
    await _stop(r)


async def _stop(r: _Replica) -> None:
    if r.unhook is not None:
        r.unhook()
    if r.procs is not None:
        await r.procs.stop()
    else:
        await r.mesh.stop()


def _stops_with(origin: ProcState, procs: ProcMesh) -> Callable[[], None]:
    """Make ``procs`` (a replica's proc mesh) stop when ``origin`` (the proc
    mesh it belongs to) is stopped for good: released, by ``procs.stop()``,
    ``async with`` or its owning actor's stop.  The stop runs in a task of
    the runtime's, which closes with it.  Returns what undoes this (the
    service stopping ``procs`` itself), so that ``origin`` holds nothing of
    replicas gone."""

    def stop() -> None:
        origin.rt.tasks.start(procs.stop(), name=f"meshio: stop {procs._state.name!r} with "
                                                 f"proc mesh {origin.name!r}")

    origin.on_release.append(stop)

    def unhook() -> None:
        if stop in origin.on_release:
            origin.on_release.remove(stop)

    return unhook


class _Joined(Gathering):
    """The answers of a call to every replica: one gathering per replica
    (replicas of different actor meshes are different targets), joined."""

    __slots__ = ("_parts",)

    def __init__(self, loop: asyncio.AbstractEventLoop, parts: list[Gathering],
                 desc: EndpointDescriptor[Any, Any, Any], name: str,
                 sites: Sequence[Site]) -> None:
        super().__init__(loop, "", [0] * len(parts), desc.unpack_result, desc.qualname, name,
                         sites)
        self._parts = parts
        for index, part in enumerate(parts):
            part.fut.add_done_callback(functools.partial(self._settle_from, index, part))

    def _settle_from(self, index: int, part: Gathering, _: asyncio.Future[None]) -> None:
        slot = self.slots[index]
        if slot.settled:  # abandoned meanwhile
            return
        if part.errors:
            slot.set_exception(part.errors[0])
        else:
            slot.set_result(part.values[0])

    def abandon(self, msg: str | None = None) -> None:
        for part in self._parts:
            part.abandon(msg)
        super().abandon(msg)


class _Replicas:
    """A service's calls to one replica at a time (its ``_route``, as a
    mesh's: ``choose``, ``call_one``): index ``i`` is its ``i``-th replica,
    whose calls it counts; a call a shrink cut off says so (see
    :meth:`_Replica.cut_off`), as a routed one does.  It keeps the replicas
    of when it was read: a call's answers are judged by them
    (:meth:`Service._as_called`), whatever :meth:`Service.scale` did since."""

    __slots__ = ("replicas",)

    def __init__(self, service: Service) -> None:
        self.replicas = service._replicas  # (scale() replaces the list: this one stays)

    @property
    def ranks(self) -> Sequence[int]:
        return range(len(self.replicas))

    def request(self, index: int, desc: EndpointDescriptor[Any, Any, Any], body: bytes,
                out: OutBuffers, deadline: float | None = None,
                once: bool = False) -> asyncio.Future[Any]:
        replica = self.replicas[index]
        fut = replica.mesh._route.request(0, desc, body, out, deadline, once)
        replica.track(fut, desc)
        return fut


class _ServiceEndpoint(Endpoint[P, R]):
    """An endpoint of a service: the mesh's adverbs over the replicas, and
    :meth:`route`."""

    __slots__ = ("_service", "_takes_session")

    _TARGET: ClassVar[str] = "service"
    _ADVERBS: ClassVar[tuple[str, ...]] = (
        "route(...) (one replica, chosen by the service's routing)",
        "choose(...) (one replica, the least loaded)",
        "call(...) (every replica, gathered into a ValueMesh)",
        "stream(...) (answers as they arrive)",
        "broadcast(...) (no answers)")

    def __init__(self, service: Service, desc: EndpointDescriptor[Any, P, R],
                 timeout: float | None = None, on_full: OnFull = "wait") -> None:
        super().__init__(service, desc, timeout, on_full)
        self._service = service
        self._takes_session = "session" in inspect.signature(desc.fn).parameters

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[R]:
        """As on a mesh (one replica, the least loaded of those that serve
        calls; with none, :class:`~meshio.SupervisionError` naming each
        replica's cause, nothing sent); a stopped service raises
        SupervisionError (not the empty mesh's
        :class:`~meshio.MeshShapeError`)."""
        self._service._check_open()
        return super().choose(*args, **kwargs)

    @traced
    async def route(self, *args: Any, session: Hashable | None = None, **kwargs: Any) -> R:
        """Call one replica, chosen by the service's routing, and again as
        the endpoint's retry policy says (see :class:`Service`);
        ``session``: the sticky-session key (routing ``"sticky"`` or a
        routing function only: the other policies refuse it with
        ValueError, nothing sent)."""
        if self._takes_session:
            raise TypeError(
                f"{self._qualname} takes a parameter named 'session', which route() takes "
                f"for the routing key; rename the parameter to route calls to it")
        try:
            hash(session)  # (whatever the routing: a sticky one keys a dict by it)
        except TypeError:
            raise TypeError(f"{self._qualname}.route(session=...) must be hashable (a str, an "
                            f"int, a tuple), got {type(session).__name__} {session!r}") from None
        routing = self._service._routing
        if session is not None and routing in ("least_loaded", "round_robin"):
            raise ValueError(
                f"{self._qualname}.route(session={session!r}) on service "
                f"{self._service._name!r}: its routing {routing!r} ignores sessions; make the "
                "service with routing=\"sticky\" (or a routing function, which is given the "
                "session) for calls of a session to reach the same replica, or leave out "
                "session=")
        body, packer = self._encode(args, kwargs)
        sent: list[_Replica] = []
        routed = self._service._routed(self._desc, body, packer, session, self._deadline(),
                                       self._on_full, sent)
        if self._timeout is None:
            result: R = await routed
            return result
        within = asyncio.timeout(self._timeout)
        try:
            async with within:
                result = await routed
        except TimeoutError:
            if not within.expired():
                raise
            if not sent:
                raise CallTimeout(
                    f"{self._qualname} routed on service {self._service._name!r}: no answer "
                    f"within {self._timeout}s: no replica served calls to send it to (it "
                    f"waited for one being restarted)", endpoint=self._qualname) from None
            last = sent[-1]
            rank = last.mesh._site(0).rank
            raise CallTimeout(
                f"{self._qualname} routed on service {self._service._name!r}: no answer within "
                f"{self._timeout}s from replica {last.id} ({last.mesh._name!r} rank {rank}, "
                f"sent {len(sent)} time(s))", endpoint=self._qualname, ranks=(rank,)) from None
        return result
