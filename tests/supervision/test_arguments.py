"""A Supervisor refuses arguments of the wrong type when it is built, with a
TypeError naming the argument and the type it got, instead of failing once
a process fails: ``clock=5`` was accepted, and after a SIGKILL the failure
handler died on ``clock.now()`` (``'int' object has no attribute 'now'``),
nothing restarted the process and a call to it never returned;
``on_escalate=5`` failed only at escalation time, and ``parent=5`` with an
``AttributeError``.  Every clock that provides what a
:class:`~meshio.supervision.Clock` promises is still accepted, and a
supervisor on a :class:`~meshio.supervision.ManualClock` still restarts a
killed process."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from typing import Any

import pytest
from supervision_helpers import DEADLINE, W, supervised

import meshio
from meshio.supervision import Clock, ManualClock, MonotonicClock


class FrozenClock:
    """A clock of a user's own, structurally a :class:`Clock` (no base)."""

    def now(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        await asyncio.Event().wait()


class NowOnly:
    """Tells the time, but cannot sleep: no clock."""

    def now(self) -> float:
        return 0.0


class ClassClock:
    """A class that is itself a clock (class methods): accepted as it is."""

    @classmethod
    def now(cls) -> float:
        return 0.0

    @classmethod
    async def sleep(cls, seconds: float) -> None:
        await asyncio.Event().wait()


def escalated(error: meshio.SupervisionError) -> bool:
    return True


async def escalated_async(error: meshio.SupervisionError) -> None:
    return None


#: (argument, a wrong value, what the message says of the type received)
WRONG: list[tuple[str, object, str]] = [
    ("strategy", None, "got NoneType None"),
    ("strategy", 5, "got int 5"),
    ("strategy", b"one_for_one", "got bytes b'one_for_one'"),
    ("name", 5, "got int 5"),
    ("name", None, "got NoneType None"),
    ("parent", 5, "got int 5"),
    ("parent", "root", "got str 'root'"),
    ("clock", 5, "got int 5"),
    ("clock", "monotonic", "got str 'monotonic'"),
    ("clock", NowOnly(), "got NowOnly"),
    ("clock", ManualClock, "got the class ManualClock"),
    ("clock", MonotonicClock, "got the class MonotonicClock"),
    ("on_escalate", 5, "got int 5"),
    ("on_escalate", "log", "got str 'log'"),
    # counts: a str (or a float) is a wrong type, not a wrong value (the
    # seconds, within and the heartbeats: test_seconds_args.py)
    ("max_restarts", "3", "got str '3'"),
    ("max_restarts", 3.0, "got float 3.0"),
    ("max_restarts", True, "got bool True"),
    ("max_restarts", None, "got NoneType None"),
    ("poison_after", "3", "got str '3'"),
    ("poison_after", 1.5, "got float 1.5"),
    ("poison_after", True, "got bool True"),
]


@pytest.mark.parametrize(("arg", "value", "got"), WRONG,
                         ids=[f"{a}-{g.removeprefix('got ')}" for a, _, g in WRONG])
def test_a_wrong_type_is_refused_naming_the_argument(arg: str, value: object,
                                                      got: str) -> None:
    make: Callable[..., meshio.Supervisor] = meshio.Supervisor
    parent = meshio.Supervisor(name="root")
    kw: dict[str, Any] = {"parent": parent, arg: value}
    with pytest.raises(TypeError) as refused:
        make(**kw)
    message = str(refused.value)
    assert message.startswith(f"Supervisor: {arg} must be "), message
    assert got in message, message
    assert parent.children == []  # a refused supervisor is no child of anyone


@pytest.mark.parametrize(("arg", "value", "least"), [
    ("max_restarts", -1, 0), ("poison_after", 0, 1), ("poison_after", -1, 1)])
def test_a_count_below_its_least_is_a_value_error(arg: str, value: int, least: int) -> None:
    kw: dict[str, Any] = {arg: value}
    with pytest.raises(ValueError, match=rf"^Supervisor: {arg} must be an int >= {least}, "
                                         rf"got {value}$"):
        meshio.Supervisor(**kw)


def test_a_clock_without_sleep_is_told_what_it_lacks() -> None:
    make: Callable[..., meshio.Supervisor] = meshio.Supervisor
    with pytest.raises(TypeError, match=r"which has no sleep\(\)$"):
        make(clock=NowOnly())
    with pytest.raises(TypeError, match=r"which has no now\(\) or sleep\(\)$"):
        make(clock=5)
    with pytest.raises(TypeError, match=r"pass an instance: clock=ManualClock\(\)"):
        make(clock=ManualClock)


def test_a_strategy_of_the_right_type_but_unknown_is_still_a_value_error() -> None:
    make: Callable[..., meshio.Supervisor] = meshio.Supervisor
    with pytest.raises(ValueError, match="Supervisor: strategy must be one of"):
        make("one_for_some")


@pytest.mark.parametrize("clock", [ManualClock(), MonotonicClock(), FrozenClock(), ClassClock],
                         ids=["ManualClock", "MonotonicClock", "own-clock", "class-clock"])
def test_every_clock_is_accepted(clock: Clock) -> None:
    sup = meshio.Supervisor(clock=clock)
    assert sup.clock is clock


def test_the_right_types_are_accepted() -> None:
    assert isinstance(meshio.Supervisor().clock, MonotonicClock)  # the default: the real one
    root = meshio.Supervisor(name="root")
    for strategy in ("one_for_one", "one_for_all", "rest_for_one"):
        for hook in (None, escalated, escalated_async, lambda e: None):
            child = meshio.Supervisor(strategy, name=f"{strategy}", parent=root,
                                      clock=ManualClock(), on_escalate=hook)
            assert child.strategy == strategy and child.on_escalate is hook
            assert child.parent is root and root.children[-1] is child
    assert len(root.children) == 12


async def test_a_supervisor_on_a_manual_clock_restarts_a_killed_process() -> None:
    async with supervised(1) as s:
        assert isinstance(s.sup.clock, ManualClock)
        w = await s.procs.spawn("w", W, 1)
        os.kill(s.old[0], signal.SIGKILL)
        _, restart = await s.restarted(0)
        pid = await asyncio.wait_for(w.pid.call_one(), DEADLINE)
        assert pid == restart.pid == s.procs.pids[0] != s.old[0]


class BrokenClock(ManualClock):
    """A clock whose ``now()`` raises once told to (user code can)."""

    broken = False

    def now(self) -> float:
        if self.broken:
            raise RuntimeError("clock broke")
        return super().now()


async def test_a_supervisor_that_raises_deciding_still_fails_the_calls() -> None:
    """The supervisor's decision on a dead process raising (here its clock)
    is logged and the process is not restarted; calls to it fail rather
    than hang (they hung: the error ended the task that fails them)."""
    clock = BrokenClock()
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0, clock=clock)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, supervisor=sup) as procs:
        w = await procs.spawn("w", W, 1)
        pid = await asyncio.wait_for(w.pid.call_one(), DEADLINE)
        clock.broken = True
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(meshio.SupervisionError, match=f"process {pid}"):
            await asyncio.wait_for(w.pid.call_one(), DEADLINE)
        clock.broken = False
