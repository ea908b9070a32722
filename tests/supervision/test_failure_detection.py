"""A supervisor detects every way a process fails — killed, exiting,
crashing, raising in a broadcast, cut off — and replaces exactly that
process; without a supervisor nothing restarts."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from supervision_helpers import DEADLINE, HOST, W, supervised, wait_pidfds

import meshio
from meshio.testing import cut_connection


async def test_sigkill_restarts_process_and_rebuilds_actors() -> None:
    async with supervised(3) as s:
        w = await s.procs.spawn("w", W, 7, tag="seven")
        before = (await w.info.call()).values()
        assert [(k, t, r, c, n) for k, t, r, c, n, _ in before] == [
            (7, "seven", r, r, 0) for r in range(3)]
        assert [pid for *_, pid in before] == s.old
        os.kill(s.old[1], signal.SIGKILL)
        failure, restart = await s.restarted(1)
        assert "SIGKILL" in failure.cause
        after = (await w.info.call()).values()
        # same coordinates, original constructor arguments, on_restart ran once on rank 1
        assert [(k, t, r, c, n) for k, t, r, c, n, _ in after] == [
            (7, "seven", 0, 0, 0), (7, "seven", 1, 1, 1), (7, "seven", 2, 2, 0)]
        assert [pid for *_, pid in after] == [s.old[0], restart.pid, s.old[2]] == s.procs.pids
        assert s.sup.failure is None


async def test_os_exit_fails_in_flight_call_with_exit_code() -> None:
    async with supervised() as s:
        w = await s.procs.spawn("w", W, 1)
        hanging = w.hang_on.call(1)  # rank 0 answers, rank 1 is in flight when it dies
        w.slice(procs=1).exit.broadcast(3)
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(hanging, DEADLINE)
        err = ei.value
        assert (err.actor, err.rank, err.host, err.pid) == ("w", 1, HOST, s.old[1])
        assert err.cause == "exited with code 3"
        assert "'procs'" in str(err) and "rank 1" in str(err) and "hang_on" in str(err)
        failure, _ = await s.restarted(1)
        assert failure.cause == "exited with code 3"
        assert (await w.echo.call(5)).values() == [(0, 5), (1, 5)]


async def test_segfault_is_detected_and_restarted() -> None:
    async with supervised() as s:
        w = await s.procs.spawn("w", W, 1)
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(w.slice(procs=0).segfault.call_one(), DEADLINE)
        assert "SIGSEGV" in ei.value.cause and ei.value.pid == s.old[0]
        failure, _ = await s.restarted(0)
        assert "SIGSEGV" in failure.cause
        assert (await w.info.call()).values()[0][:5] == (1, "", 0, 0, 1)


async def test_exception_escaping_broadcast_restarts_that_process() -> None:
    async with supervised() as s:
        w = await s.procs.spawn("w", W, 1)
        w.boom_on.broadcast(1)  # nobody to tell: a supervision event
        failure, _ = await s.restarted(1)
        assert "ValueError: boom in rank 1" in failure.cause
        assert [i[4] for i in (await w.info.call()).values()] == [0, 1]


async def test_lost_connection_is_a_failure() -> None:
    async with supervised() as s:
        w = await s.procs.spawn("w", W, 1)
        in_flight = w.hang_on.call(1)
        cut_connection(s.procs, 1)
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(in_flight, DEADLINE)
        assert ei.value.rank == 1 and ei.value.pid == s.old[1]
        failure, _ = await s.restarted(1)
        # the worker exits when it loses the controller; if slow, it is killed
        assert failure.cause in ("exited with code 1",
                                 "connection lost (process still running; killed)")
        assert (await w.echo.call(3)).values() == [(0, 3), (1, 3)]


async def test_lost_connection_to_hung_process_kills_it_retryable_call_waits() -> None:
    async with supervised() as s:
        w = await s.procs.spawn("w", W, 1)
        os.kill(s.old[1], signal.SIGSTOP)  # cannot notice the cut, cannot exit by itself
        cut_connection(s.procs, 1)
        # a round trip elsewhere: the controller has seen the loss by now
        assert await w.slice(procs=0).pid.call_one() == s.old[0]
        # issued while the controller still waits for an exit status: it must
        # wait for the restart (not spin, not fail) and run on the new process
        answer = w.slice(procs=1).ident.call_one(5)
        plain = w.slice(procs=1).pid.call_one()
        with pytest.raises(meshio.SupervisionError):
            await asyncio.wait_for(plain, DEADLINE)
        assert await asyncio.wait_for(answer, DEADLINE) == 5
        failure, _ = await s.restarted(1)
        assert failure.cause == "connection lost (process still running; killed)"
        assert s.events.kinds() == [("failure", "procs", 1), ("restart", "procs", 1)]


async def test_without_supervisor_nothing_restarts() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        w = await procs.spawn("w", W, 1)
        old = procs.pids
        in_flight = w.hang_on.call(1)
        fd = os.pidfd_open(old[1])
        os.kill(old[1], signal.SIGKILL)
        await wait_pidfds([fd])
        values = await asyncio.wait_for(in_flight, DEADLINE)  # rank 1 is a hole
        assert [p.rank for p in values.holes] == [1] and values.values() == [old[0]]
        with pytest.raises(meshio.SupervisionError) as ei:
            values.item(procs=1)
        assert "SIGKILL" in ei.value.cause
        # nothing waits for a restart that will not come, retryable or not (a
        # retryable call would wait up to a minute, past DEADLINE)
        with pytest.raises(meshio.SupervisionError):
            await asyncio.wait_for(w.slice(procs=1).ident.call_one(1), DEADLINE)
        assert procs.pids == old
        assert await w.slice(procs=0).ident.call_one(4) == 4
