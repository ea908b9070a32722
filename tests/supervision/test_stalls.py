"""Stall reports (issue 18 item 7): a call (a mailbox call, or one of a
``concurrent`` endpoint) that runs longer than its actor's ``stall_after``
(``procs.options(stall_after=...)``) gives one warning line on the
controller and, under a supervisor, one ``"stall"`` event naming actor,
rank, endpoint and duration, with the call's stack; the call itself goes
on.  Real worker processes."""

from __future__ import annotations

import asyncio
import threading

import pytest
from supervision_helpers import DEADLINE, supervised

import meshio
from log_watch import LogWatch
from meshio import Actor, endpoint


class Stuck(Actor):
    def __init__(self) -> None:
        self.gate = threading.Event()
        self.loop_gate = asyncio.Event()
        self.aside_gate = asyncio.Event()

    @endpoint
    def block(self) -> str:
        self.gate.clear()
        self.gate.wait(DEADLINE)  # STUCK-IN-THREAD
        return "released"

    @endpoint
    async def wait(self) -> str:
        self.loop_gate.clear()
        await self.loop_gate.wait()  # STUCK-ON-LOOP
        return "released"

    @endpoint(concurrent=True)
    async def release(self) -> None:
        self.gate.set()
        self.loop_gate.set()

    @endpoint
    async def quick(self) -> int:
        return 1

    @endpoint(concurrent=True)
    async def aside(self, i: int) -> int:
        return await self.held_aside(i)

    @endpoint(concurrent=2)
    async def bounded(self, i: int) -> int:
        return await self.held_aside(i)

    async def held_aside(self, i: int) -> int:
        await self.aside_gate.wait()  # STUCK-ASIDE
        return i

    @endpoint(concurrent=True)
    async def release_aside(self) -> None:
        self.aside_gate.set()


def line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if marker in text and "line_of" not in text)


async def test_a_stalled_call_is_one_event_with_its_stack_and_it_goes_on() -> None:
    async with supervised() as s:
        stuck = await s.procs.options(stall_after=0.3).spawn("stuck", Stuck)
        one = stuck.slice(procs=1)
        call = asyncio.ensure_future(one.block.call_one())
        ev = await s.events.next("stall", rank=1)
        assert ev.pid == s.old[1] and ev.mesh == "procs"
        assert "stuck rank 1: Stuck.block has been running for" in ev.cause
        assert "stall_after=0.3 s" in ev.cause
        assert f"test_stalls.py:{line_of('STUCK-IN-THREAD')}" in ev.cause
        # the call goes on (nothing killed or restarted) until released
        await asyncio.wait_for(one.release.call_one(), DEADLINE)
        assert await asyncio.wait_for(call, DEADLINE) == "released"
        # a second stalled call is reported too, and it is the next stall
        # event: the first call was reported once
        second = asyncio.ensure_future(one.wait.call_one())
        ev2 = await s.events.next("stall", rank=1)
        assert "Stuck.wait has been running for" in ev2.cause
        assert f"test_stalls.py:{line_of('STUCK-ON-LOOP')}" in ev2.cause
        await asyncio.wait_for(one.release.call_one(), DEADLINE)
        assert await asyncio.wait_for(second, DEADLINE) == "released"
        assert [k for k, _, _ in s.events.kinds()].count("stall") == 2
        assert "failure" not in [k for k, _, _ in s.events.kinds()]


async def test_each_stalled_concurrent_call_is_one_event() -> None:
    """Calls of concurrent endpoints (each in its own task, the mailbox
    idle) are reported too, each once."""
    async with supervised() as s:
        stuck = await s.procs.options(stall_after=0.3).spawn("stuck", Stuck)
        one = stuck.slice(procs=1)
        calls = [one.aside.call_one(1), one.aside.call_one(2), one.bounded.call_one(3)]
        causes = [(await s.events.next("stall", rank=1)).cause for _ in calls]
        assert sum("stuck rank 1: Stuck.aside has been running for" in c for c in causes) == 2
        assert sum("stuck rank 1: Stuck.bounded has been running for" in c
                   for c in causes) == 1
        assert all(f"test_stalls.py:{line_of('STUCK-ASIDE')}" in c for c in causes), causes
        assert await asyncio.wait_for(one.quick.call_one(), DEADLINE) == 1
        await asyncio.wait_for(one.release_aside.call_one(), DEADLINE)
        assert await asyncio.wait_for(asyncio.gather(*calls), DEADLINE) == [1, 2, 3]
        assert [k for k, _, _ in s.events.kinds()].count("stall") == 3


async def test_without_a_supervisor_the_controller_logs_one_warning(
        controller_log: LogWatch) -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        stuck = await procs.options(stall_after=0.2).spawn("stuck", Stuck)
        call = asyncio.ensure_future(stuck.wait.call_one())
        warning = await controller_log.wait_for("has been running for")
        await asyncio.wait_for(stuck.release.call_one(), DEADLINE)
        assert await asyncio.wait_for(call, DEADLINE) == "released"
        assert [m for m in controller_log.messages if "has been running" in m] == [warning]
        assert "stuck rank 0: Stuck.wait" in warning
        assert f"test_stalls.py:{line_of('STUCK-ON-LOOP')}" in warning


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "1"])
async def test_bad_stall_after_is_refused(bad: object) -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        with pytest.raises(TypeError if isinstance(bad, str) else ValueError,
                           match=r"options\(stall_after=\.\.\.\)"):
            procs.options(stall_after=bad)  # type: ignore[arg-type]
