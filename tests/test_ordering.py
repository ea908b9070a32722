"""Per sender -> actor FIFO order, and one message at a time per actor
unless an endpoint is concurrent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import meshio
from meshio import Actor, current_rank, endpoint

#: these tests hold on both transports: worker processes and in-process
pytestmark = pytest.mark.meshio_transports()

GUARD = 30.0



class Recorder(Actor):
    def __init__(self) -> None:
        self.log: list[object] = []
        self.events: list[str] = []
        self.gate = asyncio.Event()
        self.started = 0

    @endpoint
    async def append(self, item: object) -> None:
        self.log.append(item)

    @endpoint
    def append_sync(self, item: object) -> int:
        self.log.append(item)
        return len(self.log)

    @endpoint
    async def append_big(self, item: int, payload: bytes) -> int:
        self.log.append(item)
        return len(payload)

    @endpoint
    def get_log(self) -> list[Any]:
        return self.log

    @endpoint
    async def slow(self, name: str) -> str:
        """Records start and end; waits for the gate in between."""
        self.events.append(f"{name}-start")
        await self.gate.wait()
        self.events.append(f"{name}-end")
        return name

    @endpoint(concurrent=True)
    async def status(self) -> list[str]:
        return list(self.events)

    @endpoint(concurrent=True)
    async def peek_log(self) -> list[object]:
        return list(self.log)

    @endpoint(concurrent=True)
    async def open_gate(self) -> None:
        self.gate.set()

    @endpoint(concurrent=True)
    async def start_order(self, i: int) -> int:
        """Concurrent calls start in arrival order (before their first await)."""
        self.log.append(i)
        await self.gate.wait()
        return i


class Sender(Actor):
    """Sends to a recorder from inside a worker (another sender than the controller)."""

    def __init__(self, target: Recorder) -> None:
        self.target = target

    @endpoint
    async def fire(self, n: int) -> None:
        tag = f"w{current_rank().rank}"
        for i in range(n):
            self.target.append.broadcast((tag, i))
        await self.target.get_log.call_one()  # flushed: every append was handled


@pytest.fixture
async def rec(procs: meshio.ProcMesh) -> Recorder:
    return await procs.spawn("rec", Recorder)


async def test_200_concurrent_calls_are_handled_in_order(rec: Recorder) -> None:
    results = await asyncio.gather(*[rec.append.call(i) for i in range(200)])
    assert len(results) == 200
    logs = await rec.get_log.call()
    assert logs.values() == [list(range(200))] * 2


async def test_200_broadcasts_are_handled_in_order(rec: Recorder) -> None:
    for i in range(200):
        rec.append.broadcast(i)
    assert (await rec.get_log.call()).values() == [list(range(200))] * 2


async def test_order_holds_across_adverbs_and_views(rec: Recorder) -> None:
    one = rec.slice(procs=1)
    futs: list[asyncio.Future[Any]] = []
    for i in range(60):
        match i % 4:
            case 0:
                one.append.broadcast(i)
            case 1:
                futs.append(one.append_sync.call_one(i))
            case 2:
                futs.append(one.append.call(i))
            case 3:
                futs.append(rec.slice(procs=slice(1, 2)).append.choose(i))
    await asyncio.gather(*futs)
    assert await one.get_log.call_one() == list(range(60))
    assert await rec.slice(procs=0).get_log.call_one() == []


async def test_order_with_large_out_of_band_payloads(rec: Recorder) -> None:
    one = rec.slice(procs=0)
    big = b"x" * (1 << 20)
    futs = [one.append_big.call_one(i, big if i % 3 == 0 else b"s") for i in range(30)]
    sizes = await asyncio.gather(*futs)
    assert sizes == [len(big) if i % 3 == 0 else 1 for i in range(30)]
    assert await one.get_log.call_one() == list(range(30))


async def test_each_sender_keeps_its_own_order(procs: meshio.ProcMesh) -> None:
    rec = await procs.spawn("rec", Recorder)
    target = rec.slice(procs=0)
    senders = await procs.spawn("senders", Sender, target)
    # two workers and the controller all send to the same actor at once
    for i in range(100):
        target.append.broadcast(("ctl", i))
    await asyncio.gather(senders.fire.call(100),
                         *[target.append.call(("ctl", i)) for i in range(100, 150)])
    log = await target.get_log.call_one()
    assert len(log) == 350
    for tag, n in (("ctl", 150), ("w0", 100), ("w1", 100)):
        assert [i for t, i in log if t == tag] == list(range(n))


async def test_a_normal_endpoint_handles_one_message_at_a_time(rec: Recorder) -> None:
    one = rec.slice(procs=1)
    a = one.slow.call_one("a")
    b = one.slow.call_one("b")
    # a is waiting on the gate; b was sent before status and has not started
    assert await one.status.options(timeout=GUARD).call_one() == ["a-start"]
    await one.open_gate.call_one()
    assert list(await asyncio.wait_for(asyncio.gather(a, b), GUARD)) == ["a", "b"]
    assert await one.status.call_one() == ["a-start", "a-end", "b-start", "b-end"]


async def test_concurrent_calls_start_in_arrival_order(rec: Recorder) -> None:
    one = rec.slice(procs=0)
    futs = [one.start_order.call_one(i) for i in range(50)]
    # all 50 have started (in order) and are running at once, blocked on the gate
    assert await one.peek_log.options(timeout=GUARD).call_one() == list(range(50))
    await one.open_gate.call_one()
    assert await asyncio.wait_for(asyncio.gather(*futs), GUARD) == list(range(50))
    assert await one.get_log.call_one() == list(range(50))
