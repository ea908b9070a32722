"""``@endpoint`` and the adverbs: ``call``, ``call_one``, ``choose``,
``stream``, ``broadcast``.

Typing: ``@endpoint`` turns ``async def train(self, step: int) -> float``
into an ``EndpointDescriptor[Trainer, [step: int], float]``; read on a mesh
it is an ``Endpoint[[step: int], float]`` whose adverbs reuse the parameter
spec, so IDEs and mypy check every call.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import inspect
import numbers
import re
import time
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Final,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    TypeAlias,
    TypeVar,
    cast,
    overload,
)

from .._checks import check_seconds
from .._context import CallScope, call_scope
from .._exceptions import (
    ActorError,
    CallTimeout,
    DeadlockError,
    MeshioError,
    MeshShapeError,
    NotInActorError,
    SupervisionError,
    rebuild_error,
)
from .._tracing import ENABLED as TRACING
from .._tracing import OTEL, in_span, sending_now, traced
from .._transport._bulk import snapshot
from .._transport._connection import DEADLINE, Gathering, call_repr
from .._transport._credit import Waiting
from .._transport._runtime import actor_thread, on_loop_wait
from .._transport._serial import OutBuffers, Packer
from .._transport._tasks import finished, owning, take_outcome
from .._value_mesh import ValueMesh
from ._retry import PROCESS_DEATH, Retry
from ._schema import Schema

if TYPE_CHECKING:
    from typing import Concatenate, Self

    from .._context import Context
    from .._extent import Point, Region

__all__ = ("Endpoint", "EndpointDescriptor", "OnFull", "endpoint")

P = ParamSpec("P")
R = TypeVar("R")
A = TypeVar("A")
T = TypeVar("T")
_A_contra = TypeVar("_A_contra", contravariant=True)
_R_co = TypeVar("_R_co", covariant=True)

#: what a call does when the actor's mailbox is full (``Endpoint.options``)
OnFull: TypeAlias = Literal["wait", "raise"]
_ON_FULL: tuple[OnFull, ...] = ("wait", "raise")


class Site(Protocol):
    """Who a call went to, for error messages: its repr is the point in the
    view called."""

    @property
    def rank(self) -> int:
        """The actor's rank in its mesh as spawned (as in :class:`~meshio.ActorError`)."""
        ...


class Route(Protocol):
    """A :class:`CallTarget`'s calls to one actor at a time."""

    @property
    def ranks(self) -> Sequence[int]:
        """The view's actors (their global ranks, in index order)."""
        ...

    def request(self, index: int, desc: EndpointDescriptor[Any, Any, Any], body: bytes,
                out: OutBuffers, deadline: float | None = None,
                once: bool = False) -> asyncio.Future[Any]:
        """Call the actor at ``index`` (an encoded call: ``body`` and its
        out-of-band buffers ``out``); the future of its decoded result.
        ``deadline`` (``time.monotonic()``; None: none) travels with the
        call, here and in :class:`CallTarget`'s methods.  Sent again as the
        endpoint's retry policy says, unless ``once``."""
        ...


class CallTarget(Protocol):
    """What an :class:`Endpoint` needs of the actors it calls: a mesh (or a
    view of one) whose actors it addresses by index in the view.
    ``ActorMesh`` satisfies it structurally; endpoints never import it.

    Beyond the mesh's public shape, members start with an underscore: a
    mesh's public attribute names belong to its actors' endpoints.
    """

    @property
    def sizes(self) -> dict[str, int]:
        """Dimension names and sizes of the view."""
        ...

    def __len__(self) -> int:
        """Number of actors in the view."""
        ...

    def __iter__(self) -> Iterator[Point]:
        """The view's points, in index order."""
        ...

    def slice(self, /, **dims: int | builtins.slice) -> Self:
        """A view of part of this one."""
        ...

    @property
    def _name(self) -> str:
        """The actor mesh's name, for error messages."""
        ...

    @property
    def _region(self) -> Region:
        """The view's region (the shape of a :class:`~meshio.ValueMesh` of its results)."""
        ...

    @property
    def _route(self) -> Route:
        """What a call to one actor of the view reads (read once per call:
        a mesh's own attribute reads are slow, see ``meshio._actor_mesh``)."""
        ...

    def _gather_all(self, desc: EndpointDescriptor[Any, Any, Any], body: bytes,
                    out: OutBuffers, deadline: float | None = None) -> Gathering:
        """Call every actor of the view (one message per range of hosts when it
        spans several); their answers gathered, by index."""
        ...

    def _request_all(self, desc: EndpointDescriptor[Any, Any, Any], body: bytes,
                     out: OutBuffers, gather: bool, deadline: float | None = None
                     ) -> list[asyncio.Future[Any]]:
        """Call every actor of the view (one message per range of hosts when it
        spans several); the futures of their results, in index order;
        ``gather`` when they are wanted all at once rather than as they come."""
        ...

    def _send_all(self, desc: EndpointDescriptor[Any, Any, Any], body: bytes,
                  out: OutBuffers, deadline: float | None = None) -> list[Waiting]:
        """Send the call to every actor of the view: fire and forget; the
        sends that wait for room in a mailbox (see :meth:`_check_room`)."""
        ...

    def _deadlocked(self, desc: EndpointDescriptor[Any, Any, Any],
                    sends: Sequence[Waiting]) -> DeadlockError | None:
        """The :class:`~meshio.DeadlockError` of awaiting ``sends`` (of a
        broadcast of ``desc``, waiting for room in mailboxes) if that would
        wait forever (room in a mailbox held by a call that waits for the
        caller); else None."""
        ...

    def _check_room(self, desc: EndpointDescriptor[Any, Any, Any],
                    indices: Sequence[int] | None = None, *, backlog: bool = False) -> None:
        """Raise :class:`~meshio.Overloaded` if the mailbox of an actor at
        ``indices`` (None: all) is full for this caller: a call to it now
        would wait for room (``on_full="raise"`` checks first); ``backlog``:
        only if as many broadcasts as the mailbox holds already wait for
        room in this process too (a broadcast, which may not be awaited)."""
        ...

    def _site(self, index: int) -> Site:
        """Who the actor at ``index`` is, for error messages."""
        ...

    def _least_loaded(self, desc: EndpointDescriptor[Any, Any, Any]) -> int:
        """The index of the actor with the fewest calls in flight from this
        caller, of those that serve calls (a call of ``desc`` goes there).

        Raises:
            SupervisionError: none of them serves calls (why, rank by rank).
        """
        ...

    def _hole(self, index: int, error: BaseException) -> bool:
        """Whether the actor at ``index``, whose call failed with ``error``,
        is a hole: its process died (or it was not rebuilt) and nothing
        will restart it; or was one when ``error`` was made (a
        ``procs.replace`` may have filled it since).  Its call then has no
        value rather than failing."""
        ...

    def _as_called(self, route: Route) -> CallTarget:
        """The view as it was when a call read ``route`` (its ``_route``
        then), by whose indices its answers are judged: itself, unless it
        changed shape in place since (a proc mesh grown or shrunk with the
        call in flight)."""
        ...


def _self_mesh(actor: object) -> CallTarget:
    """A one-actor mesh referring to ``actor`` itself (its context, a
    :class:`meshio.Context`, is set when it is spawned)."""
    ctx: Context[CallTarget] | None = getattr(actor, "_meshio_context", None)
    if ctx is None:
        raise NotInActorError(
            f"{type(actor).__qualname__} was not spawned on a proc mesh; endpoints can only "
            "be called on actors created with procs.spawn(...)")
    point = ctx.point
    return ctx.mesh.slice(**{k: point[k] for k in point})


def _limit(concurrent: object, qualname: object) -> int | None:
    """The bound ``@endpoint(concurrent=...)`` on ``qualname`` sets: an int
    >= 1 (None for True or False: no bound, or not concurrent).  Any integer
    is taken (``numpy.int64(8)`` too), as an int.

    Raises:
        TypeError: ``concurrent`` is neither a bool nor an integer.
        ValueError: it is an integer < 1.
    """
    if isinstance(concurrent, bool):
        return None
    if not isinstance(concurrent, numbers.Integral):
        raise TypeError(
            f"@endpoint(concurrent=...) on {qualname!r} must be True, False or an int >= 1 "
            f"(the most calls of it to run at once in one actor), got {concurrent!r} "
            f"({type(concurrent).__name__})")
    if concurrent < 1:
        raise ValueError(
            f"@endpoint(concurrent=...) on {qualname!r} must be an int >= 1 (the most calls "
            f"of it to run at once in one actor), True (no bound) or False, got "
            f"{concurrent!r}; to run one call at a time, use concurrent=1 (or leave it out: "
            "one message of the actor at a time)")
    return int(concurrent)


#: what is read on an endpoint to call it (``route``: a service's; ``remote``:
#: Ray's), which an endpoint read on its class says it cannot be
_CLASS_ADVERBS: Final = frozenset(
    ("call", "call_one", "choose", "stream", "broadcast", "options", "route", "remote"))


class EndpointDescriptor(Generic[A, P, R]):
    """What ``@endpoint`` makes of a method; read it on an actor mesh to get
    an :class:`Endpoint`, or pass it to ``mesh.call(Cls.method, ...)``."""

    def __init__(self, fn: Callable[..., Any], *, concurrent: bool | int = False,
                 retryable: bool = False, retry: Retry | None = None) -> None:
        if isinstance(fn, EndpointDescriptor):
            raise TypeError(
                f"@endpoint applied twice to {fn.fn.__qualname__}: the outer decorator's "
                "options would be lost; use a single @endpoint(concurrent=..., retry=...)")
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            raise TypeError(
                f"@endpoint on generator {getattr(fn, '__qualname__', fn)!r}: an endpoint "
                "returns one value; to stream values, take a meshio.Port argument and "
                "port.send() each one (see Channel)")
        limit = _limit(concurrent, getattr(fn, "__qualname__", fn))
        if concurrent and not inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"@endpoint(concurrent={concurrent!r}) on {getattr(fn, '__qualname__', fn)!r}: "
                "only 'async def' endpoints can run concurrently (a plain 'def' endpoint runs "
                "in the actor's thread, one call at a time); make it 'async def' or drop "
                f"concurrent={concurrent!r}")
        if retry is not None and not isinstance(retry, Retry):
            raise TypeError(f"@endpoint(retry=...) on {getattr(fn, '__qualname__', fn)!r} must "
                            f"be a meshio.Retry, got {retry!r}")
        if retry is not None and retryable:
            raise TypeError(f"@endpoint on {getattr(fn, '__qualname__', fn)!r}: give retry= or "
                            "retryable=True (short for retrying on process death), not both")
        self.fn = fn
        self.name: str = fn.__name__
        #: whether its calls run concurrently with the actor's other messages
        self.concurrent: bool = bool(concurrent)
        #: at most this many of its calls run at once in one actor, the
        #: others waiting their turn (None: no bound)
        self.limit: int | None = limit
        #: when a failed call is sent again (None: never)
        self.retry: Retry | None = PROCESS_DEATH if retryable else retry
        self.is_async: bool = inspect.iscoroutinefunction(fn)
        self.schema: Schema = Schema(fn, fn.__qualname__)
        #: made once, for the requests of every call
        self.qualname: str = fn.__qualname__
        self.unpack_result: Callable[[Any, Any], Any] = self.schema.unpack_result
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type[Any] | None = None) -> Self: ...
    @overload
    def __get__(self, obj: A, objtype: type[Any] | None = None) -> Endpoint[P, R]: ...
    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        # Read on an actor instance: the endpoint of that actor alone.
        return Endpoint(_self_mesh(obj), self)

    def __repr__(self) -> str:
        return f"<endpoint {self.fn.__qualname__}>"

    if not TYPE_CHECKING:
        # Hidden from type checkers, so that they still report
        # ``Trainer.train.call(step=0)`` as an attribute the class lacks.
        def __getattr__(self, name):
            """``Trainer.train.call(step=0)``, an adverb (or Ray's
            ``.remote()``) read on the class, says to spawn the actors
            first.  (Read only for a name the descriptor lacks.)"""
            if name in _CLASS_ADVERBS:
                qualname = self.fn.__qualname__
                cls = qualname.rpartition(".")[0]
                adverb = "call" if name == "remote" else name
                use = {"stream": f"async for point, value in mesh.{self.name}.stream(...)",
                       "route": f"await meshio.Service(mesh).{self.name}.route(...)"}.get(
                           adverb, f"await mesh.{self.name}.{adverb}(...)")
                raise AttributeError(
                    f"{qualname} is read on the class {cls}, not on actors: spawn them, then "
                    f"call it through the mesh spawn returns: mesh = await procs.spawn("
                    f"'name', {cls}, ...); {use}", name=name, obj=self)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}",
                                 name=name, obj=self)


class _Method(Protocol[_A_contra, P, _R_co]):
    """A method whose first parameter is named ``self``, for mypy: a method
    taking ``**kwargs`` is no ``Callable[Concatenate[A, P], R]`` there (its
    ``self`` could also be passed by keyword, which ``Concatenate`` rules
    out); this names it, so ``P`` is inferred all the same."""

    def __call__(_method, self: _A_contra, *args: P.args, **kwargs: P.kwargs) -> _R_co: ...


class _EndpointDecorator(Protocol):
    @overload
    def __call__(
        self, fn: Callable[Concatenate[A, P], Awaitable[R]], /
    ) -> EndpointDescriptor[A, P, R]: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[A, P], R], /) -> EndpointDescriptor[A, P, R]: ...
    @overload
    def __call__(self, fn: _Method[A, P, Awaitable[R]], /) -> EndpointDescriptor[A, P, R]: ...
    @overload
    def __call__(self, fn: _Method[A, P, R], /) -> EndpointDescriptor[A, P, R]: ...


@overload
def endpoint(
    fn: Callable[Concatenate[A, P], Awaitable[R]], /
) -> EndpointDescriptor[A, P, R]: ...
@overload
def endpoint(fn: Callable[Concatenate[A, P], R], /) -> EndpointDescriptor[A, P, R]: ...
@overload
def endpoint(fn: _Method[A, P, Awaitable[R]], /) -> EndpointDescriptor[A, P, R]: ...
@overload
def endpoint(fn: _Method[A, P, R], /) -> EndpointDescriptor[A, P, R]: ...
@overload
def endpoint(*, concurrent: bool | int = False, retryable: bool = False,
             retry: Retry | None = None) -> _EndpointDecorator: ...
def endpoint(fn: Any = None, /, *, concurrent: bool | int = False, retryable: bool = False,
             retry: Retry | None = None) -> Any:
    """Mark a method of an :class:`~meshio.Actor` as remotely callable.

    ``async def`` and plain ``def`` methods both work: an ``async def``
    endpoint runs on the actor's event loop, a plain ``def`` one in the
    actor's own thread (one call at a time, in mailbox order), so a blocking
    ``def`` does not stall the loop.  Arguments and the result are validated
    against the annotations on the receiving side.

    Args:
        concurrent: let calls to this endpoint run concurrently with other
            messages of the same actor (each in its own task) instead of one
            message at a time; such a call starts on arrival, even while the
            actor is busy with a normal call.  Only for ``async def``
            endpoints that are safe to interleave (``TypeError`` on a plain
            ``def``).  Needed for reentrant calls: an endpoint called back
            by an actor its own call is waiting on (else
            :class:`~meshio.DeadlockError`).  An int ``N`` >= 1 (Ray's
            ``max_concurrency``) also bounds them: at most ``N`` calls of
            it run at once in one actor; the others wait, in arrival
            order, without holding up the actor's other messages, and
            start as running ones end (returned, raised or cancelled).  A
            waiting call keeps its deadline (dropped with
            :class:`~meshio.CallTimeout` if it passes first) and can be
            cancelled (it does not count against ``max_queued``).  A call
            made (directly or through other actors) by every call holding a
            slot would wait for itself: it fails with
            :class:`~meshio.DeadlockError`.  ``TypeError`` for a
            value neither a bool nor an int, ``ValueError`` for an int < 1.
        retry: a :class:`~meshio.Retry` policy: a call that fails with one
            of its exception types (raised by the endpoint, or
            :class:`~meshio.SupervisionError` when the actor's process died)
            is sent again, up to its number of attempts.  Without a policy
            calls are never re-executed silently.
        retryable: short for ``retry=meshio.Retry(attempts=10,
            on=(SupervisionError,))``: the endpoint is idempotent; a call
            that fails because the actor's process died is sent again to the
            new incarnation once its supervisor has restarted it.
    """
    if fn is None:
        def decorate(f: Callable[..., Any]) -> EndpointDescriptor[Any, ..., Any]:
            return EndpointDescriptor(f, concurrent=concurrent, retryable=retryable, retry=retry)

        return decorate
    if not callable(fn):
        raise TypeError(f"@endpoint expects a function, got {fn!r}")
    desc: EndpointDescriptor[Any, ..., Any] = EndpointDescriptor(
        fn, concurrent=concurrent, retryable=retryable, retry=retry)
    return desc


class Endpoint(Generic[P, R]):
    """An endpoint of an actor mesh, with the adverbs to call it.

    ``mesh.train.call(step=0)`` — every actor, gathered into a ValueMesh;
    ``call_one`` — the only actor; ``choose`` — one actor, load-balanced;
    ``stream`` — every actor, results as they arrive; ``broadcast`` — every
    actor, fire and forget.  ``options(timeout=..., on_full=...)`` sets
    per-call options.

    Inside an endpoint, calls inherit what is left of the deadline of the
    call being served (the tighter of that and their own ``timeout``).
    """

    __slots__ = ("_desc", "_mesh", "_on_full", "_timeout")

    #: what holds the endpoint and the adverbs to name, for the message of
    #: an endpoint called like a method
    _TARGET: ClassVar[str] = "actor mesh"
    _ADVERBS: ClassVar[tuple[str, ...]] = (
        "call(...) (every actor, gathered into a ValueMesh)",
        "call_one(...) (a mesh of one actor)",
        "choose(...) (one actor, load-balanced)",
        "stream(...) (answers as they arrive)",
        "broadcast(...) (no answers)")

    def __init__(self, mesh: CallTarget, desc: EndpointDescriptor[Any, P, R],
                 timeout: float | None = None, on_full: OnFull = "wait") -> None:
        self._mesh = mesh
        self._desc = desc
        self._timeout = timeout
        self._on_full: OnFull = on_full

    def __repr__(self) -> str:
        return f"<Endpoint {self._desc.fn.__qualname__} of {self._mesh!r}>"

    if not TYPE_CHECKING:
        # Hidden from type checkers, so that they still report
        # ``mesh.train(step=0)`` as a call of something not callable.
        def __call__(self, *args, **kwargs):
            """``mesh.train(step=0)`` is a mistake: endpoints are called
            through an adverb.

            Raises:
                TypeError: always, naming the endpoint and its adverbs.
            """
            raise TypeError(self._through_adverbs("is an endpoint, not a method"))

        def __getattr__(self, name):
            """``mesh.train.remote(step=0)`` (Ray's spelling) names the
            adverbs, as a call does.  (Read only for a name the endpoint
            lacks: an adverb never comes here.)"""
            if name == "remote":
                raise AttributeError(
                    self._through_adverbs("has no .remote() (Ray's spelling)"), name=name,
                    obj=self)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}",
                                 name=name, obj=self)

    def _through_adverbs(self, what: str) -> str:
        """That the endpoint ``what`` (``"is an endpoint, not a method"``)
        and the adverbs it is called through."""
        name = self._desc.name
        adverbs = ", ".join(f".{name}.{adverb}" for adverb in self._ADVERBS)
        return (f"{self._qualname} on {self._TARGET} {self._mesh._name!r} {what}: call it "
                f"through an adverb: {adverbs}")

    @property
    def _qualname(self) -> str:
        return self._desc.fn.__qualname__

    def options(self, *, timeout: float | None = None,
                on_full: OnFull | None = None) -> Endpoint[P, R]:
        """The same endpoint with per-call options.

        Args:
            timeout: seconds to wait for the answers before raising
                :class:`~meshio.CallTimeout` (``None``: wait forever, or
                as long as the deadline inherited from the endpoint making
                the call).  It travels with the call as its deadline: the
                callee sees it as ``meshio.context().deadline``, its own
                calls inherit it, and a call still queued when it passes is
                dropped without running.  It bounds the wait for room in a
                full mailbox too.
            on_full: when the mailbox of an actor called already holds
                ``max_queued`` calls of this process
                (``procs.options(max_queued=...)``): ``"wait"`` (the
                default) waits for room, in order, then sends; ``"raise"``
                sends nothing and raises :class:`~meshio.Overloaded` at once
                (from the adverb itself: ``call()``, ``broadcast()``, ...).
                Not given: as this endpoint has it.

        Raises:
            TypeError: ``timeout`` is not a number (a str, a bool), or
                ``on_full`` is not a str.
            ValueError: ``timeout`` is not seconds > 0 (NaN, or an int no
                float holds; ``math.inf`` is no bound), or ``on_full`` is
                neither ``"wait"`` nor ``"raise"``.
        """
        # (a float > 0 is taken at once: options() may be made per call)
        if timeout is not None and not (type(timeout) is float and timeout > 0):
            timeout = check_seconds(timeout, "Endpoint.options", "timeout", also=" or None")
        if on_full is None:
            on_full = self._on_full
        elif not isinstance(on_full, str):
            raise TypeError(f"Endpoint.options(on_full=...) must be 'wait' or 'raise', got "
                            f"{type(on_full).__name__} {on_full!r}")
        elif on_full not in _ON_FULL:
            raise ValueError(f"Endpoint.options(on_full=...) must be 'wait' or 'raise', got "
                             f"{on_full!r}")
        return type(self)(self._mesh, self._desc, timeout, on_full)

    def _deadline(self) -> float | None:
        """When this call's answers are due (``time.monotonic()``): the
        tighter of its own timeout and the deadline of the call being
        served, if any (None: neither)."""
        scope = call_scope()
        inherited = scope.deadline if scope is not None else None
        if self._timeout is None:
            return inherited
        own = time.monotonic() + self._timeout
        return own if inherited is None or own < inherited else inherited

    def _encode(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bytes, Packer]:
        schema = self._desc.schema
        packer = Packer()
        return schema.pack_call(args, kwargs, packer), packer

    # ------------------------------------------------------------ adverbs

    def call(self, *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[ValueMesh[R]]:
        """Call every actor of the mesh; a ValueMesh of the results.

        An actor whose process died with nothing to restart it (no
        supervisor, or restart type ``temporary``) is a hole: the call
        does not fail for it, the ValueMesh lists it in ``holes``.  Other
        failures raise (one error for all the failing ranks).

        Raises:
            Overloaded: made with ``.options(on_full="raise")``, an actor's
                mailbox is full; nothing was sent.
        """
        if TRACING and OTEL._TRACER_PROVIDER is not None and not sending_now():
            return in_span(self, self.call, args, kwargs)  # (see meshio._tracing)
        body, packer = self._encode(args, kwargs)
        mesh = self._mesh
        if self._on_full == "raise":
            mesh._check_room(self._desc)
        deadline = self._deadline()
        route = mesh._route  # (the shape its answers are judged by: _value_mesh)
        if self._desc.retry is not None:  # each actor's call retried on its own
            futs = mesh._request_all(self._desc, body, packer, True, deadline)
            return owning(self._gather(futs, deadline, route), futs)
        g = mesh._gather_all(self._desc, body, packer, deadline)
        fut = g.outcome(lambda: self._value_mesh(g.values, g.errors, route))
        return fut if deadline is None else _Due(fut, self, deadline, g, route)

    async def _gather(self, futs: list[asyncio.Future[Any]], deadline: float | None,
                      route: Route) -> ValueMesh[R]:
        if futs:
            _, pending = await asyncio.wait(futs, timeout=_left(deadline))
            if pending:
                self._raise_timeout([i for i, f in enumerate(futs) if f in pending], pending,
                                    deadline, route, {
                                        i: e for i, f in enumerate(futs) if f not in pending
                                        and (e := f.exception()) is not None})
        errors = {i: e for i, f in enumerate(futs) if (e := f.exception()) is not None}
        return self._value_mesh([None if i in errors else f.result()
                                 for i, f in enumerate(futs)], errors, route)

    def _value_mesh(self, values: list[Any], errors: dict[int, BaseException],
                    route: Route) -> ValueMesh[R]:
        """The results of a call to every actor (``errors`` by index) through
        ``route``: a ValueMesh where only holes failed, with them as its
        holes; else the failures of the others, combined."""
        mesh = self._mesh._as_called(route)
        if not errors:
            return ValueMesh(mesh._region, values)
        holes = {i: e for i, e in errors.items() if mesh._hole(i, e)}
        if len(holes) < len(errors):
            points = list(mesh)
            raise combine_failures(self._qualname, mesh, [
                (points[i], e) for i, e in sorted(errors.items()) if i not in holes])
        ranks = mesh._region.ranks
        return ValueMesh(mesh._region, values, {
            ranks[i]: cast(SupervisionError, e) for i, e in holes.items()})

    def _raise_timeout(self, late: list[int], pending: Iterable[asyncio.Future[Any]],
                       deadline: float | None, route: Route,
                       failed: Mapping[int, BaseException] | None = None) -> None:
        """Cancel what is still pending (which may be done only once its
        arguments are read: an adverb's future waits, see
        :func:`~meshio._transport._tasks.owning`); raise :meth:`_timed_out`,
        or ``CancelledError`` if ``deadline`` is the one of the call being
        served (:func:`_served_until`: that whole call is given up)."""
        for f in pending:
            f.cancel(DEADLINE)
        _expire(deadline)
        raise self._late(late, deadline, route, failed)

    def _late(self, late: list[int], deadline: float | None, route: Route,
              failed: Mapping[int, BaseException] | None) -> BaseException:
        """The error of a call through ``route`` whose ``deadline`` passed
        with the actors at ``late`` silent: its :meth:`_timed_out`, with the
        failures of those that answered (``failed``, by index; holes left
        out) combined as a call's are, so that none is lost."""
        mesh = self._mesh._as_called(route)
        timeout = self._timed_out(late, deadline, mesh)
        if not failed:
            return timeout
        failures = {i: e for i, e in failed.items() if not mesh._hole(i, e)}
        if not failures:
            return timeout
        points = list(mesh)
        others = f"{len(failures)} other actor{'s' if len(failures) > 1 else ''} failed"
        return combine_failures(self._qualname, mesh, [
            *((points[i], e) for i, e in failures.items()), *((points[i], timeout) for i in late)],
            head=f"{timeout.args[0]}; {others}")

    def _timed_out(self, late: list[int], deadline: float | None,
                   mesh: CallTarget) -> CallTimeout:
        """The error of a call to ``mesh`` (the view as called) whose
        ``deadline`` passed, naming the late actors (their indices in it;
        ranks as in ActorError/SupervisionError); ``inherited`` if
        ``deadline`` is the one of the call being served (then over: see
        :func:`_expire`)."""
        ranks = [mesh._site(i).rank for i in late]
        scope = call_scope()
        inherited = scope is not None and scope.deadline == deadline
        within = ("before the deadline of the call being served" if inherited else
                  f"within {self._timeout}s")
        # (the ranks as spawned, as in ``ranks``; a slice's points are its own)
        # (a one-actor view, a slice down to a point, has none to name)
        points = [dict(mesh._region.point(i)) for i in late]
        at = (f", at {', '.join(map(str, points))} in the view called"
              if any(points) else "")
        error = CallTimeout(
            f"{self._qualname} on {mesh._name!r}: no answer {within} from rank(s) {ranks} "
            f"of the mesh as spawned{at}",
            endpoint=self._qualname, ranks=ranks)
        error.inherited = inherited
        return error

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[R]:
        """Call the only actor of a one-actor mesh (e.g. a slice) and return its result.

        Raises:
            SupervisionError: its process is dead (a hole too: it names the
                rank and the cause).
            Overloaded: made with ``.options(on_full="raise")``, its
                mailbox is full; nothing was sent.
        """
        if TRACING and OTEL._TRACER_PROVIDER is not None and not sending_now():
            return in_span(self, self.call_one, args, kwargs)  # (see meshio._tracing)
        mesh = self._mesh
        route = mesh._route
        if len(route.ranks) != 1:
            raise MeshShapeError(
                f"call_one on {mesh._name!r}: the mesh has {len(mesh)} actors "
                f"{mesh.sizes}; slice it down to one (mesh.slice(...)) or use call()")
        desc = self._desc
        packer = Packer()  # (_encode and, with no timeout, _deadline inline: this runs per call)
        body = desc.schema.pack_call(args, kwargs, packer)
        if self._on_full == "raise":
            mesh._check_room(desc, (0,))
        if self._timeout is None:
            scope = call_scope()
            deadline = scope.deadline if scope is not None else None
        else:
            deadline = self._deadline()
        fut = route.request(0, desc, body, packer, deadline)
        return fut if deadline is None else _Due(fut, self, deadline, 0, route)

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[R]:
        """Call one actor, the least loaded as seen from this caller, of those
        that serve calls: holes, stopped actors and processes known down
        (restarting, answering no heartbeat) are left out.

        Raises:
            SupervisionError: no actor of the mesh serves calls (it says
                why, rank by rank); nothing was sent.
            Overloaded: made with ``.options(on_full="raise")``, the chosen
                actor's mailbox is full; nothing was sent.
        """
        if TRACING and OTEL._TRACER_PROVIDER is not None and not sending_now():
            return in_span(self, self.choose, args, kwargs)  # (see meshio._tracing)
        mesh = self._mesh
        if len(mesh) == 0:
            raise MeshShapeError(f"choose on {mesh._name!r}: the mesh is empty; choose "
                                 "needs at least one actor")
        body, packer = self._encode(args, kwargs)
        index = mesh._least_loaded(self._desc)
        if self._on_full == "raise":
            mesh._check_room(self._desc, (index,))
        deadline = self._deadline()
        route = mesh._route
        fut = route.request(index, self._desc, body, packer, deadline)
        return fut if deadline is None else _Due(fut, self, deadline, index, route)

    @traced
    async def stream(self, *args: P.args,
                     **kwargs: P.kwargs) -> AsyncGenerator[tuple[Point, R], None]:
        """Call every actor; yield ``(point, result)`` in arrival order.

        A failing rank raises its error when its turn comes; the iterator then
        ends.  Holes (processes dead with nothing to restart them) are skipped.

        Raises:
            Overloaded: made with ``.options(on_full="raise")``, an actor's
                mailbox is full; nothing was sent.
        """
        body, packer = self._encode(args, kwargs)
        mesh = self._mesh
        if self._on_full == "raise":
            mesh._check_room(self._desc)
        points = list(mesh)
        deadline = self._deadline()
        route = mesh._route
        futs = mesh._request_all(self._desc, body, packer, False, deadline)
        where = {f: p for f, p in zip(futs, points)}
        remaining = set(futs)
        try:
            while remaining:
                done, remaining = await asyncio.wait(
                    remaining, timeout=_left(deadline), return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    self._raise_timeout([i for i, f in enumerate(futs) if f in remaining],
                                        remaining, deadline, route)
                for f in sorted(done, key=lambda f: where[f].rank):
                    point = where[f]
                    exc = f.exception()
                    if exc is None:
                        yield point, f.result()
                    elif not mesh._as_called(route)._hole(point.rank, exc):
                        if isinstance(exc, CallTimeout):
                            _expire(deadline)  # (a callee found it passed first)
                        raise exc
        finally:  # (ended early, timed out or cancelled: once its arguments are read)
            for f in remaining:
                f.cancel()
            await finished(list(remaining))
            for f in futs:  # failures not raised (another's was, or it ended early): seen
                if not f.cancelled():
                    f.exception()

    @overload
    def route(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]: ...
    @overload
    def route(self, *args: Any, session: Hashable, **kwargs: Any) -> Coroutine[Any, Any, R]: ...
    def route(self, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, R]:
        """Call one replica of a :class:`~meshio.Service`, chosen by its
        routing; ``session=key`` (keyword only) is the sticky-session key
        (see :class:`~meshio.Service`).  Type checkers check the arguments
        of a call without ``session=`` against the endpoint's signature (a
        parameter list cannot be extended by a keyword argument); with it,
        only the result type.

        Raises:
            TypeError: on an actor mesh's endpoint (not a service's): use
                ``choose()`` there, or make a service of the mesh.
        """
        raise TypeError(
            f"{self._qualname}.route() on actor mesh {self._mesh._name!r}: route() is a "
            f"service's adverb; make a service of the mesh (meshio.Service(mesh)) or call "
            f"one actor with choose()")

    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[None]:
        """Send to every actor without waiting for answers; an exception in
        the endpoint is reported as a supervision event, not to the caller.
        Actors whose process is known dead (holes, processes being
        restarted) are skipped.

        The message goes now to every actor whose mailbox has room for it
        (see ``procs.options(max_queued=...)``); to the others it goes, in
        order, once they have room.  What this returns can be awaited (it
        need not be): ``await mesh.ep.broadcast(x)`` returns once the
        message went to every actor, so a loop of them never runs ahead of
        a slow actor by more than its mailbox's bound; any number of tasks
        may await theirs, each waits its turn.  Cancelling the await of one
        still waiting for room withdraws it: it does not go to the actors
        it has not gone to yet.  Not awaited, the messages still go, and
        those waiting for room wait in this process, up to as many as the
        mailbox holds: one more is refused.  In a plain ``def`` endpoint
        (the actor's thread) nothing can be awaited: the message is sent
        from the loop, in order.

        Raises:
            Overloaded: made with ``.options(on_full="raise")``, an actor's
                mailbox is full; or, whatever ``on_full``, ``max_queued``
                broadcasts of this process that nobody awaits already wait
                for room in it (a loop of them not awaited runs ahead of a
                slow actor): raised by this call itself, nothing sent.
            CallTimeout: (awaited) with ``.options(timeout=...)``, an actor
                had no room before it passed; the message does not go to
                it.  (Under a deadline inherited by an endpoint, the
                endpoint is cancelled instead: docs/howto/deadlines.md.)
            DeadlockError: (awaited) an actor of this process that has no
                room is busy with a call that waits for this one (the
                endpoint's own actor, say): its room would never come; the
                message does not go to the actors it has not reached.
            SupervisionError: an actor of the mesh was stopped (its proc
                mesh, or ``stop()`` on a slice holding it), known where the
                proc mesh is this process's: raised by this call itself,
                nothing sent, as a call to it would fail (through a reference
                elsewhere the message is dropped, and said on the ``meshio``
                logger of the actor's process); or (awaited) an actor's
                process died (its connection was lost) while the message
                waited for room.
        """
        if TRACING and OTEL._TRACER_PROVIDER is not None and not sending_now():
            return in_span(self, self.broadcast, args, kwargs)  # (see meshio._tracing)
        body, packer = self._encode(args, kwargs)
        # nobody waits for the delivery: its buffers are copied now, so that
        # changing them in place afterwards cannot reach an actor
        out, deadline = snapshot(packer), self._deadline()
        if getattr(actor_thread, "rt", None) is None:  # on the loop
            sends = self._broadcast(body, out, deadline)
            return _Sent(sends, deadline, self) if sends else _SENT
        on_loop_wait(self._broadcast, body, out, deadline)  # (Overloaded reaches the thread)
        return _SENT

    def _broadcast(self, body: bytes, out: OutBuffers, deadline: float | None
                   ) -> list[Waiting]:
        self._mesh._check_room(self._desc, backlog=self._on_full != "raise")
        return self._mesh._send_all(self._desc, body, out, deadline)


class _Due(asyncio.Future[T]):
    """What an adverb with a deadline returns: the outcome of ``call`` (the
    future of a call to the actor at ``late``, an index in the view as
    ``route`` had it, or of a gathered call to every actor of it, ``late`` its
    :class:`Gathering`); or, if the deadline passes first, the endpoint's
    :class:`~meshio.CallTimeout` naming the actors still silent then, once
    ``call``, cancelled with :data:`DEADLINE` (its callees drop or cancel
    it), is done.  Cancelled, it cancels ``call`` and is done once that
    is: a call's future may be done only once its arguments are read (as
    :func:`~meshio._transport._tasks.owning`'s).

    One timer and one done callback per call, no task: timed calls cost
    about what untimed ones do (``benchmarks/bench_timed.py``)."""

    __slots__ = ("_call", "_cancel", "_deadline", "_endpoint", "_error", "_late", "_route",
                 "_timer")

    def __init__(self, call: asyncio.Future[T], endpoint: Endpoint[Any, Any], deadline: float,
                 late: int | Gathering, route: Route) -> None:
        loop = call.get_loop()
        super().__init__(loop=loop)
        self._call = call
        self._endpoint = endpoint
        self._deadline = deadline
        self._late = late
        self._route = route  # (the view ``late`` is an index of: see _as_called)
        self._error: BaseException | None = None
        #: cancelled by its caller: the message, once ``call`` is done
        self._cancel: tuple[Any, ...] | None = None
        self._timer: asyncio.TimerHandle | None = loop.call_later(
            max(0.0, deadline - time.monotonic()), self._expired)
        call.add_done_callback(self._ended)

    def __repr__(self) -> str:
        ep = self._endpoint
        return call_repr(self, f"call of {ep._qualname} on {ep._TARGET} {ep._mesh._name!r}")

    def _expired(self) -> None:
        self._timer = None
        call, late = self._call, self._late
        if call.done():  # (answered: its outcome is on its way to _ended)
            return
        if isinstance(late, int):
            silent = [late]
        elif not (silent := late.unsettled()):  # every answer is in: judged a turn later
            return  # (Gathering.settled)
        scope = _served_until(self._deadline)
        if scope is not None:  # the call being served is given up, this one with it
            self.cancel(DEADLINE)
            scope.expire()
            return
        self._error = self._endpoint._late(silent, self._deadline, self._route,
                                           None if isinstance(late, int) else late.errors)
        call.cancel(DEADLINE)

    def _ended(self, call: asyncio.Future[T]) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._cancel is not None:
            if not call.cancelled():  # (its outcome, dropped: not "never retrieved")
                call.exception()
            super().cancel(*self._cancel)
        elif self._error is not None:
            self.set_exception(self._error)
        elif (not call.cancelled() and isinstance(call.exception(), CallTimeout)
              and (scope := _served_until(self._deadline)) is not None):
            # The callee found the deadline passed (this process's loop,
            # held up, had not run the timer yet): as in _expired.
            super().cancel(DEADLINE)
            scope.expire()
        else:
            take_outcome(self, call)

    def cancel(self, msg: Any | None = None) -> bool:
        if self.done():
            return False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._cancel is None:  # (what ``call`` ends with, then, is dropped)
            self._cancel = () if msg is None else (msg,)
        self._call.cancel(msg)
        return True


class _Sent:
    """What ``broadcast()`` returns: awaited, it waits until the message
    went to every actor (``sends``: those waiting for room; the deadline
    bounds the wait), or fails at once if one waits for room that would
    never come (``CallTarget._deadlocked``).  An awaitable, not a
    coroutine: not awaiting it is fine (the message still goes) and warns
    of nothing."""

    __slots__ = ("_deadline", "_endpoint", "_sends")

    def __init__(self, sends: list[Waiting], deadline: float | None,
                 endpoint: Endpoint[Any, Any] | None) -> None:
        self._sends = sends
        self._deadline = deadline
        self._endpoint = endpoint

    def __await__(self) -> Generator[Any, None, None]:
        if self._sends:
            yield from self._wait().__await__()

    def __repr__(self) -> str:
        ep = self._endpoint
        what = "broadcast" if ep is None else f"broadcast of {ep._qualname} on {ep._mesh._name!r}"
        waiting = sum(not w.over for w in self._sends)
        if not waiting:
            return f"<{what} sent: awaiting it returns at once>"
        return (f"<{what}: {waiting} of its actors had no room for it yet; awaiting it "
                f"waits until it went to them>")

    async def _wait(self) -> None:
        ep = self._endpoint
        assert ep is not None
        deadlocked = ep._mesh._deadlocked(ep._desc, self._sends)
        if deadlocked is not None:
            self._withdraw()
            raise deadlocked
        loop = asyncio.get_running_loop()
        sends = [w.future(loop) for w in self._sends]
        try:
            _, pending = await asyncio.wait(sends, timeout=_left(self._deadline))
        except asyncio.CancelledError:
            self._withdraw()
            raise
        if pending:
            self._withdraw()
            _expire(self._deadline)
            raise CallTimeout(
                f"broadcast of {ep._qualname} on {ep._mesh._name!r}: {len(pending)} of its "
                f"actors had no room in their mailbox before the deadline; the message does "
                f"not go to them", endpoint=ep._qualname)
        for f in sends:
            f.result()

    def _withdraw(self) -> None:
        """Its awaiting was given up (cancelled, or the deadline passed):
        the message does not go to the actors it has not gone to yet."""
        for w in self._sends:
            w.withdraw()


#: a broadcast that went to every actor at once
_SENT = _Sent([], None, None)


def _served_until(deadline: float | None) -> CallScope | None:
    """The call being served here, if ``deadline`` is its own (a call made
    within with no tighter timeout of its own) and it runs: once that
    passes, the whole call is given up (:meth:`CallScope.expire`)."""
    scope = call_scope()
    if scope is None or scope.task is None or scope.deadline != deadline:
        return None
    return scope


def _expire(deadline: float | None) -> None:
    """``deadline`` passed while the running code waited: if it is the
    deadline of the call being served, that call is given up
    (:meth:`CallScope.expire`) and this raises ``CancelledError``, so its
    endpoint cannot take the ``CallTimeout`` of a call it made for an
    answer of its own."""
    scope = _served_until(deadline)
    if scope is not None:
        scope.expire()
        raise asyncio.CancelledError(DEADLINE)


def _left(deadline: float | None) -> float | None:
    """Seconds until ``deadline`` (``time.monotonic()``), for ``asyncio.wait``."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


#: the kinds of failure, most serious first: what a call failing on several
#: ranks raises (the module doc of meshio._exceptions)
_SEVERITY = (SupervisionError, CallTimeout, ActorError, MeshioError)


def combine_failures(what: str, mesh: CallTarget, failures: list[tuple[Point, BaseException]],
                     head: str = "") -> BaseException:
    """One error for a call that failed on several ranks: one line per kind
    of failure, with the ranks that had it (``ranks 0-7: ActorError:
    ValueError: boom``), then the most severe first failure in full.
    ``head``: what the first line says (else: ``what`` failed on how many
    ranks)."""
    if len(failures) == 1:
        return failures[0][1]
    errors = [(p, e) for p, e in failures]
    first = next((e for kind in _SEVERITY for _, e in errors if isinstance(e, kind)), errors[0][1])
    groups: dict[str, list[Point]] = {}
    for p, e in sorted(errors, key=lambda pe: pe[0].rank):
        groups.setdefault(f"{type(e).__name__}: {_summary(e)}", []).append(p)
    lines = "\n".join(f"  {_ranks(points)}: {summary}" for summary, points in groups.items())
    head = head or f"{what} failed on {len(errors)} of {len(mesh)} ranks of {mesh._name!r}"
    message = f"{head}:\n{lines}\n\nFirst failure in full:\n{first}"
    if isinstance(first, MeshioError):
        combined = rebuild_error(type(first), (message,), first.__dict__)
        combined.failures = tuple((p, e) for p, e in errors if isinstance(e, MeshioError))
        return combined
    return first


def _summary(e: BaseException) -> str:
    """What failed, without what differs from rank to rank (a
    SupervisionError's message names its rank and pid: its cause instead;
    others end by naming who answered, by its rank as spawned: `` [g rank
    3]``, `` (from g rank 3)``)."""
    if isinstance(e, SupervisionError) and e.cause:
        return e.cause.splitlines()[0]
    line = (str(e).splitlines() or [""])[0]
    return re.sub(r" (\[|\(from )[^\[\]()]* rank \d+[\])]$", "", line)


def _ranks(points: list[Point]) -> str:
    """``rank 3 {'procs': 3}``, or ``ranks 0-3, 5`` (sorted points)."""
    if len(points) == 1:
        return f"rank {points[0].rank} {dict(points[0])}"
    return f"ranks {rank_ranges([p.rank for p in points])}"


def rank_ranges(ranks: list[int]) -> str:
    """Sorted ranks as runs: ``[0, 1, 2, 3, 5, 7, 8]`` is ``0-3, 5, 7-8``."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


