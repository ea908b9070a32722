"""An exclusive ``flock`` on a lock file, awaited on the event loop: what
makes two controllers (or two tasks of one) take turns, as ``apply()`` of
one job (:func:`meshio.jobs._job.job_lock`) and ``reattach`` of one proc
mesh (:func:`meshio._keep_alive.reattaching`) do.  ``flock`` locks belong
to an open file: two opens of the file in one process exclude each other
too."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncGenerator, Callable
from typing import Final

__all__ = ("LOCK_FLAGS", "LOCK_POLL", "flocked")

#: how a lock file is opened (created mode 0600; a symlink there is refused)
LOCK_FLAGS: Final = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
#: seconds between tries of a lock held by another (:func:`flocked`)
LOCK_POLL: Final = 0.05


@contextlib.asynccontextmanager
async def flocked(fd: int, waiting: Callable[[], object]) -> AsyncGenerator[None]:
    """Hold the exclusive ``flock`` of the lock file open as ``fd``, which
    this owns from now on (closed at the end, which lets the lock go, or
    when the wait is given up: cancelled).  ``waiting`` is called once if
    another holds it (to say what is waited for)."""
    try:
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    waiting()
                    told = True
                # (polled: a thread blocked in flock would outlive a cancelled wait,
                # and asyncio.run's exit waits for it)
                await asyncio.sleep(LOCK_POLL)
        yield
    finally:
        os.close(fd)  # (lets the lock go)
