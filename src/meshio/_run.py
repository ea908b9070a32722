"""``meshio.run``: ``asyncio.run`` on uvloop when it is installed."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from ._runtime import close_runtime

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
    """
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.run(_main(main), debug=debug)
    with asyncio.Runner(debug=debug, loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_main(main))
