"""Ports through the fan-out tree that no answer settles: a port handed
by a ``broadcast`` (no answers at all), and one in a call the processes
answer without reading it (cancelled while they were busy).  Each relay
hands the processes it passed the port on to over to the port's owner,
which counts them as holders until they die, as a process called
directly is counted: ``recv()`` then raises instead of waiting forever;
so it does once a relay that refused a tree message holding a port says
it passed it on to nobody.  Hosts are agents on loopback (ProcessJob):
real processes, real ``SIGKILL``; fan-out width 2 over 5 hosts, a tree
of depth 2."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from meshio import Actor, Channel, Port, ProtocolError, SupervisionError, context, endpoint
from meshio._transport._connection import Pending
from meshio._transport._messages import Fanout
from meshio._transport._runtime import runtime
from meshio._transport._serial import Handing, Packer
from meshio.jobs import ProcessJob

HOSTS = 5
PER_HOST = 2


class Node(Actor):
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.released = asyncio.Event()

    @endpoint
    async def point(self, x: int) -> int:
        return x

    @endpoint
    async def addr(self) -> str:
        return context().proc.addr

    @endpoint
    async def send_to(self, port: Port[int], x: int) -> None:
        port.send(x)

    @endpoint
    async def hold(self) -> None:
        self.started.set()
        await self.released.wait()

    @endpoint(concurrent=True)
    async def release(self) -> None:
        self.released.set()

    @endpoint(concurrent=True)
    async def wait_started(self) -> None:
        await self.started.wait()


@pytest.fixture
async def nodes(tmp_path: Path, width: int) -> AsyncIterator[tuple[Any, Any]]:
    job = ProcessJob(meshes={"hosts": HOSTS}, cache_dir=tmp_path / ".meshio")
    try:
        state = await job.state()
        async with state.hosts.spawn_procs(per_host={"procs": PER_HOST}) as procs:
            yield procs, await procs.spawn("nodes", Node)
    finally:
        await job.kill()


async def _relayed_beyond(mesh: Any) -> None:
    """Every relay has handled the tree messages sent before: each answers
    a call that came after them on the same connections (messages keep
    their order down the tree)."""
    await asyncio.wait_for(mesh.slice(procs=0).point.call(0), 30)


def _leaves(procs: Any) -> list[int]:
    """The pids of the second process of every host (none of them a relay)."""
    return [procs.pids[h * PER_HOST + 1] for h in range(HOSTS)]


async def test_a_port_broadcast_to_processes_killed_before_they_read_it_ends_recv(
        nodes: tuple[Any, Any]) -> None:
    """A broadcast through the tree hands a port to the second process of
    every host, each stopped (SIGSTOP) so it cannot read the port, then
    killed once the relays passed the broadcast on: recv raises (it waited
    forever: a broadcast has no answers, and nothing counted them)."""
    procs, mesh = nodes
    leaves = mesh.slice(procs=1)
    await asyncio.wait_for(leaves.point.call(0), 30)  # (the relays are connected to them)
    pids = _leaves(procs)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    port, receiver = Channel[int].open()
    leaves.send_to.broadcast(port, 1)
    await _relayed_beyond(mesh)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(SupervisionError, match="every process that held it is gone"):
        await asyncio.wait_for(receiver.recv(), 30)


async def test_a_port_broadcast_through_the_tree_is_held_until_its_readers_are_gone(
        nodes: tuple[Any, Any]) -> None:
    """A broadcast port read by every process: recv returns each value,
    waits while any of them lives (it could send again), and raises once
    the last is killed."""
    procs, mesh = nodes
    leaves = mesh.slice(procs=1)
    port, receiver = Channel[int].open()
    leaves.send_to.broadcast(port, 1)
    assert [await asyncio.wait_for(receiver.recv(), 30) for _ in range(HOSTS)] == [1] * HOSTS
    waiting = asyncio.ensure_future(receiver.recv())
    last, *others = _leaves(procs)
    for pid in others:
        os.kill(pid, signal.SIGKILL)
    for h in range(1, HOSTS):  # (once a call fails, the death is known here)
        with pytest.raises(SupervisionError):
            await asyncio.wait_for(mesh.slice(hosts=h, procs=1).point.call_one(0), 30)
    await _relayed_beyond(mesh)
    assert not waiting.done()
    os.kill(last, signal.SIGKILL)
    with pytest.raises(SupervisionError, match="every process that held it is gone"):
        await asyncio.wait_for(waiting, 30)


async def test_a_port_in_a_call_cancelled_before_it_was_read_ends_recv_once_they_die(
        nodes: tuple[Any, Any]) -> None:
    """A call through the tree hands a port to processes busy with another
    call; it is cancelled before any of them read the port, so each relay
    is told the calls it passed on were answered (given up) without the
    processes ever holding the port.  Once they are killed, recv raises (it
    waited forever: the owner had no holder left to lose)."""
    procs, mesh = nodes
    leaves = mesh.slice(procs=1)
    busy = asyncio.ensure_future(leaves.hold.call())
    try:
        await asyncio.wait_for(leaves.wait_started.call(), 30)
        port, receiver = Channel[int].open()
        call = asyncio.ensure_future(leaves.send_to.call(port, 1))
        await _relayed_beyond(mesh)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await _relayed_beyond(mesh)  # (each relay has passed the Cancel on)
        for pid in _leaves(procs):
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(SupervisionError, match="every process that held it is gone"):
            await asyncio.wait_for(receiver.recv(), 30)
    finally:
        busy.cancel()
        await asyncio.gather(busy, return_exceptions=True)


async def test_a_malformed_tree_message_holding_a_port_lets_it_go(
        nodes: tuple[Any, Any]) -> None:
    """A relay refuses a malformed tree message (only a faulty or hostile
    peer sends one) that holds a port it was to pass on: it passes it on
    to nobody, and says so, so recv raises (the relay held the port until
    it died)."""
    _, mesh = nodes
    relay = await asyncio.wait_for(mesh.slice(hosts=0, procs=0).addr.call_one(), 30)
    other = await asyncio.wait_for(mesh.slice(hosts=1, procs=1).addr.call_one(), 30)
    rt = runtime()
    conn = rt.conns.get(relay) or rt.connect(relay)
    port, receiver = Channel[int].open()
    out = Packer()
    args = out.pack_map({"port": port, "x": 1}, {"port": False, "x": False})
    assert isinstance(out, Handing)
    ports = conn.hands_down(out, relay, [other])
    assert ports
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()
    req = conn.next_req(Pending(fut, lambda raw, bufs: raw, "Node.send_to", "probe", 0))
    conn.send_message(Fanout("nodes", "send_to", msgspec.Raw(args), (), "", req, 0, [relay],
                             [(0, [(other, 1)])], 0, True, ports=ports))
    with pytest.raises(ProtocolError, match="fan-out width 0"):
        await asyncio.wait_for(fut, 30)
    with pytest.raises(SupervisionError, match="every process that held it is gone"):
        await asyncio.wait_for(receiver.recv(), 30)
