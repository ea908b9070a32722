"""Supervision trees with OTP's vocabulary.

A :class:`Supervisor` owns children in declaration order: the processes of
the proc meshes started with ``spawn_procs(..., supervisor=sup)`` (with the
actors spawned on them) and child supervisors (``Supervisor(...,
parent=sup)``).  When a process fails — it exits, its connection is lost, it
misses heartbeats, or an actor in it raises with nobody to tell — the
strategy decides what restarts:

- ``one_for_one``: the failed process only;
- ``one_for_all``: every child (the SPMD gang);
- ``rest_for_one``: the failed process and every child declared after it.

More than ``max_restarts`` restarts ``within`` seconds (OTP's intensity and
period) and the supervisor gives up: it stops its children in reverse order
and escalates to its parent, or, at the root, to the controller
(``await sup.wait_failed()``, the ``on_escalate`` hook, and the error raised
when the supervised proc mesh's ``async with`` block exits).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import traceback
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from types import FunctionType
from typing import Any, Literal, Protocol, cast, runtime_checkable

from .._checks import check_count, check_seconds
from .._context import _context
from .._exceptions import SupervisionError
from .._transport._messages import ErrorInfo
from .._transport._runtime import Runtime, check_loop, runtime
from .._transport._tasks import TaskOwner
from ._clocks import Clock, MonotonicClock
from ._events import EventKind, SupervisionEvent

__all__ = (
    "RestartType",
    "ShutdownPolicy",
    "Strategy",
    "Supervisor",
)

Strategy = Literal["one_for_one", "one_for_all", "rest_for_one"]
RestartType = Literal["permanent", "transient", "temporary"]
#: ``"brutal_kill"``: SIGKILL at once; a number: seconds of grace after a
#: graceful shutdown request, then SIGKILL
ShutdownPolicy = Literal["brutal_kill"] | float

log = logging.getLogger("meshio")

_STRATEGIES = ("one_for_one", "one_for_all", "rest_for_one")
_RESTARTS = ("permanent", "transient", "temporary")
_EVENT_HISTORY = 10_000
#: what a supervisor calls on its clock (:class:`Clock`)
_CLOCK_METHODS = ("now", "sleep")


class _Ranked(Protocol):
    @property
    def rank(self) -> int: ...


class Supervised(Protocol):
    """What a supervisor needs of a proc mesh it supervises (the process
    slots of ``spawn_procs(..., supervisor=sup)``, ``meshio._proc_state``)."""

    @property
    def name(self) -> str:
        """The proc mesh's name, for events and errors."""
        ...

    @property
    def stopped(self) -> bool:
        """Stopped by its owner: nothing of it is restarted."""
        ...

    @property
    def workers(self) -> Sequence[_Ranked]:
        """Its processes, one restart unit each."""
        ...

    @property
    def rt(self) -> Runtime:
        """The meshio runtime it belongs to (of the event loop that made it)."""
        ...

    @property
    def restart_type(self) -> RestartType:
        """``permanent``, ``transient`` or ``temporary``."""
        ...

    async def stop(self) -> None:
        """Stop every process."""

    def running(self) -> list[tuple[int, int, str]]:
        """(rank, pid, host) of each of its processes that runs (not lost,
        failed, a hole or stopped): what :meth:`stop` takes down."""
        ...

    async def stop_ranks(self, granks: Sequence[int], /) -> None:
        """Stop the processes of ranks ``granks``, together."""

    async def restart_ranks(self, granks: Sequence[int],
                            /) -> list[tuple[int, str] | Exception | None]:
        """Start ranks ``granks`` again with their actors, together (a gang
        restarts in the time of one process); per rank its new pid and host,
        or why it did not come back (a failure to count), or None (nothing
        to count: the mesh was stopped, or the replacement's loss was
        reported as a failure already)."""
        ...

    def reopen(self) -> None:
        """Accept restarts again (its supervisor was restarted by its parent)."""


class Supervisor:
    """Owns proc meshes (with their actors) and child supervisors, and
    restarts them when they fail.

    Args:
        strategy: ``"one_for_one"`` | ``"one_for_all"`` | ``"rest_for_one"``.
        max_restarts: restart intensity (OTP default 1) ...
        within: ... within this period in seconds (OTP default 5).
        name: used in events and errors.
        parent: the supervisor this one is a child of (declared in order
            with the parent's other children).
        heartbeat_interval: seconds between heartbeats to each process.
        heartbeat_timeout: a process silent this long is declared hung,
            killed and restarted (default: 3 intervals).
        poison_after: a call (of a retryable endpoint, so redelivered after
            each restart) that kills its process this many times in a row is
            not delivered again: it fails with
            :class:`~meshio.PoisonMessageError`, a ``"poison"`` event says
            so, and its crashes count as one failure against the intensity
            (the crashes of its redeliveries do not count).
        clock: time source for heartbeats and the intensity window: a
            :class:`~meshio.supervision.Clock`, an object with ``now()`` and
            ``async sleep(seconds)`` (None: the real clock,
            :class:`~meshio.supervision.MonotonicClock`;
            ``meshio.supervision.ManualClock()`` in tests).
        on_escalate: called with the error when this supervisor gives up (after
            an owning actor's ``__supervise__``, if any, did not handle it), on
            the loop that created the supervisor; returning True (or an
            awaitable of True) handles it: the escalation stops there (no
            parent supervisor or owning actor's process hears of it, the
            supervised proc mesh's ``async with`` exits without raising; the
            children stay stopped, and :attr:`failure` and :meth:`wait_failed`
            still report it). If it raises, the exception is logged and the
            escalation goes on.

    Raises:
        TypeError: an argument has the wrong type: ``strategy`` or
            ``name`` is not a str, ``max_restarts`` or ``poison_after`` not
            an int (a bool or a float such as ``3.0`` is refused), a number
            of seconds not an int or float (a str, a bool, None),
            ``parent`` not a Supervisor, ``clock`` not a clock (an instance
            with ``now`` and ``sleep``), or ``on_escalate`` not callable;
            the message names the argument and the type received.
        ValueError: an argument of the right type is out of its range: an
            unknown ``strategy``, a count below its least, seconds that are
            not > 0 (or NaN, or an int no float holds), named in the
            message.
    """

    def __init__(
        self,
        strategy: Strategy = "one_for_one",
        *,
        max_restarts: int = 1,
        within: float = 5.0,
        name: str = "supervisor",
        parent: Supervisor | None = None,
        heartbeat_interval: float = 1.0,
        heartbeat_timeout: float | None = None,
        poison_after: int = 3,
        clock: Clock | None = None,
        on_escalate: Callable[[SupervisionError], bool | Awaitable[bool | None] | None]
        | None = None,
    ) -> None:
        _check_types(strategy, name, parent, clock, on_escalate)
        if strategy not in _STRATEGIES:
            raise ValueError(f"Supervisor: strategy must be one of {_STRATEGIES}, got {strategy!r}")
        check_count(max_restarts, "Supervisor: max_restarts", 0)
        within = check_seconds(within, "Supervisor", "within")
        check_count(poison_after, "Supervisor: poison_after", 1)
        heartbeat_interval = check_seconds(heartbeat_interval, "Supervisor", "heartbeat_interval")
        if heartbeat_timeout is not None:
            heartbeat_timeout = check_seconds(heartbeat_timeout, "Supervisor", "heartbeat_timeout",
                                              also=" or None")
        self.strategy: Strategy = strategy
        self.max_restarts: int = max_restarts
        self.within: float = within
        self.name: str = name
        self.parent: Supervisor | None = parent
        self.heartbeat_interval: float = heartbeat_interval
        self.heartbeat_timeout: float = (
            3 * heartbeat_interval if heartbeat_timeout is None else heartbeat_timeout)
        self.poison_after: int = poison_after
        self.clock: Clock = MonotonicClock() if clock is None else clock
        self.on_escalate: Callable[
            [SupervisionError], bool | Awaitable[bool | None] | None] | None = on_escalate
        self.children: list[Supervised | Supervisor] = []
        self.failure: SupervisionError | None = None
        #: whether ``__supervise__`` or ``on_escalate`` handled the escalation
        #: (None: no escalation, or its hooks are still running)
        self._handled: bool | None = None
        self._restarts: list[float] = []
        #: (id(child), rank) of units a pending restart will start again
        self._scheduled: set[tuple[int, int]] = set()
        #: its restarts and escalations under way
        self._tasks = TaskOwner(f"supervisor {name!r}")
        self._events: list[SupervisionEvent] = []
        self._listeners: list[asyncio.Queue[SupervisionEvent]] = []
        self._failed: asyncio.Future[SupervisionError] | None = None
        self._lock: asyncio.Lock | None = None
        self._owner: Any = None
        if parent is not None:
            parent.children.append(self)
        try:
            ctx = _context.get()
        except LookupError:
            pass
        else:  # created inside an actor: that actor owns it (__supervise__)
            self._owner = ctx

    def __repr__(self) -> str:
        return (f"<Supervisor {self.name!r} {self.strategy} max_restarts={self.max_restarts} "
                f"within={self.within}>")

    # ------------------------------------------------------------ events

    def _emit(self, event: SupervisionEvent) -> None:
        self._events.append(event)
        del self._events[:-_EVENT_HISTORY]
        for q in self._listeners:
            q.put_nowait(event)

    def event(self, kind: EventKind, mesh: str,
              rank: int, cause: str, pid: int = -1, host: str = "") -> SupervisionEvent:
        ev = SupervisionEvent(kind, time.time(), self.name, mesh, rank, cause, pid, host)
        self._emit(ev)
        return ev

    async def events(self) -> AsyncGenerator[SupervisionEvent, None]:
        """Every event of this supervisor, from its start (the last 10,000:
        a long job's history is bounded), then live ones as they happen
        (failure, restart, stopped, escalation).  Never ends by itself:
        break out of the loop when done.

        Raises:
            WrongLoopError: iterated on another event loop than the one of
                the proc meshes it supervises (:meth:`stop`).
        """
        self._check_loop()
        queue: asyncio.Queue[SupervisionEvent] = asyncio.Queue()
        for ev in self._events:
            queue.put_nowait(ev)
        self._listeners.append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._listeners.remove(queue)

    def _failed_future(self) -> asyncio.Future[SupervisionError]:
        if self._failed is None:
            self._failed = asyncio.get_running_loop().create_future()
            if self.failure is not None and self._handled is not None:
                self._failed.set_result(self.failure)
        return self._failed

    async def wait_failed(self) -> SupervisionError:
        """Wait until this supervisor gives up (and its ``__supervise__`` /
        ``on_escalate`` hooks have run); the escalation error.

        Raises:
            WrongLoopError: awaited on another event loop than the one of
                the proc meshes it supervises (:meth:`stop`).
        """
        self._check_loop()
        return await asyncio.shield(self._failed_future())

    def _home(self) -> Runtime | None:
        """The runtime of the proc meshes it supervises (its own children's,
        else its child supervisors'): its events and failure are waited on
        that runtime's loop.  None: it supervises none now."""
        for child in self.children:
            rt = child._home() if isinstance(child, Supervisor) else child.rt
            if rt is not None:
                return rt
        return None

    def _check_loop(self) -> None:
        """Raise unless running on the loop of :meth:`_home` (if any): what
        its waits and :meth:`stop` ask first."""
        home = self._home()
        if home is not None:
            check_loop(home, f"supervisor {self.name!r}, like the proc meshes it supervises,")

    # --------------------------------------------------------- decisions

    def _serial(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def _order(self) -> list[tuple[Supervised | Supervisor, int]]:
        """Children as restart units in declaration order: one per process of
        a proc mesh, one per child supervisor (rank -1)."""
        units: list[tuple[Supervised | Supervisor, int]] = []
        for child in self.children:
            if isinstance(child, Supervisor):
                units.append((child, -1))
            elif not child.stopped:  # stopped by its owner: nothing to restart
                units.extend((child, w.rank) for w in child.workers)
        return units

    def child_failed(self, child: Supervised | Supervisor, rank: int, cause: str, *,
                     abnormal: bool = True, pid: int = -1, host: str = "",
                     counted: bool = True) -> bool:
        """A child failed (called by the proc mesh or a child supervisor);
        True if it will be restarted.  ``counted``: False when the process
        died while redelivering a call that killed it before (its restart
        does not count against the intensity: see ``poison_after``)."""
        name = child.name
        self.event("failure", name, rank, cause, pid, host)
        if self.failure is not None:
            return False
        if not isinstance(child, Supervisor) and child.stopped:
            return False
        restart = child.restart_type if not isinstance(child, Supervisor) else "permanent"
        if restart == "temporary" or (restart == "transient" and not abnormal):
            return False
        if (id(child), rank) in self._scheduled:
            return True  # a restart already on its way covers it (one gang, one restart)
        now = self.clock.now()
        self._restarts = [t for t in self._restarts if now - t < self.within]
        done = len(self._restarts)  # restarts begun within the period (a failed one too)
        if counted and done >= self.max_restarts:
            self._tasks.start(self._escalate(
                f"{_who(child, rank)} failed ({cause}) after {done} "
                f"restart{'' if done == 1 else 's'} in the last {self.within}s; "
                f"max_restarts={self.max_restarts} within {self.within}s allows no more",
                host))
            return False
        if counted:
            self._restarts.append(now)
        units = self._order()
        me = units.index((child, rank)) if (child, rank) in units else 0
        match self.strategy:
            case "one_for_one":
                targets = [(child, rank)]
            case "one_for_all":
                targets = units
            case _:
                targets = units[me:]
        self._scheduled.update((id(u), r) for u, r in targets)
        self._tasks.start(self._restart(targets, (child, rank)))
        return True

    async def _restart(self, targets: list[tuple[Supervised | Supervisor, int]],
                       failed: tuple[Supervised | Supervisor, int]) -> None:
        async with self._serial():
            if self.failure is not None:
                return
            gangs = _gangs(targets)
            try:
                for unit, ranks in reversed(gangs):
                    if unit is failed[0]:
                        ranks = [r for r in ranks if r != failed[1]]
                    if ranks:
                        await self._stop_gang(unit, ranks)
                for unit, ranks in gangs:
                    # failures of these ranks count from now on
                    self._scheduled.difference_update((id(unit), r) for r in ranks)
                    errors = await self._start_gang(unit, ranks)
                    if errors:  # each one more failure (the strategy restarts what it covers)
                        self._scheduled.difference_update((id(u), r) for u, r in targets)
                        for rank, e in errors:
                            self._start_failed(unit, rank, e)
                        return
            except Exception as e:  # a stop that fails is one more failure too
                self._scheduled.difference_update((id(u), r) for u, r in targets)
                self._start_failed(*failed, e)

    def _start_failed(self, unit: Supervised | Supervisor, rank: int, e: Exception) -> None:
        """A restart of ``unit``'s ``rank`` failed with ``e``: one more failure."""
        if self.failure is not None or (not isinstance(unit, Supervisor) and unit.stopped):
            return
        if isinstance(e, SupervisionError):
            pid, host = e.pid, e.host
        else:  # a constructor or on_restart raised: in the replacement, which runs
            pid, host = next(((p, h) for r, p, h in (
                () if isinstance(unit, Supervisor) else unit.running()) if r == rank), (-1, ""))
        self.child_failed(unit, rank, f"restart failed: {type(e).__name__}: {e}", pid=pid,
                          host=host)

    async def _stop_gang(self, unit: Supervised | Supervisor, ranks: list[int]) -> None:
        if isinstance(unit, Supervisor):
            await unit.stop()
            self.event("stopped", unit.name, -1, f"{self.strategy} restart")
            return
        running = {rank: (pid, host) for rank, pid, host in unit.running()}
        await unit.stop_ranks(ranks)
        for rank in reversed(ranks):  # (each event names the process it stopped)
            pid, host = running.get(rank, (-1, ""))
            self.event("stopped", unit.name, rank, f"{self.strategy} restart", pid, host)

    async def _start_gang(self, unit: Supervised | Supervisor,
                          ranks: list[int]) -> list[tuple[int, Exception]]:
        """Start a gang (the processes of one proc mesh, together; or a child
        supervisor), one ``restart`` event per process up; the failures to
        count."""
        if isinstance(unit, Supervisor):
            try:
                await unit._start_all()
            except Exception as e:
                return [(-1, e)]
            self.event("restart", unit.name, -1, f"{self.strategy} restart")
            return []
        errors: list[tuple[int, Exception]] = []
        for rank, result in zip(ranks, await unit.restart_ranks(ranks)):
            if isinstance(result, tuple):
                pid, host = result
                self.event("restart", unit.name, rank, f"{self.strategy} restart", pid, host)
            elif result is not None:
                errors.append((rank, result))
        return errors

    async def _start_all(self) -> None:
        """Start every child again (this supervisor restarted by its parent)."""
        self.failure = None
        self._handled = None
        self._failed = None
        self._restarts = []
        for child in self.children:
            if not isinstance(child, Supervisor):
                child.reopen()
        for unit, ranks in _gangs(self._order()):
            errors = await self._start_gang(unit, ranks)
            if errors:
                raise errors[0][1]

    async def _escalate(self, why: str, host: str) -> None:
        """Give up: stop the children, report upwards.  ``host``: where the
        failure that used up the restarts happened (the error's ``host``)."""
        async with self._serial():
            if self.failure is not None:
                return
            error = SupervisionError(
                f"supervisor {self.name!r} gave up: {why}; its children are stopped",
                actor=self.name, cause=why, host=host)
            self.failure = error
            await self._stop_children(f"supervisor {self.name!r} gave up")
            self.event("escalation", self.name, -1, why)
        owner_said = ""
        try:
            handled = await self._handled_by_owner(error)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a failing hook handles nothing: the escalation goes on
            handled = False
            owner_said = "".join(traceback.format_exception(e))
        if not handled and self.on_escalate is not None:
            try:
                result = self.on_escalate(error)
                if isinstance(result, Awaitable):
                    result = await result
                handled = result is True
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # the hook's own failure must not hide the escalation
                log.error("meshio: on_escalate hook of supervisor %r failed; the escalation "
                          "goes on", self.name, exc_info=e)
        self._handled = handled
        fut = self._failed_future()
        if not fut.done():
            fut.set_result(error)
        if handled:
            return
        if self.parent is not None:
            self.parent.child_failed(self, -1, why)
        elif self._owner is not None:
            self._report_to_owners_controller(error, owner_said)

    async def _handled_by_owner(self, error: SupervisionError) -> bool:
        """Monarch's ``__supervise__``: the actor owning this supervisor may
        handle the failure; True stops the escalation."""
        if self._owner is None:
            return False
        instance = _owner_instance(self._owner)
        hook = getattr(instance, "__supervise__", None) if instance is not None else None
        if hook is None:
            return False
        result: object = hook(error)
        if isinstance(result, Awaitable):
            result = await cast("Awaitable[object]", result)
        return result is True

    def _report_to_owners_controller(self, error: SupervisionError, owner_said: str) -> None:
        """Nobody in the owning actor's process handled the escalation: it
        becomes a failure of that actor, sent to the controller of its proc
        mesh like an exception escaping a broadcast (its supervisor replaces
        the process; without one it is reported on the controller's stderr)."""
        ctx = self._owner
        how = ("its __supervise__ raised" if owner_said
               else "neither __supervise__ nor on_escalate handled it")
        runtime().report_fault(ErrorInfo(
            "supervision", "meshio.SupervisionError",
            f"{error} (supervisor owned by actor {ctx.actor_name} rank {ctx.point.rank}; {how})",
            owner_said, ctx.actor_name, ctx.point.rank))

    async def stop(self) -> None:
        """Stop every child, in reverse declaration order.

        Raises:
            WrongLoopError: awaited on another event loop than the one its
                proc meshes belong to (the loop their ``spawn_procs`` ran
                on: it alone can wait on them), or from a thread that runs
                none; nothing is stopped.  Once that loop has ended:
                :class:`~meshio.ClosedResourceError`.
        """
        self._check_loop()
        await self._stop_children()

    async def _stop_children(self, gave_up: str = "") -> None:
        """Stop every child in reverse declaration order, each once the one
        declared after it is down (OTP's order; a proc mesh's processes
        together, by its shutdown policy).  ``gave_up``: the cause of a
        ``"stopped"`` event for each process it takes down (in reverse rank
        order) and each child supervisor that had not given up itself, as
        its child is down."""
        for child in reversed(list(self.children)):  # an owner may release one meanwhile
            if isinstance(child, Supervisor):
                up = child.failure is None
                await child.stop()
                if gave_up and up:
                    self.event("stopped", child.name, -1, gave_up)
                continue
            running = child.running()
            await child.stop()
            if gave_up:
                for rank, pid, host in reversed(running):
                    self.event("stopped", child.name, rank, gave_up, pid, host)


def _check_types(strategy: object, name: object, parent: object, clock: object,
                 on_escalate: object) -> None:
    """Refuse, when the supervisor is built, the arguments of the wrong type
    that would otherwise fail only once a process fails (a clock without
    ``now`` stopped its restarts and left calls to the mesh hanging)."""

    def got(value: object) -> str:
        return f"got {type(value).__name__} {value!r}"

    if not isinstance(strategy, str):
        raise TypeError(f"Supervisor: strategy must be a str, one of {_STRATEGIES}, "
                        f"{got(strategy)}")
    if not isinstance(name, str):
        raise TypeError(f"Supervisor: name must be a str (it names the supervisor in events "
                        f"and errors), {got(name)}")
    if parent is not None and not isinstance(parent, Supervisor):
        raise TypeError(f"Supervisor: parent must be the meshio.Supervisor this one is a child "
                        f"of, or None, {got(parent)}")
    if clock is not None:
        if isinstance(clock, type) and any(
                isinstance(inspect.getattr_static(clock, m, None), FunctionType)
                for m in _CLOCK_METHODS):
            raise TypeError(f"Supervisor: clock must be a clock object, got the class "
                            f"{clock.__qualname__}; pass an instance: "
                            f"clock={clock.__qualname__}()")
        missing = [m for m in _CLOCK_METHODS if not callable(getattr(clock, m, None))]
        if missing:
            raise TypeError(
                f"Supervisor: clock must be a meshio.supervision.Clock, an object with "
                f"now() -> float and async sleep(seconds) (e.g. "
                f"meshio.supervision.ManualClock() in tests; None for the real clock), "
                f"{got(clock)}, which has no {' or '.join(f'{m}()' for m in missing)}")
    if on_escalate is not None and not callable(on_escalate):
        raise TypeError(f"Supervisor: on_escalate must be a function called with the "
                        f"SupervisionError when the supervisor gives up, or None, "
                        f"{got(on_escalate)}")


def _gangs(units: list[tuple[Supervised | Supervisor, int]]
           ) -> list[tuple[Supervised | Supervisor, list[int]]]:
    """Restart units in order, grouped into gangs: the ranks of one proc
    mesh that follow each other go together; a child supervisor alone."""
    gangs: list[tuple[Supervised | Supervisor, list[int]]] = []
    for unit, rank in units:
        if gangs and gangs[-1][0] is unit and not isinstance(unit, Supervisor):
            gangs[-1][1].append(rank)
        else:
            gangs.append((unit, [rank]))
    return gangs


def _who(child: Supervised | Supervisor, rank: int) -> str:
    if isinstance(child, Supervisor):
        return f"child supervisor {child.name!r}"
    return f"proc mesh {child.name!r} rank {rank}"


@runtime_checkable
class _Hosting(Protocol):
    """An actor cell as supervision sees it: the actor's context and instance."""

    ctx: Any
    instance: Any


def _owner_instance(ctx: Any) -> Any:
    for cell in runtime().actors.values():
        if isinstance(cell, _Hosting) and cell.ctx is ctx:
            return cell.instance
    return None
