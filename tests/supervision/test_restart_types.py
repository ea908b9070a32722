"""Restart types of actors: transient actors are restarted only after an
abnormal exit, temporary ones never (nor rebuilt on a restarted process)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from supervision_helpers import DEADLINE, W, supervised

import meshio


async def test_transient_restarts_only_abnormal_exits() -> None:
    async with supervised() as s:
        w = await s.procs.options(restart="transient").spawn("w", W, 1)
        old = s.old
        w.slice(procs=0).exit.broadcast(0)  # normal exit: not restarted
        failure = await s.events.next("failure")
        assert failure.rank == 0 and failure.cause == "exited normally"
        # nothing to wait for: a retryable call fails (it would wait up to a
        # minute, past DEADLINE, for a restart)
        with pytest.raises(meshio.SupervisionError):
            await asyncio.wait_for(w.slice(procs=0).ident.call_one(1), DEADLINE)
        w.slice(procs=1).exit.broadcast(3)  # abnormal exit: restarted
        restart = await s.events.next("restart")
        assert restart.rank == 1 and restart.pid != old[1]
        # rank 0's failure came first: a restart of it would have come first too
        assert s.events.kinds() == [("failure", "procs", 0), ("failure", "procs", 1),
                                    ("restart", "procs", 1)]
        assert s.procs.pids == [old[0], restart.pid]
        assert await w.slice(procs=1).ident.call_one(2) == 2
        with pytest.raises(meshio.SupervisionError):
            await asyncio.wait_for(w.slice(procs=0).pid.call_one(), DEADLINE)


async def test_temporary_is_never_restarted() -> None:
    async with supervised() as s:
        w = await s.procs.options(restart="temporary").spawn("w", W, 1)
        os.kill(s.old[0], signal.SIGKILL)
        failure = await s.events.next("failure")
        assert failure.rank == 0 and "SIGKILL" in failure.cause
        for call in (w.slice(procs=0).pid.call_one, lambda: w.slice(procs=0).ident.call_one(1)):
            with pytest.raises(meshio.SupervisionError) as ei:
                await asyncio.wait_for(call(), DEADLINE)
            assert "SIGKILL" in ei.value.cause
            assert "restarts it" not in str(ei.value)
        assert s.procs.pids == s.old
        assert await w.slice(procs=1).ident.call_one(3) == 3
        assert s.events.kinds() == [("failure", "procs", 0)]


async def test_temporary_actors_on_a_restarted_process_are_not_rebuilt() -> None:
    async with supervised() as s:
        keep = await s.procs.spawn("keep", W, 1)  # permanent: the process is restarted
        temp = await s.procs.options(restart="temporary").spawn("temp", W, 2)
        os.kill(s.old[0], signal.SIGKILL)
        _, restart = await s.restarted(0)
        assert await keep.slice(procs=0).pid.call_one() == restart.pid
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(temp.slice(procs=0).pid.call_one(), DEADLINE)
        assert "temporary" in str(ei.value)
        assert await temp.slice(procs=1).pid.call_one() == s.old[1]
