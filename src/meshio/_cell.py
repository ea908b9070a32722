"""Hosting actors inside a worker: one mailbox per actor, handled one
message at a time (unless the endpoint is ``concurrent``; one
``concurrent=N`` runs at most N calls at once, the others waiting their turn
in :class:`_Slots`).

``async def`` endpoints run on the worker's loop (a mailbox call in the
actor's pump task, or in the loop callback that brought it, as that task,
when the actor was idle: at once, or, if a Cancel follows in the read that
brought it, once that read is handled, so that the Cancel comes first; a
concurrent call in its own task); plain ``def``
endpoints run in the actor's thread (:class:`ActorThread`), so a blocking
one leaves the loop free to answer heartbeats and other actors.  The
constructor runs in that thread first, so what it sets per thread is theirs.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import math
import os
import queue
import threading
import time
import traceback
import weakref
from asyncio.tasks import _enter_task, _leave_task
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import msgspec

from ._actor import Actor
from ._actor_mesh import ActorMesh
from ._constants import MAX_QUEUED, MSGPACK_NIL, STALL_AFTER
from ._context import CallScope, Context, ProcInfo, _context, context_or, enter_context, enter_scope
from ._exceptions import ActorError, SchemaError, readable
from ._extent import Region
from ._logs import records_dropped
from ._metrics import METER_MASK, Meter, encode_report, process_report
from ._stacks import (
    _MESHIO,
    ActorStacks,
    Stacks,
    capture,
    capture_call,
    capture_construction,
    encode_actors,
    thread_frames,
)
from ._tracing import ENABLED as TRACING
from ._tracing import OTEL, failed, served
from ._transport._connection import Connection, ignore_result
from ._transport._credit import forget_target, took
from ._transport._messages import (
    ActorStopped,
    Call,
    ErrorInfo,
    ErrorKind,
    Fail,
    GetStacks,
    GetStats,
    Probe,
    Reply,
    Reshaped,
    SpawnActor,
    Stalled,
    Started,
    StopActor,
)
from ._transport._runtime import Runtime, actor_thread, ask_each, register_handler, tell_held
from ._transport._serial import Buffers, Packer, Unsendable, loads
from ._transport._tasks import LEND_TIMEOUT, awaited, within
from ._util import utf8
from .endpoints._endpoint import EndpointDescriptor
from .rdma._registry import Registry

if TYPE_CHECKING:
    from types import TracebackType

    from ._proc_state import ProcState

__all__ = ("CLEANUP_TIMEOUT", "OWNED_STOP_TIMEOUT", "ActorCell", "ActorThread", "actor_error",
           "spawn_cell")

log = logging.getLogger("meshio")

#: seconds an actor's ``__cleanup__`` (and the end of its last call) may take
#: before its stop goes on without it
CLEANUP_TIMEOUT = 3.0
#: seconds a call with a retry policy waits for its Started message to be
#: written before it runs (so that its caller hears of it if it kills the process)
STARTED_FLUSH = 1.0
#: seconds the stops of the actor meshes a stopping actor owns may take in
#: all (each: the end of its calls, what it owns in turn, its ``__cleanup__``)
#: before the owner's stop goes on without them
OWNED_STOP_TIMEOUT = 2 * CLEANUP_TIMEOUT


def _type_name(t: type) -> str:
    """``ValueError``, ``mypkg.MyError``; meshio's errors by their public
    name (``meshio.SupervisionError``: see ``fixup_module_metadata``)."""
    if t.__module__ == "builtins":
        return t.__qualname__
    return f"{t.__module__}.{t.__qualname__}"


def _user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` from its first frame outside meshio's package: without the
    runtime's frames that called the user's code (the mailbox, the actor's
    thread).  Those after a user's frame stay (a call back into meshio that
    failed there); all of them if every one is meshio's."""
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename.startswith(_MESHIO):
        first = first.tb_next
    return tb if first is None else first


def actor_error(e: BaseException, ctx: Context[Any] | None, kind: ErrorKind = "actor") -> ErrorInfo:
    """What the caller is told of ``e``: everything that can be told, even of
    an exception whose ``__str__`` raises or whose traceback cannot be
    formatted (the user's code runs here, so nothing may escape).  Its
    traceback starts at the user's code (:func:`_user_traceback`)."""
    if isinstance(e, ActorError):
        # A remote error passing through (a call this endpoint made failed):
        # told as what it is (``except ValueError`` still catches it), its
        # message once; the remote traceback below it is in this one's.  (As
        # str(e) it was in the message and the traceback both: doubled per hop.)
        type_name, bases, message = e.remote_type, e.remote_bases, e.remote_message
    else:
        try:
            type_name = _type_name(type(e))
        except BaseException:
            type_name = "<exception of an unnameable type>"
        try:  # (the caller's error is an instance of the first it has loaded)
            bases = tuple(utf8(_type_name(k)) for k in type(e).__mro__[1:]
                          if k not in (Exception, BaseException, object))
        except BaseException:
            bases = ()
        try:
            message = str(e)
            if not isinstance(message, str):  # pragma: no cover - str() checks this itself
                raise TypeError("__str__ returned a non-string")
        except BaseException as inner:
            message = f"<unprintable {type_name}: str() raised {type(inner).__name__}>"
    tb = ""
    if kind == "actor":
        try:
            tb = "".join(traceback.format_exception(type(e), e, _user_traceback(e.__traceback__)))
        except BaseException:
            try:
                tb = ("Traceback (most recent call last):\n"
                      + "".join(traceback.format_tb(_user_traceback(e.__traceback__)))
                      + f"{type_name}: {message} (the rest could not be formatted)\n")
            except BaseException:
                tb = f"{type_name}: {message} (its traceback could not be formatted)\n"
    # (cut here, not only where it is read: 32 MiB of bytes in a message is not sent)
    return ErrorInfo(kind, utf8(type_name), utf8(readable(message)), utf8(readable(tb)),
                     ctx.actor_name if ctx else "", ctx.point.rank if ctx else -1, bases)


def _own_cancellation(e: BaseException) -> bool:
    """``e`` is the running task being cancelled (by meshio or the loop's
    end), not a ``CancelledError`` raised by user code."""
    task = asyncio.current_task()
    return isinstance(e, asyncio.CancelledError) and task is not None and task.cancelling() > 0


def _settle(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.done():  # nobody waits any more (the actor was stopped)
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


async def _guarded(work: Coroutine[Any, Any, None], what: str) -> None:
    """``work``, with whatever it raises logged (``SystemExit`` and
    ``KeyboardInterrupt`` too: out of a task they would end the worker)."""
    try:
        await work
    except BaseException as e:
        if _own_cancellation(e):
            raise
        log.error("meshio: %s raised; the stop goes on", what,
                  exc_info=(type(e), e, _user_traceback(e.__traceback__)))


async def _bounded(work: Coroutine[Any, Any, None], timeout: float, what: str) -> None:
    """Run ``work`` for at most ``timeout`` seconds (a step of a stop); if it
    raises, is cancelled or overruns (it is then cancelled), that is logged
    to stderr and the stop goes on."""
    task = awaited(_guarded(work, what))
    try:  # (not wait_for: it would wait for work that ignores its cancellation)
        await asyncio.wait([task], timeout=timeout)
    except BaseException:  # this stop is cancelled (the worker is exiting)
        task.cancel()
        raise
    if not task.done():
        task.cancel()
        log.error("meshio: %s did not finish within %ss; stopped without it", what, timeout)
    elif task.cancelled():
        log.error("meshio: %s was cancelled; the stop goes on", what)


async def _stop_owned(ctx: Context[Any], where: str) -> None:
    """Stop what the actor of ``ctx`` (``where``: name[rank]) started, newest
    first: the actor meshes it spawned (their ``__cleanup__`` runs;
    OWNED_STOP_TIMEOUT for all), then the proc meshes it started (each: its
    shutdown grace and CLEANUP_TIMEOUT).  A stop that fails or overruns is
    logged (an overrunning proc mesh is killed) and the stop goes on."""
    owned = ctx._owned[::-1]
    ctx._owned.clear()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + OWNED_STOP_TIMEOUT
    for mesh in owned:
        if isinstance(mesh, ActorMesh) and (mesh._procs is None
                                            or not mesh._procs._state.stopped):
            await _bounded(mesh.stop(), max(0.0, deadline - loop.time()),
                           f"the stop of actor mesh {mesh._name!r} owned by {where}")
    for state in owned:
        if not isinstance(state, ActorMesh):
            await _stop_procs(state, where)


async def _stop_procs(state: ProcState, where: str) -> None:
    grace = 0.0 if state.shutdown == "brutal_kill" else float(state.shutdown)
    try:  # (cancelled on overrun: its stop then kills the processes)
        await _bounded(state.stop(), grace + CLEANUP_TIMEOUT,
                       f"the stop of proc mesh {state.name!r} owned by {where}")
    finally:
        state.release()


def _thrown_in(task: asyncio.Task[Any]) -> bool:
    """Whether the ``GeneratorExit`` just caught in ``task``'s coroutine was
    the outcome of a future a call awaited (a thread of the user's code
    raised it), thrown in by the task: that closed the coroutines of the
    call, which answered its caller, and the task goes on.  Else its own
    coroutine is being closed (it was dropped): it ends."""
    return asyncio.current_task() is task


class _Carried(Exception):
    """A ``GeneratorExit`` raised in an actor's thread, on its way to the
    coroutine awaiting it (:meth:`ActorThread.run`): a task throwing it in
    from a future would close the coroutines awaiting instead (as
    ``yield from`` does with ``GeneratorExit``), losing it and the task."""

    def __init__(self, error: GeneratorExit) -> None:
        super().__init__()
        self.error = error


class ActorThread:
    """The thread of one actor, where its ``__init__``, plain ``def``
    endpoints and sync hooks (``on_restart``, ``__cleanup__``) run: one call
    at a time, in submission order, in the submitter's context (so
    :func:`~meshio.context` works).  Started on first use; a daemon, so a
    stuck call cannot keep the process alive."""

    def __init__(self, rt: Runtime, name: str) -> None:
        self.rt = rt
        self.name = name
        self.jobs: queue.SimpleQueue[tuple[asyncio.Future[Any], contextvars.Context,
                                           functools.partial[Any]] | None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` in the thread: what it returns or raises."""
        try:
            return await self.submit(fn, *args, **kwargs)
        except _Carried as carried:  # raised here, not thrown into the awaiting coroutines
            raise carried.error from None

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args, **kwargs)`` in the thread; its outcome, on the loop
        (a ``GeneratorExit`` it raised :class:`_Carried`)."""
        fut = self.rt.loop.create_future()
        if self.thread is None:
            self.thread = threading.Thread(target=self._work, name=self.name, daemon=True)
            self.thread.start()
        self.jobs.put((fut, contextvars.copy_context(), functools.partial(fn, *args, **kwargs)))
        return fut

    def close(self) -> None:
        """The thread ends after the calls already submitted."""
        if self.thread is not None:
            self.jobs.put(None)

    def _work(self) -> None:
        actor_thread.rt = self.rt
        loop = self.rt.loop
        while (job := self.jobs.get()) is not None:
            fut, ctx, call = job
            del job
            try:
                outcome: tuple[bool, Any] = (True, ctx.run(call))
            except StopIteration as e:  # a future cannot hold it: as in a coroutine
                error = RuntimeError(f"{call.func.__qualname__} raised StopIteration")
                error.__cause__ = e
                outcome = (False, error)
            except GeneratorExit as e:
                outcome = (False, _Carried(e))
            except BaseException as e:  # reported by the awaiting call
                outcome = (False, e)
            try:
                loop.call_soon_threadsafe(_settle, fut, *outcome)
            except RuntimeError:  # the loop is closed: the worker is exiting
                return
            del fut, ctx, call, outcome


class ActorCell:
    """One actor instance and its mailbox; ``thread``: the actor's thread,
    where its constructor ran (None: one is made)."""

    def __init__(self, rt: Runtime, target: str, ctx: Context[Any], instance: Actor,
                 thread: ActorThread | None = None, stall_after: float = STALL_AFTER,
                 max_queued: int = MAX_QUEUED) -> None:
        self.rt = rt
        self.target = target
        self.ctx = ctx
        #: "<actor name>[<rank>]", in messages (as of the current context)
        self.where = _where(ctx)
        self.instance = instance
        self.endpoints = type(instance)._meshio_endpoints
        #: calls waiting for their turn, each with its deadline (``time.monotonic()``);
        #: at most ``max_queued`` per caller (:mod:`meshio._transport._credit`),
        #: given back to each caller ``credit_batch`` at a time
        self.mailbox: deque[tuple[Connection, Call, Buffers, float | None]] = deque()
        self.max_queued = max_queued
        self.credit_batch = max(1, max_queued // 8)
        #: (connection, req) of the mailbox calls not yet started (and of the
        #: calls waiting for a slot: :class:`_Slots`); a call cancelled by its
        #: caller leaves it and is skipped when its turn comes
        self.queued: set[tuple[Connection, int]] = set()
        #: calls under way, by (connection, req): their scope (deadline, given up)
        self.scopes: dict[tuple[Connection, int], CallScope] = {}
        #: concurrent async calls under way, by (connection, req): their task
        #: (cancellable; a mailbox call's is :attr:`task`)
        self.running: dict[tuple[Connection, int], asyncio.Task[Any]] = {}
        #: calls dropped without running because their deadline passed first
        self.expired = 0
        #: calls whose caller cancelled them while they ran
        self.cancelled: set[tuple[Connection, int]] = set()
        #: tasks of concurrent calls (kept until done)
        self.tasks: set[asyncio.Task[None]] = set()
        #: the concurrent calls running their endpoint, by task: its
        #: endpoint, the call's scope and its start (``time.monotonic()``),
        #: for :class:`StallWatch`
        self.concurrent_calls: dict[
            asyncio.Task[Any], tuple[EndpointDescriptor[Any, Any, Any], CallScope, float]] = {}
        #: by name, the endpoints with a bound (``concurrent=N``): their calls
        #: under way and waiting here
        self.slots: dict[str, _Slots] = {
            name: _Slots() for name, desc in self.endpoints.items()
            if desc.limit is not None}
        #: the calls that took a slot here so far (:meth:`_holder`)
        self.slot_seq = 0
        #: this actor in call chains: "<target>[<rank>]"
        self.identity = f"{target}[{ctx.point.rank}]"
        #: mailbox calls started so far; the endpoint of the one under way
        self.seq = 0
        self.serving: EndpointDescriptor[Any, Any, Any] | None = None
        #: the scope of the mailbox call being served (while :attr:`serving`)
        self.scope: CallScope | None = None
        #: seconds a mailbox call may run before it is reported stalled; the
        #: last call (by ``seq``) so reported
        self.stall_after = stall_after
        self.stalled = 0
        #: when that call started (``time.monotonic()``)
        self.since = 0.0
        self.thread = thread or ActorThread(rt, _thread_name(ctx.actor_name, ctx.point.rank))
        #: once stopped (no more calls are taken): the task finishing the stop
        self.stopping: asyncio.Task[None] | None = None
        self.waiter: asyncio.Future[None] | None = None
        #: by endpoint name: its calls so far (``meshio.stats()``)
        self.meters: dict[str, Meter] = {name: Meter() for name in self.endpoints}
        #: a call begun outside the mailbox task that had to wait: the task
        #: goes on with it (:meth:`_begin`)
        self.begun: _GoOn | None = None
        #: the mailbox task's context (a call begun in :meth:`post` runs in it)
        self.context = contextvars.copy_context()
        #: :meth:`_take_up`, noted once per socket read that brought calls
        #: with a Cancel behind them while the actor was idle
        #: (:attr:`Runtime.admitted`), to run as the read ends: the Cancel
        #: drops its call first
        self.take_up = self._take_up
        #: the deadlock probes mailbox call :attr:`probe_seq` passed on
        #: (:meth:`probed`), by where each started and what it looks for
        self.probe_seq = 0
        self.passed: set[tuple[str, tuple[str, ...]]] = set()
        self.task = rt.tasks.start(self._pump(), name="mailbox", context=self.context)

    def post(self, conn: Connection, msg: Call, bufs: Buffers) -> None:
        deadline = None if msg.deadline is None else _deadline(msg.deadline)
        desc = self.endpoints.get(msg.method)
        if desc is not None and desc.concurrent:
            # Concurrent endpoints do not queue behind a busy actor: start now
            # (a bounded one's call whose slots are all taken waits for one).
            try:
                args, kwargs = desc.schema.unpack_args(msg.args, bufs)
            except SchemaError as e:
                self._fail(conn, msg.req, actor_error(e, self.ctx, "schema"))
                return
            if desc.limit is not None:
                slots = self.slots[desc.name]
                if len(slots.held) >= desc.limit:  # (no slot free)
                    if msg.req and slots.hold_for(msg.chain, self.queued):
                        # Every call holding a slot waits (through its
                        # chain) for this one, or for another waiting for
                        # a slot: this one would wait for a slot forever;
                        # it fails now, as a reentrant mailbox call.
                        self._fail(conn, msg.req, self._deadlock(msg, desc, None))
                        return
                    if msg.req:  # (cancellable while it waits: see cancel())
                        self.queued.add((conn, msg.req))
                    slots.waiting.append((conn, msg, args, kwargs, deadline))
                    return
                self._start(conn, msg, desc, args, kwargs, deadline, self._holder())
                return
            self._start(conn, msg, desc, args, kwargs, deadline, self.identity)
            return
        probing = False
        if msg.req and msg.chain and self.serving is not None:
            # A call that waits (through its chain) for the one under way
            # here, or whose chain holds an actor the one under way waits
            # for (two calls each waiting for a call to the other's actor)
            # would wait forever: it fails now.  If the call under way waits
            # for other actors, a probe follows what they wait for (a cycle
            # through three actors or more: :meth:`probed`).
            scope = self.scope
            reentrant = f"{self.identity}#{self.seq}" in msg.chain
            waited = None if reentrant or scope is None else scope.waiting_for(msg.chain)
            if reentrant or waited is not None:
                if msg.bounded:
                    took(conn, self.target, self.credit_batch, msg.origin)
                self._fail(conn, msg.req, self._deadlock(msg, desc, waited))
                return
            probing = scope is not None and scope.waits is not None
        waiter = self.waiter
        if waiter is not None and not waiter.done():  # idle
            if not self.mailbox and (conn._start == conn._end or conn.cancel_at < conn._start
                                     or not conn.cancel_follows()):
                # (no Cancel follows it in the read that brought it: it is the
                # read's last message, or the read's Cancels are in already;
                # else Connection.cancel_follows looks, once a read)
                if self._begin(waiter, conn, msg, bufs, deadline) >= 0:
                    return
            elif self.rt.reading:
                # A Cancel may follow in the read that brought it, or calls
                # that wait for the read's end are before it: it runs once
                # that read is parsed (each actor noted once in a row).
                if msg.req:
                    self.queued.add((conn, msg.req))
                self.mailbox.append((conn, msg, bufs, deadline))
                admitted = self.rt.admitted
                if not admitted or admitted[-1] is not self.take_up:
                    admitted.append(self.take_up)
                return
        if msg.req:
            self.queued.add((conn, msg.req))
        self.mailbox.append((conn, msg, bufs, deadline))
        if probing:
            self._probe(msg)
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def post_run(self, conn: Connection, calls: Sequence[Call], i: int) -> int:
        """``Mailbox.post_run``: ``calls[i]`` as :meth:`post` takes it, but a
        mailbox call that finds the actor idle (and no Cancel that may
        follow it in its read) is served here with the calls after it that
        a mailbox would take as they are, in one go (:meth:`_begin`; a
        burst of small calls comes as one frame of ~30): the index of the
        first call not taken."""
        waiter = self.waiter
        if (waiter is not None and not waiter.done() and not self.mailbox
                and (conn._start == conn._end or conn.cancel_at < conn._start
                     or not conn.cancel_follows())):
            end = self._begin(waiter, conn, None, [], None, calls, i)
            if end > i:
                return end
            # (none taken: not a mailbox call, or within a task: post queues it)
        self.post(conn, calls[i], [])
        return i + 1

    def _take_up(self) -> None:
        """The read that brought calls while the actor was idle is parsed:
        serve them here (:meth:`_begin`) if it still is, or, within a task,
        by waking the mailbox task."""
        waiter = self.waiter
        if waiter is None or waiter.done() or not self.mailbox:
            return
        if self._begin(waiter, None, None, None, None) < 0:
            self.waiter = None
            waiter.set_result(None)

    def _start(self, conn: Connection, msg: Call, desc: EndpointDescriptor[Any, Any, Any],
               args: tuple[Any, ...], kwargs: dict[str, Any], deadline: float | None,
               server: str) -> None:
        """Start a concurrent call in its own task (holding one of its
        endpoint's slots, if bounded, until the task is done), as ``server``
        in the chains of the calls it makes (:meth:`_holder` if it holds a
        slot, else this actor's identity)."""
        task = self.rt.tasks.start(
            self._run_concurrent(conn, msg, desc, args, kwargs, deadline, server),
            name=desc.qualname)
        self.tasks.add(task)
        if msg.req:  # cancellable from now on, not only once the task has started
            key = (conn, msg.req)
            self.running[key] = task
            # (a partial: a closure would make cells on every call of post)
            task.add_done_callback(functools.partial(self._ended, key))
        else:
            task.add_done_callback(self.tasks.discard)
        if desc.limit is not None:  # (done however it ended: even cancelled before it ran)
            self.slots[desc.name].held[server] = task
            task.add_done_callback(functools.partial(self._freed, desc, server))

    def _holder(self) -> str:
        """What a call taking a slot of a bounded endpoint is in the chains
        of the calls it makes: ``"<target>[<rank>]!<n>"`` (``n``: the
        slot calls started here so far), so that a call back to the
        endpoint from one of them is known to wait for it
        (:meth:`_Slots.hold_for`)."""
        self.slot_seq += 1
        return f"{self.identity}!{self.slot_seq}"

    def _freed(self, desc: EndpointDescriptor[Any, Any, Any], server: str,
               _: asyncio.Task[None]) -> None:
        """A call of bounded endpoint ``desc`` (``server`` in chains) is
        over: its slot goes to the first call waiting for one (in arrival
        order) that its caller has not given up and whose deadline has not
        passed, else it is free."""
        slots = self.slots[desc.name]
        del slots.held[server]
        waiting, queued = slots.waiting, self.queued
        while waiting and self.stopping is None:  # (once stopping, stop() failed them)
            conn, msg, args, kwargs, deadline = waiting.popleft()
            if msg.req:
                key = (conn, msg.req)
                if key not in queued:
                    continue  # cancelled by its caller while it waited
                queued.remove(key)
            if deadline is not None and (late := time.monotonic() - deadline) >= 0:
                self._expire(conn, msg, late, f"for one of the {desc.limit} slots of "
                             f"@endpoint(concurrent={desc.limit})")
                continue
            self._start(conn, msg, desc, args, kwargs, deadline, self._holder())
            return

    def waiting(self) -> Iterator[tuple[Connection, Call]]:
        """The calls waiting for their turn here (not yet started, not given
        up), with the connection each came on: in the mailbox, then those of
        each bounded concurrent endpoint."""
        queued = self.queued
        for conn, msg, *_ in self.mailbox:
            if not msg.req or (conn, msg.req) in queued:
                yield conn, msg
        for slots in self.slots.values():
            for conn, msg, *_ in slots.waiting:
                if not msg.req or (conn, msg.req) in queued:
                    yield conn, msg

    def _begin(self, waiter: asyncio.Future[None], conn: Connection | None, msg: Call | None,
               bufs: Buffers | None, deadline: float | None, run: Sequence[Call] = (),
               at: int = 0) -> int:
        """Serve a call that found the actor idle (``msg``; None: the calls
        of its mailbox, or of ``run``) here, in the loop callback that
        brought it, rather than by waking the mailbox task (which waits on
        ``waiter``): it runs without a wake-up or a turn of the loop first,
        and its answer goes out in the same turn; then, while it stays idle,
        the calls in the mailbox (admitted by the read that brought it, or
        come meanwhile) and those of ``run`` from ``at`` on that a mailbox
        would take as they are (the :class:`Calls` frame that brought them:
        to this actor, not numbered, a mailbox endpoint's; see
        :meth:`post_run`).  Each runs as if in that task
        (``asyncio.current_task()`` is the task, in its context), so
        everything else sees a mailbox call; one that has to wait is handed
        to the task, which goes on with it and the calls behind it
        (:class:`_GoOn`).  Returns the index of the first call of ``run``
        not taken; -1 (nothing done) when called within a task (a call made
        in this process): the task serves them."""
        loop, task = self.rt.loop, self.task
        try:
            # (It refuses when a task runs: asking current_task() first
            # would cost a Python call per call on 3.11.)
            _enter_task(loop, task)
        except RuntimeError:
            return -1
        try:
            context, mailbox, target = self.context, self.mailbox, self.target
            coro = None
            while True:
                if msg is not None and conn is not None and bufs is not None:
                    if msg.bounded:  # (took()'s common case, inline: this runs per call)
                        taken, key = conn.taken, (target, msg.origin)
                        count = taken.get(key, 0) + 1
                        if count < self.credit_batch:
                            taken[key] = count
                        else:  # (credit goes back now)
                            took(conn, target, self.credit_batch, msg.origin)
                    try:
                        coro = context.run(self._serve, conn, msg, bufs, deadline)
                    except Exception as e:  # a bug: its caller hears of it, not a hang
                        self.rt.refuse(conn, msg, e)
                    msg = None
                if coro is not None:  # (None: dropped, or answered already)
                    self.waiter = None  # (calls that arrive meanwhile queue)
                    try:
                        yielded = context.run(coro.send, None)
                    except StopIteration:  # served
                        if waiter.done():  # the call stopped the actor
                            return at
                        self.waiter = waiter
                    except BaseException as e:  # (a bug): raised in the task, as it would be
                        self.begun = _GoOn(coro, None, e)
                        break
                    else:
                        self.begun = _GoOn(coro, yielded, None)
                        break
                    coro = None
                if mailbox:
                    coro = context.run(self._next)
                    continue
                if at == len(run):
                    return at
                msg = run[at]
                if msg.seq or msg.target != target or (
                        (desc := self.endpoints.get(msg.method)) is None or desc.concurrent):
                    return at  # (post takes it: numbered, another actor's, not a mailbox call)
                at += 1
                deadline = None if msg.deadline is None else _deadline(msg.deadline)
        finally:
            _leave_task(loop, task)
        if not waiter.done():
            waiter.set_result(None)
        return at

    def _probe(self, msg: Call) -> None:
        """``msg`` queued behind the mailbox call under way, which may wait
        for other actors: send a probe (:meth:`probed`) to each it waits for
        now."""
        if any("#" in entry for entry in msg.chain):  # (else no mailbox call waits for msg)
            self._pass_on(Probe("", "", msg.chain, (), ()))

    def _pass_on(self, probe: Probe) -> None:
        """Send ``probe`` on to the actors the mailbox call under way waits
        for now (not to those it passed already)."""
        assert self.scope is not None
        here = f"{self.identity}#{self.seq}"
        path, addrs = (*probe.path, here), (*probe.addrs, self.rt.addr)
        passed = {entry.partition("#")[0] for entry in path}
        for actor, addr in self.scope.waiting().items():
            if actor not in passed:
                self.rt.connect(addr).send_message(msgspec.structs.replace(
                    probe, target=actor.rpartition("[")[0], waiter=here, path=path, addrs=addrs))

    def probed(self, probe: Probe) -> None:
        """A deadlock probe (edge chasing) came.  Searching: if the call
        that sent it waits for this actor (its call is queued here, or under
        way), and the mailbox call under way waits (through its chain) for
        the call that started the probe, the probe went round a cycle of
        busy actors, each waiting for the next: it goes, found, to the
        actor of the cycle whose mailbox call is named first (every probe
        that finds the cycle picks the same one); else on to the actors the
        call under way waits for.  Found: the call queued here from the
        actor before this one in the cycle fails with DeadlockError (the
        other calls of the cycle then go on), unless this actor moved on.
        Each check is of this process's state now, so a wait answered, or a
        call finished, on the way (a stale edge) stops the probe."""
        if self.serving is None or self.scope is None:
            return
        here = f"{self.identity}#{self.seq}"
        if probe.found:
            if here in probe.path:
                at = probe.path.index(here)
                self._break(probe.path[at - 1] if at else probe.goal[-1],
                            probe.path[at:] + probe.path[:at])
            return
        if self.probe_seq != self.seq:
            self.probe_seq, self.passed = self.seq, set()
        key = (probe.path[0], probe.goal)
        waiter = (probe.waiter,)
        if key in self.passed or not (self.scope.caller_chain[-1:] == waiter or any(
                call.chain[-1:] == waiter and (conn, call.req) in self.queued
                for conn, call, _, _ in self.mailbox)):
            return
        self.passed.add(key)
        if here not in probe.goal:
            self._pass_on(probe)
            return
        path, addrs = (*probe.path, here), (*probe.addrs, self.rt.addr)
        first = path.index(min(path))
        found = msgspec.structs.replace(probe, target=path[first].rpartition("[")[0],
                                        path=path, addrs=addrs, found=True)
        if first == len(path) - 1:
            self.probed(found)
        else:
            self.rt.connect(addrs[first]).send_message(found)

    def _break(self, before: str, cycle: tuple[str, ...]) -> None:
        """Fail the call queued here from mailbox call ``before``, the one
        before this actor in ``cycle`` (this actor's call first)."""
        for conn, msg, _, _ in self.mailbox:
            if msg.chain[-1:] == (before,) and (conn, msg.req) in self.queued:
                self.queued.remove((conn, msg.req))
                self._fail(conn, msg.req, self._deadlock(msg, self.endpoints.get(msg.method),
                                                         None, cycle))
                return

    def _deadlock(self, msg: Call, desc: EndpointDescriptor[Any, Any, Any] | None,
                  waited: str | None, cycle: tuple[str, ...] = ()) -> ErrorInfo:
        """Why ``msg`` fails: it waits for a slot of its bounded endpoint
        ``desc``, each held by a call of its chain; or for the call under
        way (reentrant), the call under way waits for actor ``waited`` of its
        chain, or for the next actor of ``cycle`` (mailbox calls, this one
        first, each waiting for the next, the last for ``msg``)."""
        names = [_named(entry) for entry in msg.chain]
        chain = " -> ".join([*names, self.where])
        called = desc.fn.__qualname__ if desc is not None else msg.method
        if desc is not None and desc.limit is not None:
            n = desc.limit
            holders = "the call" if n == 1 else f"each of the {n} calls"
            if all(server in msg.chain for server in self.slots[desc.name].held):
                what, waits = "reentrant call", "waits (through this chain) for this call"
            else:  # (some wait for other calls waiting for a slot: see _Slots.hold_for)
                what, waits = "call", ("waits (through its chain) for this call or for "
                                       "another call waiting for a slot, so none of them ends")
            return ErrorInfo(
                "deadlock", "DeadlockError",
                f"{what} would deadlock: {chain}: this call to {called} waits for a slot of "
                f"@endpoint(concurrent={n}), and {holders} of {called} under way in "
                f"{self.where} {waits}; raise the bound, mark {called} "
                "@endpoint(concurrent=True) (no bound), or do not call back an endpoint whose "
                "slots your call holds", actor=self.ctx.actor_name, rank=self.ctx.point.rank)
        busy = self.serving.fn.__qualname__ if self.serving is not None else "?"
        if cycle:
            ring = [_named(entry) for entry in cycle]
            why = (f"call would deadlock: a cycle of busy actors {' -> '.join([*ring, ring[0]])}: "
                   f"{self.where} is busy with {busy}, which waits for a call to {ring[1]}; "
                   f"each waits for the next, and {ring[-1]} for this call to {called} "
                   f"(its chain: {chain})")
        elif waited is None:
            why = (f"reentrant call would deadlock: {chain}: {self.where} is busy with {busy}, "
                   f"which waits (through this chain) for this call to {called}")
        else:
            other = _named(waited)
            why = (f"call would deadlock: {chain}: {self.where} is busy with {busy}, which "
                   f"waits for a call to {other}, while {other} is busy with a call that "
                   f"waits (through this chain) for this call to {called}")
        return ErrorInfo(
            "deadlock", "DeadlockError",
            f"{why}, and a normal endpoint runs only after the call under way; mark "
            f"{called} @endpoint(concurrent=True) to let it run while the actor is busy, or "
            "do not call an actor that waits for you", actor=self.ctx.actor_name,
            rank=self.ctx.point.rank)

    def held_for(self, chain: tuple[str, ...], sent: str) -> str | None:
        """``Mailbox.held_for``: the mailbox call under way (if any) is one
        of ``chain``: the message naming the chain, as a reentrant call's."""
        serving = self.serving
        if serving is None or f"{self.identity}#{self.seq}" not in chain:
            return None
        names = " -> ".join([*(_named(entry) for entry in chain), self.where])
        waits = ("the call awaiting it" if chain[-1] == f"{self.identity}#{self.seq}" else
                 "which waits (through this chain) for the call awaiting it")
        return (f"awaited broadcast would deadlock: {names}: this broadcast of {sent} waits "
                f"for room in the mailbox of {self.where} (max_queued={self.max_queued}), and "
                f"{self.where} is busy with {serving.fn.__qualname__}, {waits}: nothing "
                f"leaves the mailbox until that call returns; mark {sent} "
                "@endpoint(concurrent=True) (its calls do not queue), or send it to this "
                "actor without awaiting (it goes once there is room)")

    def cancel(self, conn: Connection, req: int, expired: bool = False) -> None:
        """The caller of ``req`` gave up (``expired``: its deadline passed):
        drop the call if queued (in the mailbox, or waiting for a slot of a
        bounded concurrent endpoint: it took none), cancel it if it is an
        async call under way (a running ``def`` call finishes;
        ``context().cancelled()`` tells it)."""
        key = (conn, req)
        if key in self.queued:
            self.queued.remove(key)
            self.expired += expired
            return
        scope = self.scopes.get(key)
        if scope is not None:
            if scope.cancelled:  # given up already (its deadline passed here: expire)
                return
            scope.cancelled = True
        task = self.running.get(key)
        if task is None and scope is not None and scope is self.scope \
                and self.serving is not None and self.serving.is_async:
            task = self.task  # the mailbox call under way
        if task is not None and key not in self.cancelled:
            self.cancelled.add(key)
            task.cancel()

    def lost(self, conn: Connection) -> None:
        """``conn`` is gone: nobody can take the answers of its calls, as if
        their caller had cancelled each."""
        for key in [k for k in (*self.queued, *self.scopes) if k[0] is conn]:
            self.cancel(*key)

    def stop(self, exc: BaseException | None = None) -> asyncio.Task[None]:
        """Stop the actor (idempotent): it takes no more calls, calls not
        started fail, async calls under way are cancelled.  Returns the task
        that finishes the stop (awaiting it is optional): it waits for the
        calls under way to end (a running ``def`` call cannot be cancelled),
        stops what the actor owns (:func:`_stop_owned`), then runs
        ``__cleanup__(exc)``; each step bounded in time."""
        if self.stopping is not None:
            return self.stopping
        tasks = [t for t in (self.task, *self.tasks) if not t.done()]
        for task in tasks:
            task.cancel()
        if self.rt.has_state(Registry):  # RDMA was used here
            self.rt.state(Registry).release_owned(self.target)  # its registrations go with it
        for conn, msg in self.waiting():
            if msg.req:
                conn.send_message(Fail(msg.req, self._stopped(
                    "supervision", "SupervisionError", "before handling this call")))
        given: dict[tuple[Connection, str], int] = {}
        for conn, msg, _, _ in self.mailbox:  # (concurrent calls hold no credit)
            if msg.bounded:
                given[conn, msg.origin] = given.get((conn, msg.origin), 0) + 1
        self.mailbox.clear()
        for slots in self.slots.values():
            slots.waiting.clear()
        self.queued.clear()
        for (conn, origin), n in given.items():  # its callers' calls from now on find no actor
            took(conn, self.target, 1, origin, n)
        self.stopping = self.rt.tasks.start(self._finish_stop(tasks, exc))
        return self.stopping

    async def _finish_stop(self, tasks: list[asyncio.Task[Any]],
                           exc: BaseException | None) -> None:
        me = asyncio.current_task()
        ends: list[asyncio.Future[Any]] = [t for t in tasks if t is not me]
        if self.thread.thread is not None:  # a def call under way ends first
            ends.append(self.thread.submit(lambda: None))
        if ends:
            await asyncio.wait(ends, timeout=CLEANUP_TIMEOUT)
        try:
            await _stop_owned(self.ctx, self.where)
            await self._cleanup(exc)
        finally:
            self.thread.close()

    def _stopped(self, kind: ErrorKind, type_name: str, when: str) -> ErrorInfo:
        return ErrorInfo(
            kind, type_name,
            f"actor {self.ctx.actor_name!r} rank {self.ctx.point.rank} was stopped {when}",
            actor=self.ctx.actor_name, rank=self.ctx.point.rank)

    async def _cleanup(self, exc: BaseException | None) -> None:
        hook = getattr(self.instance, "__cleanup__", None)
        if hook is None:
            return
        await _bounded(self._call_cleanup(hook, exc), CLEANUP_TIMEOUT,
                       f"{type(self.instance).__qualname__}.__cleanup__ of {self.where}")

    async def _call_cleanup(self, hook: Callable[[BaseException | None], Any],
                            exc: BaseException | None) -> None:
        _context.set(self.ctx)
        if inspect.iscoroutinefunction(hook):
            await hook(exc)
        else:
            await self.thread.run(hook, exc)

    def _fail(self, conn: Connection, req: int, info: ErrorInfo) -> None:
        if req:
            conn.send_message(Fail(req, info))
        elif info.kind in ("schema", "unknown_endpoint"):
            # A broadcast this actor could not run (its sender's mistake): no
            # failure of the actor, whose process a supervisor would replace.
            log.error("meshio: a broadcast to %s was not run: %s", self.where, info.message)
        else:  # nobody waits for a broadcast: a supervision event
            self.rt.report_fault(info)

    def _error(self, conn: Connection, req: int, e: BaseException) -> None:
        """The endpoint raised ``e``: tell the caller (or report a fault).
        ``SystemExit``/``KeyboardInterrupt`` also end the actor as a failure."""
        info = actor_error(e, self.ctx)
        if not isinstance(e, (SystemExit, KeyboardInterrupt)):
            self._fail(conn, req, info)
            return
        if req:
            conn.send_message(Fail(req, info))
        if self.stopping is None:
            if self.rt.actors.get(self.target) is self:
                del self.rt.actors[self.target]
                self.rt.incarnation.failed[self.target] = (
                    f"(rank {self.ctx.point.rank}) was stopped by the {info.type_name} an "
                    f"endpoint raised: {info.message}")
            fault = ErrorInfo(info.kind, info.type_name,
                              f"{info.message} (raised by an endpoint: the actor was stopped)",
                              info.traceback, info.actor, info.rank)

            def report(stopping: asyncio.Task[None]) -> None:
                if not stopping.cancelled():  # (cancelled: the worker is exiting)
                    self.rt.report_fault(fault, stopped=True)

            self.stop(e).add_done_callback(report)

    async def _pump(self) -> None:
        _context.set(self.ctx)
        mailbox = self.mailbox
        loop = self.rt.loop
        while self.stopping is None:
            if not mailbox:
                self.waiter = waiter = loop.create_future()
                try:
                    await waiter
                except asyncio.CancelledError as e:
                    if self.begun is None:
                        raise
                    if self.begun.thrown is None:  # (else the call ended raising that)
                        self.begun.thrown = e  # (this task was cancelled: it is the begun call's)
                begun, self.begun = self.begun, None
                if begun is not None:
                    try:
                        await begun
                    except GeneratorExit:
                        if not _thrown_in(self.task):
                            raise
                continue
            run = self._next()
            if run is not None:
                try:
                    await run  # (a coroutine done keeps nothing of its call)
                except GeneratorExit:
                    if not _thrown_in(self.task):
                        raise

    def _next(self) -> Coroutine[Any, Any, None] | None:
        """Take the first call of the mailbox (its credit goes back to its
        caller): what serves it (:meth:`_serve`), or None if its caller
        cancelled it meanwhile or it ends here.  (Its values go with this
        frame: an idle actor keeps none of its last call.)"""
        conn, msg, bufs, deadline = self.mailbox.popleft()
        if msg.bounded:
            took(conn, self.target, self.credit_batch, msg.origin)
        if msg.req:
            key = (conn, msg.req)
            if key not in self.queued:  # cancelled by its caller
                return None
            self.queued.remove(key)
        try:
            return self._serve(conn, msg, bufs, deadline)
        except Exception as e:  # a bug: its caller hears of it, not a hang
            self.rt.refuse(conn, msg, e)
            return None

    def _serve(self, conn: Connection, msg: Call, bufs: Buffers,
               deadline: float | None) -> Coroutine[Any, Any, None] | None:
        """What serves a mailbox call whose turn has come (to run in the
        mailbox task): the coroutine that runs it, or None if it ends here
        (its deadline passed, no such endpoint, bad arguments: answered).
        (Not a coroutine itself: a call served runs one coroutine of meshio's,
        :meth:`_run`, not two.)"""
        if deadline is not None and (late := time.monotonic() - deadline) >= 0:
            self._expire(conn, msg, late, "in the mailbox")
            return None
        desc = self.endpoints.get(msg.method)
        if desc is None:
            self._fail(conn, msg.req, ErrorInfo(
                "unknown_endpoint", "UnknownEndpointError",
                f"{type(self.instance).__qualname__} has no endpoint {msg.method!r} "
                f"(it has {sorted(self.endpoints)})", actor=self.ctx.actor_name,
                rank=self.ctx.point.rank))
            return None
        try:
            args, kwargs = desc.schema.unpack_args(msg.args, bufs)
        except SchemaError as e:
            self._fail(conn, msg.req, actor_error(e, self.ctx, "schema"))
            return None
        self.seq += 1
        run = self._run(conn, msg.req, desc, args, kwargs,
                        CallScope(deadline, msg.chain, self.identity, self.seq), self.task)
        if TRACING and (msg.trace or OTEL._TRACER_PROVIDER is not None):  # (else served() is run)
            return served(run, msg.trace, desc.qualname, self.where)
        return run

    def _expire(self, conn: Connection, msg: Call, late: float, where: str) -> None:
        """Drop call ``msg``, whose deadline passed ``late`` seconds ago while
        it waited ``where``, without running it (its caller is told)."""
        self.expired += 1
        if msg.req:
            conn.send_message(Fail(msg.req, ErrorInfo(
                "timeout", "CallTimeout",
                f"{self.where}: {msg.method} dropped without running: its deadline "
                f"passed {late:.3f} s ago while it waited {where}",
                actor=self.ctx.actor_name, rank=self.ctx.point.rank)))

    async def _run_concurrent(self, conn: Connection, msg: Call,
                              desc: EndpointDescriptor[Any, Any, Any],
                              args: tuple[Any, ...], kwargs: dict[str, Any],
                              deadline: float | None, server: str) -> None:
        task = asyncio.current_task()
        assert task is not None
        run = self._run(conn, msg.req, desc, args, kwargs,
                        CallScope(deadline, msg.chain, server), task)
        try:
            await (served(run, msg.trace, desc.qualname, self.where) if TRACING else run)
        except GeneratorExit:
            if not _thrown_in(task):
                raise

    async def _run(self, conn: Connection, req: int, desc: EndpointDescriptor[Any, Any, Any],
                   args: tuple[Any, ...], kwargs: dict[str, Any],
                   scope: CallScope, task: asyncio.Task[Any]) -> None:
        """Serve a call in ``task`` (the mailbox's, or a concurrent call's own)
        within ``scope``."""
        if req and desc.retry is not None:
            await _started(conn, req)
        if context_or(None) is not self.ctx:  # (a new one once its mesh grew or shrank)
            enter_context(self.ctx)
        enter_scope(scope)  # (a def endpoint's thread runs in a copy of this context)
        key = (conn, req)
        if req:  # (a concurrent call's task is in ``running`` already; a mailbox call's is
            self.scopes[key] = scope  # the mailbox task, found by its scope: see cancel())
        if scope.deadline is not None and desc.is_async:  # (see CallScope.expire)
            scope.task = task
        meter = self.meters[desc.name]
        start = time.monotonic()
        mailbox = not desc.concurrent
        if mailbox:
            self.serving, self.scope, self.since = desc, scope, start
        else:
            self.concurrent_calls[task] = (desc, scope, start)
        try:
            try:
                if desc.is_async:
                    result = await desc.fn(self.instance, *args, **kwargs)
                else:
                    result = await self.thread.run(desc.fn, self.instance, *args, **kwargs)
            except BaseException as e:
                scope.task = None  # (what it started, outliving it: see CallScope.expire)
                error = not isinstance(e, asyncio.CancelledError)
                meter.record(time.monotonic() - start, error)
                if TRACING and error:
                    failed(e)
                by_caller = self._done(key, task)
                if scope.expired:  # (its deadline passed here: CallScope.expire cancelled it)
                    task.uncancel()
                if isinstance(e, asyncio.CancelledError) and (
                        by_caller or scope.cancelled or task.cancelling()):
                    if task.cancelling():  # the actor is stopping
                        if req:
                            conn.send_message(Fail(req, self._stopped(
                                "supervision", "SupervisionError", "while handling this call")))
                        raise
                    return  # its caller gave up (or its deadline passed): nobody to answer
                self._error(conn, req, e)
                return
            scope.task = None
            ran = time.monotonic() - start
            n = meter.calls  # (Meter.record of a call that returned, inline: this runs per call)
            meter.window[n & METER_MASK] = ran
            meter.calls = n + 1
            meter.seconds += ran
            if mailbox and not self.cancelled:  # (_done's common case, inline: this runs per call)
                self.scopes.pop(key, None)
            else:
                self._done(key, task)
            if scope.expired:  # (and its endpoint went on: CancelledError caught)
                task.uncancel()
            if not req:
                return
            packer = Packer()
            try:
                body = desc.schema.pack_result(result, packer)
            except BaseException as e:  # the result's own code (e.g. __reduce__) may raise anything
                why = actor_error(e, self.ctx, "schema")
                detail = why.message if isinstance(e, (SchemaError, Unsendable)) else \
                    f"{why.type_name}: {why.message}"
                conn.send_message(Fail(req, ErrorInfo(
                    "schema", "SchemaError",
                    f"result of {desc.fn.__qualname__} could not be encoded: {detail}",
                    actor=self.ctx.actor_name, rank=self.ctx.point.rank)))
                return
            read = conn.reply(req, body, packer)
            if read is not None:
                await self._until_read(read)
        finally:
            if mailbox:
                # (Its scope stays set in the mailbox task's context, where
                # nothing else runs before the next call sets its own: a
                # context variable set costs ~1k instructions.  What it
                # waited for goes: answers are not kept until then.)
                self.serving = None
                if scope.waits is not None:
                    scope.waits = None
            else:
                del self.concurrent_calls[task]

    async def _until_read(self, read: asyncio.Future[None]) -> None:
        """A large result is read from this process's memory after it was
        sent (a caller on this host copies it; a connection writes it in
        slices): the actor runs nothing else (which could change the value in
        place, e.g. a tensor it keeps) until that is over, or for at most
        :data:`LEND_TIMEOUT` seconds (a stopped caller must not stop the
        actor for its other callers)."""
        try:
            await within(asyncio.shield(read), LEND_TIMEOUT)
        except TimeoutError:
            log.warning("meshio: %s: a large result is still being read after %g s; the "
                        "actor goes on (changing that value in place now may reach its "
                        "caller)", self.identity, LEND_TIMEOUT)

    def _ended(self, key: tuple[Connection, int], task: asyncio.Task[Any]) -> None:
        """A concurrent call's task is over, perhaps cancelled before it
        started (its caller gave up at once): nothing of it is kept."""
        self.tasks.discard(task)
        if self.running.get(key) is task:
            del self.running[key]
        self.scopes.pop(key, None)
        self.cancelled.discard(key)

    def _done(self, key: tuple[Connection, int], task: asyncio.Task[Any]) -> bool:
        """The call ``key`` ended; True if its caller had cancelled it (the
        cancellation request is then withdrawn from the task)."""
        if task is not self.task:  # a concurrent call's
            self.running.pop(key, None)
        self.scopes.pop(key, None)
        if key not in self.cancelled:
            return False
        self.cancelled.remove(key)
        task.uncancel()
        return True


class _Slots:
    """The calls of one endpoint bounded by ``@endpoint(concurrent=N)`` in
    one actor: the calls under way (a slot is free while they are fewer than
    N), and those waiting for a slot in arrival order, each as it will start (its
    arguments unpacked) with its deadline (``time.monotonic()``).  A waiting
    call that asks for an answer is in :attr:`ActorCell.queued` too, which
    it leaves when its caller gives up."""

    __slots__ = ("held", "waiting")

    def __init__(self) -> None:
        self.waiting: deque[tuple[Connection, Call, tuple[Any, ...], dict[str, Any],
                                  float | None]] = deque()
        #: the calls holding a slot, by what each is in the chains of the
        #: calls it makes (:meth:`ActorCell._holder`): their tasks
        self.held: dict[str, asyncio.Task[None]] = {}

    def hold_for(self, chain: tuple[str, ...], queued: set[tuple[Connection, int]]) -> bool:
        """Whether every call holding a slot (none is free) waits for the
        call that came with ``chain`` or for another call waiting for a
        slot: each still runs (a call it made and did not await, answered
        as it ends, waits for nothing) and is in ``chain`` or in the chain
        of a waiting call that asks for an answer (a broadcast is waited
        for by nobody) and is still ``queued`` (not given up).  None of
        them can end then, nor free a slot: calls of separate roots, each
        holding a slot, whose calls back wait for one.  Only a call whose
        chain holds one of them can close that (each call back before it
        was looked at as it came), so only then are the others read."""
        held = self.held
        if not any(entry in held for entry in chain):
            return False
        free = {server for server, task in held.items() if not task.done()}
        if len(free) < len(held):
            return False
        free.difference_update(chain)
        for conn, msg, *_ in self.waiting:
            if not free:
                break
            if msg.req and (conn, msg.req) in queued:
                free.difference_update(msg.chain)
        return not free


class _GoOn:
    """What the mailbox task awaits to go on with a call begun outside it
    (:meth:`ActorCell._begin`): that call's coroutine (``cr_await``, as a
    coroutine's, so stack captures follow it) was suspended on ``yielded``,
    or is to have ``thrown`` thrown in (or, if it ended raising ``thrown``
    on its first step, raises it); from there, what ``await`` of the
    coroutine does."""

    __slots__ = ("cr_await", "first", "thrown", "yielded")

    def __init__(self, coro: Coroutine[Any, Any, None], yielded: Any,
                 thrown: BaseException | None) -> None:
        self.cr_await = coro
        self.yielded = yielded
        self.thrown = thrown
        self.first = True

    def __await__(self) -> Any:
        return self

    def __next__(self) -> Any:
        return self.send(None)

    def send(self, value: Any) -> Any:
        if self.thrown is not None:
            thrown, self.thrown = self.thrown, None
            first, self.first = self.first, False
            waited = self.yielded
            if first and isinstance(thrown, asyncio.CancelledError) and asyncio.isfuture(waited):
                # The task was cancelled before it took over the call: cancel
                # what the call waits for, as Task.cancel does (an inner
                # call's future sends its own Cancel); it wakes the task.
                if waited.cancel(*thrown.args):
                    return waited
                if not waited.cancelled():
                    waited.exception()  # (done: dropped, as a cancelled task drops it)
            if inspect.getcoroutinestate(self.cr_await) == inspect.CORO_CLOSED:  # it raised it
                raise thrown
            return self.cr_await.throw(thrown)
        if self.first:  # the task's first step: it waits for what the call waits for
            self.first = False
            return self.yielded
        return self.cr_await.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self.first = False
        if val is None and tb is None:
            return self.cr_await.throw(typ)
        return self.cr_await.throw(typ, val, tb)

    def close(self) -> None:
        self.cr_await.close()


async def _started(conn: Connection, req: int) -> None:
    """Before a call ``req`` of an endpoint with a retry policy runs: tell its
    caller (which counts the process deaths a call was running in, for
    ``poison_after``) and wait until that is written."""
    conn.send_message(Started(req))
    await conn.flushed(STARTED_FLUSH)


def _deadline(budget: float | None) -> float | None:
    """The deadline (``time.monotonic()``) of a call that arrived with
    ``budget`` seconds left; a budget that is not a finite number (only a
    faulty peer sends one) is no deadline."""
    if budget is None or not math.isfinite(budget):
        return None
    return time.monotonic() + max(budget, 0.0)


def _named(entry: str) -> str:
    """The actor of a chain entry (``"<target>[<rank>]"``, then ``"#<n>"``
    for a mailbox call or ``"!<n>"`` for one holding a slot), as messages
    name it: ``"<name>[<rank>]"``."""
    return entry[:entry.rfind("]") + 1].rsplit("/", 1)[-1]


def _where(ctx: Context[Any]) -> str:
    return f"{ctx.actor_name}[{ctx.point.rank}]"


def _thread_name(name: str, rank: int) -> str:
    return f"meshio-actor {name}[{rank}]"


@dataclass(eq=False)
class Construction:
    """An actor whose constructor runs (its ``__init__``, then an
    ``on_restart`` hook), as ``stacks()`` shows it: its mesh's target, its
    context, its thread, the task building it, since when
    (``time.monotonic()``)."""

    target: str
    ctx: Context[Any]
    thread: ActorThread
    task: asyncio.Task[Any] | None
    since: float = field(default_factory=time.monotonic)


class Building:
    """Per runtime: the actors whose constructor runs, by target, each with
    the stops asked of it meanwhile (a ``StopActor`` that came first, as a
    spawn its caller gave up on sends); and every construction under way
    (:attr:`under_way`, stopped or not), for ``stacks()``.  A stopped one
    is stopped once built instead of taking calls; its target is free at
    once, for a new spawn of the same name.  A constructor cannot be
    interrupted: each stop is answered once the actor is built and stopped,
    or after :data:`CLEANUP_TIMEOUT`, whichever comes first (as a stop goes
    on without a ``__cleanup__`` that takes longer)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        #: the construction under way of each target: the stops asked of it
        self.stops: dict[str, list[asyncio.Future[None]]] = {}
        #: every construction under way
        self.under_way: set[Construction] = set()

    def stop(self, target: str, conn: Connection, req: int) -> bool:
        """Ask ``target``'s construction, if one runs, to stop once built
        (answering ``req`` on ``conn``); False if none runs."""
        stops = self.stops.pop(target, None)
        if stops is None:
            return False
        answered: asyncio.Future[None] = self.rt.loop.create_future()
        timer = self.rt.loop.call_later(CLEANUP_TIMEOUT, _settle, answered, True, None)
        answered.add_done_callback(lambda _: timer.cancel())
        answered.add_done_callback(lambda _: conn.send_message(Reply(req, MSGPACK_NIL)))
        stops.append(answered)
        return True

    def built(self, target: str, stops: list[asyncio.Future[None]]) -> bool:
        """``target``'s construction (whose stops are ``stops``) has ended:
        True if nobody asked it to stop meanwhile."""
        if self.stops.get(target) is stops:
            del self.stops[target]
            return True
        return False

    def close(self) -> None:
        self.stops.clear()
        self.under_way.clear()


def _stopped_meanwhile(stops: list[asyncio.Future[None]]) -> None:
    """Answer the stops asked of an actor while it was built (those not
    answered already)."""
    for answered in stops:
        _settle(answered, True, None)


async def spawn_cell(rt: Runtime, conn: Connection, msg: SpawnActor, bufs: Buffers,
                     built: Callable[[], None]) -> None:
    """Build the actor of a SpawnActor message and answer the spawner.  Its
    ``__init__`` (and a sync ``on_restart``) runs in the actor's thread, where
    its ``def`` endpoints will run, so thread-local state it sets (a
    ``threading.local``, ``torch.set_grad_enabled``) is theirs.  Stopped
    while built (:class:`Building`): stopped once built, never serving.
    ``built()`` is called before the answer goes (see :func:`_on_spawn`)."""
    ctx: Context[Any] | None = None
    thread = ActorThread(rt, _thread_name(msg.name, msg.rank))
    building = rt.state(Building)
    stops: list[asyncio.Future[None]] = []
    try:
        if msg.target in rt.actors or msg.target in building.stops:
            raise ValueError(f"an actor mesh named {msg.name!r} already lives in this process")
        building.stops[msg.target] = stops
        cls = loads(msg.cls, [], 0)
        mesh = loads(msg.mesh, [], 0)
        point = Region.full(msg.labels, msg.sizes).point(msg.rank)
        proc_rank = msg.rank if msg.proc_rank < 0 else msg.proc_rank
        ctx = Context(point, msg.name, ProcInfo(proc_rank, os.getpid(), rt.host, rt.addr), mesh)
        args, kwargs = cls._meshio_ctor.unpack_args(msg.args, bufs)
        token = _context.set(ctx)
        construction = Construction(msg.target, ctx, thread, asyncio.current_task())
        building.under_way.add(construction)
        try:
            instance = cls.__new__(cls)
            instance._meshio_context = ctx
            await thread.run(instance.__init__, *args, **kwargs)
            if msg.restart:
                hook = getattr(instance, "on_restart", None)
                if inspect.iscoroutinefunction(hook):
                    await hook()
                elif hook is not None:
                    await thread.run(hook)
        finally:
            _context.reset(token)
            building.under_way.discard(construction)
    except SchemaError as e:
        thread.close()
        building.built(msg.target, stops)
        built()
        conn.send_message(Fail(msg.req, actor_error(e, ctx, "schema")))
        _stopped_meanwhile(stops)
        return
    except BaseException as e:  # SystemExit, KeyboardInterrupt too: the spawn fails
        thread.close()
        if _own_cancellation(e):
            raise
        building.built(msg.target, stops)
        if ctx is not None:  # what the constructor started goes with it
            await _stop_owned(ctx, f"{msg.name}[{msg.rank}]")
        info = actor_error(e, ctx)
        if ctx is None:
            info = msgspec.structs.replace(info, actor=msg.name, rank=msg.rank)
        built()
        conn.send_message(Fail(msg.req, info))
        _stopped_meanwhile(stops)
        return
    cell = ActorCell(rt, msg.target, ctx, instance, thread,
                     msg.stall_after if msg.stall_after > 0 else STALL_AFTER,
                     msg.max_queued if msg.max_queued > 0 else MAX_QUEUED)
    if not building.built(msg.target, stops):  # stopped while built: stopped now
        # (built all the same: a supervisor's rebuild does not count a failure
        # for an actor mesh stopped on purpose; a spawn given up hears nothing)
        built()
        conn.send_message(Reply(msg.req, MSGPACK_NIL))
        cell.stop().add_done_callback(lambda _: _stopped_meanwhile(stops))
        return
    rt.actors[msg.target] = cell
    rt.incarnation.failed.pop(msg.target, None)
    rt.state(StallWatch)  # (started with the first actor)
    # One turn first: the mailbox task's first step (scheduled before this
    # task's wake-up) sets it waiting, so that the first call, which may
    # come as soon as the answer lands, finds the actor idle and begins at
    # once, as every later call to an idle actor does (ActorCell._begin),
    # rather than queueing for a task not yet started.
    await asyncio.sleep(0)
    built()
    conn.send_message(Reply(msg.req, MSGPACK_NIL))


class StallWatch:
    """Per runtime: reports each call (a mailbox call, or a concurrent
    one) that has run longer than its actor's ``stall_after``, once, with
    its stacks, to the controller that started this process (which logs it
    and tells the supervisor)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        #: the tasks of the concurrent calls reported (a mailbox call's:
        #: :attr:`ActorCell.stalled`)
        self.reported: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        self.task = rt.tasks.start(self._watch(), name="meshio stall watch")

    def close(self) -> None:
        self.task.cancel()

    async def _watch(self) -> None:
        while True:
            cells = [c for c in list(self.rt.actors.values()) if isinstance(c, ActorCell)]
            shortest = min((c.stall_after for c in cells), default=STALL_AFTER)
            await asyncio.sleep(min(max(shortest / 4, 0.05), 1.0))
            now = time.monotonic()
            for cell in cells:  # (nothing here awaits: the calls stay as they are)
                serving = cell.serving
                if serving is not None and cell.stalled != cell.seq:
                    running = _running(now, cell.since, cell.scope)
                    if running is not None and running >= cell.stall_after:
                        cell.stalled = cell.seq
                        self._report(cell, serving, running, functools.partial(capture, cell))
                for task, (desc, scope, since) in cell.concurrent_calls.items():
                    if task in self.reported:
                        continue
                    running = _running(now, since, scope)
                    if running is not None and running >= cell.stall_after:
                        self.reported.add(task)
                        self._report(cell, desc, running, functools.partial(
                            capture_call, cell, task, desc.qualname, running))

    def _report(self, cell: ActorCell, serving: EndpointDescriptor[Any, Any, Any],
                running_for: float, stacks: Callable[[], ActorStacks]) -> None:
        try:
            stack = Stacks((stacks(),)).text()
        except Exception as e:  # a report without its stack, rather than none
            stack = f"(its stack could not be captured: {type(e).__name__}: {e})"
        msg = Stalled(cell.ctx.actor_name, cell.ctx.point.rank, serving.qualname, running_for,
                      cell.stall_after, stack)
        if self.rt.controller is None:  # this process is the controller: say it here
            log.warning("%s", stall_line(msg))
        else:
            self.rt.connect(self.rt.controller).send_message(msg)


def _running(now: float, since: float, scope: CallScope | None) -> float | None:
    """Seconds a call that started at ``since`` has run at ``now``, less
    its pauses in pdb; None while paused (not stalled)."""
    if scope is None:
        return now - since
    if scope.paused_at is not None:
        return None
    return now - since - scope.paused_for


def stall_line(msg: Stalled) -> str:
    """The warning for a stalled call."""
    return (f"meshio: {msg.actor} rank {msg.rank}: {msg.endpoint} has been running for "
            f"{msg.running_for:.1f} s (stall_after={msg.stall_after:g} s); it is at:\n"
            f"{msg.stack}")


def cell_of(rt: Runtime, target: str) -> ActorCell | None:
    """The actor cell ``target`` of ``rt``, if it lives there."""
    cell = rt.actors.get(target)
    return cell if isinstance(cell, ActorCell) else None


def _on_spawn(rt: Runtime, conn: Connection, msg: SpawnActor, bufs: Buffers) -> None:
    building = rt.incarnation.building  # (a call for it meanwhile: not built yet, not stopped)
    building.add(msg.target)
    # The controller's heartbeats wait while it is built (decoding its class
    # and arguments, its __init__ holding the GIL: not a hang); said once
    # read, so a process stopped before it reads a spawn is judged as any
    # other.  Its end is said before the answer (the spawner may stop the
    # process as soon as it has it), or as the task ends without one.
    what = f"{msg.name}.__init__"
    tell_held(rt, what, True)
    said = False

    def built() -> None:
        nonlocal said
        if not said:
            said = True
            tell_held(rt, what, False)

    def ended(_: object) -> None:
        building.discard(msg.target)
        built()
    rt.tasks.start(spawn_cell(rt, conn, msg, bufs, built)).add_done_callback(ended)


register_handler(SpawnActor, _on_spawn)


def _on_probe(rt: Runtime, conn: Connection, msg: Probe, bufs: Buffers) -> None:
    cell = rt.actors.get(msg.target)
    if isinstance(cell, ActorCell):
        cell.probed(msg)


register_handler(Probe, _on_probe)


def _on_stop(rt: Runtime, conn: Connection, msg: StopActor, bufs: Buffers) -> None:
    """Stop the actor ``msg.target``; answered once its ``__cleanup__`` has run."""
    rt.order.forget(msg.target)
    cell = rt.actors.pop(msg.target, None)
    # stopped through a reference held elsewhere: the controller notes it first
    told = (rt.tasks.start(_told(rt, msg.target))
            if rt.controller is not None and conn.peer != rt.controller else None)
    req = msg.req
    if cell is None:
        if not rt.state(Building).stop(msg.target, conn, req):  # (else: once built)
            _stop_answered(conn, req, told)
    else:
        cell.stop().add_done_callback(lambda _: _stop_answered(conn, req, told))
    # Nothing of it stays here (its calls from now on are refused as stopped,
    # :meth:`Incarnation.stopped`): why it was missing, its callers' counts
    # (after the stop gave back those of its mailbox), its mesh's windows.
    rt.incarnation.failed.pop(msg.target, None)
    rt.incarnation.lost.discard(msg.target)
    for c in list(rt.all_conns):
        forget_target(c, msg.target, msg.whole)


register_handler(StopActor, _on_stop)

#: seconds a stop made from elsewhere waits for the controller to note it
#: (:func:`_told`; a controller gone or hung does not hold the stop longer)
TELL_TIMEOUT = 5.0


async def _told(rt: Runtime, target: str) -> None:
    """Tell the controller that started this process that its actor of mesh
    ``target`` was stopped (:class:`ActorStopped`), and wait until it has
    noted it (up to :data:`TELL_TIMEOUT`; gone or slow, the stop is
    answered anyway)."""
    assert rt.controller is not None
    await ask_each(rt, [(rt.controller, functools.partial(ActorStopped, target=target),
                         "controller", None)], ignore_result, "ActorStopped", TELL_TIMEOUT)


def _stop_answered(conn: Connection, req: int, told: asyncio.Task[None] | None) -> None:
    """Answer the stop ``req`` (0: none awaited), once ``told`` is done."""
    if told is None or told.done():
        conn.send_message(Reply(req, MSGPACK_NIL))
    else:
        told.add_done_callback(lambda _: conn.send_message(Reply(req, MSGPACK_NIL)))


def _on_reshaped(rt: Runtime, conn: Connection, msg: Reshaped, bufs: Buffers) -> None:
    """The actor's mesh grew or shrank: its context (``point``, its extent,
    ``mesh``) says so from its next message on."""
    cell = cell_of(rt, msg.target)
    if cell is None:  # stopped meanwhile
        return
    old = cell.ctx
    ctx = replace(old, point=Region.full(msg.labels, msg.sizes).point(msg.rank),
                  mesh=loads(msg.mesh, [], 0))
    object.__setattr__(ctx, "_owned", old._owned)  # (not an init field: the same list)
    instance: Any = cell.instance
    cell.ctx = instance._meshio_context = ctx
    cell.where = _where(ctx)


register_handler(Reshaped, _on_reshaped)


def _answer(rt: Runtime, conn: Connection, req: int, what: str,
            body: Callable[[], msgspec.Raw]) -> None:
    """Answer request ``req`` with ``body()``, made now on the loop (what
    ``what`` says it does); if that fails (a bug), the asker hears of it
    rather than waiting."""
    try:
        raw = body()
    except Exception as e:
        log.exception("meshio: %s failed", what)
        conn.send_message(Fail(req, ErrorInfo(
            "protocol", "ProtocolError", f"{what} in pid {os.getpid()} on {rt.host} failed "
            f"({type(e).__name__}: {e}); please report this")))
        return
    conn.send_message(Reply(req, raw))


def _cells(rt: Runtime, target: str = "") -> list[ActorCell]:
    """The actor cells of ``rt`` (of actor mesh ``target``; empty: all)."""
    return [cell for t, cell in list(rt.actors.items())
            if isinstance(cell, ActorCell) and target in ("", t)]


def _on_stacks(rt: Runtime, conn: Connection, msg: GetStacks, bufs: Buffers) -> None:
    """Answer a :class:`GetStacks` with the stacks of the actors of this
    process (of ``msg.target``, or all), those being built too, on the
    loop: no mailbox is involved."""
    building = [c for c in list(rt.state(Building).under_way) if msg.target in ("", c.target)]

    def stacks() -> msgspec.Raw:
        current = thread_frames()  # (once: a dict of every thread, each actor's among them)
        return encode_actors([*(capture(cell, current) for cell in _cells(rt, msg.target)),
                              *(capture_construction(c, current) for c in building)])
    _answer(rt, conn, msg.req, "capturing the actors' stacks", stacks)


register_handler(GetStacks, _on_stacks)


def _on_stats(rt: Runtime, conn: Connection, msg: GetStats, bufs: Buffers) -> None:
    """Answer a :class:`GetStats` with this process's numbers and its
    actors' (:mod:`meshio._metrics`), on the loop: no mailbox is involved."""
    _answer(rt, conn, msg.req, "gathering the process's stats",
            lambda: encode_report(process_report(rt.host, _cells(rt), records_dropped())))


register_handler(GetStats, _on_stats)
