"""``ActorMesh``: a reference to actors spawned on a proc mesh.

A mesh reference is a value: pickled into an argument or a result it
arrives in another process as a working reference that calls the actors
directly (not through the controller).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Container, Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, cast

import msgspec

from ._constants import MAX_QUEUED
from ._context import call_scope
from ._exceptions import (
    DeadlockError,
    Overloaded,
    PoisonMessageError,
    SupervisionError,
    UnknownEndpointError,
)
from ._extent import Extent, MeshShape, Point, Region, rank_runs, shared_ranks
from ._stacks import STACKS_TIMEOUT, Stacks, gather
from ._tracing import ENABLED as TRACING
from ._tracing import current as current_trace
from ._transport._connection import (
    DEADLINE,
    Connection,
    Gathering,
    Pending,
    ReplyFuture,
    Settle,
    Slot,
    ignore_result,
)
from ._transport._credit import Gate, Waiting, Window, budget, window_gone
from ._transport._fanout import split
from ._transport._messages import Call, Cancel, Fanout, StopActor, encode_message
from ._transport._runtime import (
    Runtime,
    actor_thread,
    existing_runtime,
    no_running_loop,
    not_its_loop,
    runtime,
)
from ._transport._serial import Handing, OutBuffers, limits
from ._transport._tasks import owning, when_done
from .endpoints._endpoint import Endpoint, EndpointDescriptor, Route, combine_failures

if TYPE_CHECKING:
    from ._proc_mesh import ProcMesh
    from ._proc_state import ProcState
    from ._value_mesh import ValueMesh

__all__ = ("ActorMesh",)

log = logging.getLogger("meshio")

#: the running loop or None (C; read per call, so bound here once)
_running_loop = asyncio.events._get_running_loop

A = TypeVar("A")
P = ParamSpec("P")
R = TypeVar("R")


class ActorMesh(MeshShape, Generic[A]):
    """Actors of class ``A``, one per point.  Endpoints are attributes:
    ``mesh.train.call(step=0)``; ``mesh.call(Trainer.train, step=0)`` is the
    explicit spelling."""

    def __init__(self, target: str, name: str, cls: type[A], region: Region,
                 addrs: Sequence[str], procs: ProcMesh | None = None,
                 base: Sequence[int] | None = None, per_host: int = 0,
                 max_queued: int = MAX_QUEUED) -> None:
        self._target = target
        self._name = name
        self._cls = cls
        self._procs = procs
        #: the bound of each actor's mailbox, per caller (``procs.options``)
        self._max_queued = max_queued
        #: calls in flight by index, counted from the first call through this
        #: reference on (:meth:`_Route.bind`): each actor of a mesh holds a
        #: reference to it, most never call through it, and a counter per
        #: actor in each made N^2 of them (~134 MB for 4,096 actors)
        self._inflight: list[int] = []
        self._reshape(region, addrs, region.ranks if base is None else base, per_host)

    def _reshape(self, region: Region, addrs: Sequence[str], base: Sequence[int],
                 per_host: int) -> None:
        """Take the shape ``region`` (at creation, and when the proc mesh of a
        whole mesh grows or shrinks in place)."""
        self._region = region
        #: global ranks of the mesh as spawned: an actor's rank is its index here
        self._base = tuple(base)
        self._addrs = tuple(addrs)
        #: processes per host (global rank // per_host: the host); 0: one host
        self._per_host = per_host
        #: calls are numbered (``Call.seq``) when the mesh spans hosts: a
        #: direct call and one through the fan-out tree take different paths
        self._numbered = bool(per_host) and len(addrs) > per_host
        #: this view's actors by host (host, indices), if it spans several
        self._hosts: list[tuple[int, list[int]]] | None = None
        # (ranks looked at only where the processes span hosts: each actor
        # builds its reference to the whole mesh)
        if self._numbered and len({r // per_host for r in region.ranks}) > 1:
            hosts: dict[int, list[int]] = {}
            for index, grank in enumerate(region.ranks):
                hosts.setdefault(grank // per_host, []).append(index)
            self._hosts = sorted(hosts.items())
        #: what a call reads (and the calls' runtime and sites, once asked)
        self._route = _Route(self)
        if self._inflight:  # (counting already: a call waiting for room may go to a new index)
            self._route.count()
        #: what the reference pickles as (:meth:`__reduce__`), once asked
        self._wire: tuple[Any, ...] | None = None

    def _with_region(self, region: Region) -> ActorMesh[A]:
        view = ActorMesh(self._target, self._name, self._cls, region, self._addrs, self._procs,
                         self._base, self._per_host, self._max_queued)
        owner = self._route.owner()
        if self._procs is None and owner is not None:
            # a view of a reference belongs to the runtime the reference
            # does (not to the one running where the slice was taken)
            view._route.home = owner
        return view

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name!r} of {self._cls.__qualname__} {self.sizes}>"

    def __getattr__(self, name: str) -> Endpoint[Any, Any]:
        if name in ("scale", "stats"):
            raise AttributeError(
                f"actor mesh {self._name!r}: {name}() is an operation of a service of "
                f"replicas: make one with meshio.Service(mesh)")
        desc = endpoint_named(self._cls, name, f"{self._cls.__qualname__} actor mesh "
                                               f"{self._name!r}")
        ep: Endpoint[Any, Any] = Endpoint(self, desc)
        self.__dict__[name] = ep  # later reads skip __getattr__
        return ep

    def __reduce__(self) -> tuple[Any, ...]:
        # Ranks and addresses travel as runs (:func:`rank_runs`,
        # :func:`_addr_runs`): a whole mesh's reference is a few runs however
        # many points it has, so spawning it (each actor gets its reference)
        # sends O(N) bytes, not N references of N addresses each.
        if self._wire is None:
            self._wire = (self._target, self._name, self._cls, self._region.extent.labels,
                          self._region.extent.sizes, rank_runs(self._region.ranks),
                          _addr_runs(self._addrs), rank_runs(self._base), self._per_host,
                          self._max_queued)
        return (_rebuild, self._wire)

    def call(self, ep: EndpointDescriptor[Any, P, R], /, *args: P.args,
             **kwargs: P.kwargs) -> asyncio.Future[ValueMesh[R]]:
        """``mesh.call(Trainer.train, step=0)``: same as ``mesh.train.call(step=0)``."""
        return Endpoint(self, endpoint_of(self._cls, ep, repr(self._name))).call(*args, **kwargs)

    async def stop(self) -> None:
        """Stop these actors (their processes keep running); returns once
        each has stopped (its ``__cleanup__`` has run) or its process is
        gone.  Stopping every actor of the mesh, at once or slice by slice,
        frees its name on the proc mesh, and a restart of their processes
        no longer rebuilds them (a stop made through a reference elsewhere,
        in an actor, is noted by the controller owning the processes
        before it returns).  A stopped actor stays stopped: calls
        through any reference to it fail with :class:`SupervisionError`
        ("actor mesh ... was stopped"), even once a new mesh has its name;
        a ``broadcast`` raises it too, nothing sent, where the proc mesh is
        this process's; through a reference elsewhere (no answer to fail)
        it is dropped, and said once per actor on the ``meshio`` logger of
        its process (forwarded to the controller).

        An actor whose process answers no heartbeat (stopped, hung, its loop
        blocked: calls to it fail as "not responding") is not waited for,
        nor one whose process stops answering while the stop waits (once
        heartbeats find it so): it is taken as stopped, and a warning on
        the ``meshio`` logger names it; it stops if its process answers
        again (or is gone with it, if a supervisor kills it)."""
        await self._stopping()

    def _stopping(self, tell: bool = True) -> asyncio.Future[list[Any]]:
        """Send :meth:`stop`'s messages now; done once every process has
        answered, is gone, or answers no heartbeat (never an exception;
        ``tell``: those that do not answer are logged)."""
        rt = self._route.runtime()
        rt.fanout.forget(self._target)
        procs = self._procs
        whole = set(self._region.ranks) >= set(self._base)
        if procs is not None:  # (stopped slice by slice: the last stop is of the whole mesh)
            whole = procs._state.stopped_actors(self._target, self._region.ranks) or whole
        futs: list[asyncio.Future[Any]] = []
        asked: list[tuple[int, str]] = []
        silent: list[SupervisionError] = []
        for index, grank in enumerate(self._region.ranks):
            addr = self._addrs[grank]
            down = _silent(rt, addr)
            if down is not None:  # told (it stops the actor if it answers again), not awaited
                silent.append(down(Pending(rt.loop.create_future(), ignore_result, "stop",
                                           self._name, self._site(index))))
                conn = rt.conns.get(addr)
                if conn is None or conn.closed:
                    continue
                conn.send_message(StopActor(0, self._target, whole))
            else:
                conn = rt.connect(addr)
                fut = rt.loop.create_future()
                req = conn.next_req(Pending(fut, ignore_result, "stop", self._name,
                                            self._site(index)))
                conn.send_message(StopActor(req, self._target, whole))
                futs.append(fut)
                asked.append((index, addr))
            window_gone(conn, self._target)  # (its calls waiting for room go, to be refused)
        gathered = asyncio.gather(*futs, return_exceptions=True)
        if tell:
            gathered.add_done_callback(functools.partial(self._unanswered, rt, asked, silent))
        return gathered

    def _unanswered(self, rt: Runtime, asked: list[tuple[int, str]],
                    silent: list[SupervisionError], gathered: asyncio.Future[list[Any]]) -> None:
        """Warn of the actors a stop did not wait for (``silent``, and those
        of ``asked`` whose process stopped answering meanwhile): each is
        taken as stopped."""
        # (cancelled from the task awaiting it, gather may end with a
        # CancelledError set rather than cancelled: nothing was answered then)
        if not gathered.cancelled() and gathered.exception() is None:
            silent += [e for (_, addr), e in zip(asked, gathered.result())
                       if isinstance(e, SupervisionError) and _silent(rt, addr) is not None]
        if not silent:
            return
        which = "; ".join(f"rank {e.rank} (process {e.pid} on {e.host}: {e.cause})"
                          for e in silent)
        log.warning("meshio: actor mesh %r: stop() did not wait for %s: its process answers no "
                    "heartbeat; taken as stopped (it stops if its process answers again, and "
                    "calls to it fail meanwhile)", self._name, which)

    async def stacks(self, *, timeout: float = STACKS_TIMEOUT) -> Stacks:
        """What these actors are doing now: the current Python stacks of each
        (its tasks, and its thread while a ``def`` endpoint runs), one entry
        per rank, with the endpoint under way and for how long.  Each process
        answers from its event loop, not through the actor's mailbox, so a
        busy actor answers too.  ``print(stacks)`` groups identical ones.

        Args:
            timeout: seconds to wait for each process; one that has not
                answered by then (stopped, hung, or its loop blocked by an
                ``async`` endpoint) is listed in ``Stacks.errors``, as is
                one that is gone, and an actor stopped (``stop()`` on the
                mesh or a slice holding it, or on its proc mesh).

        Raises:
            TypeError: ``timeout`` is not a number (a str, a bool).
            ValueError: ``timeout`` is not seconds > 0 (NaN, or an int no
                float holds; ``math.inf``: no bound).
        """
        ranks, name = self._region.ranks, self._name
        state = self._procs._state if self._procs is not None else None
        stopped: Container[int] = ()  # (known where its proc mesh is this process's)
        errors: list[str] = []
        if state is not None and state.stopped:
            stopped = ranks
            errors.append(f"actor mesh {name!r}: proc mesh {state.name!r} was stopped")
        elif state is not None:  # (a mesh stopped everywhere is forgotten: no record)
            record = next((a for a in state.actors if a.target == self._target), None)
            stopped = ranks if record is None else record.stopped
            if all(grank in stopped for grank in ranks):
                errors.append(f"actor mesh {name!r} was stopped")
            else:
                errors += [f"actor mesh {name!r} rank {self._site(index).rank} was stopped"
                           for index, grank in enumerate(ranks) if grank in stopped]
        stacks = await gather(self._route.runtime(), [
            (self._addrs[grank], self._target, f"actor mesh {name!r}", self._site(index))
            for index, grank in enumerate(ranks) if grank not in stopped], timeout)
        return Stacks(stacks.actors, (*errors, *stacks.errors))

    # -------------------------------------------------------- internals
    # _route, _gather_all, _request_all, _send_all, _check_room, _site,
    # _least_loaded (with _name, _region, the shape): the CallTarget protocol
    # its endpoints (meshio.endpoints) call; a call is sent by its _Route.

    def _check_room(self, desc: EndpointDescriptor[Any, Any, Any],
                    indices: Sequence[int] | None = None, *, backlog: bool = False) -> None:
        """Raise :class:`~meshio.Overloaded` if the mailbox of an actor at
        ``indices`` of this view (None: all) has no room for a call of
        ``desc`` now (the adverbs' ``on_full="raise"``: nothing is sent);
        ``backlog``: only if ``max_queued`` broadcasts nobody awaits
        already wait for room in this process too (a broadcast, which may
        not be awaited)."""
        if desc.concurrent:
            return  # not bounded (see meshio._transport._credit)
        rt = self._route.runtime()
        addrs, ranks = self._addrs, self._region.ranks
        gate = rt.fanout.gates.get(self._target) if self._numbered else None
        for index in range(len(ranks)) if indices is None else indices:
            addr = addrs[ranks[index]]
            if self._numbered:  # (one gate for the whole mesh)
                window: Window | Gate | None = gate
                full = gate is not None and gate.full([addr])
            else:
                conn = rt.conns.get(addr)
                window = conn.windows.get(self._target) if conn is not None else None
                full = window is not None and window.full()
            if window is None:
                continue
            if backlog and window.sends >= window.limit:
                site = self._site(index)
                raise Overloaded(
                    f"{desc.qualname} on {self._name!r} {site!r} (rank {site.rank}): its "
                    f"mailbox is full and {window.sends} broadcasts of this process that "
                    f"nobody awaits already wait for room in it (max_queued="
                    f"{self._max_queued}); the broadcast was not sent: await what an earlier "
                    f"broadcast() returned (or each one) to wait for room rather than run "
                    f"ahead of the actor", actor=self._name,
                    rank=site.rank,
                    max_queued=self._max_queued)
            if not backlog and full:
                site = self._site(index)
                raise Overloaded(
                    f"{desc.qualname} on {self._name!r} {site!r} (rank {site.rank}): its "
                    f"mailbox is full ({self._max_queued} calls of this process wait in it, "
                    f"max_queued={self._max_queued}); the call was not sent (on_full="
                    f"'raise'); retry later, or call without on_full='raise' to wait for room",
                    actor=self._name, rank=site.rank, max_queued=self._max_queued)

    def _hole(self, index: int, error: BaseException) -> bool:
        """Whether the actor at ``index``, whose call failed with ``error``, was
        a hole (see ``ProcState.hole``: it is one, or was when ``error`` was
        made); known only where its proc mesh is owned: through a reference
        held elsewhere, a dead actor's call fails as any other failure."""
        procs = self._procs
        return (procs is not None and isinstance(error, SupervisionError)
                and procs._state.hole(self._region.ranks[index], self._target, error))

    def _as_called(self, route: Route) -> ActorMesh[A]:
        if route is self._route:
            return self
        assert isinstance(route, _Route)
        return ActorMesh(self._target, self._name, self._cls, route.region, route.addrs,
                         self._procs, route.base, self._per_host, self._max_queued)

    def _gather_all(self, desc: EndpointDescriptor[Any, Any, Any], body: bytes,
                    out: OutBuffers, deadline: float | None = None) -> Gathering:
        """Call every actor of this view (through the fan-out tree when it
        spans several hosts), the answers gathered without a future each."""
        route = self._route
        rt = route.runtime()
        g = Gathering(rt.loop, route.target, route.inflight, desc.schema.unpack_result,
                      desc.fn.__qualname__, route.name, route.call_sites())
        if self._hosts is None or not limits.fanout_width:
            for i, slot in enumerate(g.slots):
                route.send(rt, i, desc, body, out, slot, deadline)
        else:
            self._fanout(desc, body, out, g, True, deadline)
        return g

    def _request_all(self, desc: EndpointDescriptor[Any, Any, Any], body: bytes,
                     out: OutBuffers, gather: bool, deadline: float | None = None
                     ) -> list[asyncio.Future[Any]]:
        """Call every actor of this view (through the fan-out tree when it
        spans several hosts); the future of each result, in index order.
        ``gather``: the caller wants them all at once (relays batch the
        answers) rather than each as it comes (a stream)."""
        if self._hosts is None or not limits.fanout_width:
            route = self._route
            return [route.request(i, desc, body, out, deadline) for i in range(len(route.ranks))]
        loop = self._route.runtime().loop
        futs: list[asyncio.Future[Any]] = [loop.create_future() for _ in self._region.ranks]
        self._fanout(desc, body, out, futs, gather, deadline)
        if desc.retry is not None:
            return [owning(self._retry(i, desc, body, out, f, deadline, None), [f])
                    for i, f in enumerate(futs)]
        return futs

    def _send_all(self, desc: EndpointDescriptor[Any, Any, Any], body: bytes,
                  out: OutBuffers, deadline: float | None = None) -> list[Waiting]:
        """Send to every actor of this view, no answers wanted; the sends
        waiting for room in a mailbox (none: all went now).

        Raises:
            SupervisionError: an actor of this view was stopped (its proc
                mesh, or ``stop()`` on this mesh or a slice holding it), as
                a call to it would: nothing sent."""
        self._stopped(desc)
        if self._hosts is None or not limits.fanout_width:
            route = self._route
            rt = route.runtime()
            return [f for i in range(len(route.ranks))
                    if (f := route.send(rt, i, desc, body, out, None, deadline)) is not None]
        waiting = self._fanout(desc, body, out, None, False, deadline)
        return [] if waiting is None else [waiting]

    def _deadlocked(self, desc: EndpointDescriptor[Any, Any, Any],
                    sends: Sequence[Waiting]) -> DeadlockError | None:
        """The error of awaiting ``sends`` (a broadcast's, waiting for room)
        if that would wait forever: one waits for room in the mailbox of
        this mesh's actor in this process, whose call under way waits for
        the caller (``Mailbox.held_for``), and no credit of that actor is
        on its way here (:attr:`Runtime.own_credit`): room comes only once
        that call returns.  (An actor of another process is not known
        here: a wait for its room ends with its call, or a deadline.)"""
        route = self._route
        rt, scope = route.rt, call_scope()
        if rt is None or scope is None or route.target in rt.own_credit:
            return None
        cell = rt.actors.get(route.target)
        why = None if cell is None else cell.held_for(scope.chain, desc.qualname)
        if why is None or not any(not w.over and w.waits_at(route.target, rt.addr) for w in sends):
            return None
        return DeadlockError(why)

    def _stopped(self, desc: EndpointDescriptor[Any, Any, Any]) -> None:
        """Raise the :class:`SupervisionError` a call of ``desc`` would fail
        with if an actor of this view was stopped (known where its proc mesh
        is this process's): a broadcast has no answer to fail."""
        state = self._route.state
        if state is None:
            return
        ranks = self._region.ranks
        record = next((a for a in state.actors if a.target == self._target), None)
        index = 0  # (the proc mesh stopped, or the actor mesh stopped everywhere: forgotten)
        if not state.stopped and record is not None:
            if not record.stopped:  # (the usual case: no scan of the ranks per broadcast)
                return
            index = next((i for i, grank in enumerate(ranks) if grank in record.stopped), -1)
            if index < 0:
                return
        p = Pending(self._route.runtime().loop.create_future(), ignore_result, desc.qualname,
                    self._name, self._site(index))
        if state.stopped:
            raise state.stopped_error(p)
        raise SupervisionError(
            f"{p.who}: actor mesh {self._name!r} was stopped (stop() on the mesh, or on a "
            f"slice holding this actor); a stopped actor stays stopped, and a mesh spawned "
            f"again under its name is another one; {desc.qualname} was not sent",
            actor=self._name, rank=p.rank, cause="actor mesh stopped")

    def _fanout(self, desc: EndpointDescriptor[Any, Any, Any], body: bytes, out: OutBuffers,
                answers: Gathering | Sequence[Settle] | None, gather: bool,
                deadline: float | None) -> Waiting | None:
        """One message per range of hosts (see :mod:`meshio._transport._fanout`);
        the answer of the actor at index ``i`` settles ``answers[i]`` (or
        slot ``i`` of a Gathering).  Once every actor called has room in its
        mailbox for it (:class:`~meshio._transport._credit.Gate`): returned
        while it waits (None: it went now)."""
        assert self._hosts is not None
        rt = self._route.runtime()
        scope, trace = call_scope(), current_trace() if TRACING else ""
        chain = () if scope is None else scope.chain
        if scope is not None and scope.seq and answers is not None and not desc.concurrent:
            for rank, settle in zip(self._region.ranks, answers.slots
                                    if isinstance(answers, Gathering) else answers):
                scope.wait_for(self._target, rank, self._addrs[rank], settle)
        gate = None if desc.concurrent else self._route.gate(rt)  # (concurrent: not bounded)
        addrs = [] if gate is None else [
            a for a in (self._addrs[r] for r in self._region.ranks) if a not in rt.dead]
        if gate is None or not gate.full(addrs):
            self._fanout_now(rt, desc, body, out, answers, gather, deadline, chain, trace, gate)
            return None
        settles = answers.slots if isinstance(answers, Gathering) else answers

        def go() -> None:
            if settles and all(s.done() for s in settles):
                return  # given up meanwhile: not sent
            self._fanout_now(rt, desc, body, out, answers, gather, deadline, chain, trace, gate)

        return gate.wait(addrs, go, answers is not None, deadline)

    def _fanout_now(self, rt: Runtime, desc: EndpointDescriptor[Any, Any, Any], body: bytes,
                    out: OutBuffers, answers: Gathering | Sequence[Settle] | None,
                    gather: bool, deadline: float | None, chain: tuple[str, ...], trace: str,
                    gate: Gate | None) -> None:
        """Send :meth:`_fanout`'s messages now (``gate``: counted there)."""
        assert self._hosts is not None
        addrs, ranks, per_host = self._addrs, self._region.ranks, self._per_host
        settles = answers.slots if isinstance(answers, Gathering) else answers
        dead = rt.dead
        groups = self._hosts
        route = self._route
        state = route.state
        if dead or (state is not None and (state.stopped or state.lost_actors)):  # (as send)
            groups = [(host, [i for i in indices
                              if not route.dead(rt, i, desc, settles[i] if settles else None)])
                      for host, indices in groups]
        relays = [next((a for a in addrs[h * per_host:(h + 1) * per_host] if a not in dead), "")
                  for h in range(len(addrs) // per_host)]
        number = rt.fanout.number
        target = self._target
        width = limits.fanout_width
        # (the ports its value holds: each relay holds them for those it passes them on to)
        handing = out if type(out) is Handing else None
        for a, b in split(0, len(relays), width):
            part = [(h, indices) for h, indices in groups if a <= h < b and indices]
            if not part:
                continue
            relay = next(r for r in relays[a:b] if r)
            conn = rt.connect(relay)
            first = 0
            if isinstance(answers, Gathering):
                slots = [answers.slots[i] for _, indices in part for i in indices]
                answers.sent(conn, slots)
                first = slots[0].req
            elif answers is not None:
                reqs = [self._route.pending(conn, i, desc, answers[i])
                        for _, indices in part for i in indices]
                first = reqs[0]
            calls = [(h, [(a, number(target, a)) for a in (addrs[ranks[i]] for i in indices)])
                     for h, indices in part]
            callees = [addr for _, called in calls for addr, _ in called]
            if gate is not None:
                gate.take(callees)
            ports = () if handing is None else conn.hands_down(handing, relay, callees)
            conn.send(encode_message(Fanout(target, desc.name, msgspec.Raw(body), chain, "",
                                            first, a, relays[a:b], calls, width, gather,
                                            budget(deadline), trace, gate is not None,
                                            ports)), out)

    async def _retry(self, index: int, desc: EndpointDescriptor[Any, Any, Any], body: bytes,
                     out: OutBuffers, fut: asyncio.Future[Any], deadline: float | None,
                     request: _Request | None) -> Any:
        """Await ``fut`` (the first attempt, whose ``request`` says whether
        it started running: None for a call not sent, or sent through the
        fan-out tree) and send the call again as the endpoint's retry policy
        says.  Where this process owns the actors' processes, a call that
        was running each time its process died, ``poison_after`` times in a
        row (its supervisor's), is not sent again: it fails with
        PoisonMessageError once the restart its last crash began is over
        (so a call made next reaches the new process), or failed."""
        policy = desc.retry
        assert policy is not None
        loop = asyncio.get_running_loop()
        state = self._procs._state if self._procs is not None else None
        grank = self._region.ranks[index]
        attempt = crashes = 0
        while True:
            attempt += 1
            redelivery = state if crashes > 0 else None
            if redelivery is not None:  # its process dying now is this call's doing
                redelivery.redelivering[grank] = redelivery.redelivering.get(grank, 0) + 1
            try:
                return await fut
            except Exception as e:
                if not isinstance(e, SupervisionError):
                    crashes = 0  # an answer: the crashes before were not in a row
                elif request is not None and request.started:
                    crashes += 1  # it was running when its process died
                # (else: it waited behind another call, or its Started was lost)
                if isinstance(e, SupervisionError) and state is not None \
                        and state.supervisor is not None \
                        and crashes >= state.supervisor.poison_after:
                    poison = self._poisoned(state, index, desc, crashes, e)
                    try:
                        await state.wait_ready(grank)
                    except SupervisionError:
                        pass  # (no restart comes: the supervisor gave up, or a stop)
                    raise poison from e
                # (the owner knows when a restart is done, or that none comes)
                restarting = isinstance(e, SupervisionError) and state is not None
                if not policy.sends_again(e, attempt, deadline,
                                          0.0 if restarting else policy.delay(attempt)):
                    raise
                if restarting:
                    assert state is not None
                    await state.wait_ready(grank)
                else:  # a reference held elsewhere, or an error raised by the endpoint
                    await asyncio.sleep(policy.delay(attempt))
            finally:
                if redelivery is not None:
                    redelivery.redelivering[grank] -= 1
            fut = _CallFuture(loop=loop)
            self._route.send(self._route.runtime(), index, desc, body, out, fut, deadline)
            request = _request_of(fut)

    def _poisoned(self, state: ProcState, index: int, desc: EndpointDescriptor[Any, Any, Any],
                  crashes: int, last: SupervisionError) -> PoisonMessageError:
        """The call to ``index`` killed its process ``crashes`` times in a
        row: its supervisor hears of it, its caller gets the error."""
        site = self._site(index)
        cause = (f"{desc.qualname} killed the process {crashes} times in a row (last: "
                 f"{last.cause}); the call is not delivered again")
        assert state.supervisor is not None
        state.supervisor.event("poison", state.name, self._region.ranks[index], cause,
                               last.pid, last.host)
        return PoisonMessageError(
            f"{desc.qualname} on {self._name!r} {site!r} (rank {site.rank}): {cause}",
            endpoint=desc.qualname, count=crashes, actor=self._name, rank=site.rank,
            host=last.host, pid=last.pid, cause=last.cause)

    def _site(self, index: int) -> _CallSite:
        return self._route.call_sites()[index]

    def _least_loaded(self, desc: EndpointDescriptor[Any, Any, Any]) -> int:
        """Of the actors that serve calls (:meth:`_Route.live`, worked out
        again only once what it reads changed), the one with the fewest
        calls in flight from this caller; ties go round-robin.

        Raises:
            SupervisionError: none of them serves calls (why, rank by rank).
        """
        route = self._route
        rt = route.rt or route.runtime()  # (the call checks its loop: Route.request)
        state = route.state
        live = route.serving  # (per call: two versions read, one loop)
        if rt.dead.version != route.dead_seen or (state is not None
                                                  and state.version != route.state_seen):
            live = route.live(rt)
        n = len(live)
        if not n:
            raise self._none_serves(rt, desc)
        inflight = route.inflight
        start = route.rr % n
        route.rr = start + 1
        best = live[start]
        low = inflight[best]
        for i in live[start + 1:] + live[:start]:
            if inflight[i] < low:
                best, low = i, inflight[i]
        return best

    def _none_serves(self, rt: Runtime, desc: EndpointDescriptor[Any, Any, Any]
                     ) -> SupervisionError:
        """The error of a ``choose`` of ``desc`` finding no actor of this view
        that serves calls: each one's, as a call to it would get (one
        actor: its own)."""
        route = self._route
        state = route.state
        out = state.out_of_service(self._target) if state is not None else {}
        failures: list[tuple[Point, BaseException]] = []
        for index, point in enumerate(self):
            down = route.down(rt, index)
            if down is not None:
                error = down(route.as_pending(index, desc, rt.loop.create_future()))
            else:
                site = self._site(index)
                why = out[self._region.ranks[index]]
                error = SupervisionError(
                    f"{self._name} rank {site.rank}: {why}; {desc.qualname} was not sent",
                    actor=self._name, rank=site.rank, cause=why.partition(":")[0])
            failures.append((point, error))
        return cast(SupervisionError, combine_failures(
            desc.qualname, self, failures,
            head=f"{desc.qualname}: choose found no actor of {self._name!r} that serves calls"))


class _Route:
    """What a call to the actors of a view reads, and the methods that send
    one (:meth:`send`): apart from its :class:`ActorMesh`, whose
    ``__getattr__`` (the endpoints as attributes) puts every attribute read
    of the mesh on CPython's slow path (~3x a plain read, unspecialized):
    the ~20 reads a call made of it cost ~12% of the caller's CPU per call.
    Made anew whenever the mesh takes a shape (:meth:`ActorMesh._reshape`)."""

    __slots__ = ("addrs", "base", "dead_seen", "home", "inflight", "max_queued", "mesh", "name",
                 "numbered", "ranks", "region", "rr", "rt", "serving", "sites", "state",
                 "state_seen", "target")

    def __init__(self, mesh: ActorMesh[Any]) -> None:
        self.mesh = mesh
        self.target = mesh._target
        self.name = mesh._name
        self.addrs = mesh._addrs
        #: the shape calls through this route go to (kept: the mesh's own
        #: changes when its proc mesh grows or shrinks in place, calls made
        #: before still in flight)
        self.region = mesh._region
        self.ranks = mesh._region.ranks
        self.base = mesh._base
        #: its proc mesh's state (None: not known here), read per call by :meth:`send`
        self.state = mesh._procs._state if mesh._procs is not None else None
        self.numbered = mesh._numbered
        self.inflight = mesh._inflight
        self.max_queued = mesh._max_queued
        #: the runtime calls go through, once the first is made (:meth:`bind`)
        self.rt: Runtime | None = None
        #: a reference (no proc mesh): the runtime the mesh belongs to, where
        #: it arrived (if it ran one) or was first called from (:meth:`bind`)
        self.home = None if self.state is not None else existing_runtime()
        #: who each call went to (:meth:`call_sites`)
        self.sites: list[_CallSite] | None = None
        #: the indices of the actors that serve calls (:meth:`live`), as of
        #: the versions of ``rt.dead`` and of the proc mesh's state seen then
        self.serving: tuple[int, ...] = ()
        self.dead_seen = self.state_seen = -1
        #: where ``ActorMesh._least_loaded`` starts looking (ties go round-robin)
        self.rr = 0

    def runtime(self) -> Runtime:
        """The runtime of the running loop, which must be the one the mesh
        belongs to (:meth:`bind`); an actor's thread, a thread with no
        loop or another loop: a clear error.  (Per call, once bound: one
        comparison.)"""
        rt = self.rt
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise self.no_loop() from None
        if rt is None or rt.loop is not loop:
            rt = self.rt = self.bind(loop)
        return rt

    def bind(self, loop: asyncio.AbstractEventLoop) -> Runtime:
        """The runtime of the first call made on ``loop``.  A mesh belongs
        to the runtime, and so the loop, that spawned its actors (a
        reference: that it arrived in, else that first used it): the
        runtime of another loop (its own job secret) could not even reach
        their processes, and the owner's cannot serve a loop not its own.
        From then on the calls of this view are counted (:meth:`count`).

        Raises:
            WrongLoopError: the mesh belongs to another loop.
            ClosedResourceError: the loop it belongs to has ended.
        """
        owner = self.owner()
        if owner is not None and owner.loop is not loop:
            raise not_its_loop(owner, f"actor mesh {self.name!r}")
        if self.state is None:  # (where it arrived: an in-process worker's, on a shared loop)
            rt = self.home = self.home or runtime()
        else:
            rt = runtime()
        self.count()
        return rt

    def count(self) -> None:
        """Count the calls in flight to each index of this view in
        :attr:`inflight` (the mesh's, shared by its shapes: it only grows, a
        call in flight to an index a shrink removed still counts itself out
        of it)."""
        inflight = self.inflight
        inflight.extend([0] * (len(self.ranks) - len(inflight)))

    def no_loop(self) -> Exception:
        """The error of a call made where no loop runs: an actor's own thread
        (a plain ``def`` endpoint; its ``__init__`` or a sync hook, where no
        call is being served), or a thread of the caller's."""
        if getattr(actor_thread, "rt", None) is not None:
            if call_scope() is None:
                return RuntimeError(
                    f"calls to {self.name!r} cannot be made from an actor's __init__ (nor a "
                    "sync on_restart or __cleanup__): it runs in the actor's own thread, where "
                    "only broadcast() and port.send() work; await the calls in an 'async def' "
                    "endpoint (e.g. one the spawner calls once the actor is spawned)")
            return RuntimeError(
                f"calls to {self.name!r} cannot be made from a plain 'def' endpoint: it runs in "
                "its actor's thread, where only broadcast() and port.send() work; make the "
                "endpoint 'async def' to await calls")
        owner = self.owner()
        what = f"actor mesh {self.name!r}"
        return no_running_loop(what) if owner is None else not_its_loop(owner, what)

    def owner(self) -> Runtime | None:
        """The runtime the mesh belongs to: its proc mesh's, or for a
        reference the one it arrived in or was first used from (None: not
        yet known; see :meth:`bind`)."""
        return self.state.rt if self.state is not None else self.home

    def send(self, rt: Runtime, index: int, desc: EndpointDescriptor[Any, Any, Any],
             body: bytes, out: OutBuffers, answer: Settle | None,
             deadline: float | None) -> Waiting | None:
        """Send one call to the actor at ``index`` of this view; its answer
        settles ``answer`` (None: no answer wanted).  ``rt``: this loop's
        runtime (:meth:`runtime`).  When the actor's mailbox has no room
        for another call of this process, the call waits here, in order,
        until there is (:mod:`meshio._transport._credit`): returned then
        (None: it went now)."""
        state = self.state  # (asked first: a call rarely finds a process dead or stopped)
        if (rt.dead or (state is not None and (state.stopped or state.lost_actors))) \
                and self.dead(rt, index, desc, answer):
            return None
        addr = self.addrs[self.ranks[index]]
        conn = rt.conns.get(addr) or rt.connect(addr)
        req = self.pending(conn, index, desc, answer) if answer is not None else 0
        # (a concurrent call starts on arrival, never queued in the mailbox;
        # one of concurrent=N waits for a slot in the actor: not bounded)
        bounded = not desc.concurrent
        scope = call_scope()
        if scope is None:
            chain: tuple[str, ...] = ()
        else:
            chain = scope.chain
            if scope.seq and bounded and answer is not None:
                scope.wait_for(self.target, self.ranks[index], addr, answer)
        if self.numbered:
            return self.send_numbered(rt, conn, addr, req, desc, body, out, bounded, deadline,
                                      chain)
        trace = current_trace() if TRACING else ""
        if bounded:
            window = conn.windows.get(self.target) or self.window(conn)
            if window.used >= window.limit or window.waiting:
                return window.wait(Call(req, self.target, desc.name, msgspec.Raw(body),
                                        chain, 0, "", None, True, trace), out, deadline)
            window.used += 1
        conn.call(Call(req, self.target, desc.name, msgspec.Raw(body), chain, 0, "",
                       None if deadline is None else budget(deadline), bounded, trace), out)
        return None

    def request(self, index: int, desc: EndpointDescriptor[Any, Any, Any], body: bytes,
                out: OutBuffers, deadline: float | None = None,
                once: bool = False) -> asyncio.Future[Any]:
        """A call to the actor at ``index`` expecting a reply (the ``Route``
        of the endpoints' ``CallTarget`` protocol); sent again as the
        endpoint's retry policy says (:class:`~meshio.Retry`), unless
        ``once`` (a service fails it over to another replica instead).  (No
        keyword-only parameter: CPython 3.11 does not specialize a call to a
        function with one, ~400 instructions a call here.)"""
        rt = self.rt
        if rt is None or rt.loop is not _running_loop():  # (once bound: this, inline)
            rt = self.runtime()
        fut = _CallFuture()  # (of the running loop, rt's: no loop= keyword to parse per call)
        self.send(rt, index, desc, body, out, fut, deadline)
        if desc.retry is None or once:
            return fut
        return owning(
            self.mesh._retry(index, desc, body, out, fut, deadline, _request_of(fut)), [fut])

    def send_numbered(self, rt: Runtime, conn: Connection, addr: str, req: int,
                      desc: EndpointDescriptor[Any, Any, Any], body: bytes, out: OutBuffers,
                      bounded: bool, deadline: float | None,
                      chain: tuple[str, ...]) -> Waiting | None:
        """:meth:`send` of request ``req`` on ``conn`` to a mesh spanning
        hosts: the call is numbered as it goes (see
        :mod:`meshio._transport._credit`).  (Apart from :meth:`send`, whose
        frame then makes no closure cells per call.)"""
        gate, target = self.gate(rt), self.target
        trace = current_trace() if TRACING else ""

        def go() -> None:
            if req and req not in conn.pending:
                return  # given up meanwhile: not sent
            if bounded:
                gate.take([addr])
            conn.call(Call(
                req, target, desc.name, msgspec.Raw(body), chain,
                rt.fanout.number(target, addr), "", budget(deadline), bounded, trace), out)

        if bounded and gate.full([addr]):
            return gate.wait([addr], go, bool(req), deadline)
        go()
        return None

    def window(self, conn: Connection) -> Window:
        """This process's calls to this mesh's actor over ``conn``."""
        window = conn.windows[self.target] = Window(conn, self.max_queued)
        return window

    def gate(self, rt: Runtime) -> Gate:
        """This process's calls to the actors of this mesh spanning hosts."""
        gate = rt.fanout.gates.get(self.target)
        if gate is None:
            gate = rt.fanout.gates[self.target] = Gate(self.target, self.max_queued)
        return gate

    def down(self, rt: Runtime, index: int) -> Callable[[Pending], SupervisionError] | None:
        """The error of a call to ``index`` if its process is known dead (or
        restarting: a new connection may be up before its actors are rebuilt,
        so the dead list is checked first), its proc mesh stopped, or its
        actor a hole while its process serves (``ProcState.actor_hole``);
        None while it serves calls."""
        dead = rt.dead.get(self.addrs[self.ranks[index]]) if rt.dead else None
        state = self.state
        if dead is None and state is not None:
            if state.stopped:
                dead = state.stopped_error  # stopped and forgotten by the runtime
            elif state.lost_actors:
                dead = state.actor_hole(self.target, self.ranks[index])
        return dead

    def live(self, rt: Runtime) -> tuple[int, ...]:
        """The indices of the actors of this view that serve calls, as far as
        this process knows: not :meth:`down` (a process gone, restarting or
        answering no heartbeat), nor, where the proc mesh is this process's,
        a hole or stopped (``ProcState.out_of_service``).  Kept in
        :attr:`serving` until either changes (their versions)."""
        state = self.state
        self.dead_seen = rt.dead.version
        out: Container[int] = ()
        if state is not None:
            self.state_seen = state.version
            out = state.out_of_service(self.target)
        ranks = self.ranks
        self.serving = tuple(i for i in range(len(ranks))
                             if ranks[i] not in out and self.down(rt, i) is None)
        return self.serving

    def dead(self, rt: Runtime, index: int, desc: EndpointDescriptor[Any, Any, Any],
             answer: Settle | None) -> bool:
        """Fail the call to ``index`` at once if it is :meth:`down`."""
        dead = self.down(rt, index)
        if dead is None:
            return False
        if answer is not None:
            answer.set_exception(dead(self.as_pending(index, desc, answer)))
        return True

    def as_pending(self, index: int, desc: EndpointDescriptor[Any, Any, Any],
                   answer: Settle) -> Pending:
        """The request to the actor at ``index`` whose answer settles ``answer``
        (a Gathering's slot is one already)."""
        if isinstance(answer, Slot):
            return answer
        return Pending(answer, desc.schema.unpack_result, desc.fn.__qualname__, self.name,
                       self.call_sites()[index])

    def pending(self, conn: Connection, index: int, desc: EndpointDescriptor[Any, Any, Any],
                answer: Settle) -> int:
        """A request on ``conn`` whose answer settles ``answer``."""
        if isinstance(answer, Slot):  # a Gathering's: it counts itself
            req = conn.next_req(answer)
            answer.sent(conn, req)
            return req
        # (Pending's and _Request's fields set here, in this frame: made
        # through a Python __init__, ~2k instructions more per call)
        p = _Request.__new__(_Request)
        p._fut = answer
        p.decode = desc.unpack_result
        p.endpoint = desc.qualname
        p.mesh = self.name
        p.route = self
        p.conn = conn
        p.index = index
        p.inflight = inflight = self.inflight
        inflight[index] += 1
        p.started = False
        req = p.req = conn.next_req(p)
        if type(answer) is _CallFuture:
            answer.request = p
        else:  # a future of the caller's (a fan-out's)
            cast("asyncio.Future[Any]", answer).add_done_callback(p.on_done)
        return req

    def call_sites(self) -> list[_CallSite]:
        """Who each call of this view goes to (made once per view, not once per call)."""
        sites = self.sites
        if sites is None:
            sites = self.sites = [_CallSite(self, i) for i in range(len(self.ranks))]
        return sites


def _silent(rt: Runtime, addr: str) -> Callable[[Pending], SupervisionError] | None:
    """The error of calls to the process at ``addr`` if it answers no
    heartbeat (not responding, or cut off), as this runtime's heartbeats
    found (a worker of its own) or its controller told it (``PeerDown``,
    its connection open); None otherwise: it serves, is gone (a dial fails
    at once), or is being restarted (its replacement answers)."""
    down = rt.dead.get(addr) if rt.dead else None
    if down is None or addr in rt.watch.down:
        return down
    if addr in rt.watch.on_pong:  # a worker of its own, down otherwise
        return None
    conn = rt.conns.get(addr)
    return down if conn is not None and not conn.closed else None


def _request_of(fut: asyncio.Future[Any]) -> _Request | None:
    """The request of a call just sent (None: not sent, it failed at once)."""
    return getattr(fut, "request", None) if isinstance(fut, _CallFuture) else None


def endpoint_named(cls: type[Any], name: str, what: str) -> EndpointDescriptor[Any, Any, Any]:
    """The endpoint ``name`` of actor class ``cls``, read on ``what`` (a
    mesh or a service, for the message).

    Raises:
        UnknownEndpointError: ``cls`` has no such endpoint (its endpoints
            listed); an ``AttributeError``, so ``hasattr`` still answers.
    """
    endpoints = cast("dict[str, EndpointDescriptor[Any, Any, Any]]", cls._meshio_endpoints)
    desc = endpoints.get(name) if not name.startswith("__") else None
    if desc is None:
        plain = callable(getattr(cls, name, None)) and not name.startswith("_")
        hint = f"; {cls.__qualname__}.{name} is a method without @endpoint" if plain else ""
        raise UnknownEndpointError(
            f"{what} has no endpoint {name!r} (endpoints: {sorted(endpoints)}){hint}")
    return desc


def endpoint_of(cls: type[Any], ep: EndpointDescriptor[Any, P, R],
                what: str) -> EndpointDescriptor[Any, P, R]:
    """``ep``, given to ``call`` on ``what`` (a mesh or a service, for the
    message) of actor class ``cls``, checked to be an endpoint of ``cls``
    (defined there or on a base class).

    Raises:
        TypeError: ``ep`` is not an endpoint.
        UnknownEndpointError: it is another class's.
    """
    if not isinstance(ep, EndpointDescriptor):
        raise TypeError(f"{what}.call: {ep!r} is not an endpoint; pass one "
                        f"such as {cls.__qualname__}.<endpoint name>")
    if not any(vars(k).get(ep.name) is ep for k in cls.__mro__):
        raise UnknownEndpointError(f"{what}.call: {ep!r} is not an endpoint of {cls.__qualname__}")
    return ep


class _CallFuture(ReplyFuture):
    """The future of a call to one actor: cancelling it (the caller gave
    up: cancelled, timed out, a stream abandoned) cancels the call, which
    the callee drops or cancels; its reply is then ignored.  No done
    callback per call: its request is settled with it."""

    __slots__ = ("reads", "request")

    #: set once sent (no ``__init__``: one Python call less per call); unset
    #: for a call failed before it was sent
    request: _Request | None
    #: set when its large arguments are read after it was sent
    #: (:meth:`Pending.lent`): cancelled, it is done only once they are read
    reads: list[asyncio.Future[None]]

    def call_name(self) -> str:
        p = getattr(self, "request", None)  # (None once settled: it lets its request go)
        return "meshio call" if p is None else f"call of {p.endpoint} on {p.mesh!r} rank {p.rank}"

    def cancel(self, msg: Any | None = None) -> bool:
        if self.done():
            return False
        p = getattr(self, "request", None)
        self.request = None
        if p is not None:
            p.given_up(msg == DEADLINE)
        if not when_done(getattr(self, "reads", None), functools.partial(super().cancel, msg)):
            return super().cancel(msg)
        return True


class _Request(Pending):
    """A call to one actor whose answer settles a future: it counts itself
    out of the actor's calls in flight when settled or given up."""

    __slots__ = ("conn", "index", "inflight", "req", "route", "started")

    #: the request on ``conn`` for the call to the actor at ``index`` of
    #: ``route``'s view, counted in ``inflight`` (the view's); made by
    #: :meth:`_Route.pending`, which sets these and Pending's fields (no
    #: ``__init__``; who was called is made only if an error message asks)
    conn: Connection
    index: int
    inflight: list[int]
    req: int
    route: _Route
    #: the callee said the call started running (endpoints with a retry policy)
    started: bool

    @property
    def point(self) -> Any:
        return self.route.call_sites()[self.index]

    @property
    def target(self) -> str:
        return self.route.target

    def begun(self) -> None:
        self.started = True

    def set_result(self, result: Any, /) -> None:
        self.inflight[self.index] -= 1  # (_settled, inline: this runs per call)
        fut = self._fut
        if type(fut) is _CallFuture:
            fut.request = None
        fut.set_result(result)

    def set_exception(self, exception: BaseException, /) -> None:
        self._settled()
        self._fut.set_exception(exception)

    def _settled(self) -> None:
        self.inflight[self.index] -= 1
        if type(self._fut) is _CallFuture:
            self._fut.request = None

    def lent(self, read: asyncio.Future[None]) -> None:
        fut = self._fut
        if type(fut) is _CallFuture:
            fut.reads = [*getattr(fut, "reads", ()), read]

    def given_up(self, expired: bool = False) -> None:
        """The caller cancelled the call before its answer came (``expired``:
        because its deadline passed)."""
        self.inflight[self.index] -= 1
        if self.conn.pending.pop(self.req, None) is not None:
            self.conn.send_cancel(Cancel(self.req, self.route.target, expired))

    def on_done(self, f: asyncio.Future[Any]) -> None:
        """The done callback of a future that is not a :class:`_CallFuture`."""
        if f.cancelled():
            self.given_up()


class _CallSite:
    """Who a call went to, worked out only if an error message needs it:
    ``rank`` is the actor's rank in its mesh as spawned (as in
    :class:`~meshio.ActorError`), the repr its point in the view called,
    both as the view was shaped when the call was made (its
    :class:`_Route`'s)."""

    __slots__ = ("index", "route")

    def __init__(self, route: _Route, index: int) -> None:
        self.route = route
        self.index = index

    @property
    def rank(self) -> int:
        return self.route.base.index(self.route.ranks[self.index])

    @property
    def addr(self) -> str:
        """The actor's process (a call through the fan-out tree is on its
        relay's connection: ``Pending.callee``)."""
        return self.route.addrs[self.route.ranks[self.index]]

    @property
    def proc(self) -> str:
        """The actor's process as its proc mesh names it, ``proc mesh 'wp'
        rank 1`` ("": not known): the mesh's name is in the actor mesh's
        target, which begins with the proc mesh's id, ``<name>-<uuid>/``
        (``ProcState.new_target``); its rank is the process's there."""
        name = self.route.target.partition("/")[0].rpartition("-")[0]
        return f"proc mesh {name!r} rank {self.route.ranks[self.index]}" if name else ""

    def __repr__(self) -> str:
        return repr(self.route.region.point(self.index))


#: an address run: ``count`` addresses ``f"{prefix}{first + i}"`` (a proc
#: mesh's slots are named by rank); ``first`` -1: the one address ``prefix``
_AddrRun = tuple[str, int, int]


def _addr_runs(addrs: Sequence[str]) -> tuple[_AddrRun, ...]:
    """``addrs`` as runs of addresses numbered consecutively (one per host
    for a proc mesh's; any other address a run of its own)."""
    runs: list[_AddrRun] = []
    prefix, first, count = "", -1, 0
    for addr in addrs:
        stem = addr.rstrip("0123456789")
        digits = addr[len(stem):]
        n = int(digits) if digits and (digits == "0" or digits[0] != "0") else -1
        if n < 0:
            stem = addr
        elif count and first >= 0 and n == first + count and stem == prefix:
            count += 1
            continue
        if count:
            runs.append((prefix, first, count))
        prefix, first, count = stem, n, 1
    if count:
        runs.append((prefix, first, count))
    return tuple(runs)


@functools.lru_cache(maxsize=32)
def _shared_addrs(runs: tuple[_AddrRun, ...]) -> tuple[str, ...]:
    """The addresses of :func:`_addr_runs`' ``runs``, made once per process
    (shared as :func:`~meshio._extent.shared_ranks` shares ranks)."""
    return tuple(prefix if first < 0 else f"{prefix}{i}"
                 for prefix, first, count in runs for i in range(first, first + count))


def _rebuild(target: str, name: str, cls: type[Any], labels: Sequence[str],
             sizes: Sequence[int], ranks: tuple[tuple[int, int], ...],
             addrs: tuple[_AddrRun, ...], base: tuple[tuple[int, int], ...], per_host: int,
             max_queued: int) -> ActorMesh[Any]:
    return ActorMesh(target, name, cls, Region(Extent(labels, sizes), shared_ranks(ranks)),
                     _shared_addrs(addrs), base=shared_ranks(base), per_host=per_host,
                     max_queued=max_queued)
