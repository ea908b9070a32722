"""``meshio.run``: ``asyncio.run`` on uvloop when it is installed."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ("run",)

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Run the controller coroutine ``main`` to completion and return its result.

    Uses uvloop's event loop when uvloop is importable, the default loop otherwise.
    """
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.run(main, debug=debug)
    with asyncio.Runner(debug=debug, loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
