"""Busy polling (``set_limits(busy_poll=...)``): a process that hears from
another process within ``busy_poll`` seconds of the time before keeps its
loop polling instead of sleeping, until that long after the last data; a
lone message, data in memory (the in-process transport) or ``busy_poll=0``
never start it, and it stops by itself.  That it pays (latency about 3x
lower) is measured in ``benchmarks/bench_small.py``, not here."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest

import meshio
from meshio import Actor, endpoint
from meshio._transport._runtime import Runtime, runtime
from meshio._transport._serial import limits
from meshio.testing import in_process_host

#: turns of the loop polling may take to notice it should stop (one does)
TURNS = 100


class Echo(Actor):
    @endpoint
    async def ping(self, x: int) -> int:
        return x

    @endpoint
    async def polling(self) -> bool:
        """Whether this worker's loop is polling while it serves this call."""
        return runtime().polling

    @endpoint
    async def never_poll(self) -> None:
        meshio.set_limits(busy_poll=0)


async def stopped(rt: Runtime) -> bool:
    """Whether ``rt`` stops polling within a few turns of the loop."""
    for _ in range(TURNS):
        if not rt.polling:
            return True
        await asyncio.sleep(0)
    return not rt.polling


async def test_back_to_back_calls_keep_both_ends_polling_until_they_stop(
        restore_limits: None) -> None:
    meshio.set_limits(busy_poll=60.0)  # every message is "soon after" the last
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = await procs.spawn("echo", Echo)
        rt = runtime()
        assert await echo.ping.call_one(1) == 1
        assert await echo.ping.call_one(2) == 2
        assert rt.polling  # the second reply came within 60 s of the first
        assert await echo.polling.call_one() is True  # and so did the worker's calls
        meshio.set_limits(busy_poll=0)
        assert await stopped(rt)
        await echo.never_poll.call_one()
        assert await echo.polling.call_one() is False
        assert await echo.ping.call_one(3) == 3
        assert not rt.polling


@pytest.fixture
async def rt(restore_limits: None) -> AsyncIterator[Runtime]:
    """A runtime of the test's loop alone (no sockets: ``heard`` is called
    by hand) where every data is "soon after" the last (``busy_poll`` of
    60 s); closed after the test."""
    meshio.set_limits(busy_poll=60.0)
    rt = Runtime(asyncio.get_running_loop(), in_process=True)
    try:
        yield rt
    finally:
        rt.close()


async def test_a_lone_message_does_not_start_polling(rt: Runtime) -> None:
    rt.heard()  # the first data: nothing came before it
    assert not rt.polling
    rt.heard()
    assert rt.polling
    limits.busy_poll = 1e-9
    assert await stopped(rt)
    rt.heard()  # long after the last one now
    assert not rt.polling


async def test_only_idle_turns_yield_the_core(rt: Runtime,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A polling turn that heard nothing new gives the core to whatever else
    is runnable on it; one with new data does not (it is working, not
    waiting)."""
    yields: list[None] = []
    monkeypatch.setattr(os, "sched_yield", lambda: yields.append(None))
    rt.heard()
    rt.heard()
    assert rt.polling
    for _ in range(3):
        await asyncio.sleep(0)
    idle = len(yields)
    assert idle >= 1  # turns with nothing new
    for _ in range(5):
        rt.heard()  # new data before every turn
        await asyncio.sleep(0)
    assert len(yields) == idle


async def test_closing_the_runtime_stops_polling(rt: Runtime) -> None:
    rt.heard()
    rt.heard()
    assert rt.polling
    rt.close()
    assert await stopped(rt)


async def test_in_memory_connections_never_poll(restore_limits: None) -> None:
    """Runtimes on one loop (the in-process transport) wake nobody up: no
    polling for their messages, however close together."""
    meshio.set_limits(busy_poll=60.0)
    async with in_process_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = await procs.spawn("echo", Echo)
        for x in range(5):
            assert await echo.ping.call_one(x) == x
        assert await echo.polling.call_one() is False
        assert not runtime().polling
