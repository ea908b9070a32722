"""The in-process transport's limits, said before anything starts: an actor
there cannot start worker processes (its runtime listens on no socket they
could reach), so ``this_host().spawn_procs()`` in it is refused at once;
an in-process host still spawns from it.  ``spawn_procs`` options only a
process honours (``env``, ``bootstrap``) are refused: ``env`` was ignored,
so a test passed there and failed on processes.  A supervisor restarts a
killed in-process worker as it would a process."""

from __future__ import annotations

import signal
from typing import Any

import pytest

import meshio
from meshio import Actor, endpoint
from meshio.testing import child_pids, in_process_host, worker_processes

GUARD = 30.0


class Parent(Actor):
    @endpoint
    async def spawn_processes(self) -> None:
        async with meshio.this_host().spawn_procs(per_host={"procs": 1}):
            pass

    @endpoint
    async def spawn_in_process(self) -> list[int]:
        async with in_process_host().spawn_procs(per_host={"procs": 2}) as procs:
            children = await procs.spawn("children", Child)
            return (await children.rank.call()).values()


class Child(Actor):
    @endpoint
    async def rank(self) -> int:
        return meshio.current_rank().rank


@pytest.mark.timeout(GUARD)
async def test_an_in_process_actor_cannot_start_processes() -> None:
    before = child_pids()
    async with in_process_host().spawn_procs(per_host={"procs": 1}) as procs:
        parent = await procs.spawn("parent", Parent)
        with pytest.raises(RuntimeError, match=r"in-process transport.*'processes' transport"):
            await parent.spawn_processes.call_one()
        assert child_pids() == before  # nothing was launched
        # the actor goes on serving, and an in-process host spawns from it
        assert await parent.spawn_in_process.call_one() == [0, 1]


def setup() -> None:
    """A bootstrap (never run: refused)."""


@pytest.mark.timeout(GUARD)
@pytest.mark.parametrize(("options", "refused"), [
    ({"env": {"MY_FLAG": "on"}}, r"spawn_procs\(env=\.\.\.\).*environment per worker"),
    ({"bootstrap": setup}, r"spawn_procs\(bootstrap=\.\.\.\).*new process"),
    ({"env": {"A": "1"}, "bootstrap": setup}, r"spawn_procs\(env=\.\.\., bootstrap=\.\.\.\)"),
])
async def test_options_only_a_process_honours_are_refused(options: dict[str, Any],
                                                          refused: str) -> None:
    with pytest.raises(ValueError, match=refused + r".*'processes' transport"):
        in_process_host().spawn_procs(per_host={"procs": 1}, **options)


@pytest.mark.timeout(GUARD)
async def test_a_supervisor_restarts_a_killed_in_process_worker() -> None:
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0)
    async with in_process_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        children = await procs.spawn("children", Child)
        worker_processes(procs)[1].send_signal(signal.SIGKILL)
        kinds = []
        async for event in sup.events():
            kinds.append((event.kind, event.rank))
            if event.kind == "restart":
                break
        assert kinds == [("failure", 1), ("restart", 1)], kinds
        await procs.ready()
        assert (await children.rank.call()).values() == [0, 1]


@pytest.mark.timeout(GUARD)
async def test_an_empty_env_is_taken() -> None:
    async with in_process_host().spawn_procs(per_host={"procs": 1}, env={}) as procs:
        children = await procs.spawn("children", Child)
        assert await children.rank.call_one() == 0
