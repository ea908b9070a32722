"""Every task has an owner (as in trio's nurseries and anyio's task groups).

A :class:`TaskOwner` belongs to one object that lives as long as its tasks
may (a runtime, an actor cell, a proc mesh's state, a supervisor, a
launcher, an inspection server): it starts them (:meth:`TaskOwner.start`),
keeps them until they end, and cancels and awaits them all when its object closes
(:meth:`TaskOwner.aclose`, or :meth:`TaskOwner.cancel` where closing is
synchronous).  :func:`awaited` is the one other way to make a task: one
its caller awaits itself (the future an adverb returns, a wait with a
timeout), so the caller owns it; :func:`together` awaits several side by
side with them, as a task group does.

These two are the only places in meshio that call ``create_task`` or
``ensure_future`` (``tests/test_task_owners.py`` keeps it so).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, Final, TypeVar

__all__ = ("LEND_TIMEOUT", "TaskOwner", "awaited", "owning", "take_outcome", "together",
           "when_done")

T = TypeVar("T")
log = logging.getLogger("meshio")

#: seconds a process waits for another to read a large value from its memory
#: (by descriptor on one host, in slices over a connection) before going on
#: without: an actor before its next call (``Cell._until_read``), a caller
#: who gave up a call before its cancellation is done (:func:`when_done`)
LEND_TIMEOUT = 10.0


class TaskOwner:
    """The tasks of one object (``what`` names it), on ``loop``."""

    __slots__ = ("_loop", "_tasks", "what")

    def __init__(self, what: str, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.what: str = what
        self._loop = loop
        self._tasks: set[asyncio.Task[Any]] = set()

    def __repr__(self) -> str:
        return f"<TaskOwner of {self.what}: {len(self._tasks)} tasks>"

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Any:
        return iter(list(self._tasks))

    def start(self, coro: Coroutine[Any, Any, T], name: str | None = None,
              context: contextvars.Context | None = None) -> asyncio.Task[T]:
        """Run ``coro`` as a task of this owner's, on its loop (the running
        one when none was given), in ``context`` (a copy of the current one
        when none was given)."""
        loop = self._loop or asyncio.get_running_loop()
        task = loop.create_task(coro, name=name, context=context)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        # (an error nobody retrieves is reported by asyncio, as for any task)
        self._tasks.discard(task)

    def cancel(self) -> None:
        """Cancel every task still running (closing synchronously)."""
        for task in list(self._tasks):
            task.cancel()

    async def aclose(self) -> None:
        """Cancel every task still running and wait until all have ended."""
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)


async def finished(futs: Sequence[asyncio.Future[Any]]) -> None:
    """Wait until every future of ``futs`` is done, whose work nothing can
    stop (a copy in a thread, a call's arguments still read): cancelled
    meanwhile, it waits all the same, then raises ``CancelledError``.  Once
    it returns or raises, none of them uses memory its caller may then free
    or change."""
    cancelled = False
    while left := [f for f in futs if not f.done()]:
        try:
            await asyncio.wait(left)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


async def to_the_end(fut: asyncio.Future[T]) -> T:
    """``fut``'s result, waited for to its end even if cancelled meanwhile
    (:func:`finished`: work nothing can stop halfway), then raising
    ``CancelledError`` (its own outcome retrieved: not "never retrieved")."""
    try:
        await finished([fut])
    except asyncio.CancelledError:
        if not fut.cancelled():
            fut.exception()
        raise
    return fut.result()


async def within(aw: Awaitable[T], seconds: float | None) -> T:
    """``await aw``, raising ``TimeoutError`` after ``seconds`` (None: no
    limit): ``asyncio.wait_for`` without its flaw on Python 3.11, where a
    cancellation that comes as ``aw`` completes is lost (it returns the
    result and its caller goes on as if never cancelled: a ``grow()``
    cancelled while it started processes finished growing)."""
    async with asyncio.timeout(seconds):
        return await aw


def awaited(aw: Awaitable[T]) -> asyncio.Future[T]:
    """``aw`` as a future its caller awaits (or hands to the user, who
    awaits it): the caller owns it, and cancelling it cancels ``aw``."""
    return asyncio.ensure_future(aw)


async def together(aws: Iterable[Awaitable[T]]) -> list[T]:
    """Await ``aws`` side by side: their results, in order.  As in a task
    group, the first to fail (or this call's cancellation) cancels the
    others, and its error is raised once every one has ended:
    ``asyncio.gather`` would leave them running, owned by nobody (a start
    that failed left its other workers' hellos waiting on processes it had
    killed)."""
    futs = [awaited(aw) for aw in aws]
    try:
        return await asyncio.gather(*futs)
    except BaseException:
        for fut in futs:
            fut.cancel()
        await finished(futs)
        raise


#: what :func:`when_done` warns of by default (``{n}``: the values still read)
GIVEN_UP: Final = ("a call given up is done, though {n} of its large values are still being "
                   "read by the process it called")


def when_done(futs: Sequence[asyncio.Future[Any]] | None, then: Callable[[], object],
              warning: str = GIVEN_UP) -> bool:
    """Call ``then`` once every future of ``futs`` (a call's lent
    arguments, ``Pending.lent``; the calls an adverb owns; the frames a
    dropped RDMA buffer lent) is done, or after :data:`LEND_TIMEOUT`
    seconds, whichever is first (a callee that never reads, stopped or
    hung, must not keep its caller's cancellation or deadline waiting for
    ever: it is warned of, ``warning`` saying what); False, calling nothing,
    if they all are already."""
    left = [f for f in futs or () if not f.done()]
    if not left:
        return False
    called = False

    def once(late: bool) -> None:
        nonlocal called
        if called:
            return
        called = True
        timer.cancel()
        if late:
            log.warning("meshio: %s after %g s (not responding?): changing them in place now "
                        "may reach it", warning.format(n=sum(not f.done() for f in left)),
                        LEND_TIMEOUT)
        then()

    timer = left[0].get_loop().call_later(LEND_TIMEOUT, once, True)
    asyncio.gather(*left, return_exceptions=True).add_done_callback(lambda _: once(False))
    return True


def owning(coro: Coroutine[Any, Any, T], calls: Sequence[asyncio.Future[Any]]
           ) -> asyncio.Future[T]:
    """:func:`awaited` for ``coro`` (what an adverb with a deadline or a
    retry policy awaits) whose ``calls`` may be done only later than
    cancelled (a call's large arguments still read from this process's
    memory, see ``Pending.lent``): once ``coro`` ends, what is left of
    them is cancelled, and the future is done with its outcome only when
    they are done too, also if it is cancelled before ``coro`` even started
    (then no ``except``/``finally`` of it runs)."""
    return _Owning(awaited(coro), calls)


class _Owning(asyncio.Future[T]):
    """See :func:`owning`: the outcome of ``task`` once ``calls`` are done."""

    def __init__(self, task: asyncio.Future[T], calls: Sequence[asyncio.Future[Any]]) -> None:
        super().__init__(loop=task.get_loop())
        self._task = task
        self._calls = calls
        self._cancel: tuple[Any, ...] | None = None  # cancelled after ``task`` ended: its args
        task.add_done_callback(self._ended)

    def cancel(self, msg: Any | None = None) -> bool:
        if self.done():
            return False
        if not self._task.cancel(msg) and self._cancel is None:  # ended: its calls are ending
            self._cancel = () if msg is None else (msg,)
        return True

    def _ended(self, task: asyncio.Future[T]) -> None:
        for f in self._calls:
            f.cancel()
        if not when_done(self._calls, self._settle):
            self._settle()

    def _settle(self) -> None:
        task = self._task
        if self.done():
            return
        if self._cancel is not None:
            super().cancel(*self._cancel)
        else:
            take_outcome(self, task)


def take_outcome(fut: asyncio.Future[T], done: asyncio.Future[T]) -> None:
    """Settle ``fut`` as ``done`` ended: cancelled (with its message), with
    its exception, or with its result.  ``fut``'s own ``cancel`` is not
    called (a future that waits for others before it is cancelled, as
    :func:`owning`'s, overrides it)."""
    if done.cancelled():
        try:
            done.result()
        except asyncio.CancelledError as e:
            asyncio.Future[T].cancel(fut, *e.args[:1])
    elif (error := done.exception()) is not None:
        fut.set_exception(error)
    else:
        fut.set_result(done.result())
