"""``meshio.run``: ``asyncio.run`` on uvloop when it is installed, stopping
on Ctrl-C, SIGTERM or SIGHUP with one line and exit status 130, 143 or 129."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Generator
from types import FrameType
from typing import Any, Final, NoReturn, TypeVar

from ._transport._runtime import close_runtime

__all__ = ("run",)

T = TypeVar("T")

#: the signals that stop ``run`` gracefully, and what the line printed says
STOP_SIGNALS: Final = {signal.SIGINT: "interrupted (Ctrl-C)",
                       signal.SIGTERM: "terminated (SIGTERM)",
                       signal.SIGHUP: "hung up (SIGHUP: its terminal closed)"}
#: seconds after a stop signal the loop has not taken yet that another one
#: means the loop is blocked (not merely busy, nor sent the signal twice in
#: a row as ``timeout`` does): that one raises KeyboardInterrupt where it is
BLOCKED_AFTER: Final = 1.0


def _open_stdio() -> None:
    """Descriptors 0, 1 and 2 open (``/dev/null`` for any the program was
    started without: ``cmd <&-``, ``>&-``): else a socket of the loop gets
    one of them, and libuv aborts the process (``uv__close: Assertion `fd >
    STDERR_FILENO' failed``, a core dump) when it closes it at the end."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:  # (closed: the lowest free descriptor, this one, is opened)
            os.open(os.devnull, os.O_RDWR)


class _Stop:
    """The stop signals of one ``run``.  The first cancels ``main`` from a
    loop callback, so it is never raised inside the loop's own code (a
    protocol callback, a transport); later ones are ignored while the stop
    runs (it is bounded: each proc mesh's shutdown grace), unless the loop
    has been blocked since the first, in code that never yields: then they
    raise KeyboardInterrupt there, as plain asyncio does."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.at = 0.0
        self.taken = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None

    @contextlib.contextmanager
    def handling(self) -> Generator[None]:
        """Handle the stop signals whose handlers are Python's defaults
        (in the main thread; a program's own handlers are left alone)."""
        replaced: list[tuple[int, Any]] = []
        if threading.current_thread() is threading.main_thread():
            for sig, default in ((signal.SIGINT, signal.default_int_handler),
                                 (signal.SIGTERM, signal.SIG_DFL),
                                 (signal.SIGHUP, signal.SIG_DFL)):
                if signal.getsignal(sig) is default:
                    signal.signal(sig, self._on_signal)
                    replaced.append((sig, default))
        try:
            yield
        finally:
            for signum, handler in replaced:
                signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum, self.at = signum, time.monotonic()
            if self.loop is not None:
                try:
                    self.loop.call_soon_threadsafe(self.take)
                except RuntimeError:  # the loop is closed: run is returning
                    pass
        elif not self.taken and time.monotonic() - self.at > BLOCKED_AFTER:
            raise KeyboardInterrupt

    def started(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        """``main`` runs as ``task``: a signal that came before is taken now."""
        self.loop, self.task = loop, task
        if self.signum is not None:
            self.take()

    def take(self) -> None:
        """On the loop: one line to stderr, and ``main`` cancelled."""
        if self.taken:
            return
        self.taken = True
        if self.task is not None:
            self.task.cancel()
        try:  # (after a SIGHUP the terminal may be gone: EIO)
            print(f"meshio: {STOP_SIGNALS[signal.Signals(self.signum or signal.SIGINT)]}; "
                  "stopping worker processes", file=sys.stderr, flush=True)
        except OSError:
            pass

    def exit(self) -> NoReturn:
        """The end of a stopped run (the line printed if the loop never took it)."""
        self.take()
        raise SystemExit(128 + (self.signum or signal.SIGINT))


async def _main(main: Coroutine[Any, Any, T], stop: _Stop) -> T:
    task = asyncio.current_task()
    assert task is not None
    stop.started(asyncio.get_running_loop(), task)
    try:
        return await main
    finally:
        close_runtime()


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Run the controller coroutine ``main`` to completion and return its result.

    Uses uvloop's event loop when uvloop is importable, the default loop
    otherwise.  meshio's listening socket and connections are closed at the
    end; worker processes still running exit with them.

    Ctrl-C (SIGINT), SIGTERM (what ``timeout``, Slurm and Kubernetes send)
    and SIGHUP (the terminal or ssh session closed) stop the program
    gracefully: one line goes to stderr (``meshio:
    interrupted (Ctrl-C); stopping worker processes``), ``main`` is cancelled
    as ``asyncio.run`` does on Ctrl-C, so its ``async with`` blocks stop their
    proc meshes (actors' ``__cleanup__`` runs), and the program exits with
    status 130 after SIGINT, 143 after SIGTERM, 129 after SIGHUP
    (``SystemExit``), the shell's convention for a command ended by a
    signal.  More signals during that
    stop are ignored; only while the loop is blocked by code that never
    yields does another one, a second or more after the first, raise
    ``KeyboardInterrupt`` in that code.  Signals whose handlers the program
    set itself are left to those handlers.

    Raises:
        SystemExit: with code 130 after SIGINT (or a ``KeyboardInterrupt``),
            143 after SIGTERM, 129 after SIGHUP.
        RuntimeError: called while an event loop runs in this thread (a
            notebook cell, an ``async def``): ``await main`` there instead.
        TypeError: ``main`` is not a coroutine (``meshio.run(main)``: the
            function, not yet called).
    """
    if not asyncio.iscoroutine(main):
        name = getattr(main, "__name__", "main")
        raise TypeError(
            f"meshio.run() takes a coroutine, as asyncio.run() does: call the function, "
            f"`meshio.run({name}())` (in a notebook cell: `await {name}()`); got "
            f"{type(main).__name__} {main!r}")
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        name = getattr(main, "__qualname__", "main")
        main.close()  # never awaited: no "coroutine was never awaited" warning
        raise RuntimeError(
            "meshio.run() cannot run inside a running event loop (a Jupyter/IPython cell "
            f"or an async function): await the coroutine there instead, e.g. "
            f"`await {name}()` at the top level of the cell")
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        loop_factory = None
    else:
        loop_factory = uvloop.new_event_loop
        _open_stdio()
    stop = _Stop()
    with stop.handling():
        try:
            with asyncio.Runner(debug=debug, loop_factory=loop_factory) as runner:
                result = runner.run(_main(main, stop))
        except KeyboardInterrupt:  # the loop was blocked, or the program raised it
            pass
        except asyncio.CancelledError:
            if stop.signum is None:  # not cancelled by a stop signal
                raise
        else:
            if stop.signum is None:
                return result
    # Out of the except block: the interrupt's traceback (and the frames and
    # abandoned calls it holds) is freed first, after the loop closed, so
    # those calls' errors are not reported (see runtime()).
    stop.exit()
