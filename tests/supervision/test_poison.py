"""Poison messages (issue 18 item 5): a retried call that kills its actor's
process ``poison_after`` times in a row is not delivered again: it fails
with ``PoisonMessageError`` (endpoint, count), the supervisor reports a
``"poison"`` event, those crashes count as one failure (a supervisor that
allows one restart does not give up), and the actor goes on serving.
Real processes, killed with real signals."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from supervision_helpers import DEADLINE, supervised

import meshio
from meshio import Actor, PoisonMessageError, SupervisionError, endpoint


class Food(Actor):
    @endpoint(retryable=True)
    async def eat(self, x: int, log: str) -> int:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        if x == 666 or (x < 0 and len(Path(log).read_text().split()) <= -x):
            os.kill(os.getpid(), signal.SIGKILL)  # poison (or bad luck -x times)
        return x

    @endpoint
    async def eat_once(self, x: int) -> int:
        if x == 666:
            os.kill(os.getpid(), signal.SIGKILL)
        return x


async def test_a_poison_message_is_quarantined_and_counts_as_one_failure(tmp_path: Path) -> None:
    log = str(tmp_path / "runs")
    async with supervised(2, max_restarts=1, poison_after=3) as s:
        food = await s.procs.spawn("food", Food)
        one = food.slice(procs=1)
        with pytest.raises(PoisonMessageError) as info:
            await asyncio.wait_for(one.eat.call_one(666, log), DEADLINE)
        assert (info.value.endpoint, info.value.count, info.value.rank) == ("Food.eat", 3, 1)
        assert "killed the process 3 times in a row" in str(info.value)
        assert len(Path(log).read_text().split()) == 3  # delivered three times, not four
        ev = await s.events.next("poison", rank=1)
        assert "Food.eat killed the process 3 times in a row" in ev.cause
        # three crashes, one failure: a supervisor allowing one restart went on
        assert s.sup.failure is None
        assert await asyncio.wait_for(one.eat.call_one(1, log), DEADLINE) == 1
        assert (await asyncio.wait_for(food.eat.call(2, log), DEADLINE)).values() == [2, 2]


async def test_a_call_made_right_after_the_poison_error_is_served(tmp_path: Path) -> None:
    """The poison error reaches its caller once the restart its last crash
    began is over: a plain call (not retryable, so it does not wait for a
    restart) made next is served by the new process."""
    log = str(tmp_path / "runs")
    async with supervised(1, max_restarts=1, poison_after=3) as s:
        food = await s.procs.spawn("food", Food)
        with pytest.raises(PoisonMessageError):
            await asyncio.wait_for(food.eat.call_one(666, log), DEADLINE)
        assert await asyncio.wait_for(food.eat_once.call_one(5), DEADLINE) == 5
        assert s.sup.failure is None


async def test_the_poison_error_comes_when_its_supervisor_gives_up(tmp_path: Path) -> None:
    """No restart follows the last crash (the supervisor gives up): the
    caller still gets its PoisonMessageError, at once."""
    log = str(tmp_path / "runs")
    with pytest.raises(SupervisionError, match="SIGKILL"):  # (the owner's exit: gave up)
        async with supervised(1, max_restarts=0, poison_after=1) as s:
            food = await s.procs.spawn("food", Food)
            with pytest.raises(PoisonMessageError) as info:
                await asyncio.wait_for(food.eat.call_one(666, log), DEADLINE)
            assert info.value.count == 1
    assert s.sup.failure is not None


async def test_crashes_not_in_a_row_are_not_poison(tmp_path: Path) -> None:
    """Two crashes then success, under poison_after=3: the call completes."""
    log = str(tmp_path / "runs")
    async with supervised(2, max_restarts=1, poison_after=3) as s:
        food = await s.procs.spawn("food", Food)
        assert await asyncio.wait_for(food.slice(procs=0).eat.call_one(-2, log),
                                      DEADLINE) == -2
        assert len(Path(log).read_text().split()) == 3
        assert s.sup.failure is None


async def test_a_call_that_is_not_retried_is_not_redelivered() -> None:
    async with supervised(2, max_restarts=3, poison_after=3) as s:
        food = await s.procs.spawn("food", Food)
        with pytest.raises(SupervisionError) as info:
            await asyncio.wait_for(food.slice(procs=0).eat_once.call_one(666), DEADLINE)
        assert not isinstance(info.value, PoisonMessageError)
        await s.restarted(0)
        assert await asyncio.wait_for(food.slice(procs=0).eat_once.call_one(5), DEADLINE) == 5


def test_bad_poison_after_is_refused() -> None:
    with pytest.raises(ValueError, match="poison_after"):
        meshio.Supervisor(poison_after=0)
    for bad in (1.5, "3"):
        with pytest.raises(TypeError, match="poison_after"):
            meshio.Supervisor(poison_after=bad)  # type: ignore[arg-type]


async def test_calls_queued_behind_a_poison_message_are_not_blamed(tmp_path: Path) -> None:
    """Only a call that was running when its process died counts a crash:
    good calls queued behind the poison message (redelivered with it after
    each crash) complete; the poison message alone is quarantined."""
    log = str(tmp_path / "runs")
    async with supervised(2, max_restarts=1, poison_after=3) as s:
        food = await s.procs.spawn("food", Food)
        one = food.slice(procs=1)
        poison = asyncio.ensure_future(one.eat.call_one(666, log))
        good = [asyncio.ensure_future(one.eat.call_one(i, log)) for i in range(20)]
        with pytest.raises(PoisonMessageError):
            await asyncio.wait_for(poison, DEADLINE)
        assert await asyncio.wait_for(asyncio.gather(*good), DEADLINE) == list(range(20))
        assert s.sup.failure is None
