"""The in-process transport (meshio.testing.in_process_host): workers are
runtimes on the test's own loop, reached over in-memory connections that
carry real frames. What only it can get wrong: which runtime an actor sees,
large and concurrent messages through the memory pipe, backpressure, and
how its workers end."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

import meshio
from meshio import Actor, SupervisionError, context, endpoint
from meshio._transport._runtime import close_runtime
from meshio.testing import child_pids, in_process_host

GUARD = 30.0
MiB = 1 << 20

#: what actors of this module's tests left behind (same process: readable here)
seen: dict[str, Any] = {}


class Echo(Actor):
    def __init__(self, tag: str = "") -> None:
        self.tag = tag

    @endpoint
    async def where(self) -> tuple[int, str, int]:
        ctx = context()
        return os.getpid(), ctx.proc.addr, ctx.proc.rank

    @endpoint
    async def echo(self, value: Any) -> Any:
        return value

    @endpoint
    async def relay(self, other: Echo, value: str) -> list[str]:
        """Call ``other`` from this actor (actor to actor, both in-process)."""
        return (await other.echo.call(f"{self.tag}:{value}")).values()

    @endpoint
    async def hang(self) -> None:
        await asyncio.Event().wait()

    async def __cleanup__(self, exc: BaseException | None) -> None:
        seen.setdefault("cleanups", []).append((self.tag, type(exc).__name__))
        event = seen.get("cleaned")
        if isinstance(event, asyncio.Event):
            event.set()


@pytest.fixture(autouse=True)
def forget() -> None:
    seen.clear()


async def test_workers_are_runtimes_of_this_process() -> None:
    """No process starts: every worker answers with the test's pid, each at
    an address and rank of its own."""
    before = child_pids()
    async with in_process_host().spawn_procs(per_host={"procs": 3}) as procs:
        assert procs.pids == [os.getpid()] * 3
        echo = await procs.spawn("echo", Echo)
        found = (await asyncio.wait_for(echo.where.call(), GUARD)).values()
        assert [pid for pid, _, _ in found] == [os.getpid()] * 3
        assert len({addr for _, addr, _ in found}) == 3
        assert [rank for _, _, rank in found] == [0, 1, 2]
        assert child_pids() == before


async def test_large_and_concurrent_values_cross_in_memory() -> None:
    """Values far larger than one delivery (out-of-band buffers, big str)
    arrive whole and in order, several at once, and are copies: mutating
    what was sent changes nothing received."""
    async with in_process_host().spawn_procs(per_host={"procs": 2}) as procs:
        echo = await procs.spawn("echo", Echo)
        blob = bytearray(os.urandom(32 * MiB))
        text = "meshio" * (2 * MiB)
        calls = [echo.echo.call(v) for v in (bytes(blob), text, list(range(100_000)))]
        blob[:] = bytes(len(blob))  # the sender reuses its buffer at once
        got = await asyncio.wait_for(asyncio.gather(*calls), GUARD)
        assert got[0].values()[1] != bytes(len(blob)) and len(got[0].values()[1]) == 32 * MiB
        assert got[1].values() == [text, text]
        assert got[2].values()[0] == list(range(100_000))


async def test_a_small_receive_budget_pauses_and_resumes(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """With a receive budget smaller than the messages in flight, the memory
    pipes pause reading and resume as others finish: every call completes."""
    monkeypatch.setenv("MESHIO_RECEIVE_BUDGET", "1")  # the environment comes back after
    meshio.set_limits(receive_budget=4 * MiB)
    try:
        async with in_process_host().spawn_procs(per_host={"procs": 2}) as procs:
            echo = await procs.spawn("echo", Echo)
            values = [bytes([i]) * (3 * MiB) for i in range(6)]
            got = await asyncio.wait_for(
                asyncio.gather(*(echo.echo.call(v) for v in values)), GUARD)
            assert [g.values() for g in got] == [[v, v] for v in values]
    finally:
        meshio.set_limits(receive_budget=8 << 30)  # the default


async def test_actors_call_each_other_on_their_own_runtimes() -> None:
    """An actor calling another mesh from its endpoint uses its own worker's
    runtime (not the controller's): the call goes out and the answer comes
    back to it."""
    async with in_process_host().spawn_procs(per_host={"procs": 2}) as procs:
        a = await procs.slice(procs=0).spawn("a", Echo, tag="a")
        b = await procs.spawn("b", Echo, tag="b")
        got = await asyncio.wait_for(a.relay.call_one(b, "x"), GUARD)
        assert got == ["a:x", "a:x"]


async def test_stop_runs_each_cleanup_and_fails_calls_in_flight() -> None:
    """Stopping the mesh stops its actors as a worker process would (their
    __cleanup__ runs) and a call still in flight fails instead of hanging."""
    async with in_process_host().spawn_procs(per_host={"procs": 2}) as procs:
        echo = await procs.spawn("echo", Echo, tag="e")
        other = await procs.spawn("other", Echo, tag="o")
        stuck = echo.hang.call()
        # answered after the hang call was delivered (one connection per worker, in order)
        await asyncio.wait_for(other.where.call(), GUARD)
    assert sorted(seen["cleanups"]) == [("e", "NoneType")] * 2 + [("o", "NoneType")] * 2
    with pytest.raises(SupervisionError):
        await asyncio.wait_for(stuck, GUARD)


async def test_closing_the_controller_runtime_ends_its_in_process_workers() -> None:
    """A lost controller (its runtime closed) ends in-process workers as it
    ends worker processes: their actors are stopped with the error saying so."""
    seen["cleaned"] = asyncio.Event()
    procs = await in_process_host().spawn_procs(per_host={"procs": 1})
    await procs.spawn("echo", Echo, tag="lost")
    close_runtime()  # what the end of the controller's loop does
    await asyncio.wait_for(seen["cleaned"].wait(), GUARD)
    assert seen["cleanups"] == [("lost", "SupervisionError")]
