"""What a restart keeps: references to the actors (held by the controller
or by other actors) reach the new incarnation, calls in flight are not run
twice unless retryable, and the other ranks serve while one is rebuilt;
``procs.ready()`` waits for it."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from supervision_helpers import DEADLINE, W, supervised

import meshio
from meshio import Actor, endpoint


class Gated(Actor):
    """Its rebuild after a restart blocks until the test writes to ``gate``."""

    def __init__(self, gate: str) -> None:
        self.gate = gate
        self.restarted = False

    def on_restart(self) -> None:
        with open(self.gate, "rb") as f:  # a FIFO: blocks until the test says go
            f.read(1)
        self.restarted = True

    @endpoint
    def state(self) -> tuple[int, bool, int]:
        return (meshio.current_rank().rank, self.restarted, os.getpid())


class Relay(Actor):
    """Holds a reference to another actor mesh and calls it directly."""

    def __init__(self, target: W) -> None:
        self.target = target

    @endpoint
    async def pid_of(self, rank: int) -> int:
        return await self.target.slice(procs=rank).pid.call_one()


async def test_references_held_by_controller_and_other_actors_reach_new_incarnation() -> None:
    async with supervised() as s, \
            meshio.this_host().spawn_procs(per_host={"procs": 1}, name="helper") as helper:
        w = await s.procs.spawn("w", W, 1)
        relay = await helper.spawn("relay", Relay, w)
        one = w.slice(procs=1)  # a slice taken before the restart
        assert await relay.pid_of.call_one(1) == s.old[1]
        os.kill(s.old[1], signal.SIGKILL)
        _, restart = await s.restarted(1)
        assert await relay.pid_of.call_one(1) == restart.pid
        assert await relay.pid_of.call_one(0) == s.old[0]
        assert await one.pid.call_one() == restart.pid
        assert (await w.pid.call()).values() == [s.old[0], restart.pid]


async def test_in_flight_calls_are_not_reexecuted(tmp_path: Path) -> None:
    path = tmp_path / "runs"
    async with supervised() as s:
        w = await s.procs.spawn("w", W, 1)
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(w.slice(procs=1).record_then_exit.call_one(str(path)),
                                   DEADLINE)
        assert ei.value.cause == "exited with code 7" and ei.value.pid == s.old[1]
        assert ei.value.rank == 1  # its rank in the mesh as spawned, through a slice too
        _, restart = await s.restarted(1)
        # a round trip to the new incarnation: anything resent would have run by now
        assert await w.slice(procs=1).pid.call_one() == restart.pid
        assert path.read_text().split() == [str(s.old[1])]


async def test_retryable_call_completes_on_new_incarnation(tmp_path: Path) -> None:
    path = tmp_path / "runs"
    async with supervised() as s:
        w = await s.procs.spawn("w", W, 1)
        answer = await asyncio.wait_for(
            w.slice(procs=1).record_retryable.call_one(str(path)), DEADLINE)
        _, restart = await s.restarted(1)
        assert answer == restart.pid == s.procs.pids[1] != s.old[1]
        # executed twice: by the incarnation that died, then by the new one
        assert path.read_text().split() == [str(s.old[1]), str(restart.pid)]


async def test_slices_without_the_failed_rank_work_while_it_restarts(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    gate_fd = os.open(gate, os.O_RDWR)  # never blocks; holds the FIFO open
    try:
        async with supervised(3) as s:
            g = await s.procs.spawn("g", Gated, str(gate))
            old = s.old
            os.kill(old[1], signal.SIGKILL)
            await s.events.next("failure", rank=1)
            # rank 1's rebuild is blocked on the gate: the others keep serving
            for _ in range(3):
                assert await g.slice(procs=0).state.call_one() == (0, False, old[0])
                assert await g.slice(procs=2).state.call_one() == (2, False, old[2])
                assert (await g.slice(procs=slice(0, 3, 2)).state.call()).values() == [
                    (0, False, old[0]), (2, False, old[2])]
                with pytest.raises(meshio.SupervisionError) as ei:
                    await asyncio.wait_for(g.slice(procs=1).state.call_one(), DEADLINE)
                assert "SIGKILL" in ei.value.cause and ei.value.rank == 1
            with pytest.raises(meshio.SupervisionError):
                await asyncio.wait_for(g.state.call(), DEADLINE)
            assert not [e for e in s.events.seen if e.kind == "restart"]
            os.write(gate_fd, b"x")  # let the rebuild finish
            restart = await s.events.next("restart", rank=1)
            assert (await g.state.call()).values() == [
                (0, False, old[0]), (1, True, restart.pid), (2, False, old[2])]
    finally:
        os.close(gate_fd)


async def test_ready_waits_for_the_restart_and_raises_when_none_comes() -> None:
    """``procs.ready()`` returns once a failed process is back with its
    actors (for a slice: its own processes), and raises when nothing will
    bring a process back (here: its restart type)."""
    async with supervised() as s:
        w = await s.procs.options(restart="transient").spawn("w", W, 1)
        await asyncio.wait_for(s.procs.ready(), DEADLINE)  # up: at once
        os.kill(s.old[1], signal.SIGKILL)
        await s.events.next("failure", rank=1)
        await asyncio.wait_for(s.procs.slice(procs=0).ready(), DEADLINE)  # not its rank
        await asyncio.wait_for(s.procs.ready(), DEADLINE)
        restart = await s.events.next("restart", rank=1)
        assert s.procs.pids == [s.old[0], restart.pid]
        assert await w.slice(procs=1).pid.call_one() == restart.pid
        w.slice(procs=0).exit.broadcast(0)  # a normal exit: transient, not restarted
        await s.events.next("failure", rank=0)
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(s.procs.ready(), DEADLINE)
        assert ei.value.rank == 0 and ei.value.cause == "exited normally"
        await asyncio.wait_for(s.procs.slice(procs=1).ready(), DEADLINE)


async def test_a_stopped_actor_mesh_is_not_rebuilt_by_a_restart() -> None:
    """ActorMesh.stop() of the whole mesh: a restart of its processes does
    not bring it back, and its name is free again on the proc mesh."""
    async with supervised() as s:
        gone = await s.procs.spawn("gone", W, 1)
        kept = await s.procs.spawn("kept", W, 2)
        await asyncio.wait_for(gone.stop(), DEADLINE)
        os.kill(s.old[1], signal.SIGKILL)
        _, restart = await s.restarted(1)
        assert (await kept.pid.call()).values() == [s.old[0], restart.pid]
        with pytest.raises(meshio.SupervisionError, match="actor mesh 'gone' was stopped"):
            await asyncio.wait_for(gone.slice(procs=1).pid.call_one(), DEADLINE)
        again = await s.procs.spawn("gone", W, 3)  # the name is free
        assert [k for k, *_ in (await again.info.call()).values()] == [3, 3]
