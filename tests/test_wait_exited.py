"""``meshio.testing.wait_exited``: several waits on one pidfd each see the
process exit, and what it was given wrong, or a wait that ran out, is
said naming ``pidfd``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshio.testing import wait_exited

GUARD = 30.0


@pytest.fixture
def reader() -> Iterator[subprocess.Popen[bytes]]:
    """A process that exits once its stdin is closed."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(GUARD)


async def test_two_waits_on_one_pidfd_both_see_the_exit(
        reader: subprocess.Popen[bytes]) -> None:
    """The second wait's reader replaced the first's, and its end removed
    both: the first waited out its timeout though the process had exited."""
    pidfd = os.pidfd_open(reader.pid)
    try:
        waits = asyncio.gather(wait_exited(pidfd, GUARD), wait_exited(pidfd, GUARD))
        assert reader.stdin is not None
        reader.stdin.close()
        assert await waits == [None, None]
        await wait_exited(pidfd, GUARD)  # (and again, once it has exited)
    finally:
        os.close(pidfd)


async def test_a_wait_that_runs_out_names_the_pidfd(reader: subprocess.Popen[bytes]) -> None:
    pidfd = os.pidfd_open(reader.pid)
    try:
        with pytest.raises(TimeoutError) as e:
            await wait_exited(pidfd, 0.01)
        assert str(e.value) == (f"wait_exited: pidfd {pidfd} did not become readable (the "
                                "process did not exit) within 0.01 s")
    finally:
        os.close(pidfd)


@pytest.mark.parametrize("pidfd", [True, "3", 3.0])
async def test_a_pidfd_not_an_int_is_a_type_error(pidfd: object) -> None:
    with pytest.raises(TypeError, match=r"^wait_exited\(pidfd=\.\.\.\) must be a pidfd"):
        await wait_exited(pidfd, GUARD)  # type: ignore[arg-type]


async def test_a_descriptor_not_a_pidfd_is_a_value_error(tmp_path: Path) -> None:
    """A regular file failed in epoll (a bare PermissionError), a pipe just
    waited out its timeout, a closed fd was a bare OSError."""
    r, w = os.pipe()
    with (tmp_path / "f").open("w") as f:
        for fd in (r, f.fileno()):
            with pytest.raises(ValueError, match=rf"^wait_exited\(pidfd={fd}\): not a pidfd"):
                await wait_exited(fd, GUARD)
    os.close(r)
    os.close(w)
    closed = max(map(int, os.listdir("/proc/self/fd"))) + 100
    with pytest.raises(ValueError, match=rf"^wait_exited\(pidfd={closed}\): no such open file"):
        await wait_exited(closed, GUARD)
