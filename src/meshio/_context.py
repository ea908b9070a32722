"""Where the running actor is: :class:`Context`, and the context variable
the actor cells set while an actor runs.  A leaf module, so that the
concept packages (supervision, RDMA) can ask which actor is running
without importing actors."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from ._extent import Point

__all__ = ("Context", "ProcInfo")

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
    #: what the actor started, oldest first: the actor meshes it spawned and
    #: the ``ProcState`` of the proc meshes it started; stopped before its
    #: own ``__cleanup__`` runs, newest first (``meshio._cell._stop_owned``)
    _owned: list[Any] = field(default_factory=list[Any], init=False, repr=False, compare=False)


_context: contextvars.ContextVar[Context[Any]] = contextvars.ContextVar("meshio_context")


def _own(thing: Any) -> None:
    """The running actor, if any, owns ``thing`` (an actor mesh or a proc
    mesh's state): it is stopped when the actor is stopped."""
    ctx = _context.get(None)
    if ctx is not None:
        ctx._owned.append(thing)
