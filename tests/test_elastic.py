"""Elastic meshes with real worker processes: holes (ranks SIGKILLed with
nothing to restart them) in ``call``/``stream``/``broadcast``/``call_one``/``choose``,
``procs.replace`` filling a hole or renewing a live process, ``grow`` and
``shrink`` in place (the actor meshes follow; removed processes exit; a
supervisor sees stops, not failures), and bad arguments.

Nothing sleeps to wait: tests wait on ``procs.wait_failed()``, pidfds and
the supervisor's events, each under a generous guard.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from supervision_helpers import DEADLINE, Events, manual_sup

import meshio
from fifo_gate import Gate, hold
from gone import wait_gone
from meshio import Actor, endpoint
from meshio.testing import child_pids, wait_exited


class Counter(Actor):
    """Starts at ``start``; ``add`` changes it (state a fresh process has not)."""

    def __init__(self, start: int) -> None:
        self.value = start

    @endpoint
    async def add(self, k: int) -> None:
        self.value += k

    @endpoint(concurrent=True)  # (an actor calling its whole mesh calls itself too)
    async def get(self) -> tuple[int, int]:
        """(value, pid)"""
        return self.value, os.getpid()

    @endpoint
    async def fail(self) -> None:
        raise ValueError(f"fails at {self.value}")

    @endpoint(retryable=True)
    async def get_retryable(self) -> int:
        return self.value

    @endpoint
    async def where(self) -> tuple[int, dict[str, int], dict[str, int]]:
        """(rank, point, sizes of the mesh) as this actor sees them"""
        point = meshio.current_rank()
        return point.rank, dict(point), dict(point.extent)

    @endpoint
    async def peer_values(self) -> list[int]:
        """The values of every actor of its mesh, called through its context."""
        mesh = meshio.context(Counter).mesh
        return [v for v, _ in (await mesh.get.call()).values()]


class HeldWhenArmed(Actor):
    """Once the file ``armed`` is in ``gate``, its constructor writes its
    pid to ``gate/pid`` and holds its process at the gate (see fifo_gate)."""

    def __init__(self, gate: str) -> None:
        if os.path.exists(os.path.join(gate, "armed")):
            with open(os.path.join(gate, "pid"), "w") as f:
                f.write(str(os.getpid()))
            hold(os.path.join(gate, "ready"), os.path.join(gate, "release"))

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


@asynccontextmanager
async def counters(n: int = 3, **spawn_kw: object) -> AsyncIterator[
        tuple[meshio.ProcMesh, Counter]]:
    async with meshio.this_host().spawn_procs(per_host={"gpus": n}, **spawn_kw) as procs:
        yield procs, await procs.spawn("counters", Counter, 10)


async def kill_and_wait(procs: meshio.ProcMesh, rank: int) -> None:
    """SIGKILL ``rank`` and wait until it is known to be a hole."""
    os.kill(procs.pids[rank], signal.SIGKILL)
    failure = await asyncio.wait_for(procs.wait_failed(), DEADLINE)
    assert failure.rank == rank


# ------------------------------------------------------------------ holes


async def test_call_returns_a_value_mesh_with_holes() -> None:
    async with counters() as (procs, c):
        await c.slice(gpus=0).add.call_one(5)
        await kill_and_wait(procs, 1)
        assert [dict(p) for p in procs.holes] == [{"gpus": 1}]
        values = await asyncio.wait_for(c.get.call(), DEADLINE)
        assert [dict(p) for p in values.holes] == [{"gpus": 1}]
        assert [v for v, _ in values.values()] == [15, 10]
        assert [dict(p) for p, _ in values.items()] == [{"gpus": 0}, {"gpus": 2}]
        assert values.item(gpus=2)[0] == 10
        with pytest.raises(meshio.SupervisionError) as ei:
            values.item(gpus=1)
        assert ei.value.rank == 1 and "SIGKILL" in ei.value.cause
        assert "procs.replace(1)" in str(ei.value)
        assert values.slice(gpus=slice(1, 3)).holes[0]["gpus"] == 0
        assert values.slice(gpus=0).holes == []
        assert "<hole>" in repr(values)
        # a retryable endpoint does not wait for a restart that never comes
        retried = await asyncio.wait_for(c.get_retryable.call(), DEADLINE)
        assert retried.values() == [15, 10]
        assert [dict(p) for p in retried.holes] == [{"gpus": 1}]


async def test_other_failures_still_raise_beside_holes() -> None:
    async with counters() as (procs, c):
        await kill_and_wait(procs, 0)
        with pytest.raises(meshio.ActorError) as ei:
            await asyncio.wait_for(c.fail.call(), DEADLINE)
        assert ei.value.remote_type == "ValueError"
        assert "ranks 1-2" in str(ei.value) and "rank 0" not in str(ei.value)


async def test_broadcast_and_stream_skip_holes() -> None:
    async with counters() as (procs, c):
        await kill_and_wait(procs, 2)
        c.add.broadcast(1)  # no error anywhere for the hole
        seen = sorted([(p.rank, v) async for p, (v, _) in c.get.stream()])
        assert seen == [(0, 11), (1, 11)]  # (arrival order: sorted)


async def test_call_one_on_a_hole_raises_supervision_error() -> None:
    async with counters() as (procs, c):
        await kill_and_wait(procs, 1)
        for call in (c.slice(gpus=1).get.call_one, c.slice(gpus=1).get_retryable.call_one):
            with pytest.raises(meshio.SupervisionError) as ei:
                await asyncio.wait_for(call(), DEADLINE)
            assert ei.value.rank == 1 and "SIGKILL" in ei.value.cause  # rank as spawned
            assert "rank 1" in str(ei.value)


async def test_choose_leaves_holes_out_until_replaced() -> None:
    """choose goes to the actors that serve calls: a hole's calls failed at
    once, so it never had one in flight and "fewest in flight" chose it
    again and again (4 of 12 sequential and 10 of 12 concurrent calls raised
    SupervisionError); once replaced, it is chosen again."""
    async with counters() as (procs, c):
        await kill_and_wait(procs, 0)
        one_by_one = [await asyncio.wait_for(c.where.choose(), DEADLINE) for _ in range(12)]
        assert sorted({rank for rank, _, _ in one_by_one}) == [1, 2]
        together = await asyncio.wait_for(
            asyncio.gather(*(c.where.choose() for _ in range(12))), DEADLINE)
        assert sorted(rank for rank, _, _ in together) == [1] * 6 + [2] * 6
        await asyncio.wait_for(procs.replace(0), DEADLINE)
        together = await asyncio.wait_for(
            asyncio.gather(*(c.where.choose() for _ in range(6))), DEADLINE)
        assert sorted(rank for rank, _, _ in together) == [0, 0, 1, 1, 2, 2]


async def test_choose_with_no_actor_left_says_why_for_each() -> None:
    """With every actor a hole or stopped, choose raises SupervisionError at
    once (nothing is sent), naming the mesh and each rank's cause; on one
    actor, the error a call to it gets."""
    async with counters() as (procs, c):
        await c.slice(gpus=2).stop()
        for rank in (0, 1):
            os.kill(procs.pids[rank], signal.SIGKILL)
            await asyncio.wait_for(procs.slice(gpus=rank).wait_failed(), DEADLINE)
        with pytest.raises(meshio.SupervisionError) as ei:
            c.get.choose()
        head = str(ei.value).split("\n\n")[0]
        assert head == (
            "Counter.get: choose found no actor of 'counters' that serves calls:\n"
            "  ranks 0-1: SupervisionError: killed by signal SIGKILL\n"
            "  rank 2 {'gpus': 2}: SupervisionError: its actor was stopped (actors.stop() on "
            "a slice holding it)")
        assert "procs.replace(0)" in str(ei.value)
        failures = [(p, e) for p, e in ei.value.failures if isinstance(e, meshio.SupervisionError)]
        assert [(p.rank, e.rank) for p, e in failures] == [(0, 0), (1, 1), (2, 2)]
        with pytest.raises(meshio.SupervisionError) as ei:
            c.slice(gpus=2).get.choose()
        assert str(ei.value) == (
            "counters rank 2: its actor was stopped (actors.stop() on a slice holding it); "
            "Counter.get was not sent")
        assert ei.value.rank == 2 and ei.value.actor == "counters"


async def test_temporary_under_a_supervisor_is_a_hole_a_restart_is_not() -> None:
    sup, _ = manual_sup()
    async with Events(sup) as events, meshio.this_host().spawn_procs(
            per_host={"gpus": 2}, supervisor=sup) as procs:
        keep = await procs.spawn("keep", Counter, 1)
        temp = await procs.options(restart="temporary").spawn("temp", Counter, 2)
        os.kill(procs.pids[0], signal.SIGKILL)  # restarted: the process is permanent
        await events.next("restart", rank=0)
        assert procs.holes == []
        assert (await keep.get.call()).holes == []
        # the temporary actor was not rebuilt on the new process: a hole
        values = await asyncio.wait_for(temp.get.call(), DEADLINE)
        assert [dict(p) for p in values.holes] == [{"gpus": 0}]
        await procs.replace(0)  # rebuilds temporary actors too
        assert [v for v, _ in (await temp.get.call()).values()] == [2, 2]


async def test_temporary_process_is_a_hole_under_a_supervisor() -> None:
    sup, _ = manual_sup()
    async with Events(sup) as events, meshio.this_host().spawn_procs(
            per_host={"gpus": 2}, supervisor=sup, restart="temporary") as procs:
        c = await procs.spawn("c", Counter, 1)
        os.kill(procs.pids[1], signal.SIGKILL)
        await events.next("failure", rank=1)
        values = await asyncio.wait_for(c.get.call(), DEADLINE)
        assert [dict(p) for p in values.holes] == [{"gpus": 1}]
        assert "restart='temporary'" in str(values.holes and _hole_error(values))
        assert events.kinds() == [("failure", "procs", 1)]


def _hole_error(values: meshio.ValueMesh[tuple[int, int]]) -> meshio.SupervisionError:
    try:
        values.item(**dict(values.holes[0]))
    except meshio.SupervisionError as e:
        return e
    raise AssertionError("a hole gave a value")


# ---------------------------------------------------------------- replace


async def test_replace_fills_a_hole_with_fresh_state() -> None:
    async with counters() as (procs, c):
        c.add.broadcast(5)
        old = procs.pids
        await kill_and_wait(procs, 1)
        await asyncio.wait_for(procs.replace(procs.holes[0]), DEADLINE)
        assert procs.holes == []
        values = await c.get.call()
        assert values.holes == []
        assert [v for v, _ in values.values()] == [15, 10, 15]  # rebuilt from its arguments
        assert values.item(gpus=1)[1] == procs.pids[1] != old[1]
        assert procs.pids[0::2] == old[0::2]
        assert await c.slice(gpus=1).where.call_one() == (1, {"gpus": 1}, {"gpus": 3})


async def test_replace_a_live_process_stops_it_first() -> None:
    async with counters(2) as (procs, c):
        await c.add.call(3)
        old = procs.pids[0]
        fd = os.pidfd_open(old)
        try:
            await asyncio.wait_for(procs.replace({"gpus": 0}), DEADLINE)
            await wait_exited(fd, DEADLINE)
        finally:
            os.close(fd)
        values = await c.get.call()
        assert [v for v, _ in values.values()] == [10, 13]
        assert procs.pids[0] != old


async def test_a_replacement_killed_while_its_actors_are_rebuilt_is_a_hole_again(
        tmp_path: pathlib.Path) -> None:
    """The new process of ``replace()`` SIGKILLed inside a rebuilt actor's
    constructor: SupervisionError naming it, and the point a hole that the
    next ``replace`` fills.  Before, ``replace`` raised a bare AssertionError."""
    gate = Gate(tmp_path)
    async with meshio.this_host().spawn_procs(per_host={"gpus": 1}) as procs:
        held = await procs.spawn("held", HeldWhenArmed, str(tmp_path))
        (tmp_path / "armed").touch()
        await kill_and_wait(procs, 0)
        replacing = asyncio.ensure_future(procs.replace(0))
        await gate.wait_held(DEADLINE)
        new = int((tmp_path / "pid").read_text())
        os.kill(new, signal.SIGKILL)
        with pytest.raises(meshio.SupervisionError,
                           match=f"rank 0: its new process {new} .*killed by signal SIGKILL "
                                 f"while its actors were rebuilt; it is a hole again"):
            await asyncio.wait_for(replacing, DEADLINE)
        assert [p.rank for p in procs.holes] == [0]
        (tmp_path / "armed").unlink()
        await asyncio.wait_for(procs.replace(0), DEADLINE)
        assert procs.holes == [] and await held.pid.call_one() == procs.pids[0]


# ------------------------------------------------------------ grow, shrink


async def test_grow_then_call_answers_from_every_point() -> None:
    async with counters(2) as (procs, c):
        await c.add.call(1)
        half = c.slice(gpus=slice(0, 2))
        await asyncio.wait_for(procs.grow(gpus=2), DEADLINE)
        assert procs.sizes == {"gpus": 4} and len(set(procs.pids)) == 4
        assert c.sizes == {"gpus": 4}
        values = await c.get.call()
        assert [v for v, _ in values.values()] == [11, 11, 10, 10]
        assert [pid for _, pid in values.values()] == procs.pids
        assert await c.slice(gpus=3).where.call_one() == (3, {"gpus": 3}, {"gpus": 4})
        # the actors there before see the new shape too, and reach the new peers
        assert await c.slice(gpus=0).where.call_one() == (0, {"gpus": 0}, {"gpus": 4})
        assert await c.slice(gpus=1).peer_values.call_one() == [11, 11, 10, 10]
        assert half.sizes == {"gpus": 2}  # a slice keeps its points
        # an actor mesh spawned after the grow spans the new shape
        more = await procs.spawn("more", Counter, 7)
        assert len(await more.get.call()) == 4


async def test_shrink_stops_the_removed_processes() -> None:
    async with counters(4) as (procs, c):
        old = procs.pids
        tail = c.slice(gpus=3)
        fds = [os.pidfd_open(pid) for pid in old[2:]]
        try:
            await asyncio.wait_for(procs.shrink(gpus=2), DEADLINE)
            for fd in fds:
                await wait_exited(fd, DEADLINE)
        finally:
            for fd in fds:
                os.close(fd)
        assert procs.sizes == {"gpus": 2} and procs.pids == old[:2]
        assert c.sizes == {"gpus": 2}
        assert await c.slice(gpus=1).where.call_one() == (1, {"gpus": 1}, {"gpus": 2})
        values = await c.get.call()
        assert values.holes == [] and [pid for _, pid in values.values()] == old[:2]
        with pytest.raises(meshio.SupervisionError) as ei:  # a view of a removed point
            await asyncio.wait_for(tail.get.call_one(), DEADLINE)
        assert "shrink" in ei.value.cause
        await procs.grow(gpus=1)  # grows again, from a fresh process
        assert [v for v, _ in (await c.get.call()).values()] == [10, 10, 10]


class Parked(Actor):
    """``park`` returns its pid once ``release`` is called."""

    def __init__(self) -> None:
        self.released = asyncio.Event()

    @endpoint(concurrent=True)
    async def park(self) -> int:
        await self.released.wait()
        return os.getpid()

    @endpoint(concurrent=True)
    async def release(self) -> None:
        self.released.set()


@pytest.mark.parametrize("adverb", ["call", "stream"])
async def test_a_call_in_flight_across_a_shrink_settles(adverb: str) -> None:
    """A call to every actor still in flight when a shrink removes some of
    them: the kept ones answer, the removed ones fail with
    SupervisionError.  Before, their answers were judged by the mesh's new
    shape (an IndexError in the transport, which dropped the connection and
    its answers): the call never settled."""
    async with meshio.this_host().spawn_procs(per_host={"gpus": 4}) as procs:
        parked = await procs.spawn("parked", Parked)
        kept = procs.pids[:2]

        async def streamed() -> list[int]:
            return [pid async for _, pid in parked.park.stream()]
        call = asyncio.ensure_future(parked.park.call() if adverb == "call" else streamed())
        await asyncio.wait_for(procs.shrink(gpus=2), DEADLINE)
        await parked.release.call()  # (the kept two)
        with pytest.raises(meshio.SupervisionError) as failed:
            await asyncio.wait_for(call, DEADLINE)
        if adverb == "call":
            assert "failed on 2 of 4 ranks of 'parked'" in str(failed.value), failed.value
            assert "rank 2 {'gpus': 2}" in str(failed.value) and \
                "rank 3 {'gpus': 3}" in str(failed.value), failed.value
        assert [pid for _, pid in (await parked.park.call()).items()] == kept


async def test_a_supervisor_treats_a_shrink_as_a_stop() -> None:
    sup, _ = manual_sup()
    async with Events(sup) as events, meshio.this_host().spawn_procs(
            per_host={"gpus": 3}, supervisor=sup) as procs:
        c = await procs.spawn("c", Counter, 1)
        await procs.shrink(gpus=2)
        stopped = await events.next("stopped")
        assert stopped.cause == "shrink" and stopped.rank == 2
        await events.next("stopped")
        assert events.kinds() == [("stopped", "procs", 2), ("stopped", "procs", 1)]
        assert sup.failure is None
        os.kill(procs.pids[0], signal.SIGKILL)  # the next event is its failure: nothing else
        failure = await events.next("failure")
        assert failure.rank == 0
        await events.next("restart", rank=0)
        assert [v for v, _ in (await c.get.call()).values()] == [1]


class HeldAtCleanup(Actor):
    """Its actors at ranks ``held`` or above hold their process's loop in
    ``__cleanup__`` at the gate in the directory ``gate`` (see fifo_gate):
    only SIGKILL ends such a process."""

    def __init__(self, gate: str, held: int) -> None:
        self.gate = gate if meshio.current_rank().rank >= held else None

    async def __cleanup__(self, exc: BaseException | None) -> None:
        if self.gate is not None:
            hold(os.path.join(self.gate, "ready"), os.path.join(self.gate, "release"))

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


async def test_a_shrink_cancelled_once_begun_keeps_the_new_shape(tmp_path: pathlib.Path) -> None:
    """As documented: a shrink cancelled once it has reshaped the mesh is not
    undone: the mesh and its actor meshes keep the new shape (sizes, pids),
    the removed processes are killed rather than waited for (here one that
    its shutdown grace, longer than the guard, would have waited on), a
    supervisor reports each stopped, and the caller gets CancelledError.
    Before, the removed processes were left to exit when they would, and
    the supervisor was not told."""
    gate = Gate(tmp_path)
    sup, _ = manual_sup()
    async with Events(sup) as events, meshio.this_host().spawn_procs(
            per_host={"gpus": 3}, supervisor=sup, shutdown=10 * DEADLINE) as procs:
        held = await procs.spawn("held", HeldAtCleanup, str(tmp_path), 2)
        old = procs.pids
        fd = os.pidfd_open(old[2])
        try:
            shrinking = asyncio.ensure_future(procs.shrink(gpus=1))
            await gate.wait_held(DEADLINE)  # rank 2 stops: the shrink waits out its grace
            shrinking.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(shrinking, DEADLINE)
            await wait_exited(fd, DEADLINE)
        finally:
            os.close(fd)
        stopped = await events.next("stopped")
        assert (stopped.cause, stopped.rank, stopped.pid) == ("shrink", 2, old[2])
        assert procs.sizes == {"gpus": 2} and procs.pids == old[:2]
        assert held.sizes == {"gpus": 2}
        assert (await asyncio.wait_for(held.pid.call(), DEADLINE)).values() == old[:2]


async def test_a_shrink_cancelled_before_it_began_changes_nothing(
        tmp_path: pathlib.Path) -> None:
    """As documented: a shrink cancelled while it waits to begin (here for a
    grow under way) leaves the mesh as it was; the grow goes on."""
    gate = Gate(tmp_path)
    async with meshio.this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        held = await procs.spawn("held", HeldWhenArmed, str(tmp_path))
        (tmp_path / "armed").touch()
        growing = asyncio.ensure_future(procs.grow(gpus=1))
        await gate.wait_held(DEADLINE)  # the new process builds its actor: the grow holds on
        shrinking = asyncio.ensure_future(procs.shrink(gpus=1))
        await asyncio.sleep(0)  # (one turn of the loop: the shrink waits for the grow)
        shrinking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(shrinking, DEADLINE)
        await gate.open()
        await asyncio.wait_for(growing, DEADLINE)
        assert procs.sizes == {"gpus": 3} and held.sizes == {"gpus": 3}
        assert (await asyncio.wait_for(held.pid.call(), DEADLINE)).values() == procs.pids


async def test_grow_the_first_dimension_of_a_2d_mesh() -> None:
    async with meshio.this_host().spawn_procs(per_host={"dp": 1, "tp": 2}) as procs:
        c = await procs.spawn("c", Counter, 4)
        await procs.grow(dp=1)
        assert c.sizes == {"dp": 2, "tp": 2}
        assert await c.slice(dp=1, tp=1).where.call_one() == (
            3, {"dp": 1, "tp": 1}, {"dp": 2, "tp": 2})
        with pytest.raises(ValueError, match="renumber"):
            await procs.grow(tp=1)


class SmallWorld(Actor):
    """Refuses to be built at a rank >= ``limit``."""

    def __init__(self, limit: int) -> None:
        if meshio.current_rank().rank >= limit:
            raise ValueError(f"rank {meshio.current_rank().rank} is past {limit}")

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


async def test_grow_is_all_or_nothing() -> None:
    async with meshio.this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        small = await procs.spawn("small", SmallWorld, 3)
        before = child_pids()
        with pytest.raises(meshio.ActorError, match="past 3") as ei:
            await asyncio.wait_for(procs.grow(gpus=2), DEADLINE)  # rank 3 refuses
        assert ei.value.remote_type == "ValueError"
        assert child_pids() == before  # the new processes were stopped
        assert procs.sizes == {"gpus": 2} and small.sizes == {"gpus": 2}
        assert (await small.pid.call()).values() == procs.pids
        await procs.grow(gpus=1)  # rank 2 is fine
        assert (await small.pid.call()).values() == procs.pids and len(procs.pids) == 3


async def test_a_grow_cancelled_at_any_turn_grows_nothing() -> None:
    """``grow()`` cancelled after 0, 1, ... turns of the loop raises
    CancelledError and leaves the mesh and its processes as they were.
    Before, a cancellation that came as a process started (its launch is
    one step) was lost in ``asyncio.wait_for`` (Python 3.11): the grow went
    on and finished.  A new process that had not connected yet (no
    Shutdown can reach it) is killed at once, as by a start given up: it
    waited out the whole graceful ``shutdown`` before (5 s by default; here
    longer than the guard)."""
    async with meshio.this_host().spawn_procs(per_host={"gpus": 1},
                                              shutdown=10 * DEADLINE) as procs:
        before = child_pids()
        for turns in range(4):
            growing = asyncio.ensure_future(procs.grow(gpus=1))
            for _ in range(turns):
                await asyncio.sleep(0)  # (one turn of the loop, not a wait)
            growing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(growing, DEADLINE)
            assert procs.sizes == {"gpus": 1}, f"grown though cancelled after {turns} turns"
            await wait_gone(list(child_pids() - before), DEADLINE)


async def test_a_replace_cancelled_at_any_turn_leaves_a_serving_rank_or_a_hole() -> None:
    """``replace()`` cancelled after 0, 1, ... turns of the loop (before it
    began, while it stopped the live process, while the new one started)
    leaves the rank serving as it was or a hole, which the next ``replace``
    fills.  Before, one cancelled while it stopped the process left the
    rank neither: calls failed as to a process down and the next
    ``replace`` waited forever for a restart nobody made."""
    async with counters(2) as (procs, c):
        for turns in range(6):
            replacing = asyncio.ensure_future(procs.replace(1))
            for _ in range(turns):
                await asyncio.sleep(0)  # (one turn of the loop, not a wait)
            replacing.cancel()
            try:
                await asyncio.wait_for(replacing, DEADLINE)
            except asyncio.CancelledError:
                pass
            values = await asyncio.wait_for(c.get.call(), DEADLINE)
            assert [p.rank for p in values.holes] in ([], [1]), f"after {turns} turns"
            await asyncio.wait_for(procs.replace(1), DEADLINE)
            values = await asyncio.wait_for(c.get.call(), DEADLINE)
            assert [v for v, _ in values.values()] == [10, 10] and not values.holes


# ------------------------------------------------------------ bad arguments


async def test_bad_arguments_get_clear_errors() -> None:
    async with counters(2) as (procs, _):
        with pytest.raises(KeyError, match="no dimension 'hosts'"):
            await procs.grow(hosts=1)
        with pytest.raises(ValueError, match="at least 1 point"):
            await procs.shrink(gpus=2)
        with pytest.raises(ValueError, match="slice"):
            await procs.slice(gpus=slice(0, 1)).grow(gpus=1)
        with pytest.raises(ValueError, match="a slice of proc mesh"):  # (it has no dim 'gpus')
            await procs.slice(gpus=0).grow(gpus=1)
        with pytest.raises(ValueError, match="a slice of proc mesh"):
            await procs.slice(gpus=1).shrink(gpus=1)
        with pytest.raises(ValueError, match=">= 1"):
            await procs.grow(gpus=0)
        with pytest.raises(TypeError, match="one dimension"):
            await procs.grow()
        with pytest.raises(TypeError, match="expected an int"):
            await procs.grow(gpus=1.5)  # type: ignore[arg-type]
        with pytest.raises(IndexError, match="ranks 0-1"):
            await procs.replace(2)
        with pytest.raises(IndexError):
            await procs.replace({"gpus": 5})
        with pytest.raises(TypeError, match="rank"):
            await procs.replace("0")  # type: ignore[arg-type]
        assert procs.sizes == {"gpus": 2} and len(procs.pids) == 2
    with pytest.raises(meshio.SupervisionError, match="stopped"):
        await procs.grow(gpus=1)
