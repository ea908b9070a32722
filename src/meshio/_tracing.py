"""OpenTelemetry spans for calls: the optional ``otel`` extra
(``pip install 'meshio[otel]'``).

When the ``opentelemetry`` package is importable, every call gets a span on
both sides: a ``CLIENT`` span where an adverb sends it (``call``,
``call_one``, ``choose``, ``stream``, ``broadcast``), current while it
sends, and a ``SERVER`` span where the endpoint runs, child of the caller's
(its W3C ``traceparent`` travels in the call message, :class:`Call.trace
<meshio._transport._messages.Call>`), current while the endpoint runs, so
the calls an endpoint makes are its children: a trace shows controller →
actor → actor, across processes and hosts.  Spans go to the global tracer
provider of each process (``opentelemetry.trace.set_tracer_provider``);
without one they are OpenTelemetry's no-op spans.

Without the package nothing of it is imported and nothing is paid per call:
:data:`ENABLED` is decided once, at import, and the adverbs are then not
wrapped at all (:func:`traced` returns them as they are); the call path
checks one module constant.  The plain adverbs (``call``, ``call_one``,
``choose``, ``broadcast``) are never wrapped: each tests for a tracer
provider itself, inline, and only then goes through :func:`in_span`.
With the package but no tracer provider set in this process
(:func:`_recording`), no span is made either: a call being served only
passes its caller's ``traceparent`` on to the calls it makes
(:data:`_inbound`), so a trace crosses a process that records nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import re
from collections.abc import AsyncIterator, Callable, Coroutine
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

__all__ = ("ENABLED", "OTEL", "current", "failed", "in_span", "parent", "served", "sending",
           "traced")

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

#: a W3C ``traceparent`` of version 00: trace id, span id, flags
_TRACEPARENT: Final = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})\Z")
#: whether the ``otel`` extra is installed (decided once, at import)
ENABLED: Final = find_spec("opentelemetry") is not None

if ENABLED or TYPE_CHECKING:  # (type checkers see the extra: it is in the dev one)
    from opentelemetry import context as _otel_context
    from opentelemetry import trace as _trace

    _tracer = _trace.get_tracer("meshio")
    _CLIENT = _trace.SpanKind.CLIENT
    _SERVER = _trace.SpanKind.SERVER
    _ERROR = _trace.Status(_trace.StatusCode.ERROR)
    #: what a process has before it sets a tracer provider (or with the no-op one)
    _NO_PROVIDER = (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)
    _trace.get_tracer_provider()  # one named by OTEL_PYTHON_TRACER_PROVIDER is set now

#: opentelemetry's ``trace`` module (None without the extra): a plain adverb
#: tests ``TRACING and OTEL._TRACER_PROVIDER is not None`` inline (see
#: :func:`in_span`)
OTEL: Any = _trace if ENABLED else None

#: set while :func:`in_span` runs a plain adverb within its span: the
#: adverb's inline test then lets it run as is
sending: contextvars.ContextVar[bool] = contextvars.ContextVar("meshio_sending",
                                                               default=False)
#: ``sending.get``, bound once (see ``meshio._context.enter_scope``)
sending_now: Callable[[], bool] = sending.get

#: while a call is served in a process that records no spans: its caller's
#: ``traceparent``, passed on as is by the calls it makes
_inbound: contextvars.ContextVar[str] = contextvars.ContextVar("meshio_traceparent",
                                                              default="")


def _recording() -> bool:
    """Whether this process has a tracer provider (spans are made); asked
    per call, since a program may set one at any time.  OpenTelemetry's
    global (``opentelemetry-api`` 1.20 and later), set once by
    ``set_tracer_provider``, is read directly: its public getter checks the
    environment on every call until one is set, which costs more than the
    rest of this fast path.  Where a call is sent, ``_trace._TRACER_PROVIDER
    is None`` is tested before calling this (no provider ever set: the
    common case, without the cost of a call)."""
    provider = _trace._TRACER_PROVIDER
    return provider is not None and not isinstance(provider, _NO_PROVIDER)


def current() -> str:
    """The W3C ``traceparent`` of the current span, for the call being
    sent ("" when there is none)."""
    if _trace._TRACER_PROVIDER is None or not _recording():
        return _inbound.get()
    ctx = _trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return ""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def _fail(span: Any, error: BaseException) -> None:
    span.record_exception(error)
    span.set_status(_ERROR)


def _end_with_result(span: Any, fut: asyncio.Future[Any]) -> None:
    """End ``span`` when ``fut`` is done, failed if it failed."""
    def end(_: object) -> None:
        if not fut.cancelled() and (error := fut.exception()) is not None:
            _fail(span, error)
        span.end()
    fut.add_done_callback(end)


def _client_span(handle: Any, adverb: str) -> Any:
    """A new ``CLIENT`` span for a use of ``adverb`` of the endpoint handle
    ``handle``, named ``"<Actor.endpoint> <adverb>"``."""
    return _tracer.start_span(f"{handle._qualname} {adverb}", kind=_CLIENT, attributes={
        "meshio.mesh": handle._mesh._name, "meshio.adverb": adverb})


def traced(adverb: F) -> F:
    """``adverb`` (an ``async`` method of an endpoint handle: ``stream``, a
    service's ``route``) with a ``CLIENT`` span per use, named
    ``"<Actor.endpoint> <adverb>"``, current while it runs and ended at the
    coroutine's or the stream's end; ``adverb`` itself when the extra is
    absent.  (A plain adverb, which sends at once, tests for a provider
    inline and calls :func:`in_span`: no wrapper on the path of every call.)"""
    if not ENABLED:
        return adverb
    name = adverb.__name__

    if inspect.isasyncgenfunction(adverb):
        @functools.wraps(adverb)
        def stream(handle: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            if not _recording():
                return cast(AsyncIterator[Any], adverb(handle, *args, **kwargs))
            return traced_stream(handle, *args, **kwargs)

        async def traced_stream(handle: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            span = _client_span(handle, name)
            items = adverb(handle, *args, **kwargs)
            try:
                while True:
                    token = _otel_context.attach(_trace.set_span_in_context(span))
                    try:
                        item = await items.__anext__()
                    except StopAsyncIteration:
                        return
                    finally:
                        _otel_context.detach(token)
                    yield item
            except BaseException as e:
                _fail(span, e)
                raise
            finally:
                await items.aclose()
                span.end()
        return stream  # type: ignore[return-value]

    if inspect.iscoroutinefunction(adverb):
        @functools.wraps(adverb)
        def coroutine(handle: Any, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]:
            if not _recording():
                return cast(Coroutine[Any, Any, Any], adverb(handle, *args, **kwargs))
            return traced_coroutine(handle, *args, **kwargs)

        async def traced_coroutine(handle: Any, *args: Any, **kwargs: Any) -> Any:
            with _trace.use_span(_client_span(handle, name), end_on_exit=True):
                return await adverb(handle, *args, **kwargs)
        return coroutine  # type: ignore[return-value]

    raise TypeError(f"traced: {adverb.__qualname__} is neither a coroutine nor an async "
                    "generator function; a plain adverb tests OTEL inline and calls in_span")


def in_span(handle: Any, adverb: Callable[..., T], args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> T:
    """``adverb(*args, **kwargs)`` (a plain adverb of ``handle``: ``call``,
    ``call_one``, ``choose``, ``broadcast``) within a ``CLIENT`` span, current
    while it sends and ended when what it returns is done (at once if not a
    future).  The adverb calls this first thing when a tracer provider was
    ever set (``OTEL._TRACER_PROVIDER is not None``, tested inline: a wrapper
    around it, its frame and its arguments packed again, cost ~4% of a small
    call's CPU in the caller); it is called again from here with
    :data:`sending` set, which its test reads, and then runs as is."""
    token = sending.set(True)
    try:
        if not _recording():  # (a no-op provider)
            return adverb(*args, **kwargs)
        span = _client_span(handle, adverb.__name__)
        attached = _otel_context.attach(_trace.set_span_in_context(span))
        try:
            result = adverb(*args, **kwargs)
        except BaseException as e:
            _fail(span, e)
            span.end()
            raise
        finally:
            _otel_context.detach(attached)
    finally:
        sending.reset(token)
    sent: object = result
    if isinstance(sent, asyncio.Future):
        _end_with_result(span, sent)  # pyright: ignore[reportUnknownArgumentType]
    else:
        span.end()
    return result


def parent(traceparent: str) -> Any:
    """The context of a caller's span sent as a W3C ``traceparent``
    (``00-<trace id>-<span id>-<flags>``, lower-case hex); None when it is
    not one (a peer's bytes are not trusted: anything malformed is no
    parent, never an error)."""
    m = _TRACEPARENT.match(traceparent)
    if m is None:
        return None
    ids = [int(part, 16) for part in m.groups()]
    ctx = _trace.SpanContext(ids[0], ids[1], is_remote=True,
                             trace_flags=_trace.TraceFlags(ids[2] & 0xFF))
    return _trace.set_span_in_context(_trace.NonRecordingSpan(ctx)) if ctx.is_valid else None


def served(run: Coroutine[Any, Any, T], traceparent: str, endpoint: str,
           where: str) -> Coroutine[Any, Any, T]:
    """``run`` (an endpoint's call being served), to await in a ``SERVER``
    span, child of the caller's span ``traceparent`` ("" : a trace of its
    own), current meanwhile so that the calls it makes are its children;
    with no tracer provider, no span: the calls it makes carry
    ``traceparent`` on (``run`` itself when there is none)."""
    if _trace._TRACER_PROVIDER is not None and _recording():
        return _in_span(run, traceparent, endpoint, where)
    if traceparent and _TRACEPARENT.match(traceparent):  # (a peer's bytes: checked)
        return _passing_on(run, traceparent)
    return run


async def _passing_on(run: Coroutine[Any, Any, T], traceparent: str) -> T:
    forwarded = _inbound.set(traceparent)
    try:
        return await run
    finally:
        _inbound.reset(forwarded)


async def _in_span(run: Coroutine[Any, Any, T], traceparent: str, endpoint: str,
                   where: str) -> T:
    span = _tracer.start_span(endpoint, context=parent(traceparent) if traceparent else None,
                              kind=_SERVER, attributes={"meshio.actor": where})
    token = _otel_context.attach(_trace.set_span_in_context(span))
    try:
        return await run
    finally:
        _otel_context.detach(token)
        span.end()


def failed(error: BaseException) -> None:
    """The endpoint being served raised ``error``: its span says so (the
    error itself goes to the caller, not through the span's ``with``)."""
    _fail(_trace.get_current_span(), error)
