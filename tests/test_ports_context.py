"""Ports and channels for streaming values; context() and current_rank()
inside actors."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, cast

import pytest

import meshio
from meshio import Actor, Channel, Point, Port, context, current_rank, endpoint
from meshio._transport import _runtime

#: these tests hold on both transports: worker processes and in-process
pytestmark = pytest.mark.meshio_transports()

GUARD = 30.0



class Streamer(Actor):
    def __init__(self) -> None:
        ctx = context()  # available in the constructor too
        self.init_point = dict(ctx.point)
        self.init_name = ctx.actor_name

    @endpoint
    async def stream_to(self, port: Port[int], n: int) -> None:
        for i in range(n):
            port.send(i)
        port.close()

    @endpoint
    def send_rank(self, port: Port[Any]) -> None:
        port.send((current_rank().rank, os.getpid()))

    @endpoint
    async def echo_any(self, value: Any) -> Any:
        return value

    @endpoint
    async def send_many(self, port: Port[Any], n: int) -> None:
        r = current_rank().rank
        for i in range(n):
            port.send((r, i))

    @endpoint
    async def relay(self, peer: Streamer, n: int) -> list[int]:
        """Open a channel here, let a peer stream into it, read it back."""
        port, recv = Channel[int].open()
        await peer.stream_to.call_one(port, n)
        return [v async for v in recv]

    @endpoint
    async def whoami(self) -> dict[str, Any]:
        ctx = context()
        return {
            "point": dict(ctx.point),
            "rank": ctx.point.rank,
            "current": dict(current_rank()),
            "same": current_rank() == ctx.point,
            "name": ctx.actor_name,
            "pid": ctx.proc.pid,
            "real_pid": os.getpid(),
            "mesh_sizes": ctx.mesh.sizes,
            "init_point": self.init_point,
            "init_name": self.init_name,
        }

    @endpoint
    def sync_point(self) -> Point:
        return current_rank()

    @endpoint(concurrent=True)
    async def ident(self) -> int:
        return current_rank().rank

    @endpoint
    async def ask_peer(self) -> int:
        """Call the other actor of the mesh through context().mesh."""
        me = current_rank()["procs"]
        peer = cast(Streamer, context().mesh.slice(procs=1 - me))
        return await peer.ident.call_one()

    @endpoint
    async def ask_all(self) -> list[int]:
        """Call every actor, self included (ident is concurrent, so no deadlock)."""
        return (await context().mesh.ident.call()).values()

    @endpoint
    async def ask_self(self) -> int:
        """An endpoint read on the instance calls this very actor."""
        return await self.ident.call_one()


@pytest.fixture
async def streamers(procs: meshio.ProcMesh) -> Streamer:
    return await procs.spawn("streamers", Streamer)


# ------------------------------------------------------------------- ports


async def test_channel_async_for(streamers: Streamer) -> None:
    port, recv = Channel[int].open()
    assert isinstance(port, Port)
    streamers.slice(procs=0).stream_to.broadcast(port, 5)
    got = await asyncio.wait_for(_collect(recv), GUARD)
    assert got == [0, 1, 2, 3, 4]


async def _collect(recv: meshio.PortReceiver[Any]) -> list[Any]:
    return [v async for v in recv]


async def test_channel_recv_one_by_one_and_after_close(streamers: Streamer) -> None:
    port, recv = Channel[int].open()
    await streamers.slice(procs=1).stream_to.call_one(port, 3)
    assert [await recv.recv() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(meshio.ClosedResourceError, match="closed"):
        await recv.recv()
    # stays closed
    with pytest.raises(meshio.ClosedResourceError, match="closed"):
        await recv.recv()
    assert await _collect(recv) == []


async def test_channel_preserves_order_of_many_values(streamers: Streamer) -> None:
    port, recv = Channel[int].open()
    streamers.slice(procs=0).stream_to.broadcast(port, 500)
    assert await asyncio.wait_for(_collect(recv), GUARD) == list(range(500))


async def test_recv_waits_for_the_value(streamers: Streamer, procs: meshio.ProcMesh) -> None:
    port, recv = Channel[Any].open()
    pending = asyncio.ensure_future(recv.recv())
    await streamers.ident.call()  # a round trip: recv() has started waiting
    assert not pending.done()
    streamers.slice(procs=1).send_rank.broadcast(port)
    assert await asyncio.wait_for(pending, GUARD) == (1, procs.pids[1])


async def test_many_senders_one_port(streamers: Streamer, procs: meshio.ProcMesh) -> None:
    port, recv = Channel[Any].open()
    await streamers.send_rank.call(port)
    got = {await recv.recv() for _ in range(2)}
    assert got == {(0, procs.pids[0]), (1, procs.pids[1])}
    # values of each sender arrive in its order, whatever the interleaving
    streamers.send_many.broadcast(port, 50)
    got2 = [await asyncio.wait_for(recv.recv(), GUARD) for _ in range(100)]
    for r in (0, 1):
        assert [i for rr, i in got2 if rr == r] == list(range(50))


async def test_port_owned_by_an_actor(streamers: Streamer) -> None:
    # rank 0 opens a channel and passes its port to rank 1, which streams into it
    got = await streamers.slice(procs=0).relay.call_one(streamers.slice(procs=1), 4)
    assert got == [0, 1, 2, 3]


async def test_port_send_from_the_controller_itself() -> None:
    port, recv = Channel[str].open()
    port.send("a")
    port.send("b")
    port.close()
    assert await asyncio.wait_for(_collect(recv), GUARD) == ["a", "b"]


async def test_closed_receiver_drops_later_values(streamers: Streamer) -> None:
    ports = _runtime.runtime().ports
    before = len(ports)
    port, recv = Channel[int].open()
    recv.close()
    await streamers.slice(procs=0).stream_to.call_one(port, 3)
    assert len(ports) == before
    with pytest.raises(meshio.ClosedResourceError):
        await recv.recv()
    # a new channel is unaffected
    port2, recv2 = Channel[int].open()
    await streamers.slice(procs=0).stream_to.call_one(port2, 2)
    assert await asyncio.wait_for(_collect(recv2), GUARD) == [0, 1]


async def test_port_send_of_a_value_that_cannot_be_encoded_is_a_schema_error(
        streamers: Streamer) -> None:
    """As for an endpoint's argument: SchemaError (a ValueError), saying why."""
    port, recv = Channel[Any].open()
    with pytest.raises(meshio.SchemaError, match=r"cannot be sent: TypeError: cannot pickle") as e:
        port.send(threading.Lock())
    assert isinstance(e.value, ValueError)
    with pytest.raises(meshio.SchemaError, match=r"arguments cannot be sent: TypeError"):
        await streamers.slice(procs=0).echo_any.call_one(threading.Lock())
    port.send("still open")  # nothing was sent, the port still works
    assert await asyncio.wait_for(recv.recv(), GUARD) == "still open"


async def test_port_argument_is_type_checked(streamers: Streamer) -> None:
    with pytest.raises(meshio.SchemaError, match=r"\$\.port"):
        await streamers.slice(procs=0).stream_to.call_one("not a port", 1)  # type: ignore[arg-type]


# ----------------------------------------------------------------- context


async def test_context_inside_actors(streamers: Streamer, procs: meshio.ProcMesh) -> None:
    info = await streamers.whoami.call()
    for point, d in info.items():
        assert d["point"] == dict(point) == {"procs": point.rank}
        assert d["rank"] == point.rank
        assert d["current"] == d["point"] and d["same"] is True
        assert d["name"] == "streamers"
        assert d["pid"] == d["real_pid"] == procs.pids[point.rank]
        assert d["mesh_sizes"] == {"procs": 2}
        assert d["init_point"] == d["point"] and d["init_name"] == "streamers"


async def test_current_rank_travels_as_a_point(streamers: Streamer) -> None:
    points = await streamers.sync_point.call()
    for p, got in points.items():
        assert isinstance(got, Point)
        assert got == p and got.rank == p.rank and dict(got) == dict(p)


async def test_context_mesh_calls_peers(streamers: Streamer) -> None:
    assert (await streamers.ask_peer.options(timeout=GUARD).call()).values() == [1, 0]
    assert (await streamers.ask_all.options(timeout=GUARD).call()).values() == [[0, 1], [0, 1]]
    assert (await streamers.ask_self.options(timeout=GUARD).call()).values() == [0, 1]


async def test_context_on_a_two_dim_mesh(meshio_host: meshio.HostMesh) -> None:
    async with meshio_host.spawn_procs(per_host={"hosts": 2, "gpus": 2}) as pm:
        s = await pm.slice(gpus=1).spawn("streamers", Streamer)
        info = await s.whoami.call()
        assert [d["point"] for d in info.values()] == [{"hosts": 0}, {"hosts": 1}]
        assert [d["pid"] for d in info.values()] == [pm.pids[1], pm.pids[3]]
        assert [d["mesh_sizes"] for d in info.values()] == [{"hosts": 2}] * 2


async def test_context_in_the_controller_is_an_error() -> None:
    with pytest.raises(meshio.NotInActorError,
                       match=r"^meshio\.context\(\) is only available inside an actor"):
        context()
    with pytest.raises(meshio.NotInActorError,  # (named as called)
                       match=r"^meshio\.current_rank\(\) is only available inside an actor"):
        current_rank()


def test_context_outside_any_loop_is_an_error() -> None:
    with pytest.raises(meshio.NotInActorError):
        context()
