"""Credit-based flow control of the calls to one actor: its bounded mailbox.

Caller side, per connection and actor (:class:`Window`): the calls sent to
the actor that it has not given back yet, at most ``limit`` (the actor's
``max_queued``).  A call beyond that waits in the caller, in order
(:meth:`Window.wait`), until the actor gives credit back; the adverbs fail
it at once instead with ``meshio.Overloaded`` when asked to
(``.options(on_full="raise")``).

Callee side (:func:`took`): each call its caller counted (``Call.bounded``)
is counted again when it leaves the mailbox (it starts, or is dropped:
expired, cancelled, refused, its actor stopped or gone); every ``batch`` of
them per connection and actor goes back in one :class:`Credit` message, so
the per-call path sends nothing more.  The caller's count includes the calls
taken but not yet given back, so the mailbox never holds more than ``limit``
calls of one caller; and a full window always gets credit back in the end
(``limit`` is at least ``batch``, and every call leaves the mailbox).

The bound is per caller, as Ray's ``max_pending_calls`` is per handle:
each process calling an actor may have ``max_queued`` calls waiting in its
mailbox.  Calls to ``concurrent`` endpoints (they start on arrival, never
queue in the mailbox) are not counted: those of an ``@endpoint(concurrent=N)``
waiting for a slot would otherwise hold up the caller's calls to the actor's
other endpoints, the one that frees the slot perhaps among them.

An actor mesh spanning several hosts is called directly (one actor) and
through the fan-out tree (all of them), and its calls are numbered per actor
(``Call.seq``) when they are sent.  Its caller keeps one :class:`Gate` for
the whole mesh: calls per actor address not given back, at most ``limit``
each, and one queue of the calls that wait for room, whatever their path;
a tree call goes once every actor it reaches has room.  No call overtakes
an earlier one of the same caller, so numbering them as they go keeps the
per-sender order.  An actor gives the credit of a tree call back the way
the call came (``Credit.origin``, ``Credit.addr``): each relay passes it up
to where that origin's tree calls came from (``FanoutState.ups``).

A process calling its own actors counts the credit they gave back to it
and it has not received yet (``Runtime.own_credit``): with none on its
way, a call waiting for room in the mailbox of such an actor, busy with a
call that waits for the caller, would wait forever (an awaited broadcast
fails with ``DeadlockError`` instead: ``ActorMesh._deadlocked``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from msgspec.structs import replace

from ._messages import Call, Credit
from ._serial import OutBuffers

if TYPE_CHECKING:
    from ._connection import Connection

log = logging.getLogger("meshio")

__all__ = ("Gate", "Waiting", "Window", "budget", "credit", "forget_target", "took",
           "window_gone", "windows_lost")


def budget(deadline: float | None) -> float | None:
    """What a call message carries of ``deadline`` (``time.monotonic()``):
    the seconds left, at least a microsecond (one already past is dropped
    by its callee, which answers ``CallTimeout``)."""
    return None if deadline is None else max(deadline - time.monotonic(), 1e-6)


class Waiting:
    """A call waiting for room (as small as it can be: a flood of
    broadcasts nobody awaits waits here): its deadline; once it went (or
    was dropped: given up, past its deadline, withdrawn), ``over``;
    ``error``: why it never will (its connection was lost); ``sent``: made
    only for someone awaiting it, done when it is over."""

    __slots__ = ("deadline", "error", "over", "sent")

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.over = False
        self.error: BaseException | None = None
        self.sent: asyncio.Future[None] | None = None

    def future(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """A future done when this call is over (failed: ``error``); from
        now on someone awaits it (a broadcast's send no longer counts as
        one nobody awaits)."""
        if self.sent is None:
            self.sent = loop.create_future()
            if self.error is not None:
                self.sent.set_exception(self.error)
            elif self.over:
                self.sent.set_result(None)
            else:
                self._awaited()
        return self.sent

    def withdraw(self) -> None:
        """Whoever awaited this send gave up on it (cancelled, or its
        deadline passed) before it went: it never goes."""
        if not self.over:
            self._withdraw()
            self.over = True
            if self.sent is not None:
                self.sent.cancel()

    def waits_at(self, target: str, addr: str) -> bool:
        """Whether this call waits (among others) for room in the mailbox
        of actor mesh ``target``'s actor in the process at ``addr``: it
        goes to that actor, which has none for this process now."""
        raise NotImplementedError

    def _awaited(self) -> None:
        raise NotImplementedError

    def _withdraw(self) -> None:
        raise NotImplementedError

    def _end(self, error: BaseException | None = None) -> None:
        self.over = True
        self.error = error
        sent = self.sent
        if sent is not None and not sent.done():
            if error is None:
                sent.set_result(None)
            else:
                sent.set_exception(error)


class _Held(Waiting):
    """A call waiting at ``window``: the message and its buffers."""

    __slots__ = ("call", "out", "window")

    def __init__(self, window: Window, call: Call, out: OutBuffers,
                 deadline: float | None) -> None:
        super().__init__(deadline)
        self.window = window
        self.call = call
        self.out = out

    def waits_at(self, target: str, addr: str) -> bool:
        window = self.window
        return (self.call.target == target and window.conn.peer == addr
                and window.used >= window.limit)

    def _awaited(self) -> None:
        self.window.sends -= not self.call.req

    def _withdraw(self) -> None:
        self.window.waiting.remove(self)  # (the others still wait for room: none now)


class Window:
    """The calls of this process to one actor over ``conn``: ``used`` of
    ``limit`` are sent and not given back; the calls waiting for room, of
    which ``sends`` are broadcasts nobody awaits (refused beyond ``limit``:
    nothing else bounds them)."""

    __slots__ = ("conn", "limit", "sends", "used", "waiting")

    def __init__(self, conn: Connection, limit: int) -> None:
        self.conn = conn
        self.limit = limit
        self.used = 0
        self.sends = 0
        self.waiting: deque[_Held] = deque()

    def full(self) -> bool:
        """A call now would wait (or fail with ``on_full="raise"``)."""
        return self.used >= self.limit or bool(self.waiting)

    def wait(self, call: Call, out: OutBuffers, deadline: float | None) -> Waiting:
        """Queue ``call`` (``Call.bounded``; its ``deadline`` budget is
        worked out when it goes) until there is room, behind the calls
        already waiting."""
        waiting = _Held(self, call, out, deadline)
        self.waiting.append(waiting)
        self.sends += not call.req
        return waiting

    def _release(self) -> None:
        waiting, conn = self.waiting, self.conn
        while waiting and self.used < self.limit:
            item = waiting.popleft()
            call, deadline = item.call, item.deadline
            self.sends -= not call.req and item.sent is None
            if call.req and call.req not in conn.pending:
                pass  # given up (or failed) meanwhile: not sent
            elif deadline is not None and deadline <= time.monotonic():
                pass  # its callee would drop it: not sent
            else:
                if deadline is not None:
                    call = replace(call, deadline=budget(deadline))
                conn.call(call, item.out)
                self.used += 1
            item._end()


class _Queued(Waiting):
    """A call (or tree call) to a mesh spanning hosts that waits at its
    ``gate``: the actors it needs room at, what sends it (and counts
    it at the gate), whether it wants an answer."""

    __slots__ = ("addrs", "answered", "gate", "go")

    def __init__(self, gate: Gate, addrs: list[str], go: Callable[[], None], answered: bool,
                 deadline: float | None) -> None:
        super().__init__(deadline)
        self.gate = gate
        self.addrs = addrs
        self.go = go
        self.answered = answered

    def waits_at(self, target: str, addr: str) -> bool:
        gate = self.gate
        return (gate.target == target and addr in self.addrs
                and gate.used.get(addr, 0) >= gate.limit)

    def _awaited(self) -> None:
        self.gate.sends -= not self.answered

    def _withdraw(self) -> None:
        self.gate.waiting.remove(self)
        self.gate.release()  # (the first in the queue, it held up those behind it)


class Gate:
    """The bounded calls of this process to the actors of one mesh spanning
    hosts (its ``target``): per actor address, ``used`` of ``limit`` not
    given back; the calls waiting for room, in one queue (of which
    ``sends`` are broadcasts nobody awaits, refused beyond ``limit``)."""

    __slots__ = ("limit", "sends", "target", "used", "waiting")

    def __init__(self, target: str, limit: int) -> None:
        self.target = target
        self.limit = limit
        self.used: dict[str, int] = {}
        self.sends = 0
        self.waiting: deque[_Queued] = deque()

    def full(self, addrs: list[str]) -> bool:
        """A call to the actors at ``addrs`` now would wait."""
        return bool(self.waiting) or any(self.used.get(a, 0) >= self.limit for a in addrs)

    def take(self, addrs: list[str]) -> None:
        """A call goes to the actors at ``addrs`` now (its sender says so)."""
        used = self.used
        for a in addrs:
            used[a] = used.get(a, 0) + 1

    def wait(self, addrs: list[str], go: Callable[[], None], answered: bool,
             deadline: float | None) -> Waiting:
        """Queue the call ``go`` sends (and counts with :meth:`take`) until
        every actor at ``addrs`` has room, behind the calls already waiting;
        past ``deadline`` it is not sent.  ``answered``: it wants an answer
        (else it is a broadcast's)."""
        item = _Queued(self, addrs, go, answered, deadline)
        self.waiting.append(item)
        self.sends += not answered
        return item

    def give(self, addr: str, n: int) -> None:
        """``n`` calls left the mailbox of the actor at ``addr`` (its process
        is gone: all of them, ``n`` < 0)."""
        if n < 0:
            self.used.pop(addr, None)
        else:
            self.used[addr] = max(0, self.used.get(addr, 0) - n)
        self.release()

    def release(self) -> None:
        """Send the calls waiting, in order, while the actors of the first
        have room."""
        waiting, used, limit = self.waiting, self.used, self.limit
        while waiting and all(used.get(a, 0) < limit for a in waiting[0].addrs):
            item = waiting.popleft()
            self.sends -= not item.answered and item.sent is None
            if item.deadline is None or item.deadline > time.monotonic():
                try:
                    item.go()  # (a call its caller gave up on meanwhile sends nothing)
                except Exception as e:  # a bug: whoever awaits the send hears of it
                    log.exception("meshio: sending a call that waited for room failed")
                    item._end(e)
                    continue
            item._end()


def credit(conn: Connection, msg: Credit, gates: dict[str, Gate]) -> None:
    """The actor ``msg.target`` at the other end of ``conn`` took ``msg.n``
    of our calls out of its mailbox: send as many of those waiting (at its
    :class:`Window`, or at the :class:`Gate` of its mesh spanning hosts)."""
    rt = conn.rt
    if msg.n > 0 and (msg.addr or conn.peer) == rt.addr:  # its own actor's: on the way no more
        own = rt.own_credit
        if (left := own.get(msg.target, 0) - msg.n) > 0:
            own[msg.target] = left
        else:
            own.pop(msg.target, None)
    window = conn.windows.get(msg.target)
    if window is not None:
        if msg.n < 0:  # the actor is stopped (it said so, finding none): its window goes
            window_gone(conn, msg.target)
            return
        window.used = max(0, window.used - msg.n)
        window._release()
        return
    gate = gates.get(msg.target)
    addr = msg.addr or conn.peer
    if gate is not None and addr is not None:
        gate.give(addr, msg.n)


def took(conn: Connection, target: str, batch: int, origin: str, n: int = 1) -> None:
    """``n`` calls that came on ``conn`` (made by ``origin``: a tree
    call's; else by ``conn``'s peer), counted by their maker, left the
    mailbox of ``target`` in this process: given back once ``batch`` of
    them have."""
    taken = conn.taken
    key = (target, origin)
    count = taken.get(key, 0) + n
    if count >= batch:
        taken[key] = 0
        rt = conn.rt
        if (origin or conn.peer) == rt.addr:  # this process's own calls: on their way back
            rt.own_credit[target] = rt.own_credit.get(target, 0) + count
        conn.send_message(Credit(target, count, origin, rt.addr))
    else:
        taken[key] = count


def window_gone(conn: Connection, target: str) -> None:
    """The actor ``target`` at the other end of ``conn`` is stopped: this
    process's window for it goes (a stopped actor mesh leaves nothing in
    its callers), and the calls waiting there for room are sent now, to be
    refused."""
    window = conn.windows.pop(target, None)
    if window is not None and window.waiting:
        window.used, window.limit = 0, len(window.waiting)
        window._release()


def forget_target(conn: Connection, target: str, whole: bool) -> None:
    """The actor ``target`` of this process is stopped: nothing of it stays
    in ``conn``: the counts of its calls that came on it not given back
    (their caller forgets its window too); ``whole``: its whole mesh is
    stopped, and so this process's own window for calls to the actor of
    that mesh at the other end goes too (:func:`window_gone`)."""
    if whole:
        window_gone(conn, target)
    conn.rt.own_credit.pop(target, None)
    taken = conn.taken
    if taken:
        for key in [k for k in taken if k[0] == target]:
            del taken[key]


def windows_lost(conn: Connection, error: Callable[[], BaseException]) -> None:
    """``conn`` is gone: its waiting sends never go; whoever waits for one
    gets ``error()`` (the calls among them fail with their pending request)."""
    for window in conn.windows.values():
        for item in window.waiting:
            item._end(error())
        window.waiting.clear()
        window.sends = 0
