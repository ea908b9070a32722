"""The controller's own ``meshio`` log records, awaitable (the
``controller_log`` fixture of ``conftest.py``)."""

from __future__ import annotations

import asyncio
import logging

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
