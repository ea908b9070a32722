"""Errors raised by meshio.

Every error is a value you can read: it says what happened, to which actor
mesh / rank / host, and what you can do about it::

    MeshioError                      base of everything meshio raises
    ├── ActorError                   an endpoint (or constructor) raised remotely
    │                                (also an instance of the remote exception's class,
    │                                or of its nearest base class loaded here; not of
    │                                meshio's own: remote_type 'meshio.DeadlockError')
    ├── SchemaError (ValueError)     arguments or a result do not match the signature
    ├── SupervisionError             a process or actor died; the call cannot complete
    │   ├── ProcessStartError        a worker process exited or never said hello at start
    │   └── ProcMeshTakenError       reattach: the kept-alive proc mesh serves another controller
    ├── CallTimeout (TimeoutError)   no answer within ``.options(timeout=...)``
    ├── Overloaded                   an actor's mailbox is full and the call asked not to wait
    ├── UnknownActorError (LookupError)     no such actor in the target process
    ├── UnknownProcMeshError (LookupError)  no kept-alive proc mesh of that name to re-attach
    ├── UnknownEndpointError (AttributeError) the actor has no such endpoint
    ├── DeadlockError (RuntimeError) a call (or awaited broadcast) would wait on its busy caller
    ├── NotInActorError (RuntimeError)  actor-only API used outside a spawned actor
    ├── WrongLoopError (RuntimeError)   a mesh, port, service or supervisor used off its event loop
    ├── MeshShapeError (ValueError)  the mesh has the wrong number of actors for the adverb
    ├── ClosedResourceError          a port (every value read) or a runtime was closed
    ├── ProtocolError                a malformed or truncated frame was received
    │   └── AuthenticationError      a peer could not prove it belongs to this job
    └── RDMAError                    a one-sided transfer failed (dropped buffer, dead owner)
        └── RDMASizeError (ValueError)  offset/length/destination do not fit

meshio never raises ``MeshioError`` itself, only the precise types above.
Wrong arguments (a non-endpoint given to ``mesh.call``, a bad option value)
raise the builtin ``TypeError``/``ValueError``, as in Python itself.

Warnings: ``RDMAFallbackWarning`` (once per process) when transfers fall back
to the TCP backend.

A call on many ranks that fails on several of them raises one error of the
most serious kind (supervision > timeout > actor > schema); its ``failures``
attribute lists every failing rank with its own error.
"""

from __future__ import annotations

import builtins
import re
import sys
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar

if TYPE_CHECKING:
    from ._extent import Point

__all__ = (
    "ActorError",
    "AuthenticationError",
    "CallTimeout",
    "ClosedResourceError",
    "DeadlockError",
    "MeshShapeError",
    "MeshioError",
    "NotInActorError",
    "Overloaded",
    "ProcMeshTakenError",
    "ProcessStartError",
    "ProtocolError",
    "RDMAError",
    "RDMAFallbackWarning",
    "RDMASizeError",
    "SchemaError",
    "SupervisionError",
    "UnknownActorError",
    "UnknownEndpointError",
    "UnknownProcMeshError",
    "WrongLoopError",
)

E = TypeVar("E", bound="MeshioError")


class MeshioError(Exception):
    """Base class of every error meshio raises.

    Attributes:
        failures: for a call on several ranks, ``(point, error)`` for every
            rank that failed; empty for a single failure.
    """

    failures: tuple[tuple[Point, MeshioError], ...]

    def __init__(
        self, message: str, *, failures: Sequence[tuple[Point, MeshioError]] = ()
    ) -> None:
        super().__init__(message)
        self.failures = tuple(failures)

    @property
    def message(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by state (the message and every attribute), since the
        keyword-only arguments of subclasses' ``__init__`` are not in ``args``."""
        return (rebuild_error, (type(self), self.args, self.__dict__))


def rebuild_error(cls: type[E], args: tuple[Any, ...], state: dict[str, Any]) -> E:
    """An error of type ``cls`` with ``args`` and attributes ``state``,
    without calling its ``__init__`` (unpickling; a copy with a new message),
    nor a ``__new__`` written in Python (a remote exception's class, see
    :func:`new_actor_error`): the first built-in class of its MRO makes it."""
    builtin: Any = next(k for k in cls.__mro__ if k.__module__ == "builtins")
    error: E = builtin.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ActorError(MeshioError):
    """An exception raised by a remote endpoint or actor constructor.

    Where it can be, the error is also an instance of the remote exception's
    class, so ``except ValueError:`` around a call catches a ``ValueError``
    raised by the endpoint: when that class is loaded in the caller's process
    under the same name (a built-in, or a class of a module the caller has
    imported), is an ``Exception`` and can be subclassed.  Where it is not
    loaded (its module only the remote process imported) or cannot be
    subclassed, the nearest of its base classes that is and can stands in
    for it: a remote ``class BadBatch(ValueError)`` is a ``ValueError`` here.
    It is built without running that class's ``__init__``, so the remote
    exception's attributes are not there: ``args`` is the message below,
    ``remote_message`` is ``str()`` of the remote exception.  Its texts are
    cut to a size a terminal or log can take (:func:`readable`).  It stays a
    plain ``ActorError`` when the remote exception is one of meshio's (a
    remote ``SupervisionError`` is not this call's process dying: the caller
    gets an ``ActorError`` whose ``remote_type`` is
    ``'meshio.SupervisionError'``) or a ``StopIteration``,
    ``StopAsyncIteration`` or ``SyntaxError`` (the first class of its MRO
    loaded here), and where none of its classes is loaded here and can be
    subclassed.

    Attributes:
        remote_type: qualified name of the remote exception's type.
        remote_bases: qualified names of its base classes, nearest first
            (without ``Exception``, ``BaseException`` and ``object``).
        remote_message: ``str()`` of the remote exception.
        remote_traceback: the remote traceback, formatted (in a Jupyter
            kernel, its cells named as IPython names them: ``Cell In[3]``).
        actor: name of the actor mesh.
        rank: flat rank of the failing actor in its mesh.
        endpoint: name of the endpoint (``"__init__"`` for the constructor).
    """

    def __init__(
        self,
        message: str,
        *,
        remote_type: str,
        remote_message: str,
        remote_traceback: str,
        actor: str,
        rank: int,
        endpoint: str,
        remote_bases: Sequence[str] = (),
        failures: Sequence[tuple[Point, MeshioError]] = (),
    ) -> None:
        super().__init__(message, failures=failures)
        self.remote_type = remote_type
        self.remote_bases: tuple[str, ...] = tuple(remote_bases)
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        self.actor = actor
        self.rank = rank
        self.endpoint = endpoint

    #: the remote exception's class this error is also an instance of (set on
    #: the subclass :func:`_also` makes for it)
    _remote_class: ClassVar[type[Exception] | None] = None

    def __reduce__(self) -> tuple[Any, ...]:
        if self._remote_class is None:
            return super().__reduce__()
        return (_rebuild_also, (self._remote_class, self.args, self.__dict__))


#: remote exception classes an ActorError is never made an instance of:
#: meshio's own (a remote SupervisionError is not this call's process dying),
#: StopIteration (a future cannot hold one), StopAsyncIteration (it would end
#: an ``async for`` around the call silently), SyntaxError (tracebacks print
#: its fields, which are not there)
_NOT_ALSO = (MeshioError, StopIteration, StopAsyncIteration, SyntaxError)


def new_actor_error(message: str, *, remote_type: str, remote_message: str,
                    remote_traceback: str, actor: str, rank: int, endpoint: str,
                    remote_bases: Sequence[str] = ()) -> ActorError:
    """The :class:`ActorError` for a remote exception of type ``remote_type``
    (``ValueError``, ``pkg.mod.MyError``) with base classes ``remote_bases``
    (nearest first): also an instance of the first of these classes loaded
    here that can be, but of none where a class of :data:`_NOT_ALSO` comes
    first (see the class docstring)."""
    state = {"failures": (), "remote_type": remote_type,
             "remote_bases": tuple(remote_bases), "remote_message": remote_message,
             "remote_traceback": remote_traceback, "actor": actor, "rank": rank,
             "endpoint": endpoint}
    cls: type[ActorError] | None = None
    for name in (remote_type, *remote_bases):
        remote = _loaded_class(name)
        if remote is not None and (issubclass(remote, _NOT_ALSO) or (cls := _also(remote))):
            break
    return rebuild_error(cls or ActorError, (message,), state)


#: the characters a line of a remote error's text keeps (:func:`readable`)
_LINE_KEEP: Final = 8 * 1024
#: the characters a remote error's whole text keeps (:func:`readable`)
_TEXT_KEEP: Final = 32 * 1024


def readable(text: str) -> str:
    """``text`` of a remote error (its message, its traceback) cut to a size
    a terminal or log can take: a line longer than :data:`_LINE_KEEP`
    characters keeps its start and end, its middle replaced by a note of how
    many characters were cut, and so does the whole text beyond
    :data:`_TEXT_KEEP`; the traceback's frames, short lines, stay.  (A
    remote ``ValueError(b"e" * 2**25)`` printed 64 MiB: its message's
    ``repr`` of the bytes, once at the top and once in the traceback.)"""
    if len(text) <= _LINE_KEEP:
        return text
    return _cut("\n".join(_cut(line, _LINE_KEEP) for line in text.split("\n")), _TEXT_KEEP)


#: a frame's file in a formatted traceback
_FRAME_FILE: Final = re.compile(r'File "([^"\n]+)", line ')


def cell_names(traceback: str) -> str:
    """``traceback`` (a remote one, formatted) with the files of a Jupyter
    kernel's cells (``/tmp/ipykernel_1234/567.py``, where an actor class
    defined in a notebook runs) named as IPython names them in its own
    tracebacks (``Cell In[3], line 18``); outside a kernel, as it is."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    name = getattr(getattr(shell, "compile", None), "format_code_name", None)
    if name is None:
        return traceback

    def cell(frame: re.Match[str]) -> str:
        label = name(frame[1])
        return frame[0] if label is None else f"{label[0]} {label[1]}, line "
    return _FRAME_FILE.sub(cell, traceback)


def _cut(text: str, keep: int) -> str:
    """``text``, where longer than ``keep`` characters, as its start and end
    around a note of how many were cut, ``keep`` characters in all (so that
    a text cut by the process that raised is not cut again where it is
    read)."""
    if len(text) <= keep:
        return text
    half = (keep - 48) // 2  # (room for the note)
    return f"{text[:half]} ... [{len(text) - 2 * half} characters cut] ... {text[-half:]}"


def _loaded_class(type_name: str) -> type[Exception] | None:
    """The exception class named ``type_name`` in a module this process has
    already imported (nothing is imported for a remote peer), or None."""
    found: object = None
    if "." not in type_name:
        found = getattr(builtins, type_name, None)
    parts = type_name.split(".")
    for i in range(len(parts) - 1, 0, -1):  # the longest loaded module name
        found = sys.modules.get(".".join(parts[:i]))
        if found is not None:
            for name in parts[i:]:
                found = getattr(found, name, None)
            break
    return found if isinstance(found, type) and issubclass(found, Exception) else None


#: what :func:`_also` made, by remote class
_also_made: dict[type[Exception], type[ActorError] | None] = {}


def _also(remote: type[Exception]) -> type[ActorError] | None:
    """``ActorError`` subclassing ``remote`` too (one per class), or None where
    that cannot be (see :data:`_NOT_ALSO`; a class that refuses subclasses,
    a layout or metaclass that does not combine, a ``__new__`` that needs
    arguments)."""
    if remote in _also_made:
        return _also_made[remote]

    def body(ns: dict[str, Any]) -> None:
        ns.update(__module__=ActorError.__module__, __qualname__=ActorError.__qualname__,
                  __doc__=f"An ActorError that is also a {remote.__qualname__}.",
                  _remote_class=remote,
                  # the message, whatever the remote class's own would print
                  __str__=BaseException.__str__, __repr__=BaseException.__repr__)

    cls: type[ActorError] | None = None
    if not issubclass(remote, _NOT_ALSO):
        try:
            cls = types.new_class("ActorError", (ActorError, remote), exec_body=body)
            rebuild_error(cls, ("",), {})  # its instances can be made
        except Exception:
            cls = None
    _also_made[remote] = cls
    return cls


def _rebuild_also(remote: type[Exception], args: tuple[Any, ...],
                  state: dict[str, Any]) -> ActorError:
    """Unpickle an ActorError that is also a ``remote``."""
    return rebuild_error(_also(remote) or ActorError, args, state)


class SchemaError(MeshioError, ValueError):
    """Arguments or a result do not match the endpoint's signature.

    The message names the endpoint and the path of the offending field
    (``$.step``, ``$.batch[3].x``).
    """


class SupervisionError(MeshioError):
    """The process or actor serving a call died, so the call cannot complete.

    Attributes:
        actor: name of the actor mesh ('' when not known).
        rank: flat rank in that mesh (-1 when not known).
        host: host name of the process (a supervisor's escalation: where the
            failure that used up its restarts happened; '' when not known).
        pid: process id (-1 when not known).
        cause: what happened ("killed by signal SIGKILL", "exit code 3",
            "connection lost", ...).
    """

    def __init__(
        self,
        message: str,
        *,
        actor: str = "",
        rank: int = -1,
        host: str = "",
        pid: int = -1,
        cause: str = "",
        failures: Sequence[tuple[Point, MeshioError]] = (),
    ) -> None:
        super().__init__(message, failures=failures)
        self.actor = actor
        self.rank = rank
        self.host = host
        self.pid = pid
        self.cause = cause


class PoisonMessageError(SupervisionError):
    """A call whose handling killed its actor's process ``count`` times in a
    row (redelivered each time to the restarted incarnation, its endpoint
    being retryable) is not delivered again: the actor goes on serving the
    others.  Its supervisor reports a ``"poison"`` event, and counts those
    crashes as one failure.

    Attributes:
        endpoint: ``Class.endpoint`` of the call.
        count: how many times it killed the process.
    """

    def __init__(self, message: str, *, endpoint: str, count: int, actor: str = "",
                 rank: int = -1, host: str = "", pid: int = -1, cause: str = "") -> None:
        super().__init__(message, actor=actor, rank=rank, host=host, pid=pid, cause=cause)
        self.endpoint = endpoint
        self.count = count


class ProcessStartError(SupervisionError):
    """A worker process exited, or said no hello within the start timeout,
    while its proc mesh was started (``spawn_procs``) or while a supervisor
    restarted it.  The message names the proc mesh, rank, pid and host, and
    what happened (``exited with code 3``, ``no hello within 60.0s``); the worker's
    stderr, above it, says why."""


class ProcMeshTakenError(SupervisionError):
    """``reattach(name)``: the kept-alive proc mesh serves another
    controller, so nothing was re-attached.  That controller re-attached to
    it first (another process, or another task of this one; a ``reattach``
    that waited for one under way raises this once it succeeded), or it is
    the controller that spawned it, still connected.  The message names
    it.  Re-attach once that controller is gone (its ``keep_alive`` wait
    starts again then), or stop the mesh from there.  A
    :class:`SupervisionError`, as this refusal was before it had a type of
    its own."""


class CallTimeout(MeshioError, TimeoutError):
    """No answer arrived within the call's timeout.

    Attributes:
        endpoint: ``Class.endpoint`` that timed out.
        ranks: flat ranks that did not answer in time.
        inherited: the deadline that passed was the one the call inherited
            from the call an endpoint was serving.  While that call runs,
            its endpoint never gets such a ``CallTimeout``: the deadline
            cancels it (``CancelledError``), with the calls it made; only a
            task it started that outlived it does.
    """

    def __init__(
        self,
        message: str,
        *,
        endpoint: str = "",
        ranks: Sequence[int] = (),
        failures: Sequence[tuple[Point, MeshioError]] = (),
    ) -> None:
        super().__init__(message, failures=failures)
        self.endpoint = endpoint
        self.ranks: tuple[int, ...] = tuple(ranks)
        #: the deadline that passed was the one inherited from the call an
        #: endpoint was serving (once that call was over)
        self.inherited = False


class Overloaded(MeshioError):
    """The mailbox of the actor called is full: this caller already has
    ``max_queued`` calls waiting in it (``procs.options(max_queued=...)``),
    and the call was made with ``.options(on_full="raise")``, so it was not
    sent.  Raised at once by the adverb (``call``, ``call_one``, ``choose``,
    ``stream``, ``broadcast``, ``Service.route``); without that option the
    call waits for room instead.  A ``broadcast()`` raises it whatever the
    option when ``max_queued`` broadcasts of this caller that nobody awaits
    already wait for room (awaited ones wait their turn).  Retry later, slow
    down, await the broadcasts, or raise the bound.

    Attributes:
        actor: the actor mesh's name.
        rank: the actor's rank in its mesh as spawned.
        max_queued: the bound of its mailbox (per caller).
    """

    def __init__(self, message: str, *, actor: str = "", rank: int = -1,
                 max_queued: int = 0) -> None:
        super().__init__(message)
        self.actor = actor
        self.rank = rank
        self.max_queued = max_queued


class UnknownActorError(MeshioError, LookupError):
    """The target process hosts no actor of that name (never spawned or stopped)."""


class UnknownProcMeshError(MeshioError, LookupError):
    """``this_host().reattach(name)`` found no proc mesh of that name kept
    alive on this host (never spawned with ``keep_alive``, stopped, or its
    workers are gone).  The message lists the names that can be re-attached."""


class UnknownEndpointError(MeshioError, AttributeError):
    """The actor class has no endpoint of that name."""


class DeadlockError(MeshioError, RuntimeError):
    """A call reached an actor that is busy with a call waiting on it.

    Raised by the callee's runtime, at once, instead of queueing a call that
    could never run: each call carries the chain of actors waiting on it, and
    an actor that finds itself in the chain of a call to one of its normal
    (not ``concurrent``) endpoints while serving the call that waits would
    deadlock.  The message names the chain (``gen[0] -> learner[1] ->
    gen[0]``); mark the reentered endpoint ``@endpoint(concurrent=True)``.
    Likewise a call to an ``@endpoint(concurrent=N)`` none of whose slots is
    free, every call holding one being in its chain (or in that of another
    call waiting for a slot): it "waits for a slot of
    @endpoint(concurrent=N)" (raise N, or drop the bound).  And, raised by
    the caller's own runtime, an awaited ``broadcast`` that waits for room
    in a full mailbox of its process whose call under way is in the
    caller's chain ("awaited broadcast would deadlock": nothing leaves that
    mailbox until the call awaiting it returns).
    """


class NotInActorError(MeshioError, RuntimeError):
    """API that needs a running actor was used without one: ``context()`` or
    ``current_rank()`` outside an actor (e.g. in the controller), or an
    actor's own mesh asked of an instance built directly instead of with
    ``procs.spawn(...)``."""


class WrongLoopError(MeshioError, RuntimeError):
    """A proc mesh, actor mesh, service, port receiver or supervisor was used
    from an event loop other than the one it belongs to (the loop whose
    meshio runtime made it: a later ``asyncio.run``, or one in another
    thread), or from a thread that runs no event loop (``asyncio.to_thread``).
    Each loop has a meshio runtime of its own, with its own job secret, and
    nothing moves between them.  Raised at once by the operation (a call,
    ``spawn``, ``stop``, ``Service.scale``, ``PortReceiver.recv``,
    ``Supervisor.wait_failed``, ...), before it changes anything.  The
    message names what was used and the fix: run the code on that loop,
    from another thread in a coroutine function (``async def call():
    return await mesh.step.call_one(...)``) run there by
    ``asyncio.run_coroutine_threadsafe(call(), loop).result()``; an adverb
    passed to it directly runs, and raises, in the calling thread
    (``loop.call_soon_threadsafe(port.send, v)`` for a port).  At a
    script's top level (the main thread, no loop running:
    ``procs = this_host().spawn_procs(...)`` as in Monarch) it says to
    write an ``async def main()`` run by ``meshio.run(main())`` instead.
    Once that loop has ended, the same uses raise
    :class:`ClosedResourceError` instead."""


class MeshShapeError(MeshioError, ValueError):
    """The actor mesh has the wrong number of actors for the adverb:
    ``call_one`` on a mesh that is not exactly one actor (slice it down
    first), ``choose`` on an empty mesh.  Raised by the adverb, before any
    call is sent."""


class ClosedResourceError(MeshioError):
    """The resource was closed: ``PortReceiver.recv()`` once the sender
    closed the port and every value sent before has been read (``async for``
    over the receiver simply ends); a layer's state asked of a runtime that
    has closed (its loop's ``meshio.run`` returned); a mesh, service, port
    receiver or supervisor used after the event loop it belongs to has ended
    (see :class:`WrongLoopError`)."""


class ProtocolError(MeshioError):
    """A malformed or truncated frame was received; the connection is dropped."""


class AuthenticationError(ProtocolError):
    """A peer could not prove it belongs to this job (another user, a wrong or
    missing job secret, not a meshio process): the connection is dropped
    before any frame is read.  Callers get it when the process at an actor's
    address fails the handshake."""


class RDMAError(MeshioError):
    """A one-sided transfer could not be done: the buffer was dropped, its
    owner is gone, or the backend failed.  The message names the buffer, its
    owner (pid, host) and the backend."""


class RDMASizeError(RDMAError, ValueError):
    """Offset, length or destination size do not fit the registered buffer."""


class RDMAFallbackWarning(UserWarning):
    """Transfers fall back to the TCP backend (no same-host path or ibverbs
    device between the two processes): they work, slower.  Emitted once."""
