"""``meshio.run``: ``asyncio.run`` on uvloop when it is installed, ending
on Ctrl-C with one line and exit status 130."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ._transport._runtime import close_runtime

__all__ = ("run",)

T = TypeVar("T")


async def _main(main: Coroutine[Any, Any, T]) -> T:
    try:
        return await main
    finally:
        close_runtime()


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Run the controller coroutine ``main`` to completion and return its result.

    Uses uvloop's event loop when uvloop is importable, the default loop
    otherwise.  meshio's listening socket and connections are closed at the
    end; worker processes still running exit with them.

    Ctrl-C (``KeyboardInterrupt``) cancels ``main`` as ``asyncio.run`` does,
    so its ``async with`` blocks stop their proc meshes; then one line goes
    to stderr instead of a traceback and the program exits with status 130
    (``SystemExit(130)``), the shell's convention for an interrupted command.

    Raises:
        SystemExit: with code 130, after Ctrl-C.
        RuntimeError: called while an event loop runs in this thread (a
            notebook cell, an ``async def``): ``await main`` there instead.
    """
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
    try:
        with asyncio.Runner(debug=debug, loop_factory=loop_factory) as runner:
            return runner.run(_main(main))
    except KeyboardInterrupt:
        pass
    # Out of the except block: the interrupt's traceback (and the frames and
    # abandoned calls it holds) is freed first, after the loop closed, so
    # those calls' errors are not reported (see runtime()).
    print("meshio: interrupted (Ctrl-C); worker processes stopped", file=sys.stderr,
          flush=True)
    raise SystemExit(130)
