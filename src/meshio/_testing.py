"""Helpers for tests of meshio programs: process leak checks and waiting on
process exit without sleeping."""

from __future__ import annotations

import asyncio
import os

__all__ = ("child_pids", "wait_exited")


def child_pids() -> set[int]:
    """Live (non-zombie) child processes of this process, e.g. workers a test
    forgot to stop (Linux ``/proc``)."""
    me = str(os.getpid())
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            found.add(int(entry))
    return found


async def wait_exited(pidfd: int, timeout: float) -> None:
    """Wait on the running loop until the process behind ``pidfd``
    (``os.pidfd_open``) has exited.

    Raises:
        TimeoutError: it is still running after ``timeout`` seconds.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        await asyncio.wait_for(fut, timeout)
    finally:
        loop.remove_reader(pidfd)
