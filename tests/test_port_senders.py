"""A receiver whose every sender has died stops waiting (issue 18 item 6):
``recv()`` raises ``SupervisionError`` once each other process the port was
passed to is gone without closing it, after the values they sent; while one
holder lives it waits as before.  Real processes, killed with SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

import meshio
from meshio import Actor, Channel, ClosedResourceError, Port, SupervisionError, endpoint

GUARD = 30.0


class Holder(Actor):
    def __init__(self, port: Port[int]) -> None:
        self.port = port  # held from the constructor on

    @endpoint
    async def send(self, x: int) -> int:
        self.port.send(x)
        return os.getpid()

    @endpoint
    async def close(self) -> None:
        self.port.close()


async def test_recv_raises_once_every_holder_died_after_their_values() -> None:
    port, receiver = Channel[int].open()
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        holders = await procs.spawn("holders", Holder, port)
        pids = (await holders.send.call(1)).values()
        assert [await asyncio.wait_for(receiver.recv(), GUARD) for _ in range(2)] == [1, 1]
        os.kill(pids[0], signal.SIGKILL)
        await asyncio.wait_for(holders.slice(procs=1).send.call_one(2), GUARD)
        assert await asyncio.wait_for(receiver.recv(), GUARD) == 2  # one holder lives: served
        await asyncio.wait_for(holders.slice(procs=1).send.call_one(3), GUARD)
        os.kill(pids[1], signal.SIGKILL)
        assert await asyncio.wait_for(receiver.recv(), GUARD) == 3  # sent before it died
        with pytest.raises(SupervisionError, match="every process that held it is gone"):
            await asyncio.wait_for(receiver.recv(), GUARD)


async def test_a_closed_port_still_says_closed() -> None:
    port, receiver = Channel[int].open()
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        holder = await procs.spawn("holder", Holder, port)
        await asyncio.wait_for(holder.close.call_one(), GUARD)
        with pytest.raises(ClosedResourceError):
            await asyncio.wait_for(receiver.recv(), GUARD)
