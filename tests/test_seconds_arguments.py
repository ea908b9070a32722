"""Every public argument that is a number of seconds refuses what is none:
NaN (which compares false with everything, so a bare ``> 0`` let it
through: ``options(timeout=nan)`` made every call time out at once,
"within nans"), a bool (an int to Python: ``True`` was one second), a
string or None where a number is due (an unclear ``TypeError`` from a
comparison), and out-of-range values, with the error its function documents
naming the argument, before anything is sent or started.

An int no float holds (``10**400``) is a wrong value everywhere, refused
with the argument's own ``ValueError`` (where inf means "no limit" too: inf
says it).  Taken, it raised ``OverflowError: int too large to convert to
float`` later, from the call (``options(timeout=10**400)``) or from
``spawn_procs(keep_alive=...)``."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import meshio
from meshio import Actor, RDMABuffer, endpoint

NAN = math.nan
#: an int beyond a float's range: a number, but of no seconds
HUGE = 10**400


class Echo(Actor):
    @endpoint
    async def echo(self, x: int) -> int:
        return x


#: (what, the call with a bad value, the bad values, the error, a phrase of its
#: message); called on the loop (an RDMABuffer registers with its runtime)
SYNC: list[tuple[str, Callable[[Any], object], tuple[object, ...], type[Exception], str]] = [
    ("RDMABuffer.options(timeout)", lambda v: RDMABuffer(bytearray(8)).options(timeout=v),
     (NAN, True, "1", 0, -1.0, HUGE), ValueError,
     "options(timeout=...) must be seconds > 0"),
    ("Supervisor(within)", lambda v: meshio.Supervisor(within=v),
     (NAN, 0, -1.0, HUGE), ValueError, "within must be > 0 seconds"),
    ("Supervisor(within)", lambda v: meshio.Supervisor(within=v),
     (True, "1", None), TypeError, "within must be a number of seconds (> 0), got"),
    ("Supervisor(heartbeat_interval)", lambda v: meshio.Supervisor(heartbeat_interval=v),
     (NAN, 0, HUGE), ValueError, "heartbeat_interval must be > 0 seconds"),
    ("Supervisor(heartbeat_interval)", lambda v: meshio.Supervisor(heartbeat_interval=v),
     (True, "1", None), TypeError, "heartbeat_interval must be a number of seconds (> 0), got"),
    ("Supervisor(heartbeat_timeout)", lambda v: meshio.Supervisor(heartbeat_timeout=v),
     (NAN, 0, -1.0, HUGE), ValueError, "heartbeat_timeout must be > 0 seconds or None"),
    ("Supervisor(heartbeat_timeout)", lambda v: meshio.Supervisor(heartbeat_timeout=v),
     (True, "3"), TypeError, "heartbeat_timeout must be a number of seconds (> 0) or None"),
    ("Supervisor(max_restarts)", lambda v: meshio.Supervisor(max_restarts=v),
     (-1,), ValueError, "max_restarts must be an int >= 0"),
    ("Supervisor(max_restarts)", lambda v: meshio.Supervisor(max_restarts=v),
     (True, 1.0, 3.0, "1", None), TypeError, "max_restarts must be an int >= 0, got"),
    ("Supervisor(poison_after)", lambda v: meshio.Supervisor(poison_after=v),
     (0, -1), ValueError, "poison_after must be an int >= 1"),
    ("Supervisor(poison_after)", lambda v: meshio.Supervisor(poison_after=v),
     (True, 1.5, "3"), TypeError, "poison_after must be an int >= 1, got"),
    ("Retry(backoff)", lambda v: meshio.Retry(backoff=v),
     (NAN, True, "1", -1.0, HUGE), ValueError, "Retry(backoff=...) must be a number >= 0"),
]

#: the same for spawn_procs, checked when awaited, before any process starts
SPAWN: list[tuple[str, tuple[object, ...], type[Exception], str]] = [
    ("shutdown", (NAN, True, "1", -1.0, HUGE), ValueError,
     "shutdown must be 'brutal_kill' or seconds >= 0"),
    ("heartbeat_interval", (True, "1", None), TypeError,
     "heartbeat_interval must be a number of seconds"),
    ("heartbeat_interval", (HUGE,), ValueError, "heartbeat_interval must be > 0 seconds"),
    ("heartbeat_timeout", (NAN, 0, -1.0, HUGE), ValueError, "must be > 0"),
    ("partition_timeout", (NAN, math.inf, 0, -1.0, HUGE), ValueError,
     "partition_timeout must be seconds > 0"),
    ("partition_timeout", (True, "60", None), TypeError,
     "partition_timeout must be a number of seconds"),
    ("keep_alive", (True, "1"), TypeError, "keep_alive must be seconds"),
    ("keep_alive", (NAN, math.inf, 0, HUGE), ValueError, "keep_alive must be seconds > 0"),
]


@pytest.mark.parametrize(("what", "make", "bad", "error", "phrase"), SYNC,
                         ids=[f"{row[0]}-{row[3].__name__}" for row in SYNC])
async def test_a_seconds_argument_refuses_what_is_no_seconds(
        what: str, make: Callable[[Any], object], bad: tuple[object, ...],
        error: type[Exception], phrase: str) -> None:
    for value in bad:
        with pytest.raises(error) as refused:
            make(value)
        assert phrase in str(refused.value) and repr(value) in str(refused.value), (
            what, value, str(refused.value))


#: calls refusing an int no float holds, whose message must say why (not only
#: "must be > 0", then the 401 digits)
HUGE_TOLD: list[tuple[str, Callable[[Any], object]]] = [
    ("RDMABuffer.options(timeout)", lambda v: RDMABuffer(bytearray(8)).options(timeout=v)),
    ("Supervisor(within)", lambda v: meshio.Supervisor(within=v)),
    ("Supervisor(heartbeat_interval)", lambda v: meshio.Supervisor(heartbeat_interval=v)),
    ("Supervisor(heartbeat_timeout)", lambda v: meshio.Supervisor(heartbeat_timeout=v)),
]


@pytest.mark.parametrize(("what", "make"), HUGE_TOLD, ids=[row[0] for row in HUGE_TOLD])
async def test_an_int_no_float_holds_is_told_too_large(
        what: str, make: Callable[[Any], object]) -> None:
    with pytest.raises(ValueError, match=r"got 10+: too large, more than a float holds"):
        make(HUGE)


@pytest.mark.parametrize(("arg", "bad", "error", "phrase"), SPAWN,
                         ids=[f"{row[0]}-{row[2].__name__}" for row in SPAWN])
async def test_spawn_procs_refuses_what_is_no_seconds(
        arg: str, bad: tuple[object, ...], error: type[Exception], phrase: str) -> None:
    for value in bad:
        spawn: Callable[..., Awaitable[meshio.ProcMesh]] = meshio.this_host().spawn_procs
        with pytest.raises(error, match=rf"spawn_procs: .*{phrase}") as refused:
            await spawn(per_host={"procs": 1}, **{arg: value})
        assert repr(value) in str(refused.value), (arg, value, str(refused.value))
        if value is HUGE:
            assert "too large, more than a float holds" in str(refused.value)


async def test_the_options_of_calls_and_meshes_refuse_what_is_no_seconds(
        procs: meshio.ProcMesh) -> None:
    echo = await procs.spawn("echo", Echo)
    for value in (NAN, True, "1", 0, -1.0, HUGE):
        with pytest.raises(ValueError, match=r"options\(timeout=...\) must be a positive number"):
            echo.echo.options(timeout=value)  # type: ignore[arg-type]
    for value in (NAN, True, "1", 0, math.inf, HUGE):
        with pytest.raises(ValueError, match=r"options\(stall_after=...\) must be a positive"):
            procs.options(stall_after=value)  # type: ignore[arg-type]
    # an int no float holds is told so, not only that it must be positive
    huge = r"got 10+: too large, more than a float holds"
    with pytest.raises(ValueError, match=huge):
        echo.echo.options(timeout=HUGE)
    with pytest.raises(ValueError, match=huge):
        procs.options(stall_after=HUGE)
    for value in (NAN, True, "1", 0, HUGE):
        with pytest.raises(ValueError, match=r"stacks\(timeout=...\) must be seconds > 0"):
            await procs.stacks(timeout=value)  # type: ignore[arg-type]
    # what is seconds still is (infinity: no bound), and calls go on as before
    assert set((await echo.echo.options(timeout=math.inf).call(3)).values()) == {3}
    assert set((await echo.echo.options(timeout=30).call(4)).values()) == {4}
