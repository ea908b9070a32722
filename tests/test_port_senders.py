"""A receiver whose every sender has died stops waiting (issue 18 item 6):
``recv()`` raises ``SupervisionError`` once each other process the port was
passed to is gone without closing it, after the values they sent; while one
holder lives it waits as before.  Real processes, killed with SIGKILL."""

from __future__ import annotations

import asyncio
import gc
import os
import re
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


async def test_a_value_sent_after_another_sender_closed_is_dropped_and_said(
        caplog: pytest.LogCaptureFixture) -> None:
    """One ``close()`` ends the channel for every sender (README, Ports):
    a value another holder sends after it is dropped, and the receiving
    process says so on its ``meshio`` log, once per port."""
    port, receiver = Channel[int].open()
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        holders = await procs.spawn("holders", Holder, port)
        first, second = holders.slice(procs=0), holders.slice(procs=1)
        await asyncio.wait_for(first.send.call_one(1), GUARD)
        await asyncio.wait_for(first.close.call_one(), GUARD)
        assert [v async for v in receiver] == [1]  # (ended by the close)
        with caplog.at_level("WARNING", logger="meshio"):
            pid = await asyncio.wait_for(second.send.call_one(2), GUARD)
            await asyncio.wait_for(second.send.call_one(3), GUARD)
            # (the answer to a later call from the same process comes after its values)
            await asyncio.wait_for(second.send.call_one(4), GUARD)
        said = [r.getMessage() for r in caplog.records if "was dropped" in r.getMessage()]
        assert len(said) == 1 and re.fullmatch(
            rf"meshio: a value sent to port \d+ by process {pid} was dropped: the port is "
            r"closed \(one close\(\) ends it for every sender\), or its receiver was closed "
            r"or is gone \(said once per port\)", said[0]), said


class Handed(Actor):
    """Is handed ports; keeps those it is told to keep, and never closes one
    (only their receivers do)."""

    def __init__(self) -> None:
        self.kept: list[Port[int]] = []

    @endpoint
    async def send_one(self, port: Port[int], value: int) -> None:
        port.send(value)

    @endpoint
    def send_in_thread(self, port: Port[int], value: int) -> None:
        port.send(value)

    @endpoint
    async def keep(self, port: Port[int], value: int) -> None:
        port.send(value)
        self.kept.append(port)

    @endpoint
    async def forget(self) -> None:
        self.kept.clear()

    @endpoint
    async def told(self) -> int:
        """How many ports this process remembers telling it holds."""
        from meshio import _port
        from meshio._transport._runtime import runtime
        gc.collect()
        return len(runtime().state(_port._Held).told)


@pytest.mark.meshio_transports("processes", "in-process")
async def test_ports_handed_over_and_never_closed_are_not_kept_for_good(
        procs: meshio.ProcMesh) -> None:
    """A process remembers which ports it told their receivers it holds; a
    port never closed there (its receiver closed or dropped it: an RL loop
    handing a fresh port to a generator each step) stayed, one entry each,
    for good.  It is remembered while the process holds the port; a port
    forgotten and handed over again still delivers."""
    handed = (await procs.spawn("handed", Handed)).slice(procs=0)
    first, first_rx = Channel[int].open()
    await asyncio.wait_for(handed.keep.call_one(first, -1), GUARD)
    assert await asyncio.wait_for(first_rx.recv(), GUARD) == -1
    for i in range(40):
        port, rx = Channel[int].open()
        send = handed.send_one if i % 3 else handed.send_in_thread
        await asyncio.wait_for(send.call_one(port, i), GUARD)
        assert await asyncio.wait_for(rx.recv(), GUARD) == i
        if i % 2:
            rx.close()  # (the others are dropped)
    assert await asyncio.wait_for(handed.told.call_one(), GUARD) == 1  # the one it keeps
    await asyncio.wait_for(handed.forget.call_one(), GUARD)
    assert await asyncio.wait_for(handed.told.call_one(), GUARD) == 0
    await asyncio.wait_for(handed.send_one.call_one(first, -2), GUARD)  # (told again)
    assert await asyncio.wait_for(first_rx.recv(), GUARD) == -2


async def test_a_process_killed_before_it_read_the_port_counts_as_a_holder() -> None:
    """The port goes to a process stopped (SIGSTOP) before the call is sent,
    so it cannot have read the port (nor told the receiver it holds it),
    and is then killed: it counted as a holder from the send on, so recv
    raises instead of waiting forever."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        handed = (await procs.spawn("handed", Handed)).slice(procs=0)
        pid = procs.pids[0]
        os.kill(pid, signal.SIGSTOP)
        port, receiver = Channel[int].open()
        call = handed.send_one.call_one(port, 1)  # (sent before it returns)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(SupervisionError):
            await asyncio.wait_for(call, GUARD)
        with pytest.raises(SupervisionError, match="every process that held it is gone"):
            await asyncio.wait_for(receiver.recv(), GUARD)


async def test_every_process_a_call_handed_the_port_to_counts_as_a_holder() -> None:
    """One call hands the port to two stopped processes; one is killed:
    the receiver waits for the other, which reads the port and sends once
    resumed; once it is gone too, recv raises."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        handed = await procs.spawn("handed", Handed)
        pids = procs.pids
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        port, receiver = Channel[int].open()
        call = handed.send_one.call(port, 7)
        os.kill(pids[0], signal.SIGKILL)
        with pytest.raises(SupervisionError):  # (once it fails, the death is known here)
            await asyncio.wait_for(handed.slice(procs=0).forget.call_one(), GUARD)
        os.kill(pids[1], signal.SIGCONT)  # (it still holds the port: recv waits for it)
        assert await asyncio.wait_for(receiver.recv(), GUARD) == 7
        assert len((await asyncio.wait_for(call, GUARD)).holes) == 1  # rank 0's
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(SupervisionError, match="every process that held it is gone"):
            await asyncio.wait_for(receiver.recv(), GUARD)
