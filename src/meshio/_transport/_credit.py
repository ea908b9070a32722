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
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._messages import Credit

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ("Window", "credit", "took", "windows_lost")


class _Waiting:
    """A send waiting for room: ``send()`` sends it (False: it is no longer
    wanted and takes no room); ``sent``, where someone waits for it to go
    (a broadcast's), done once it went (or was dropped), failed if the
    connection is lost first."""

    __slots__ = ("send", "sent")

    def __init__(self, send: Callable[[], bool], sent: asyncio.Future[None] | None) -> None:
        self.send = send
        self.sent = sent


class Window:
    """The calls of this process to one actor over one connection: ``used``
    of ``limit`` are sent and not given back; the sends waiting for room."""

    __slots__ = ("limit", "used", "waiting")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.waiting: deque[_Waiting] = deque()

    def full(self) -> bool:
        """A call now would wait (or fail with ``on_full="raise"``)."""
        return self.used >= self.limit or bool(self.waiting)

    def wait(self, send: Callable[[], bool], loop: asyncio.AbstractEventLoop | None
             ) -> asyncio.Future[None] | None:
        """Queue ``send`` until there is room (behind the sends already
        waiting); with ``loop``, the future of its going out."""
        sent = None if loop is None else loop.create_future()
        self.waiting.append(_Waiting(send, sent))
        return sent

    def _release(self) -> None:
        waiting = self.waiting
        while waiting and self.used < self.limit:
            item = waiting.popleft()
            if item.send():
                self.used += 1
            if item.sent is not None and not item.sent.done():
                item.sent.set_result(None)


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
            if item.sent is not None and not item.sent.done():
                item.sent.set_exception(error())
        window.waiting.clear()
