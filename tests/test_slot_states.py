"""A process slot's life is an explicit state enum (``SlotState``) whose
allowed moves are one table (``TRANSITIONS``): real processes are stopped,
killed, found hung, restarted, replaced, removed and stopped, and every move
the code makes is recorded and checked against the table, rank by rank, in
order."""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import signal
from collections.abc import Iterator

import pytest
from supervision_helpers import DEADLINE, Events, W, manual_sup, until

import meshio
import meshio._proc_state as proc_state
from meshio import endpoint
from meshio._proc_state import TRANSITIONS
from meshio._proc_state import SlotState as S


class Moves:
    """Every move of every slot, in order, as (rank, from, to); refused
    ones too (``TRANSITIONS`` is checked on the record)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, S, S]] = []
        self._moved = asyncio.Event()

    def record(self, rank: int, frm: S, to: S) -> None:
        self.seen.append((rank, frm, to))
        self._moved.set()

    def path(self, rank: int) -> list[S]:
        """The states ``rank``'s slot went to, in order."""
        return [to for r, _, to in self.seen if r == rank]

    async def reach(self, rank: int, state: S, times: int = 1) -> None:
        """Wait until ``rank``'s slot went to ``state`` ``times`` times."""
        async def wait() -> None:
            while self.path(rank).count(state) < times:
                self._moved.clear()
                await self._moved.wait()

        await asyncio.wait_for(wait(), DEADLINE)

    def check(self) -> None:
        refused = [m for m in self.seen if m[1:] not in TRANSITIONS]
        assert not refused, f"moves outside TRANSITIONS: {refused}"


@pytest.fixture
def moves(monkeypatch: pytest.MonkeyPatch) -> Iterator[Moves]:
    seen = Moves()
    move = proc_state._Worker.move

    def recorded(self: proc_state._Worker, to: S) -> None:
        if to is not self.state:
            seen.record(self.rank, self.state, to)
        move(self, to)

    monkeypatch.setattr(proc_state._Worker, "move", recorded)
    yield seen
    seen.check()


class Faulty(W):
    @endpoint
    async def quit(self) -> None:
        raise SystemExit(3)  # ends the actor: a fault its supervisor answers with a kill


def test_the_table_has_a_way_into_every_state_and_refuses_the_rest() -> None:
    assert {to for _, to in TRANSITIONS} == set(S)
    assert {frm for frm, _ in TRANSITIONS} == set(S) - {S.REMOVED}  # for good
    assert (S.SERVING, S.SERVING) not in TRANSITIONS
    w = proc_state._Worker.__new__(proc_state._Worker)
    w.rank, w.addr, w.state = 3, "somewhere", S.REMOVED
    with pytest.raises(RuntimeError, match=r"rank 3 .*cannot go from removed to serving"):
        w.move(S.SERVING)
    assert w.state is S.REMOVED
    w.move(S.REMOVED)  # staying is not a move


def test_only_move_changes_a_slot_s_state() -> None:
    tree = ast.parse(inspect.getsource(proc_state))
    writers = {(cls.name, fn.name) for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
               for fn in cls.body if isinstance(fn, ast.FunctionDef) for node in ast.walk(fn)
               if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
               for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
               if isinstance(t, ast.Attribute) and t.attr == "state"}
    assert writers == {("_Worker", "__init__"), ("_Worker", "move")}


async def test_a_slot_without_a_supervisor(moves: Moves) -> None:
    """Hung and back, killed (a hole), replaced, removed by a shrink; the
    other rank is stopped with its mesh."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        w = await procs.spawn("w", W, 1)
        pid = procs.pids[1]
        os.kill(pid, signal.SIGSTOP)
        try:
            await moves.reach(1, S.NOT_RESPONDING)
        finally:
            os.kill(pid, signal.SIGCONT)
        await moves.reach(1, S.SERVING, times=2)
        os.kill(pid, signal.SIGKILL)
        await moves.reach(1, S.HOLE)
        assert procs.holes == [{"procs": 1}]
        replacing = asyncio.ensure_future(procs.replace(1))
        await moves.reach(1, S.REFILLING)
        assert procs.holes == [{"procs": 1}]  # a hole until its replacement serves
        await asyncio.wait_for(replacing, DEADLINE)
        assert procs.holes == [] and (await w.echo.call(5)).values() == [(0, 5), (1, 5)]
        await asyncio.wait_for(procs.shrink(procs=1), DEADLINE)
    assert moves.path(1) == [S.SERVING, S.NOT_RESPONDING, S.SERVING, S.LOST, S.HOLE,
                             S.REFILLING, S.SERVING, S.REMOVED]
    rank0 = moves.path(0)  # (a loaded machine may make it look hung for a while)
    assert rank0[0] is S.SERVING and rank0[-1] is S.STOPPED and S.LOST not in rank0


async def test_a_supervisor_s_restarts(moves: Moves) -> None:
    """one_for_all: the lost rank and its stopped sibling come back; then a
    fault makes the supervisor kill and restart a rank."""
    sup, _ = manual_sup("one_for_all")
    async with Events(sup) as events, \
            meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        f = await procs.spawn("f", Faulty, 1)
        os.kill(procs.pids[1], signal.SIGKILL)
        await events.next("restart", rank=0)
        await events.next("restart", rank=1)
        assert moves.path(1) == [S.SERVING, S.LOST, S.RESTARTING, S.STARTING, S.SERVING]
        assert moves.path(0) == [S.SERVING, S.STOPPING, S.RESTARTING, S.STARTING, S.SERVING]
        del moves.seen[:]
        await f.slice(procs=0).quit.broadcast()
        await events.next("restart", rank=1)
        await until(lambda: moves.path(0)[-1:] == [S.SERVING])
        assert moves.path(0) == [S.KILLING, S.LOST, S.RESTARTING, S.STARTING, S.SERVING]
        assert moves.path(1) == [S.STOPPING, S.RESTARTING, S.STARTING, S.SERVING]
        assert (await f.echo.call(1)).values() == [(0, 1), (1, 1)]


async def test_a_supervisor_that_gives_up(moves: Moves) -> None:
    sup, _ = manual_sup(max_restarts=0)
    with pytest.raises(meshio.SupervisionError, match="gave up"):
        async with Events(sup) as events, \
                meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
            await procs.spawn("w", W, 1)
            os.kill(procs.pids[1], signal.SIGKILL)
            await events.next("escalation")
            assert procs.stopped
    assert moves.path(1) == [S.SERVING, S.LOST, S.FAILED, S.STOPPED]
    assert moves.path(0) == [S.SERVING, S.STOPPED]
