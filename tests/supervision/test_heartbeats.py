"""Hung processes (SIGSTOP): missed heartbeats get them killed and
restarted, on the manual clock tick by tick and on the real clock."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from supervision_helpers import DEADLINE, W, supervised, until, wait_pidfds

import meshio


async def test_hung_process_missing_heartbeats_is_killed_and_restarted() -> None:
    async with supervised(heartbeat_interval=1.0) as s:  # timeout: 3 intervals
        assert s.sup.heartbeat_timeout == 3.0
        w = await s.procs.spawn("w", W, 1)
        clock = s.clock
        await until(lambda: clock.sleepers == 1)  # the heartbeat loop waits on the clock
        os.kill(s.old[1], signal.SIGSTOP)
        in_flight = w.hang_on.call(-1)  # rank 1 cannot answer: it is stopped
        ticks = 0
        while not in_flight.done():
            assert ticks < 200, "the hung process was never declared hung"
            clock.advance(1.0)
            ticks += 1
            await until(lambda: clock.sleepers == 1 or in_flight.done())
            # rank 0's pong for this tick arrives before this reply (same connection)
            assert await asyncio.wait_for(w.slice(procs=0).pid.call_one(), DEADLINE) == s.old[0]
        with pytest.raises(meshio.SupervisionError) as ei:
            await in_flight
        assert ei.value.rank == 1 and ei.value.pid == s.old[1]
        # killed at the first tick where it had been silent for more than 3 s
        assert "hung: no heartbeat answer for 4.0s" in ei.value.cause
        failure, _ = await s.restarted(1)
        assert "hung" in failure.cause and "heartbeat_timeout=3.0s" in failure.cause
        assert (await w.echo.call(2)).values() == [(0, 2), (1, 2)]


async def test_hung_process_detected_with_real_clock() -> None:
    async with supervised(real_clock=True, heartbeat_interval=0.2,
                          heartbeat_timeout=2.0) as s:
        w = await s.procs.spawn("w", W, 1)
        fd = os.pidfd_open(s.old[1])
        os.kill(s.old[1], signal.SIGSTOP)
        # another rank may look hung too on a loaded machine: look at rank 1 only
        failure, _ = await s.restarted(1, alone=False)
        assert "hung" in failure.cause
        await wait_pidfds([fd])  # the stopped process was killed
        assert (await w.slice(procs=1).echo.call_one(9)) == (1, 9)
