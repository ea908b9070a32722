"""``wait_gone``: wait until processes that are not this test's children
(host agents, their workers) have exited, on the kernel's word (pidfd);
``killed``: SIGKILL one and wait so."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable

from meshio.testing import wait_exited


async def wait_gone(pids: Iterable[int], within: float = 60.0) -> None:
    """Wait until every process of ``pids`` has exited (one gone already
    counts); ``TimeoutError`` after ``within`` seconds for one."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            await wait_exited(fd, within)
        finally:
            os.close(fd)


async def killed(pid: int, within: float = 60.0) -> None:
    """SIGKILL ``pid`` and wait until it has exited (gone for good, not
    just signalled); ``TimeoutError`` after ``within`` seconds."""
    fd = os.pidfd_open(pid)
    try:
        os.kill(pid, signal.SIGKILL)
        await wait_exited(fd, within)
    finally:
        os.close(fd)
