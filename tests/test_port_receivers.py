"""A port's receiving end: several tasks reading one receiver, a receiver
closed by its owner, the runtime's table of open ports, which keeps only
receivers still open (no entry per channel ever opened), and a receiver
given to another process (it stays where its channel was opened)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest

import meshio
from meshio import Channel, ClosedResourceError, Port, PortReceiver, SchemaError, endpoint
from meshio._transport import _runtime
from test_ports_context import Streamer

#: these tests hold on both transports: worker processes and in-process
pytestmark = pytest.mark.meshio_transports()

GUARD = 30.0


class Sender(Streamer):  # (its stream_to)
    @endpoint
    async def send(self, port: Port[int], value: int) -> None:
        port.send(value)

    @endpoint
    async def ping(self) -> None:
        pass

    @endpoint
    async def drain(self, inbox: PortReceiver[int]) -> int:
        return sum([v async for v in inbox])

    @endpoint
    async def open_inbox(self) -> PortReceiver[int]:
        return Channel[int].open()[1]


@pytest.fixture
async def sender(procs: meshio.ProcMesh) -> Sender:
    return await procs.slice(procs=0).spawn("sender", Sender)


def open_ports() -> int:
    """How many receivers this process's runtime has registered (the table
    the transport hands port values to)."""
    return len(_runtime.runtime().ports)


# ------------------------------------------------------- several readers


async def test_two_tasks_waiting_in_recv_both_get_values(sender: Sender) -> None:
    port, receiver = Channel[int].open()
    first = asyncio.ensure_future(receiver.recv())
    second = asyncio.ensure_future(receiver.recv())
    await sender.ping.call_one()  # a round trip: both tasks wait in recv() now
    assert not first.done() and not second.done()
    await sender.stream_to.call_one(port, 5)
    got = await asyncio.wait_for(asyncio.gather(first, second), GUARD)
    assert sorted(got) == [0, 1]
    assert [v async for v in receiver] == [2, 3, 4]


async def test_readers_in_async_for_share_the_values_and_all_end(sender: Sender) -> None:
    port, receiver = Channel[int].open()

    async def read() -> list[int]:
        return [v async for v in receiver]

    readers = [asyncio.ensure_future(read()) for _ in range(3)]
    await sender.ping.call_one()  # every reader waits in recv() now
    await sender.stream_to.call_one(port, 20)
    got = await asyncio.wait_for(asyncio.gather(*readers), GUARD)
    assert sorted(v for values in got for v in values) == list(range(20))
    for values in got:  # each reader sees its share in the order sent
        assert values == sorted(values)


async def test_a_cancelled_reader_leaves_the_value_to_another(sender: Sender) -> None:
    port, receiver = Channel[int].open()
    cancelled = asyncio.ensure_future(receiver.recv())
    waiting = asyncio.ensure_future(receiver.recv())
    await sender.ping.call_one()
    cancelled.cancel()
    await sender.send.call_one(port, 7)
    assert await asyncio.wait_for(waiting, GUARD) == 7
    assert cancelled.cancelled()


# --------------------------------------------- closed by its owner


async def test_recv_on_a_receiver_closed_by_its_owner_raises(sender: Sender) -> None:
    port, receiver = Channel[int].open()
    await sender.send.call_one(port, 1)
    receiver.close()  # (a value not yet read is dropped with it)
    with pytest.raises(ClosedResourceError, match="receiver was closed"):
        await asyncio.wait_for(receiver.recv(), GUARD)
    assert [v async for v in receiver] == []


async def test_closing_the_receiver_ends_the_tasks_waiting_in_recv(sender: Sender) -> None:
    port, receiver = Channel[int].open()
    waiting = [asyncio.ensure_future(receiver.recv()) for _ in range(2)]
    await sender.ping.call_one()
    receiver.close()
    for task in waiting:
        with pytest.raises(ClosedResourceError):
            await asyncio.wait_for(task, GUARD)
    await sender.stream_to.call_one(port, 3)  # later sends are dropped, the sender unaffected
    with pytest.raises(ClosedResourceError):
        await receiver.recv()


# ----------------------------------------------- the table of open ports


async def test_a_channel_closed_by_its_sender_and_read_leaves_no_entry(sender: Sender) -> None:
    before = open_ports()
    receivers = []
    for _ in range(20):
        port, receiver = Channel[int].open()
        receivers.append(receiver)  # (held: only the channel's end unregisters it)
        await sender.stream_to.call_one(port, 1)
        assert [v async for v in receiver] == [0]
    assert open_ports() == before


async def test_a_receiver_closed_by_its_owner_leaves_no_entry(sender: Sender) -> None:
    before = open_ports()
    port, receiver = Channel[int].open()
    assert open_ports() == before + 1
    receiver.close()
    assert open_ports() == before
    await sender.stream_to.call_one(port, 2)  # dropped, as for any closed port
    assert open_ports() == before


async def test_a_receiver_nobody_holds_leaves_no_entry(sender: Sender) -> None:
    before = open_ports()
    port, receiver = Channel[int].open()
    gone = weakref.ref(receiver)
    del receiver
    gc.collect()
    assert gone() is None
    assert open_ports() == before
    await sender.send.call_one(port, 1)  # dropped, as for a closed port
    await sender.stream_to.call_one(port, 1)
    assert open_ports() == before


async def test_an_open_receiver_stays_registered_while_held(sender: Sender) -> None:
    port, receiver = Channel[Any].open()
    gc.collect()
    await sender.send.call_one(port, 5)
    assert await asyncio.wait_for(receiver.recv(), GUARD) == 5


# ------------------------------------------------- a receiver stays home


async def test_a_receiver_sent_to_an_actor_names_the_port_to_send(sender: Sender) -> None:
    """Ray's "pass the queue to the consumer": refused as a SchemaError that
    says where the receiver is, why it cannot go, and what to send (it was
    pickle's "no default __reduce__ due to non-trivial __cinit__")."""
    port, receiver = Channel[int].open()
    with pytest.raises(SchemaError, match=(
            r"^Sender\.drain: arguments cannot be sent: a PortReceiver cannot be sent - at "
            r"`\$\.inbox`: it stays in the process that opened its channel.*; send the Port "
            r"instead")):
        sender.drain.call_one(receiver)
    with pytest.raises(SchemaError, match=r"^Sender\.drain: .* - at `\$\.inbox\[0\]`"):
        sender.drain.call_one([receiver])  # type: ignore[arg-type]
    with pytest.raises(SchemaError, match=r"^result of Sender\.open_inbox could not be "
                                          r"encoded: a PortReceiver cannot be sent: it stays"):
        await asyncio.wait_for(sender.open_inbox.call_one(), GUARD)
    await sender.send.call_one(port, 5)  # (the channel still works)
    assert await asyncio.wait_for(receiver.recv(), GUARD) == 5
