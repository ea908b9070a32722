"""The controller's own ``meshio`` log records, awaitable (the
``controller_log`` fixture of ``conftest.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Iterator
from typing import Any

#: generous bound on waiting for one record
DEADLINE = 30.0


class LogWatch(logging.Handler):
    """The controller's own ``meshio`` log records (warnings and up), awaitable."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.event.set()

    async def wait_for(self, text: str) -> str:
        while not any(text in m for m in self.messages):
            self.event.clear()
            await asyncio.wait_for(self.event.wait(), DEADLINE)
        return next(m for m in self.messages if text in m)


@contextlib.contextmanager
def loop_reports() -> Iterator[list[dict[str, Any]]]:
    """What the running loop's exception handler is given meanwhile (an
    error in a callback, a task's exception never retrieved), collected
    instead of printed; the handler is restored after.  A garbage
    collection at the end brings out what dropped futures would report."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        yield reported
        gc.collect()
    finally:
        loop.set_exception_handler(handler)
