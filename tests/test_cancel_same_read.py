"""A call and its Cancel that reach an idle actor in one read: the call never
runs.  A call that finds its actor idle is served in the loop callback that
read it (``tests/test_mailbox_inline.py``), but only once the whole read is
parsed, so a Cancel behind it in the same read drops it first, as it drops
a call queued behind a busy actor (``tests/test_unresponsive_cancel.py``).
The case that brings them together: a process stopped (SIGSTOP) while its
caller's calls fail as "not responding" and are cancelled there; everything
waits in the socket, and the process reads it all at once when it runs
again."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest
from supervision_helpers import next_pong

import meshio
from meshio import Actor, endpoint

GUARD = 10.0
#: short heartbeats: a stopped process is found not responding within a second
BEATS = {"heartbeat_interval": 0.1, "heartbeat_timeout": 1.0}
CALLS = 5


class Counter(Actor):
    """Counts the calls that ran, whichever kind of endpoint served them."""

    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    @endpoint
    async def addr(self) -> str:
        return meshio.context().proc.addr

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def incr_async(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    def incr_def(self) -> int:
        with self.lock:
            self.n += 1
            return self.n

    @endpoint(concurrent=True)
    async def incr_concurrent(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    async def count(self) -> int:
        return self.n


@pytest.mark.parametrize("method", ["incr_async", "incr_def", "incr_concurrent"])
async def test_calls_failed_as_not_responding_to_an_idle_actor_never_run(method: str) -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, **BEATS) as procs:
        counter = await procs.spawn("counter", Counter)
        addr = await asyncio.wait_for(counter.addr.call_one(), GUARD)
        pid = procs.pids[0]
        os.kill(pid, signal.SIGSTOP)
        try:
            calls = [getattr(counter, method).call_one() for _ in range(CALLS)]
            failed = await asyncio.wait_for(
                asyncio.gather(*calls, return_exceptions=True), GUARD)
            assert all(isinstance(e, meshio.SupervisionError) and "not responding for" in str(e)
                       for e in failed), failed
            answered = next_pong(addr)
        finally:
            os.kill(pid, signal.SIGCONT)
        await asyncio.wait_for(answered, GUARD)
        # (after the calls and their Cancels on the same connection)
        assert await asyncio.wait_for(counter.count.call_one(), GUARD) == 0
        # the actor serves new calls at once
        assert await asyncio.wait_for(getattr(counter, method).call_one(), GUARD) == 1


async def test_a_call_cancelled_by_its_caller_in_the_same_read_never_runs() -> None:
    # Two processes: the call is made to a stopped one and written out (a
    # round trip to the other ends the turn that wrote it), then cancelled
    # by its caller; the stopped process reads the call, its Cancel and a
    # call after them at once.
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        counters = await procs.spawn("counter", Counter)
        stopped, running = counters.slice(procs=0), counters.slice(procs=1)
        os.kill(procs.pids[0], signal.SIGSTOP)
        try:
            # (until it is stopped: a busy-polling loop could read the call first;
            # WNOWAIT leaves the stop to whoever else waits for it)
            await asyncio.wait_for(asyncio.to_thread(
                os.waitid, os.P_PID, procs.pids[0], os.WSTOPPED | os.WNOWAIT), GUARD)
            call = stopped.incr_async.call_one()
            assert await asyncio.wait_for(running.pid.call_one(), GUARD) == procs.pids[1]
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            # (sent behind the Cancel, on the same connection)
            counted = stopped.count.call_one()
            # (written by the end of the turn: before the process runs again)
            assert await asyncio.wait_for(running.pid.call_one(), GUARD) == procs.pids[1]
        finally:
            os.kill(procs.pids[0], signal.SIGCONT)
        assert await asyncio.wait_for(counted, GUARD) == 0
        assert await asyncio.wait_for(stopped.incr_async.call_one(), GUARD) == 1
