"""Errors raised by meshio.

Every error is a value you can read: it says what happened, to which actor
mesh / rank / host, and what you can do about it::

    MeshioError                      base of everything meshio raises
    ├── ActorError                   an endpoint (or constructor) raised remotely
    ├── SchemaError (ValueError)     arguments or a result do not match the signature
    ├── SupervisionError             a process or actor died; the call cannot complete
    ├── CallTimeout (TimeoutError)   no answer within ``.options(timeout=...)``
    ├── UnknownActorError (LookupError)     no such actor in the target process
    ├── UnknownEndpointError (AttributeError) the actor has no such endpoint
    ├── DeadlockError (RuntimeError) a reentrant call would wait on its own busy caller
    ├── ProtocolError                a malformed or truncated frame was received
    │   └── AuthenticationError      a peer could not prove it belongs to this job
    └── RDMAError                    a one-sided transfer failed (dropped buffer, dead owner)
        └── RDMASizeError (ValueError)  offset/length/destination do not fit

Warnings: ``RDMAFallbackWarning`` (once per process) when transfers fall back
to the TCP backend.

A call on many ranks that fails on several of them raises one error of the
most serious kind (supervision > timeout > actor > schema); its ``failures``
attribute lists every failing rank with its own error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._extent import Point

__all__ = (
    "ActorError",
    "AuthenticationError",
    "CallTimeout",
    "DeadlockError",
    "MeshioError",
    "ProtocolError",
    "RDMAError",
    "RDMAFallbackWarning",
    "RDMASizeError",
    "SchemaError",
    "SupervisionError",
    "UnknownActorError",
    "UnknownEndpointError",
)


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


class ActorError(MeshioError):
    """An exception raised by a remote endpoint or actor constructor.

    Attributes:
        remote_type: qualified name of the remote exception's type.
        remote_message: ``str()`` of the remote exception.
        remote_traceback: the remote traceback, formatted.
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
        failures: Sequence[tuple[Point, MeshioError]] = (),
    ) -> None:
        super().__init__(message, failures=failures)
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        self.actor = actor
        self.rank = rank
        self.endpoint = endpoint


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
        host: host name of the process.
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


class CallTimeout(MeshioError, TimeoutError):
    """No answer arrived within the call's timeout.

    Attributes:
        endpoint: ``Class.endpoint`` that timed out.
        ranks: flat ranks that did not answer in time.
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
        self.ranks = tuple(ranks)


class UnknownActorError(MeshioError, LookupError):
    """The target process hosts no actor of that name (never spawned or stopped)."""


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
    """


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
