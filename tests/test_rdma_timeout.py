"""``RDMABuffer.options(timeout=...)`` against an owner that stopped (SIGSTOP)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import meshio
import meshio._transport._runtime
from meshio import Actor, RDMABuffer, endpoint

#: guard on a wait that should end long before it (a regression fails, not hangs)
GUARD = 15.0
TIMEOUT = 0.5
N = 1 << 16

pytestmark = pytest.mark.filterwarnings("ignore::meshio.RDMAFallbackWarning")


class Owner(Actor):
    def __init__(self) -> None:
        self.data = bytearray(os.urandom(N))

    @endpoint
    async def register(self) -> RDMABuffer:
        self.buf = RDMABuffer(self.data, backend="tcp")
        return self.buf


async def test_tcp_transfers_and_drop_time_out_on_a_stopped_owner() -> None:
    """issue 7 item 21: with ``options(timeout=...)``, a tcp-backend read,
    write and ``drop()`` on a buffer whose owner is stopped (SIGSTOP) raise
    CallTimeout promptly (long before the heartbeat timeout) and leave no
    request waiting; requests already sent still take effect, in order, when
    the owner resumes."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        owner = await procs.spawn("owner", Owner)
        buf = (await owner.register.call_one()).options(timeout=TIMEOUT)
        assert buf.backend == "tcp"
        conn = meshio._transport._runtime.runtime().conns[buf.handle.owner]
        pid = procs.pids[0]
        dst = bytearray(N)
        ops: tuple[tuple[tuple[str, Callable[[], Awaitable[object]]], ...], ...] = (
            (("read", lambda: buf.read_into(dst)),
             ("write", lambda: buf.write_from(bytes(16), offset=8))),
            (("drop", buf.drop),))
        for round_ in ops:
            os.kill(pid, signal.SIGSTOP)
            try:
                for name, op in round_:
                    t0 = time.monotonic()
                    with pytest.raises(meshio.CallTimeout, match=rf"{name}.*{TIMEOUT}s"):
                        await asyncio.wait_for(op(), GUARD)
                    assert time.monotonic() - t0 < TIMEOUT + 2.0, name
                assert not [p for p in conn.pending.values() if p.endpoint.startswith("RDMA")]
            finally:
                os.kill(pid, signal.SIGCONT)
            if name == "write":  # resumed: the timed-out write was served first
                assert await asyncio.wait_for(buf.read_into(dst), GUARD) == N
                assert dst[8:24] == bytes(16)
        with pytest.raises(meshio.RDMAError, match="dropped"):  # so was the drop
            await asyncio.wait_for(buf.read_into(dst), GUARD)


#: the proc mesh's heartbeat timeout in the test below: far past GUARD, so
#: only the buffer's own deadline can end a transfer on a stopped owner
NO_HEARTBEAT = 600.0


class Reader(Actor):
    @endpoint
    async def read(self, buf: RDMABuffer) -> int:
        return await buf.read_into(bytearray(N))

    @endpoint
    async def read_untyped(self, buf: Any) -> int:
        return int(await buf.read_into(bytearray(N)))


async def test_the_timeout_travels_with_the_buffer() -> None:
    """``buf.options(timeout=...)`` sent to another actor (an argument
    annotated ``RDMABuffer``, or ``Any``) keeps its deadline there: a read
    from a stopped owner (SIGSTOP) raises CallTimeout in that actor.
    Before, the buffer arrived without it and the read waited for the
    owner's heartbeat timeout."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 2},
                                              heartbeat_timeout=NO_HEARTBEAT) as procs:
        owner = await procs.slice(procs=0).spawn("owner", Owner)
        peer = await procs.slice(procs=1).spawn("peer", Reader)
        buf = (await asyncio.wait_for(owner.register.call_one(), GUARD)).options(timeout=TIMEOUT)
        for read in (peer.read, peer.read_untyped):
            os.kill(procs.pids[0], signal.SIGSTOP)
            try:
                with pytest.raises(meshio.ActorError) as info:
                    await asyncio.wait_for(read.call_one(buf), GUARD)
            finally:
                os.kill(procs.pids[0], signal.SIGCONT)
            assert info.value.remote_type == "meshio.CallTimeout"
            assert re.search(rf"RDMA read of {N} bytes .* took longer than {TIMEOUT}s",
                             info.value.remote_message), info.value.remote_message
            # resumed: the same buffer reads there
            assert await asyncio.wait_for(read.call_one(buf), GUARD) == N
