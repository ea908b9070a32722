"""Where the running actor is: :class:`Context`, and the context variable
the actor cells set while an actor runs.  A leaf module, so that the
concept packages (supervision, RDMA) can ask which actor is running
without importing actors."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec

if TYPE_CHECKING:
    from ._extent import Point

__all__ = ("CallScope", "Context", "ProcInfo")

#: what ``Context.mesh`` is typed as: the actor's class, or ``ActorMesh[Any]``
M = TypeVar("M")


@dataclass(frozen=True)
class ProcInfo:
    """The process an actor lives in."""

    rank: int
    pid: int
    host: str
    addr: str


@dataclass(frozen=True)
class Context(Generic[M]):
    """Where the running actor is.

    Attributes:
        point: the actor's coordinates in the mesh it was spawned as.
        actor_name: the name given to ``procs.spawn``.
        proc: the process hosting the actor.
        mesh: a reference to the whole actor mesh (call your peers with it);
            typed as the actor's class with ``context(Trainer)``.
    """

    point: Point
    actor_name: str
    proc: ProcInfo
    mesh: M
    @property
    def deadline(self) -> float | None:
        """When the call under way must be answered, on this process's
        ``time.monotonic()`` clock (None: no deadline, or no call under way).
        The caller's ``options(timeout=...)`` travels with the call as a
        remaining duration; calls made from here inherit what is left."""
        scope = _scope.get()
        return None if scope is None else scope.deadline

    def remaining(self) -> float | None:
        """Seconds left until :attr:`deadline` (0 once passed; None: no deadline)."""
        deadline = self.deadline
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def cancelled(self) -> bool:
        """True once the call under way was given up: its caller cancelled it
        or its deadline passed.  A ``def`` endpoint, which cannot be
        interrupted in its thread, polls this to stop early; an ``async``
        one is cancelled (``CancelledError`` at its next ``await``)."""
        scope = _scope.get()
        return scope is not None and scope.cancelled

    #: what the actor started, oldest first: the actor meshes it spawned and
    #: the ``ProcState`` of the proc meshes it started; stopped before its
    #: own ``__cleanup__`` runs, newest first (``meshio._cell._stop_owned``)
    _owned: list[Any] = field(default_factory=list[Any], init=False, repr=False, compare=False)


_context: contextvars.ContextVar[Context[Any]] = contextvars.ContextVar("meshio_context")
#: ``_context.get`` and ``_context.set`` (see :data:`enter_scope`)
context_or: Callable[[Context[Any] | None], Context[Any] | None] = _context.get
enter_context: Callable[[Context[Any]], contextvars.Token[Context[Any]]] = _context.set


class CallScope(msgspec.Struct, gc=False):
    """The call an actor is serving: its deadline (``time.monotonic()``;
    None: none) and whether it was given up.  Set by the actor cell for the
    call's task (and the thread of a ``def`` endpoint, which reads
    ``cancelled`` while the loop sets it); calls made within inherit the
    deadline and carry :attr:`chain`.  While pdb holds it (``breakpoint()``,
    :mod:`meshio._debug`), ``paused_at`` is when that began; ``paused_for``
    sums the pauses over: time spent paused is not a stall.  (A Struct: one
    is made per call served, without a Python ``__init__``.)"""

    deadline: float | None
    #: the chain the call came with (``Call.chain``), its server's identity
    #: (``"<target>[<rank>]"``; ``"…!<n>"`` for a call holding a slot of an
    #: ``@endpoint(concurrent=N)``) and its mailbox number (0: a concurrent call)
    caller_chain: tuple[str, ...] = ()
    server: str = ""
    seq: int = 0
    cancelled: bool = False
    paused_at: float | None = None
    paused_for: float = 0.0
    #: while the call holds its actor's mailbox: the answers it may wait
    #: for from a mailbox of another actor, ``(target, rank, addr, answer)``
    #: (:meth:`wait_for`); None once it ended, or if it made none
    waits: list[tuple[str, int, str, Any]] | None = None
    #: how long :attr:`waits` may grow before answers in already are dropped
    waits_limit: int = 64
    #: while an ``async`` call with a deadline runs: the task serving it
    #: (:meth:`expire` cancels it; cleared as the call ends)
    task: asyncio.Task[Any] | None = None
    #: :meth:`expire` cancelled :attr:`task` (its server withdraws that
    #: cancellation as the call ends)
    expired: bool = False

    @property
    def chain(self) -> tuple[str, ...]:
        """What a call made within carries as ``Call.chain``: the call's
        chain, this actor last (``"#<n>"`` when the call holds its mailbox:
        the callee fails a call that would deadlock).  Made only when a call
        is made, not per call served."""
        server = f"{self.server}#{self.seq}" if self.seq else self.server
        return (*self.caller_chain, server)

    def wait_for(self, target: str, rank: int, addr: str, answer: Any) -> None:
        """Record that this call (holding its mailbox: :attr:`seq`) may wait
        for ``answer`` (its ``done()`` says when not) from a normal
        endpoint of actor ``rank`` of ``target`` (in the process at
        ``addr``): that call queues behind whatever that actor's mailbox
        serves, and a call that actor serves which waits (directly, or
        through other actors' calls: deadlock probes follow these records)
        for a call to this one is a deadlock the cell tells
        (:meth:`~meshio._cell.ActorCell.post`)."""
        waits = self.waits
        if waits is None:
            waits = self.waits = []
        elif len(waits) >= self.waits_limit:  # (a long call making many: amortized)
            waits[:] = [w for w in waits if not w[3].done()]
            self.waits_limit = 2 * len(waits) + 64
        waits.append((target, rank, addr, answer))

    def waiting_for(self, chain: tuple[str, ...]) -> str | None:
        """The entry of ``chain`` (``"<target>[<rank>]#<n>"``: an actor
        whose mailbox call waits for the call ``chain`` came with) whose
        actor this call waits for an answer from, if any."""
        waits = self.waits
        if not waits:
            return None
        for entry in chain:
            server, hashed, _ = entry.partition("#")
            target, _, rank = server.rpartition("[")
            if hashed and rank[:-1].isdigit():
                n = int(rank[:-1])
                if any(w[0] == target and w[1] == n and not w[3].done() for w in waits):
                    return entry
        return None

    def waiting(self) -> dict[str, str]:
        """The actors (``"<target>[<rank>]"``) whose answers this call waits
        for now, with the address of each one's process."""
        return {f"{w[0]}[{w[1]}]": w[2] for w in self.waits or () if not w[3].done()}

    def expire(self) -> None:
        """The deadline of the call passed here, while it waited for a call
        it made on that same deadline (none of its own, or a looser one):
        the whole call is given up, as if its caller had cancelled it
        (:meth:`Context.cancelled` says so).  Its task is cancelled, unless
        that is the task running now, which raises ``CancelledError``
        itself; either way the endpoint gets ``CancelledError``, never the
        ``CallTimeout`` of the call it made, which it could catch and
        answer something else (docs/howto/deadlines.md).  Only while
        :attr:`task` is set (once the call is over, a task it started that
        outlived it gets the ``CallTimeout`` as any call)."""
        task = self.task
        if task is not None and not self.cancelled:
            self.cancelled = True
            if task is not asyncio.current_task():
                self.expired = True
                task.cancel()

    def pause(self, paused: bool) -> None:
        """pdb paused the call (True) or let it go on (False)."""
        now = time.monotonic()
        if paused and self.paused_at is None:
            self.paused_at = now
        elif not paused and self.paused_at is not None:
            self.paused_for += now - self.paused_at
            self.paused_at = None


_scope: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar(
    "meshio_call_scope", default=None)


#: the call under way here (its :attr:`CallScope.chain` is what a call made
#: now carries as ``Call.chain``); None outside any.  (The variable's own
#: ``get``: no Python frame per call made.)
call_scope: Callable[[], CallScope | None] = _scope.get
#: ``_scope.set``, bound once: a method of a name a
#: module imports is read as an attribute on Python 3.11 (LOAD_ATTR, never
#: specialized for a method: a bound method made per call), not LOAD_METHOD
enter_scope: Callable[[CallScope | None], contextvars.Token[CallScope | None]] = _scope.set


def _own(thing: Any) -> None:
    """The running actor, if any, owns ``thing`` (an actor mesh or a proc
    mesh's state): it is stopped when the actor is stopped."""
    ctx = _context.get(None)
    if ctx is not None:
        ctx._owned.append(thing)
