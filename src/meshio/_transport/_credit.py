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
queue) are not counted, nor, for now, any call to an actor mesh spanning
several hosts: its calls to all actors go through the fan-out tree (relays
forward them, nothing counts them), and a direct call that waited for room
would be numbered (``Call.seq``) after a tree call sent later, breaking the
per-sender order.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from msgspec.structs import replace

from ._messages import Call, Credit, encode_message
from ._serial import OutBuffers

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ("Waiting", "Window", "budget", "credit", "took", "windows_lost")


def budget(deadline: float | None) -> float | None:
    """What a call message carries of ``deadline`` (``time.monotonic()``):
    the seconds left, at least a microsecond (one already past is dropped
    by its callee, which answers ``CallTimeout``)."""
    return None if deadline is None else max(deadline - time.monotonic(), 1e-6)


class Waiting:
    """A call waiting for room (as small as it can be: a flood of
    broadcasts nobody awaits waits here): the message, its buffers and
    deadline; once it went (or was dropped: given up, past its deadline),
    ``over``; ``error``: why it never will (its connection was lost);
    ``sent``: made only for someone awaiting it, done when it is over."""

    __slots__ = ("call", "deadline", "error", "out", "over", "sent")

    def __init__(self, call: Call, out: OutBuffers, deadline: float | None) -> None:
        self.call = call
        self.out = out
        self.deadline = deadline
        self.over = False
        self.error: BaseException | None = None
        self.sent: asyncio.Future[None] | None = None

    def future(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """A future done when this call is over (failed: ``error``)."""
        if self.sent is None:
            self.sent = loop.create_future()
            if self.error is not None:
                self.sent.set_exception(self.error)
            elif self.over:
                self.sent.set_result(None)
        return self.sent

    def _end(self, error: BaseException | None = None) -> None:
        self.over = True
        self.error = error
        sent = self.sent
        if sent is not None and not sent.done():
            if error is None:
                sent.set_result(None)
            else:
                sent.set_exception(error)


class Window:
    """The calls of this process to one actor over ``conn``: ``used`` of
    ``limit`` are sent and not given back; the calls waiting for room, of
    which ``sends`` want no answer (broadcasts: nobody need await them, so
    they are refused beyond ``limit``)."""

    __slots__ = ("conn", "limit", "sends", "used", "waiting")

    def __init__(self, conn: Connection, limit: int) -> None:
        self.conn = conn
        self.limit = limit
        self.used = 0
        self.sends = 0
        self.waiting: deque[Waiting] = deque()

    def full(self) -> bool:
        """A call now would wait (or fail with ``on_full="raise"``)."""
        return self.used >= self.limit or bool(self.waiting)

    def wait(self, call: Call, out: OutBuffers, deadline: float | None) -> Waiting:
        """Queue ``call`` (``Call.bounded``; its ``deadline`` budget is
        worked out when it goes) until there is room, behind the calls
        already waiting."""
        waiting = Waiting(call, out, deadline)
        self.waiting.append(waiting)
        self.sends += not call.req
        return waiting

    def _release(self) -> None:
        waiting, conn = self.waiting, self.conn
        while waiting and self.used < self.limit:
            item = waiting.popleft()
            call, deadline = item.call, item.deadline
            self.sends -= not call.req
            if call.req and call.req not in conn.pending:
                pass  # given up (or failed) meanwhile: not sent
            elif deadline is not None and deadline <= time.monotonic():
                pass  # its callee would drop it: not sent
            else:
                if deadline is not None:
                    call = replace(call, deadline=budget(deadline))
                conn.send(encode_message(call), item.out)
                self.used += 1
            item._end()


def credit(conn: Connection, msg: Credit) -> None:
    """The actor ``msg.target`` took ``msg.n`` of our calls out of its
    mailbox: send as many of those waiting."""
    window = conn.windows.get(msg.target)
    if window is not None:
        window.used = max(0, window.used - msg.n)
        window._release()


def took(conn: Connection, target: str, batch: int, n: int = 1) -> None:
    """``n`` calls of ``conn``'s peer, counted by it, left the mailbox of
    ``target``: given back once ``batch`` of them have."""
    taken = conn.taken
    count = taken.get(target, 0) + n
    if count >= batch:
        taken[target] = 0
        conn.send_message(Credit(target, count))
    else:
        taken[target] = count


def windows_lost(conn: Connection, error: Callable[[], BaseException]) -> None:
    """``conn`` is gone: its waiting sends never go; whoever waits for one
    gets ``error()`` (the calls among them fail with their pending request)."""
    for window in conn.windows.values():
        for item in window.waiting:
            item._end(error())
        window.waiting.clear()
        window.sends = 0
