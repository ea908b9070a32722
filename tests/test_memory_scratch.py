"""An in-memory connection's first scratch receive buffer is small (4 KiB),
growing as frames need: at 256 KiB, as a socket's, the thousands of
connections of a 1,024-point in-process mesh left the process ~25 MiB
larger after each such mesh was stopped (glibc keeps freed buffers of that
size in its heap).  A socket's stays 256 KiB."""

from __future__ import annotations

import asyncio
import socket

import pytest

from meshio import Actor, endpoint
from meshio._transport._connection import Connection
from meshio._transport._frames import _MEMORY_SCRATCH, _SCRATCH
from meshio._transport._memory import memory_pipe
from meshio._transport._runtime import close_runtime, runtime
from meshio.testing import in_process_host

DEADLINE = 60.0


class Echo(Actor):
    @endpoint
    def echo(self, value: bytes) -> bytes:
        return value


async def test_an_in_memory_connection_s_first_scratch_buffer_is_small() -> None:
    rt = runtime()
    a, b = Connection(rt, None), Connection(rt, None)
    memory_pipe(asyncio.get_running_loop(), a, rt.context, "a", b, rt.context, "b")
    try:
        assert len(b.get_buffer(1)) == _MEMORY_SCRATCH < _SCRATCH
    finally:
        a.abort()
        close_runtime()


async def test_a_socket_s_first_scratch_buffer_is_unchanged() -> None:
    loop = asyncio.get_running_loop()
    rt = runtime()
    ours, theirs = socket.socketpair()
    conn = Connection(rt, None)
    try:
        await loop.connect_accepted_socket(lambda: conn, ours)
        assert len(conn.get_buffer(1)) == _SCRATCH
    finally:
        conn.abort()
        theirs.close()
        close_runtime()


@pytest.mark.parametrize("size", [100, 5_000, 40_000, 70_000, 300_000])
async def test_frames_larger_than_it_arrive_whole(size: int) -> None:
    """It grows (doubling) for a frame that waits in it (parts below 64 KiB),
    or a large part is received into its own object."""
    async with in_process_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = await procs.spawn("echo", Echo)
        values = [bytes([i]) * size for i in range(3)]
        got = await asyncio.wait_for(asyncio.gather(*(echo.echo.call_one(v) for v in values)),
                                     DEADLINE)
        assert got == values
