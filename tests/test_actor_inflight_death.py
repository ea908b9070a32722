"""A call in flight from an actor (not the controller) to an actor whose
process is SIGKILLed: the caller's ``SupervisionError`` names the proc mesh
and the rank of the process called, as the controller's does, and gives as
its cause what the caller saw, its lost connection (the exit status is
known only to the process that watches it: the controller, whose own error
and supervisor say "killed by signal SIGKILL").

Before, it named the process only by its socket address
("... connection closed to process 25029 at @meshio-.../wp-c94df212-1 ..."),
with the cause "connection closed", a word the documented causes do not use.

Real processes, a real signal, real sockets.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

import meshio
from gone import killed
from meshio import Actor, endpoint

#: generous bound on any single wait: a regression fails instead of hanging
GUARD = 60.0


class Slow(Actor):
    @endpoint
    def slow(self, started: str) -> None:
        """Say it runs (opening the FIFO ``started`` blocks until the test
        reads it), then never return: the test kills the process."""
        os.close(os.open(started, os.O_WRONLY))
        threading.Event().wait()


class Caller(Actor):
    def __init__(self, slow: Slow) -> None:
        self.slow = slow

    @endpoint
    async def call_slow(self, started: str, adverb: str) -> dict[str, str]:
        """The error of a call to ``slow``, as text (what the test reads)."""
        try:
            if adverb == "call_one":
                await self.slow.slow.call_one(started)
            else:
                await self.slow.slow.call(started)
        except meshio.SupervisionError as e:
            if e.failures:  # (a call to every actor: each one's error)
                [(_, e)] = e.failures
                assert isinstance(e, meshio.SupervisionError)
            return {"msg": str(e), "actor": e.actor, "rank": str(e.rank), "pid": str(e.pid),
                    "cause": e.cause}
        return {}


@pytest.mark.parametrize("adverb", ["call_one", "call"])
async def test_an_actors_call_in_flight_names_the_proc_mesh_of_a_killed_process(
        tmp_path: Path, adverb: str) -> None:
    started = str(tmp_path / "started")
    os.mkfifo(started)
    host = meshio.this_host()
    async with host.spawn_procs(per_host={"gpus": 2}, name="wp") as wp, \
            host.spawn_procs(per_host={"gpus": 1}, name="hp") as hp:
        # on proc rank 1 only: the actor's rank (0) is not its process's
        slow = await wp.slice(gpus=1).spawn("w", Slow)
        caller = await hp.spawn("caller", Caller, slow)
        in_flight = asyncio.ensure_future(caller.call_slow.call_one(started, adverb))
        fd = await asyncio.wait_for(asyncio.to_thread(os.open, started, os.O_RDONLY), GUARD)
        os.close(fd)  # (the call runs in w's process)
        pid = wp.pids[1]
        await killed(pid, GUARD)
        got = await asyncio.wait_for(in_flight, GUARD)
    assert got["msg"].startswith(f"w rank 0 on proc mesh 'wp' rank 1: process {pid} "), got
    assert "while Slow.slow was in flight" in got["msg"], got
    assert "connection closed" in got["msg"] and "exited or was killed" in got["msg"], got
    assert "reports why" in got["msg"], got  # (where the cause is known)
    assert got["cause"] == "connection lost", got
    assert (got["actor"], got["rank"], got["pid"]) == ("w", "0", str(pid)), got
