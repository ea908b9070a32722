"""``lock_held``: another process holding a job's lock (``<name>.lock``
beside its cache, what ``apply()`` and ``kill()`` take) until the test lets
it go, and a way to wait until an ``apply()`` or ``kill()`` of this process
waits for it; ``lock_wanted``: another process that takes the lock once
this one lets it go, saying ``waiting`` first if it finds it held."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from subprocess import PIPE
from typing import Any

from log_watch import DEADLINE, LogWatch

#: holds the lock of the job cached at ``argv[1]``, says ``held``, and lets
#: it go when its stdin closes; says ``waiting`` first if another holds it
HOLDER = """
import asyncio, logging, sys
from pathlib import Path
from meshio.jobs._job import job_lock

class Waiting(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if "of this job holds" in record.getMessage():
            print("waiting", flush=True)

async def main() -> None:
    logging.getLogger("meshio").addHandler(Waiting())
    logging.getLogger("meshio").setLevel(logging.INFO)
    async with job_lock(Path(sys.argv[1]), "the holder"):
        print("held", flush=True)
        await asyncio.to_thread(sys.stdin.read)

asyncio.run(main())
"""


class LockHolder:
    """A process holding a job's lock (see :func:`lock_held`)."""

    def __init__(self, proc: asyncio.subprocess.Process, watch: LogWatch) -> None:
        self.proc = proc
        self.watch = watch

    @contextlib.asynccontextmanager
    async def waiting(self, work: Awaitable[Any]) -> AsyncIterator[None]:
        """Run ``work`` (an ``apply()`` or ``kill()``) until it logs that it
        waits for the job's lock; the body then runs while it waits; on
        leaving, the lock is let go and ``work`` must end.

        Raises:
            AssertionError: ``work`` ended first (it did not wait for the lock).
        """
        task = asyncio.ensure_future(work)
        said = asyncio.ensure_future(self.watch.wait_for("of this job holds"))
        try:
            done, _ = await asyncio.wait([task, said], return_when=asyncio.FIRST_COMPLETED)
            assert task not in done, "it ended without waiting for the job's lock"
            yield
            await self.release()
            await task
        finally:
            for t in (said, task):
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t

    async def said(self) -> str:
        """The holder's next line: ``waiting`` (another holds the lock) or ``held``."""
        assert self.proc.stdout is not None
        return (await asyncio.wait_for(self.proc.stdout.readline(), DEADLINE)).decode().strip()

    async def release(self) -> None:
        """Let the lock go: the holder exits."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert await asyncio.wait_for(self.proc.wait(), DEADLINE) == 0


@contextlib.asynccontextmanager
async def lock_held(cache: Path) -> AsyncIterator[LockHolder]:
    """Another process holds the lock of the job cached at ``cache`` (from
    when this is entered until ``release()``); this process's ``meshio``
    INFO lines are watched meanwhile."""
    async with lock_wanted(cache) as holder:
        assert await holder.said() == "held"
        yield holder


@contextlib.asynccontextmanager
async def lock_wanted(cache: Path) -> AsyncIterator[LockHolder]:
    """Another process takes the lock of the job cached at ``cache`` as
    soon as it is free (its ``said()`` tells when: ``held``, after
    ``waiting`` if it found the lock held) and holds it until ``release()``;
    this process's ``meshio`` INFO lines are watched meanwhile."""
    logger = logging.getLogger("meshio")
    watch = LogWatch()
    watch.setLevel(logging.INFO)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(watch)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", HOLDER, str(cache),
                                                stdin=PIPE, stdout=PIPE)
    try:
        yield LockHolder(proc, watch)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        logger.removeHandler(watch)
        logger.setLevel(level)
