"""What stopping an actor mesh leaves, and what a reference to it does after.

- ``procs.spawn`` and ``actors.stop()`` on a proc mesh with a process that
  answers no heartbeat (SIGSTOP) do not hang: the spawn fails naming the rank
  and why, the stop returns and says which actor it did not wait for.
- A stopped mesh leaves no flow-control window in its callers: the
  controller, its peers, and actors that call it (once they learn of it).
- Stopping every actor of a mesh, slice by slice (a service's stop), frees
  its name and its record as stopping the whole mesh does; a stopped slice
  is not rebuilt by a restart.
- A reference to a stopped mesh stays stopped (SupervisionError), even once
  a new mesh has its name; a rank refilled by ``replace`` is reached through
  the old reference (the same mesh).
- ``choose`` leaves out an actor stopped alone, and one whose process
  answers no heartbeat.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from supervision_helpers import W, next_pong, supervised

import meshio
import meshio._transport._runtime
from log_watch import LogWatch
from meshio import Actor, endpoint
from meshio._transport._credit import Window

#: generous bound on one step on a loaded machine; a hang runs past it
DEADLINE = 30.0


class A(Actor):
    def __init__(self, generation: int = 0) -> None:
        self.generation = generation

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def which(self) -> int:
        return self.generation

    @endpoint
    async def addr(self) -> str:
        return meshio.context().proc.addr


class BlocksCleanup(Actor):
    """Its ``__cleanup__`` blocks its process's loop (no heartbeat answer)
    until the file ``release`` exists."""

    def __init__(self, release: str) -> None:
        self.release = release

    async def __cleanup__(self, exc: BaseException | None) -> None:
        while not os.path.exists(self.release):
            time.sleep(0.05)  # (blocking the loop is the point)

    @endpoint
    async def addr(self) -> str:
        return meshio.context().proc.addr


class Peer(Actor):
    """An actor of a mesh whose actors call each other; and a caller of
    other meshes.  Reports what this process holds of flow control."""

    @endpoint
    async def ping(self) -> int:
        return meshio.context().point.rank

    @endpoint
    async def call_peers(self) -> list[int]:
        """Call the other actors of this one's mesh (each in its process)."""
        ctx = meshio.context()
        mesh: Any = ctx.mesh
        return [await mesh.slice(procs=i).ping.call_one()
                for i in range(len(mesh)) if i != ctx.point.rank]

    @endpoint
    async def call_other(self, other: Peer) -> list[int]:
        return list((await other.ping.call()).values())

    @endpoint
    async def call_stopped(self, other: Peer) -> str:
        """A call to a stopped mesh: its error."""
        try:
            await other.ping.call()
        except meshio.MeshioError as e:
            return str(e)
        return "answered"

    @endpoint
    async def flow_control(self) -> tuple[int, int]:
        """(Window objects alive here, callers' counts not given back)."""
        gc.collect()
        rt = meshio._transport._runtime.runtime()
        return (sum(type(o) is Window for o in gc.get_objects()),
                sum(len(c.taken) for c in rt.all_conns))


class Says(Actor):
    @endpoint
    async def say(self, text: str) -> None:
        logging.getLogger("meshio").warning(text)


def windows() -> int:
    gc.collect()
    return sum(type(o) is Window for o in gc.get_objects())


async def until_not_responding(mesh: A) -> None:
    """Wait until heartbeats find the process of ``mesh`` (one actor)
    silent: a call to it waits for that, then fails."""
    with pytest.raises(meshio.SupervisionError, match="not responding"):
        await asyncio.wait_for(mesh.pid.call_one(), DEADLINE)


# ------------------------------------------------ not responding: no hang


async def test_spawn_and_stop_on_a_process_that_answers_no_heartbeat_do_not_hang(
        procs: meshio.ProcMesh, controller_log: LogWatch) -> None:
    """Once heartbeats find rank 0 silent (SIGSTOP), a spawn fails at once
    naming it and why, and a stop returns saying it did not wait for it
    (both waited for as long as it was stopped); once it answers again, its
    actor is stopped, and both names are free."""
    a = await procs.spawn("a", A)
    hung = a.slice(procs=0)
    addr = await asyncio.wait_for(hung.addr.call_one(), DEADLINE)
    pid = procs.pids[0]
    os.kill(pid, signal.SIGSTOP)
    try:
        await until_not_responding(hung)
        with pytest.raises(meshio.SupervisionError, match="not responding") as ei:
            await asyncio.wait_for(procs.spawn("b", A), DEADLINE)
        assert "rank 0" in str(ei.value) and "A.__init__ was not sent" in str(ei.value)
        await asyncio.wait_for(a.stop(), DEADLINE)
        said = await controller_log.wait_for("stop() did not wait for rank 0")
        assert "actor mesh 'a'" in said and f"process {pid}" in said and "not responding" in said
        answered = next_pong(addr)
    finally:
        os.kill(pid, signal.SIGCONT)
    await asyncio.wait_for(answered, DEADLINE)
    # once it answers, the stop it was sent has stopped its actor
    with pytest.raises(meshio.SupervisionError, match="actor mesh 'a' was stopped"):
        await asyncio.wait_for(hung.pid.call_one(), DEADLINE)
    again = await asyncio.wait_for(procs.spawn("b", A), DEADLINE)  # the failed spawn's name
    assert (await asyncio.wait_for(again.pid.call(), DEADLINE)).values() == procs.pids
    await asyncio.wait_for(procs.spawn("a", A), DEADLINE)  # the stopped mesh's name


async def test_a_stop_waiting_for_a_process_that_stops_answering_returns_when_found(
        procs: meshio.ProcMesh, controller_log: LogWatch, tmp_path: Path) -> None:
    """A stop under way when its process stops answering (the actor's
    cleanup blocks the loop) returns once heartbeats find it silent, and
    says so."""
    release = tmp_path / "release"
    b = await procs.slice(procs=1).spawn("b", BlocksCleanup, str(release))
    addr = await asyncio.wait_for(b.addr.call_one(), DEADLINE)
    try:
        await asyncio.wait_for(b.stop(), DEADLINE)  # its cleanup blocks the loop
        said = await controller_log.wait_for("stop() did not wait for rank 0")
        assert "actor mesh 'b'" in said and f"process {procs.pids[1]}" in said
        answered = next_pong(addr)
    finally:
        release.touch()
    await asyncio.wait_for(answered, DEADLINE)
    await asyncio.wait_for(procs.spawn("b", A), DEADLINE)


# ------------------------------------------------------ no window left


async def test_stopped_meshes_leave_no_window_in_the_controller(
        procs: meshio.ProcMesh) -> None:
    """Spawn, call, stop under new names and under one name: no Window
    stays (each is per connection and actor mesh); nor after calls through a
    stale reference."""
    async def cycle(name: str) -> A:
        m = await procs.spawn(name, A)
        await asyncio.wait_for(m.pid.call(), DEADLINE)
        await asyncio.wait_for(m.stop(), DEADLINE)
        return m

    await cycle("warm")
    before = windows()
    for i in range(30):
        stale = await cycle(f"m{i}")
        await cycle("same")
    with pytest.raises(meshio.MeshioError, match="stopped"):  # (which: a test below)
        await asyncio.wait_for(stale.pid.call(), DEADLINE)
    await asyncio.wait_for(procs.spawn("last", A), DEADLINE)  # a round trip after the refusal
    del stale
    assert windows() == before


@pytest.mark.meshio_procs(per_host={"procs": 3})
async def test_stopped_meshes_leave_no_window_in_the_workers(procs: meshio.ProcMesh) -> None:
    """Actor-to-actor: the peers of a mesh (ranks 1 and 2) that call each
    other, and an actor in another process (rank 0) calling it; stopped,
    the peers forget at once, the other caller once a call of its finds it
    stopped.  The callees keep no count of their callers' calls either."""
    caller = await procs.slice(procs=0).spawn("caller", Peer)
    census = await procs.spawn("census", Peer)

    async def cycle(name: str) -> None:
        m = await procs.slice(procs=slice(1, 3)).spawn(name, Peer)
        for rank in (0, 1):  # (one at a time: each waits for the other's answer)
            assert await asyncio.wait_for(m.slice(procs=rank).call_peers.call_one(),
                                          DEADLINE) == [1 - rank]
        assert await asyncio.wait_for(caller.call_other.call_one(m), DEADLINE) == [0, 1]
        await asyncio.wait_for(m.stop(), DEADLINE)
        said = await asyncio.wait_for(caller.call_stopped.call_one(m), DEADLINE)
        assert "stopped" in said  # (what, test_a_reference_to_a_stopped_mesh_stays_stopped...)

    await cycle("warm")
    before = (await asyncio.wait_for(census.flow_control.call(), DEADLINE)).values()
    for i in range(20):
        await cycle(f"m{i}")
    after = (await asyncio.wait_for(census.flow_control.call(), DEADLINE)).values()
    assert after == before


# ------------------------------------------- stopped slice by slice


async def test_stopping_every_actor_slice_by_slice_frees_the_name(
        procs: meshio.ProcMesh) -> None:
    gen = await procs.spawn("gen", A, 1)
    await asyncio.wait_for(gen.slice(procs=1).stop(), DEADLINE)
    with pytest.raises(ValueError, match="already has actors named 'gen'"):
        await procs.spawn("gen", A, 2)  # one actor of it serves on
    assert await asyncio.wait_for(gen.slice(procs=0).which.call_one(), DEADLINE) == 1
    await asyncio.wait_for(gen.slice(procs=0).stop(), DEADLINE)
    with pytest.raises(meshio.UnknownActorError):  # its record (constructor arguments) went
        procs.actors("gen", A)
    again = await asyncio.wait_for(procs.spawn("gen", A, 2), DEADLINE)
    assert (await asyncio.wait_for(again.which.call(), DEADLINE)).values() == [2, 2]


async def test_choose_leaves_out_an_actor_stopped_alone(procs: meshio.ProcMesh) -> None:
    """After ``actors.stop()`` on a slice, choose goes to the mesh's other
    actors (every other one failed: "actor mesh 'a' was stopped ... call it
    through the reference that spawn returned", the caller using it); a call
    to the stopped actor says a stop of the mesh or of a slice holding it,
    naming it by its rank in the mesh."""
    a = await procs.spawn("a", A, 1)
    await asyncio.wait_for(a.slice(procs=1).stop(), DEADLINE)
    chosen = await asyncio.wait_for(asyncio.gather(*(a.pid.choose() for _ in range(6))),
                                    DEADLINE)
    assert chosen == [procs.pids[0]] * 6
    with pytest.raises(meshio.SupervisionError) as ei:
        await asyncio.wait_for(a.slice(procs=1).pid.call_one(), DEADLINE)
    said = str(ei.value)
    assert said.startswith("actor mesh 'a' was stopped in process ")
    assert "stop() on the mesh, or on a slice holding this actor" in said
    assert "the reference that spawn returned" not in said
    assert said.endswith(" [a rank 1]") and ei.value.rank == 1


async def test_choose_leaves_out_an_actor_whose_process_answers_no_heartbeat(
        procs: meshio.ProcMesh) -> None:
    """A process heartbeats found silent (SIGSTOP) gets no choose (each
    would fail "not responding"), until it answers again."""
    a = await procs.spawn("a", A)
    hung = a.slice(procs=1)
    addr = await asyncio.wait_for(hung.addr.call_one(), DEADLINE)
    pid = procs.pids[1]
    os.kill(pid, signal.SIGSTOP)
    try:
        await until_not_responding(hung)
        chosen = await asyncio.wait_for(asyncio.gather(*(a.pid.choose() for _ in range(4))),
                                        DEADLINE)
        assert chosen == [procs.pids[0]] * 4
        answered = next_pong(addr)
    finally:
        os.kill(pid, signal.SIGCONT)
    await asyncio.wait_for(answered, DEADLINE)
    chosen = await asyncio.wait_for(asyncio.gather(*(a.pid.choose() for _ in range(4))),
                                    DEADLINE)
    assert sorted(chosen) == sorted(procs.pids * 2)


async def test_a_stopped_service_frees_its_mesh_name(procs: meshio.ProcMesh) -> None:
    gen = await procs.spawn("gen", A, 1)
    svc = meshio.Service(gen, routing="least_loaded")
    assert await asyncio.wait_for(svc.which.route(), DEADLINE) == 1
    await asyncio.wait_for(svc.stop(), DEADLINE)
    with pytest.raises(meshio.UnknownActorError):
        procs.actors("gen", A)
    again = await asyncio.wait_for(procs.spawn("gen", A, 2), DEADLINE)
    assert (await asyncio.wait_for(again.which.call(), DEADLINE)).values() == [2, 2]
    with pytest.raises(meshio.SupervisionError, match="actor mesh 'gen' was stopped"):
        await asyncio.wait_for(gen.which.call(), DEADLINE)


class Stopper(Actor):
    """Stops an actor mesh through the reference it was given."""

    @endpoint
    async def halt(self, mesh: A) -> None:
        await mesh.stop()

    @endpoint
    async def halt_w(self, mesh: W) -> None:
        await mesh.stop()


async def test_a_mesh_stopped_from_inside_an_actor_frees_its_name(
        procs: meshio.ProcMesh) -> None:
    """A stop made through a reference elsewhere (an actor's) is noted by
    the controller that owns the processes before the stop returns: the
    name is free for a new spawn (it was still taken: "already has actors
    named 'gen'"), slice by slice too."""
    stopper = await procs.slice(procs=0).spawn("stopper", Stopper)
    gen = await procs.spawn("gen", A, 1)
    await asyncio.wait_for(stopper.halt.call_one(gen), DEADLINE)
    again = await asyncio.wait_for(procs.spawn("gen", A, 2), DEADLINE)
    assert (await asyncio.wait_for(again.which.call(), DEADLINE)).values() == [2, 2]
    await asyncio.wait_for(stopper.halt.call_one(again.slice(procs=1)), DEADLINE)
    with pytest.raises(ValueError, match="already has actors named 'gen'"):
        await procs.spawn("gen", A, 3)  # one actor of it serves on
    await asyncio.wait_for(stopper.halt.call_one(again.slice(procs=0)), DEADLINE)
    third = await asyncio.wait_for(procs.spawn("gen", A, 3), DEADLINE)
    assert (await asyncio.wait_for(third.which.call(), DEADLINE)).values() == [3, 3]


async def test_a_slice_stopped_from_inside_an_actor_is_not_rebuilt_by_a_restart() -> None:
    """It was: the restart rebuilt the actor the controller did not know
    was stopped, and the reference's calls went through to it again."""
    async with supervised() as s:
        stopper = await s.procs.slice(procs=0).spawn("stopper", Stopper)
        w = await s.procs.spawn("w", W, 1)
        await asyncio.wait_for(stopper.halt_w.call_one(w.slice(procs=1)), DEADLINE)
        os.kill(s.old[1], signal.SIGKILL)
        await s.restarted(1)
        with pytest.raises(meshio.SupervisionError, match="actor mesh 'w' was stopped"):
            await asyncio.wait_for(w.slice(procs=1).pid.call_one(), DEADLINE)
        assert await asyncio.wait_for(w.slice(procs=0).pid.call_one(), DEADLINE) == s.old[0]


async def test_a_stopped_slice_is_not_rebuilt_by_a_restart() -> None:
    async with supervised() as s:
        w = await s.procs.spawn("w", W, 1)
        await asyncio.wait_for(w.slice(procs=1).stop(), DEADLINE)
        os.kill(s.old[1], signal.SIGKILL)
        _, restart = await s.restarted(1)
        probe = await asyncio.wait_for(s.procs.spawn("probe", W, 2), DEADLINE)
        assert (await asyncio.wait_for(probe.pid.call(), DEADLINE)).values() == [
            s.old[0], restart.pid]
        with pytest.raises(meshio.SupervisionError, match="actor mesh 'w' was stopped"):
            await asyncio.wait_for(w.slice(procs=1).pid.call_one(), DEADLINE)
        assert await asyncio.wait_for(w.slice(procs=0).pid.call_one(), DEADLINE) == s.old[0]


# ------------------------------------- a stopped mesh's reference stays dead


class Holder(Actor):
    """Holds a reference to another actor mesh and calls it directly."""

    def __init__(self, held: A) -> None:
        self.held = held

    @endpoint
    async def which(self) -> int:
        return await self.held.which.call_one()


async def test_a_reference_to_a_stopped_mesh_stays_stopped_after_a_new_spawn(
        procs: meshio.ProcMesh) -> None:
    old = await procs.slice(procs=0).spawn("c", A, 1)
    holder = await procs.slice(procs=1).spawn("holder", Holder, old)
    assert await asyncio.wait_for(holder.which.call_one(), DEADLINE) == 1
    await asyncio.wait_for(old.stop(), DEADLINE)
    with pytest.raises(meshio.SupervisionError, match="actor mesh 'c' was stopped") as ei:
        await asyncio.wait_for(old.which.call_one(), DEADLINE)
    assert ei.value.actor == "c" and ei.value.rank == 0
    new = await asyncio.wait_for(procs.slice(procs=0).spawn("c", A, 2), DEADLINE)
    assert await asyncio.wait_for(new.which.call_one(), DEADLINE) == 2
    for stale in (old.which.call_one(), holder.which.call_one()):
        with pytest.raises((meshio.SupervisionError, meshio.ActorError),
                           match="actor mesh 'c' was stopped"):
            await asyncio.wait_for(stale, DEADLINE)
    await asyncio.wait_for(old.stop(), DEADLINE)  # a stale stop stops nothing of the new one
    assert await asyncio.wait_for(new.which.call_one(), DEADLINE) == 2
    with pytest.raises(ValueError, match="already has actors named 'c'"):
        await procs.slice(procs=0).spawn("c", A, 3)


async def test_a_hole_refilled_by_replace_is_reached_through_the_old_reference(
        procs: meshio.ProcMesh) -> None:
    a = await procs.spawn("a", A, 1)
    os.kill(procs.pids[1], signal.SIGKILL)
    await asyncio.wait_for(procs.wait_failed(), DEADLINE)
    await asyncio.wait_for(procs.replace(1), DEADLINE)
    assert (await asyncio.wait_for(a.pid.call(), DEADLINE)).values() == procs.pids
    assert await asyncio.wait_for(a.slice(procs=1).which.call_one(), DEADLINE) == 1


class Broadcasts(Actor):
    """Broadcasts through a reference it was given (held elsewhere than
    where its proc mesh is: whether its actors are stopped is not known)."""

    @endpoint
    async def tell(self, held: A) -> None:
        await held.which.broadcast()

    @endpoint
    async def say_through(self, says: Says, text: str) -> None:
        """``says.say`` from here: after this process's broadcasts, in order."""
        await says.say.call_one(text)


async def test_a_broadcast_to_a_stopped_mesh_raises_where_its_procs_are_owned(
        procs: meshio.ProcMesh) -> None:
    # As a call to it would, awaited or not: nothing is sent.
    a = await procs.spawn("a", A)
    await asyncio.wait_for(a.slice(procs=1).stop(), DEADLINE)
    with pytest.raises(meshio.SupervisionError,
                       match=r"a rank 1: actor mesh 'a' was stopped .* A.which was not sent"):
        a.which.broadcast()
    await asyncio.wait_for(a.slice(procs=0).which.broadcast(), DEADLINE)
    await asyncio.wait_for(a.stop(), DEADLINE)
    for sent in (lambda: a.which.broadcast(), lambda: a.slice(procs=0).which.broadcast()):
        with pytest.raises(meshio.SupervisionError, match="a rank 0: actor mesh 'a' was stopped"):
            await asyncio.wait_for(sent(), DEADLINE)
    own = await meshio.this_host().spawn_procs(per_host={"procs": 1})
    b = await own.spawn("b", A)
    await asyncio.wait_for(own.stop(), DEADLINE)
    with pytest.raises(meshio.SupervisionError,
                       match=r"b rank 0: proc mesh .* was stopped; spawn a new one"):
        b.which.broadcast()


async def test_a_broadcast_to_a_stopped_mesh_through_a_reference_elsewhere_is_said_once(
        procs: meshio.ProcMesh, controller_log: LogWatch) -> None:
    # A broadcast has nobody waiting for an answer: one that finds its actor
    # stopped is said on the worker's log (forwarded here), once per actor.
    one = procs.slice(procs=0)
    gone, says = await one.spawn("gone", A), await one.spawn("says", Says)
    other = await procs.slice(procs=1).spawn("other", Broadcasts)
    await gone.stop()
    for _ in range(3):
        await other.tell.call_one(gone)
    # (sent after them on the same connection: its record comes after theirs;
    # a call from here could reach that process before them)
    await other.say_through.call_one(says, "after the broadcasts")
    await controller_log.wait_for("after the broadcasts")
    dropped = [m for m in controller_log.messages if "a broadcast of which was dropped" in m]
    assert len(dropped) == 1 and "actor mesh 'gone' was stopped" in dropped[0]
