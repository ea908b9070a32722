"""``Actor``, the base class of everything spawned on a proc mesh, and the
per-actor ``context()``."""

from __future__ import annotations

import abc
import builtins
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, overload

from ._actor_mesh import ActorMesh
from ._context import Context, _context
from ._exceptions import NotInActorError
from ._transport._serial import Unsendable
from .endpoints._endpoint import EndpointDescriptor
from .endpoints._schema import Schema

if TYPE_CHECKING:
    import asyncio
    from typing import ParamSpec, Self

    from ._extent import Extent, Point
    from ._service import ReplicaStats
    from ._stacks import Stacks
    from ._value_mesh import ValueMesh

    P = ParamSpec("P")
    R = TypeVar("R")

__all__ = ("Actor", "context", "current_rank")

A = TypeVar("A", bound="Actor")

#: names of mesh (and service) operations; an endpoint may not take one of them
RESERVED = frozenset({
    "call", "extent", "flatten", "rename", "scale", "size", "sizes", "slice", "split",
    "stacks", "stats", "stop",
})


class _ActorMeta(abc.ABCMeta):
    """Lets a mesh reference pass for its actor class in ``isinstance`` (so a
    parameter annotated ``learners: Learner`` accepts a mesh of learners)."""

    def __instancecheck__(cls, obj: object) -> bool:
        if super().__instancecheck__(obj):
            return True
        return isinstance(obj, ActorMesh) and issubclass(obj._cls, cls)  # pyright: ignore[reportUnknownMemberType]


class Actor(metaclass=_ActorMeta):
    """Base class of actors.  Mark remotely callable methods with ``@endpoint``.

    ``__init__`` runs in the actor's process with the constructor arguments
    given to ``procs.spawn(...)``, inside the actor's :func:`context`, in
    the actor's own thread, where its plain ``def`` endpoints run too, one
    call at a time in mailbox order: thread-local state set in ``__init__``
    (a ``threading.local``, ``torch.set_grad_enabled(False)``) is theirs.
    They may ``port.send`` and ``broadcast``; to ``await`` calls or use the
    event loop, write an ``async def`` endpoint: those run on the worker's
    event loop, in its main thread.

    Optional hooks, looked up by name:

    - ``on_restart(self)`` (sync: in the actor's thread; async: on the
      loop): runs after ``__init__`` when a supervisor rebuilds the actor in
      a replacement process.
    - ``__supervise__(self, error)``: a supervisor created inside this actor
      gave up; return True to handle it (see ``docs/supervision.md``).
    - ``__cleanup__(self, exc)`` (sync or async): runs once when the actor is
      stopped: ``ActorMesh.stop``, its proc mesh stopped, its worker shutting
      down (actors of a process in reverse spawn order), or the actor ending
      on ``SystemExit``/``KeyboardInterrupt`` from an endpoint.  ``exc`` is
      None on a normal stop, else the exception that ended the actor.  It
      runs after the actor's last call has ended (a running ``async`` call
      is cancelled first) and after what the actor owns is stopped: the
      actor meshes it spawned (newest first; their own hooks run), then the
      proc meshes it started.  An ``async`` hook runs on the worker's loop,
      a sync one in the actor's thread, with 3 seconds to finish; if it
      raises or overruns, that is logged to the worker's stderr and the
      stop goes on.

    For type checkers an actor class also stands for a mesh of such actors
    (``procs.spawn`` returns the mesh typed as the class), so the mesh
    operations below type-check on it; at run time they live on
    :class:`~meshio.ActorMesh`.  A :class:`~meshio.Service` of such actors
    is typed as the class too, so ``svc.generate.route(...)`` infers the
    endpoint's result; ``scale`` and ``stats`` below are a service's.
    """

    _meshio_endpoints: ClassVar[dict[str, EndpointDescriptor[Any, Any, Any]]] = {}
    _meshio_ctor: ClassVar[Schema]

    def __init__(self) -> None:
        pass

    def _meshio_reduce(self) -> tuple[Any, ...]:
        """How the actor travels in a message (an argument, a result, a
        value on a port: ``coordinator.register.call(self)``): as a
        reference to itself alone, ``context(Cls).mesh.slice(**current_rank())``,
        which the receiver calls as it would a mesh (its state stays here).
        A plain pickle (``copy.deepcopy``, a process pool) still copies it.

        Raises:
            Unsendable: the instance was not spawned (made as ``Cls()``):
                it refers to no actor.
        """
        ctx: Context[ActorMesh[Any]] | None = getattr(self, "_meshio_context", None)
        if ctx is None:
            raise Unsendable(self, f"a {type(self).__qualname__} made as a plain object",
                             "it is no actor spawned on a proc mesh, and an actor travels as "
                             "a reference to it; send the actor mesh procs.spawn(...) "
                             "returned (or a slice of it)")
        return ctx.mesh.slice(**ctx.point).__reduce__()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        endpoints: dict[str, EndpointDescriptor[Any, Any, Any]] = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                if isinstance(value, EndpointDescriptor):
                    endpoints[name] = value
                else:
                    endpoints.pop(name, None)
        clash = sorted(RESERVED & endpoints.keys())
        if clash:
            raise TypeError(
                f"{cls.__qualname__}: endpoint name(s) {clash} clash with mesh operations; "
                "rename them")
        cls._meshio_endpoints = endpoints
        cls._meshio_ctor = Schema(cls.__init__, f"{cls.__qualname__}.__init__")

    if TYPE_CHECKING:
        # Typing-only: what a mesh of this actor can do (see the class docstring).
        @property
        def extent(self) -> Extent:
            """Mesh operation (an actor mesh's, for type checkers): dimension
            names and sizes of the mesh."""
            ...
        @property
        def sizes(self) -> dict[str, int]:
            """Mesh operation (an actor mesh's, for type checkers): ``{dim: size}``
            for every dimension."""
            ...
        def size(self, dim: str | None = None) -> int:
            """Mesh operation (an actor mesh's, for type checkers): size of
            ``dim``, or the number of actors when ``dim`` is omitted."""
            ...
        def __len__(self) -> int:
            """Mesh operation (an actor mesh's, for type checkers): the number
            of actors."""
            ...
        def __iter__(self) -> Iterator[Point]:
            """Mesh operation (an actor mesh's, for type checkers): the points
            of the mesh, in row-major order."""
            ...
        def slice(self, /, **dims: int | builtins.slice) -> Self:
            """Mesh operation (an actor mesh's, for type checkers): the actors
            at some coordinates: an int drops the dim, a ``slice`` keeps it
            (``trainers.slice(gpus=0)``)."""
            ...
        def flatten(self, name: str) -> Self:
            """Mesh operation (an actor mesh's, for type checkers): one
            dimension called ``name`` with every actor, in row-major order."""
            ...
        def rename(self, /, **names: str) -> Self:
            """Mesh operation (an actor mesh's, for type checkers): rename
            dims: ``trainers.rename(gpus="workers")``."""
            ...
        def split(self, dim: str, /, **sizes: int) -> Self:
            """Mesh operation (an actor mesh's, for type checkers): split one
            dim into several, row-major: ``trainers.split("gpus", nodes=2,
            local=4)``; one size may be ``-1`` (inferred)."""
            ...
        def call(self, ep: EndpointDescriptor[Any, P, R], /, *args: P.args,
                 **kwargs: P.kwargs) -> asyncio.Future[ValueMesh[R]]:
            """Mesh operation (an actor mesh's, for type checkers):
            ``trainers.call(Trainer.train, step=0)`` is
            ``trainers.train.call(step=0)``: every actor's result, as a
            :class:`~meshio.ValueMesh`."""
            ...
        async def stacks(self, *, timeout: float = ...) -> Stacks:
            """Mesh operation (an actor mesh's, for type checkers): every
            actor's current Python stacks, one entry per rank (see
            :meth:`meshio.ActorMesh.stacks`)."""
            ...
        async def stop(self) -> None:
            """Mesh operation (an actor mesh's, for type checkers): stop these
            actors (their ``__cleanup__`` runs; their processes keep running)."""
            ...
        async def scale(self, *, replicas: int, drain_timeout: float | None = None) -> None:
            """Service operation (a :class:`~meshio.Service`'s, for type
            checkers): grow or shrink the service to ``replicas`` replicas
            (``drain_timeout``: how long a removed replica's calls are
            waited for)."""
            ...
        def stats(self) -> list[ReplicaStats]:
            """Service operation (a :class:`~meshio.Service`'s, for type
            checkers): calls in flight, completed and their latency, per replica."""
            ...


@overload
def context() -> Context[ActorMesh[Any]]: ...
@overload
def context(actor_class: type[A], /) -> Context[A]: ...
def context(actor_class: type[Actor] | None = None, /) -> Context[Any]:
    """The running actor's :class:`Context`.

    ``context(Trainer)`` types its ``mesh`` as ``Trainer``, so calls to the
    actor's peers type-check (``context(Trainer).mesh.step.call(1)``).

    Raises:
        NotInActorError: when called outside an actor (e.g. in the controller).
        TypeError: the running actor is not a ``actor_class``.
    """
    ctx = _running("context")
    if actor_class is not None and not isinstance(ctx.mesh, actor_class):
        raise TypeError(f"context({actor_class.__qualname__}): the running actor "
                        f"{ctx.actor_name!r} is of class {ctx.mesh._cls.__qualname__}, "
                        f"not {actor_class.__qualname__}; pass its own class (or a base)")
    return ctx


def current_rank() -> Point:
    """The running actor's point: ``context().point``.

    Raises:
        NotInActorError: when called outside an actor (e.g. in the controller).
    """
    return _running("current_rank").point


def _running(called: str) -> Context[Any]:
    """The running actor's context; outside an actor, an error naming the
    function ``called``."""
    try:
        return _context.get()
    except LookupError:
        raise NotInActorError(
            f"meshio.{called}() is only available inside an actor (its __init__ or "
            "an endpoint); the controller has no mesh coordinates") from None


