"""A process that stops answering heartbeats (SIGSTOP), with no supervisor:
the calls its callers were told failed are cancelled on its actors once it
runs again, so they do not keep the actors busy; and the errors that name a
process stopped by its supervisor, or one that is dead or hung in
``meshio.stats()``, say so plainly."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path

import pytest
from supervision_helpers import next_pong

import meshio
from busy_actor import Busy
from meshio import Actor, endpoint

GUARD = 10.0
#: short heartbeats: a stopped process is found not responding within a second
BEATS = {"heartbeat_interval": 0.1, "heartbeat_timeout": 1.0}
#: calls queued behind the running one: their Cancels take more than one read
QUEUED = 5000


@pytest.mark.parametrize("adverb", ["call_one", "call"])
async def test_calls_failed_as_not_responding_are_cancelled_once_it_runs_again(
        adverb: str) -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, **BEATS) as procs:
        busy = await procs.spawn("busy", Busy)
        pid = procs.pids[0]
        addr = await busy.addr.call_one()
        running = asyncio.ensure_future(getattr(busy.wait_long, adverb)())
        await asyncio.wait_for(busy.started.call_one(), GUARD)
        queued = [asyncio.ensure_future(getattr(busy.record, adverb)("queued"))
                  for _ in range(QUEUED)]
        os.kill(pid, signal.SIGSTOP)
        try:
            failed = await asyncio.wait_for(
                asyncio.gather(running, *queued, return_exceptions=True), GUARD)
            assert all(isinstance(e, meshio.SupervisionError) and "not responding for" in str(e)
                       for e in failed)
            answered = next_pong(addr)
        finally:
            os.kill(pid, signal.SIGCONT)
        await asyncio.wait_for(answered, GUARD)
        # the call running on the actor was cancelled there, the queued ones
        # dropped (none ran) ...
        await asyncio.wait_for(busy.was_cancelled.call_one(), GUARD)
        assert await asyncio.wait_for(busy.seen.call_one(), GUARD) == ["wait_long cancelled"]
        # ... and the actor serves new calls at once
        await asyncio.wait_for(busy.record.call_one("next"), GUARD)
        assert await asyncio.wait_for(busy.seen.call_one(), GUARD) == [
            "wait_long cancelled", "next"]


class Caller(Actor):
    @endpoint
    async def call_busy(self, busy: Busy) -> str:
        """Call ``busy`` (in another process): the error it ends with."""
        try:
            await busy.wait_long.call_one()
        except meshio.MeshioError as e:
            return str(e)
        return "answered"


async def test_an_actors_call_failed_as_not_responding_is_cancelled_there_too() -> None:
    # The call is an actor's, to an actor of another process of its proc
    # mesh: the controller's heartbeats tell the caller's process (PeerDown).
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, **BEATS) as procs:
        busy = await procs.slice(procs=1).spawn("busy", Busy)
        caller = await procs.slice(procs=0).spawn("caller", Caller)
        addr = await busy.addr.call_one()
        failed = asyncio.ensure_future(caller.call_busy.call_one(busy))
        await asyncio.wait_for(busy.started.call_one(), GUARD)
        os.kill(procs.pids[1], signal.SIGSTOP)
        try:
            assert "not responding for" in await asyncio.wait_for(failed, GUARD)
            answered = next_pong(addr)
        finally:
            os.kill(procs.pids[1], signal.SIGCONT)
        await asyncio.wait_for(answered, GUARD)
        await asyncio.wait_for(busy.was_cancelled.call_one(), GUARD)
        assert await asyncio.wait_for(busy.seen.call_one(), GUARD) == ["wait_long cancelled"]


class Refuses(Actor):
    """Its constructor fails once ``flag`` exists (on every restart)."""

    def __init__(self, flag: str) -> None:
        if os.path.exists(flag):
            raise RuntimeError("refuses on restart")

    @endpoint(retryable=True)
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def plain(self) -> int:
        return os.getpid()


async def test_given_up_processes_say_they_were_stopped_after_the_supervisor_gave_up(
        tmp_path: Path) -> None:
    sup = meshio.Supervisor("one_for_one", max_restarts=1, within=60.0)
    errors: list[meshio.SupervisionError] = []
    with pytest.raises(meshio.SupervisionError, match="gave up"):  # (escalated on exit)
        async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup,
                                                  name="given") as procs:
            await give_up(procs, tmp_path / "flag", errors)
    *given_up, plain = errors
    assert len(given_up) == 2  # a retryable call in flight, and ready()
    for e in given_up:
        said = str(e)
        assert re.match(r"proc mesh 'given' rank [01]: process \d+ on \S+ was stopped after "
                        r"its supervisor gave up \(", said), said
        assert said.endswith("; spawn a new one")
        assert "proc mesh stopped" not in said and e.cause == "supervisor gave up"
    # (made as the mesh is stopped: in flight as its process went, or not sent)
    assert re.match(r"r rank 0(: proc mesh 'given'| on proc mesh 'given' rank 0: process \d+ "
                    r"on \S+) was stopped after its supervisor gave up \(", str(plain)), plain


async def give_up(procs: meshio.ProcMesh, flag: Path,
                  errors: list[meshio.SupervisionError]) -> None:
    """Make the supervisor of ``procs`` give up (rank 1 cannot restart), and
    collect the errors of a retryable call made meanwhile, of ``ready()``,
    and of a plain call to rank 0 after that."""
    actors = await procs.spawn("r", Refuses, str(flag))
    flag.touch()
    os.kill(procs.pids[1], signal.SIGKILL)
    for wait in (actors.slice(procs=1).pid.call_one, procs.ready,
                 actors.slice(procs=0).plain.call_one):
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(wait(), GUARD)
        errors.append(ei.value)


class Idle(Actor):
    @endpoint
    async def ping(self) -> None:
        pass


async def test_stats_names_a_dead_and_a_hung_process_once_with_its_pid() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, name="txt") as procs:
        await procs.spawn("idle", Idle)
        hung, dead = procs.pids
        os.kill(dead, signal.SIGKILL)
        await asyncio.wait_for(procs.wait_failed(), GUARD)
        os.kill(hung, signal.SIGSTOP)
        try:
            snapshot = await meshio.stats(timeout=0.5)
        finally:
            os.kill(hung, signal.SIGCONT)
        errors = [p.error for p in snapshot.proc_meshes[0].processes]
        assert errors == [
            f"proc mesh 'txt' rank 0 (pid {hung}) did not answer within 0.5 s: its process is "
            "stopped or hung, or an async endpoint blocks its event loop",
            f"proc mesh 'txt' rank 1 (pid {dead}): killed by signal SIGKILL"]
