"""What a worker does once its runtime is up: serve the controller until it
shuts the worker down or its connection is lost, then stop the worker's
actors.  A worker process (:mod:`meshio.worker`) runs it on its own loop;
the in-process transport (:mod:`meshio.testing`) on the test's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ._exceptions import SupervisionError
from ._transport._runtime import Runtime

__all__ = ("serve",)


async def serve(rt: Runtime, controller: str,
                before_close: Callable[[], None] | None = None) -> int:
    """Be a worker on ``rt`` until the controller at ``controller`` shuts
    it down (0) or its connection is lost (1); then stop its actors (each
    ``__cleanup__``, in reverse spawn order, each one bounded), call
    ``before_close`` (the last messages out) and close ``rt``."""
    rt.controller = controller
    done: asyncio.Future[int] = rt.loop.create_future()

    def finish(code: int) -> None:
        if not done.done():
            done.set_result(code)

    rt.on_shutdown = lambda: finish(0)
    rt.on_lost[controller] = lambda conn: finish(1)
    rt.connect(controller)
    code = await done
    exc = None if code == 0 else SupervisionError(
        f"worker {rt.worker} lost its controller's connection; its actors are stopped",
        cause="controller connection lost")
    for target, cell in reversed(list(rt.actors.items())):
        del rt.actors[target]
        await cell.stop(exc)
    if before_close is not None:
        before_close()
    rt.close()
    return code
