"""The adverbs on ``mesh.endpoint``: call, call_one, choose, stream,
broadcast, and per-call options (timeouts)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os

import pytest

import meshio
import meshio._transport._runtime
from meshio import Actor, CallTimeout, MeshioError, Point, ValueMesh, current_rank, endpoint
from meshio.testing import process_address

#: these tests hold on both transports: worker processes and in-process
pytestmark = pytest.mark.meshio_transports()

#: guard against hangs in tests that wait on remote events (a failure, not a wait)
GUARD = 30.0



class Worker(Actor):
    def __init__(self, base: int = 0) -> None:
        self.base = base
        self.value = 0
        self.gate = asyncio.Event()
        self.met: dict[str, asyncio.Event] = {"a": asyncio.Event(), "b": asyncio.Event()}

    @endpoint
    async def add(self, x: int) -> int:
        return self.base + x + current_rank().rank

    @endpoint
    def sync_add(self, x: int) -> int:
        return self.base + x + current_rank().rank

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def rank(self) -> int:
        return current_rank().rank

    @endpoint
    def fail(self, why: str) -> None:
        raise RuntimeError(why)

    @endpoint
    def set_value(self, v: int) -> None:
        self.value = v

    @endpoint
    def get_value(self) -> int:
        return self.value

    @endpoint
    async def gated(self, wait_rank: int) -> int:
        """Answers at once, except on ``wait_rank`` which waits for ``open_gate``."""
        if current_rank().rank == wait_rank:
            await self.gate.wait()
        return current_rank().rank

    @endpoint
    async def hold(self) -> int:
        await self.gate.wait()
        return current_rank().rank

    @endpoint(concurrent=True)
    async def open_gate(self) -> None:
        self.gate.set()

    @endpoint(concurrent=True)
    async def ping(self) -> str:
        return f"pong {current_rank().rank}"

    @endpoint(concurrent=True)
    async def meet(self, me: str, other: str) -> str:
        """Two concurrent calls that can only finish if they overlap."""
        self.met[me].set()
        await self.met[other].wait()
        return me


@pytest.fixture
async def workers(procs: meshio.ProcMesh) -> Worker:
    w = await procs.spawn("workers", Worker, base=100)
    # warm up: every connection is up before timing-sensitive checks
    await w.ping.call()
    return w


# ------------------------------------------------------------------ call


async def test_call_gathers_a_value_mesh_in_point_order(workers: Worker,
                                                        procs: meshio.ProcMesh) -> None:
    result = await workers.add.call(x=1)
    assert isinstance(result, ValueMesh)
    assert result.sizes == {"procs": 2}
    assert result.values() == [101, 102]
    assert [(dict(p), v) for p, v in result.items()] == [({"procs": 0}, 101),
                                                        ({"procs": 1}, 102)]
    assert (await workers.pid.call()).values() == procs.pids


async def test_call_positional_and_explicit_form(workers: Worker) -> None:
    assert (await workers.add.call(5)).values() == [105, 106]
    assert (await workers.call(Worker.add, x=2)).values() == [102, 103]
    assert (await workers.call(Worker.add, 3)).values() == [103, 104]


async def test_explicit_form_rejects_foreign_endpoints(workers: Worker) -> None:
    class Other(Actor):
        @endpoint
        async def add(self, x: int) -> int:
            return x

    with pytest.raises(meshio.UnknownEndpointError, match="not an endpoint of Worker"):
        await workers.call(Other.add, x=1)


async def test_plain_def_and_async_def_endpoints(workers: Worker) -> None:
    assert (await workers.sync_add.call(x=7)).values() == [107, 108]
    assert (await workers.add.call(x=7)).values() == [107, 108]
    assert await workers.slice(procs=1).sync_add.call_one(x=0) == 101


async def test_many_concurrent_calls_all_answer(workers: Worker) -> None:
    results = await asyncio.gather(*[workers.add.call(x=i) for i in range(50)])
    assert [r.values() for r in results] == [[100 + i, 101 + i] for i in range(50)]


# -------------------------------------------------------------- call_one


async def test_call_one_on_a_one_actor_slice(workers: Worker, procs: meshio.ProcMesh) -> None:
    assert await workers.slice(procs=0).add.call_one(x=1) == 101
    assert await workers.slice(procs=1).add.call_one(1) == 102
    assert await workers.slice(procs=1).pid.call_one() == procs.pids[1]


async def test_call_one_on_many_actors_is_a_clear_error(workers: Worker) -> None:
    with pytest.raises(meshio.MeshShapeError) as info:
        await workers.add.call_one(x=1)
    msg = str(info.value)
    assert "call_one" in msg and "2 actors" in msg and "slice" in msg
    # a slice that keeps a dim of size 2 is still two actors
    with pytest.raises(meshio.MeshShapeError, match="2 actors"):
        await workers.slice(procs=slice(0, 2)).add.call_one(x=1)


# ---------------------------------------------------------------- choose


async def test_choose_returns_one_value(workers: Worker) -> None:
    v = await workers.add.choose(x=10)
    assert v in (110, 111)


async def test_choose_load_balances_sequential_calls(workers: Worker,
                                                     procs: meshio.ProcMesh) -> None:
    seen = [await workers.pid.choose() for _ in range(10)]
    assert set(seen) == set(procs.pids)


async def test_choose_load_balances_concurrent_calls(workers: Worker,
                                                     procs: meshio.ProcMesh) -> None:
    seen = await asyncio.gather(*[workers.pid.choose() for _ in range(20)])
    assert set(seen) == set(procs.pids)
    # neither actor gets (almost) everything
    assert min(seen.count(p) for p in procs.pids) >= 5


async def test_choose_avoids_a_busy_actor(workers: Worker, procs: meshio.ProcMesh) -> None:
    held = asyncio.ensure_future(workers.hold.choose())  # stuck on one of the two
    picks = [await workers.pid.choose() for _ in range(6)]
    await workers.open_gate.call()
    busy_rank = await asyncio.wait_for(held, GUARD)
    # while one call was stuck on an actor, choose kept picking the idle one
    assert picks == [procs.pids[1 - busy_rank]] * 6


async def test_choose_on_empty_mesh_is_an_error(workers: Worker) -> None:
    empty = workers.slice(procs=slice(0, 0))
    assert len(empty) == 0
    with pytest.raises(meshio.MeshShapeError, match="empty"):
        await empty.pid.choose()
    assert (await empty.pid.call()).values() == []


# ---------------------------------------------------------------- stream


async def test_stream_yields_points_and_values(workers: Worker) -> None:
    got = [(p, v) async for p, v in workers.add.stream(x=1)]
    assert all(isinstance(p, Point) for p, _ in got)
    assert sorted((p.rank, dict(p), v) for p, v in got) == [
        (0, {"procs": 0}, 101), (1, {"procs": 1}, 102)]


async def test_stream_yields_in_arrival_order(workers: Worker) -> None:
    """Rank 0 waits until the controller has seen rank 1's answer."""
    order = []
    async for point, value in workers.gated.options(timeout=GUARD).stream(wait_rank=0):
        assert point.rank == value
        order.append(point.rank)
        if point.rank == 1:
            # rank 0 is still waiting: release it only now
            await workers.slice(procs=0).open_gate.options(timeout=GUARD).call_one()
    assert order == [1, 0]


async def test_stream_in_arrival_order_the_other_way(workers: Worker) -> None:
    order = []
    async for point, _ in workers.gated.options(timeout=GUARD).stream(wait_rank=1):
        order.append(point.rank)
        if point.rank == 0:
            await workers.slice(procs=1).open_gate.options(timeout=GUARD).call_one()
    assert order == [0, 1]


async def test_stream_over_a_slice(workers: Worker) -> None:
    got = [(dict(p), v) async for p, v in workers.slice(procs=1).add.stream(x=0)]
    assert got == [({}, 101)]


async def test_a_stream_failing_on_every_rank_leaves_nothing_unretrieved(
        workers: Worker, caplog: pytest.LogCaptureFixture) -> None:
    """The first failure is raised; the other ranks' are not logged as
    "exception was never retrieved" (before: one such report per rank)."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    for _ in range(3):
        with pytest.raises(MeshioError, match="no good"):
            async for _ in workers.fail.stream("no good"):
                pass
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


# ------------------------------------------------------------- broadcast


async def test_broadcast_is_fire_and_forget(workers: Worker) -> None:
    workers.set_value.broadcast(v=42)
    # FIFO per sender: the later call sees the broadcast's effect
    assert (await workers.get_value.call()).values() == [42, 42]
    workers.slice(procs=1).set_value.broadcast(7)
    assert (await workers.get_value.call()).values() == [42, 7]


async def test_broadcast_exception_does_not_reach_the_caller(
        workers: Worker, procs: meshio.ProcMesh, capsys: pytest.CaptureFixture[str]) -> None:
    # an exception in a broadcast is a supervision event, not an error here
    workers.slice(procs=1).fail.broadcast("broadcast went wrong")
    workers.set_value.broadcast(v=3)
    assert (await workers.get_value.call()).values() == [3, 3]
    # the controller heard of it (the fault precedes the reply on that
    # connection) and holds it for its window (other ranks' faults): the stop prints it
    await procs.stop()
    err = capsys.readouterr().err
    assert "broadcast went wrong" in err and "RuntimeError" in err and "workers" in err


# --------------------------------------------------------------- options


async def test_options_validates_timeout(workers: Worker) -> None:
    for bad, error in ((0, ValueError), (-1, ValueError), ("1", TypeError)):
        with pytest.raises(error, match=r"options\(timeout=\.\.\.\)"):
            workers.add.options(timeout=bad)  # type: ignore[arg-type]
    # options do not leak into the arguments, and None means no timeout
    assert (await workers.add.options(timeout=None).call(x=0)).values() == [100, 101]
    assert (await workers.add.options(timeout=GUARD).call(x=0)).values() == [100, 101]


async def test_call_timeout_names_endpoint_and_silent_ranks(workers: Worker) -> None:
    with pytest.raises(CallTimeout) as info:
        await workers.gated.options(timeout=1.5).call(wait_rank=1)
    err = info.value
    assert isinstance(err, TimeoutError) and isinstance(err, MeshioError)
    assert err.ranks == (1,)
    assert "gated" in err.endpoint
    msg = str(err)
    assert "Worker.gated" in msg and "[1]" in msg and "'workers'" in msg

    # the mesh still serves concurrent endpoints while rank 1 is stuck...
    assert (await workers.ping.options(timeout=GUARD).call()).values() == ["pong 0", "pong 1"]
    # ... and everything once the hang is released
    await workers.slice(procs=1).open_gate.options(timeout=GUARD).call_one()
    assert (await workers.add.options(timeout=GUARD).call(x=0)).values() == [100, 101]


async def test_call_timeout_on_call_one_and_choose(workers: Worker) -> None:
    stuck = workers.slice(procs=0)
    with pytest.raises(CallTimeout) as info:
        await stuck.gated.options(timeout=0.3).call_one(wait_rank=0)
    assert info.value.ranks == (0,) and "gated" in str(info.value)
    with pytest.raises(CallTimeout):
        await stuck.gated.options(timeout=0.3).choose(wait_rank=0)
    await stuck.open_gate.call_one()
    # the two queued calls are answered late and do not disturb later calls
    assert await stuck.add.options(timeout=GUARD).call_one(x=1) == 101


async def test_timeout_names_the_actor_rank_not_the_slice_index(workers: Worker) -> None:
    stuck = workers.slice(procs=1)  # index 0 of the slice, rank 1 of the mesh
    with pytest.raises(CallTimeout) as info:
        await stuck.gated.options(timeout=0.3).call_one(wait_rank=1)
    assert info.value.ranks == (1,)
    with pytest.raises(CallTimeout) as info:
        await stuck.gated.options(timeout=0.3).choose(wait_rank=1)
    assert info.value.ranks == (1,)
    conn = meshio._transport._runtime.runtime().conns[process_address(stuck)]
    assert not any(p.endpoint.endswith("gated") for p in conn.pending.values())  # not kept
    await stuck.open_gate.call_one()


async def test_stream_timeout_after_the_fast_rank(workers: Worker) -> None:
    got = []
    with pytest.raises(CallTimeout) as info:
        async for point, v in workers.gated.options(timeout=1.5).stream(wait_rank=0):
            got.append((point.rank, v))
    assert got == [(1, 1)]
    assert info.value.ranks == (0,)
    await workers.open_gate.call()


# ----------------------------------------------------------- concurrency


async def test_concurrent_endpoint_calls_overlap(workers: Worker) -> None:
    one = workers.slice(procs=0).meet.options(timeout=GUARD)
    # each call waits for the other: both finish only if they run at once
    a, b = await asyncio.gather(one.call_one(me="a", other="b"), one.call_one(me="b", other="a"))
    assert (a, b) == ("a", "b")


async def test_concurrent_endpoint_runs_while_a_normal_one_is_busy(workers: Worker) -> None:
    busy = asyncio.ensure_future(workers.slice(procs=1).gated.call_one(wait_rank=1))
    assert await workers.slice(procs=1).ping.options(timeout=GUARD).call_one() == "pong 1"
    assert not busy.done()
    await workers.slice(procs=1).open_gate.call_one()
    assert await asyncio.wait_for(busy, GUARD) == 1
