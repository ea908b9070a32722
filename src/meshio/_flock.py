"""An exclusive ``flock`` on a lock file, awaited on the event loop: what
makes two controllers (or two tasks of one) take turns, as ``apply()`` of
one job (:func:`meshio.jobs._job.job_lock`) and ``reattach`` of one proc
mesh (:func:`meshio._keep_alive.reattaching`) do.  ``flock`` locks belong
to an open file: two opens of the file in one process exclude each other
too.

A job's lock file stays beside its cache (which stays too, for the next
controller); a proc mesh's goes with its last holder (:func:`flocked_file`),
since one is made per name re-attached and nothing else marks its end."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Final

__all__ = ("LOCK_FLAGS", "LOCK_POLL", "flocked", "flocked_file")

#: how a lock file is opened (created mode 0600; a symlink there is refused)
LOCK_FLAGS: Final = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
#: seconds between tries of a lock held by another (:func:`flocked`)
LOCK_POLL: Final = 0.05


async def _lock(fd: int, waiting: Callable[[], object] | None) -> bool:
    """Take the exclusive ``flock`` of ``fd``; whether another held it
    first (``waiting`` is called then, if given)."""
    waited = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return waited
        except BlockingIOError:
            if not waited and waiting is not None:
                waiting()
            waited = True
            # (polled: a thread blocked in flock would outlive a cancelled wait,
            # and asyncio.run's exit waits for it)
            await asyncio.sleep(LOCK_POLL)


@contextlib.asynccontextmanager
async def flocked(fd: int, waiting: Callable[[], object]) -> AsyncGenerator[None]:
    """Hold the exclusive ``flock`` of the lock file open as ``fd``, which
    this owns from now on (closed at the end, which lets the lock go, or
    when the wait is given up: cancelled).  ``waiting`` is called once if
    another holds it (to say what is waited for)."""
    try:
        await _lock(fd, waiting)
        yield
    finally:
        os.close(fd)  # (lets the lock go)


@contextlib.asynccontextmanager
async def flocked_file(path: Path, waiting: Callable[[], object]) -> AsyncGenerator[None]:
    """Hold the exclusive ``flock`` of the lock file ``path`` (made if it is
    missing) as :func:`flocked` does, and remove the file as the lock is let
    go.  Safe for every locker that does the same: only the holder removes
    the file, and one that gets the lock of a file removed meanwhile (those
    waiting when it went), or replaced, opens ``path`` again and waits there.

    Raises:
        OSError: the lock file cannot be opened.
    """
    told = False
    while True:
        fd = os.open(path, LOCK_FLAGS, 0o600)
        try:
            told = await _lock(fd, None if told else waiting) or told
            if _is(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        try:
            path.unlink(missing_ok=True)  # (held: those waiting on it open the path again)
        finally:
            os.close(fd)  # (lets the lock go)


def _is(fd: int, path: Path) -> bool:
    """Whether ``path`` is the file open as ``fd``."""
    try:
        there = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)
