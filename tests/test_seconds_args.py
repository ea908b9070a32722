"""Every public argument that is a number of seconds is checked by one rule,
with one message naming the function and the argument
(``Retry(backoff=...) must be a number of seconds, got '1' (str)``):

- what is no number is a ``TypeError``: a str, None (where None means
  nothing), a bool (an int to Python: ``True`` was one second);
- a number out of range is a ``ValueError``: negative, 0 where the function
  needs time, NaN (which compares false with everything: a bare ``> 0``
  let it through, and ``options(timeout=nan)`` made every call time out at
  once), ``math.inf`` where it means no limit to that function, and an int
  no float holds (``10**400``: taken, it raised ``OverflowError`` later,
  from the call or from the timer), which the message calls too large.

The rules differed from place to place before: ``Retry(backoff="1")`` and
``options(timeout="1")`` were ValueErrors, ``Supervisor(within="1")`` a
TypeError.  What every place takes is still taken: ``math.inf`` where it is
"no limit", 0 where it is allowed, None where it means the default.

Any real number that is no bool is seconds, NumPy scalars too
(``numpy.float32(0.5)``, ``numpy.int64(3)``: a timeout computed with NumPy
was a TypeError unless a ``float64``), taken as the float it is: a call
made with one answers (kept as given, a ``numpy.float32`` timeout failed
to encode on the wire).  ``numpy.bool_`` and complex numbers are still
refused as no number."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import meshio
from meshio import Actor, RDMABuffer, endpoint
from meshio._checks import check_seconds
from meshio.jobs import KubernetesJob, ProcessJob, SlurmJob
from meshio.jobs._agent import serve_agent
from meshio.store import WeightStore
from meshio.testing import child_pids, in_process_host, wait_exited

#: an int beyond a float's range: a number, but of no seconds
HUGE = 10**400


class Echo(Actor):
    @endpoint
    async def echo(self, x: int) -> int:
        return x


class Given:
    """What a place needs to be called: a directory, and (made on first use,
    stopped after the test) an in-process proc mesh with an actor on it."""

    def __init__(self, tmp_path: Path, stack: contextlib.AsyncExitStack) -> None:
        self.tmp_path = tmp_path
        self._stack = stack
        self._procs: meshio.ProcMesh | None = None
        self._echo: Echo | None = None  # (an actor mesh, typed as its actor)

    async def procs(self) -> meshio.ProcMesh:
        if self._procs is None:
            self._procs = await self._stack.enter_async_context(
                in_process_host().spawn_procs(per_host={"procs": 1}))
        return self._procs

    async def echo(self) -> Echo:
        if self._echo is None:
            self._echo = await (await self.procs()).spawn("echo", Echo)
        return self._echo


@pytest.fixture
async def given(tmp_path: Path, restore_limits: None) -> AsyncIterator[Given]:
    async with contextlib.AsyncExitStack() as stack:
        yield Given(tmp_path, stack)


Call = Callable[[Given, Any], Awaitable[object]]


@dataclass(frozen=True)
class Place:
    """A public argument that is seconds, and what it takes besides seconds > 0."""

    where: str  # the function, as the message names it
    arg: str
    call: Call  # calls it with a value (may raise before anything is done)
    zero: bool = False  # 0 is taken
    inf: bool = True  # math.inf is taken (no limit)
    none: bool = False  # None is taken (the default)
    str_is_value: bool = False  # a str is of its type (shutdown="brutal_kill")
    method: str = ""  # the method, where the message names the function only

    def __str__(self) -> str:
        return f"{self.method or self.where}({self.arg})"


def spawn(arg: str) -> Call:
    async def call(g: Given, v: Any) -> object:
        kw: dict[str, Any] = {arg: v}
        return meshio.this_host().spawn_procs(per_host={"procs": 1}, **kw)
    return call


async def endpoint_options(g: Given, v: Any) -> object:
    return (await g.echo()).echo.options(timeout=v)


async def procs_options(g: Given, v: Any) -> object:
    return (await g.procs()).options(stall_after=v)


async def procs_stacks(g: Given, v: Any) -> object:
    return await (await g.procs()).stacks(timeout=v)


async def actors_stacks(g: Given, v: Any) -> object:
    return await (await g.echo()).stacks(timeout=v)


async def stats(g: Given, v: Any) -> object:
    return await meshio.stats(timeout=v)


async def rdma_options(g: Given, v: Any) -> object:
    return RDMABuffer(bytearray(8)).options(timeout=v)


async def store_read(g: Given, v: Any) -> object:
    return await WeightStore("weights").read(timeout=v)


async def store_read_into(g: Given, v: Any) -> object:
    return await WeightStore("weights").read_into({}, timeout=v)


async def doctor(g: Given, v: Any) -> object:
    return await meshio.doctor(timeout=v)


async def exited(g: Given, v: Any) -> object:
    await wait_exited(-1, v)  # (checked before the pidfd is)
    return None


async def agent(g: Given, v: Any) -> object:
    await serve_agent("127.0.0.1:0", b"s" * 32, idle_timeout=v)
    return None


def sync(make: Callable[[Given, Any], object]) -> Call:
    async def call(g: Given, v: Any) -> object:
        return make(g, v)
    return call


PLACES: list[Place] = [
    Place("Endpoint.options", "timeout", endpoint_options, none=True),
    Place("ProcMesh.options", "stall_after", procs_options, inf=False, none=True),
    Place("stacks", "timeout", procs_stacks, method="ProcMesh.stacks"),
    Place("stacks", "timeout", actors_stacks, method="ActorMesh.stacks"),
    Place("stats", "timeout", stats),
    Place("RDMABuffer.options", "timeout", rdma_options, none=True),
    Place("Retry", "backoff", sync(lambda g, v: meshio.Retry(backoff=v)), zero=True, inf=False),
    Place("Supervisor", "within", sync(lambda g, v: meshio.Supervisor(within=v))),
    Place("Supervisor", "heartbeat_interval",
          sync(lambda g, v: meshio.Supervisor(heartbeat_interval=v))),
    Place("Supervisor", "heartbeat_timeout",
          sync(lambda g, v: meshio.Supervisor(heartbeat_timeout=v)), none=True),
    Place("HostMesh.spawn_procs", "shutdown", spawn("shutdown"), zero=True, str_is_value=True),
    Place("HostMesh.spawn_procs", "heartbeat_interval", spawn("heartbeat_interval")),
    Place("HostMesh.spawn_procs", "heartbeat_timeout", spawn("heartbeat_timeout"), none=True),
    Place("HostMesh.spawn_procs", "partition_timeout", spawn("partition_timeout"), inf=False),
    Place("HostMesh.spawn_procs", "keep_alive", spawn("keep_alive"), inf=False, none=True),
    Place("set_limits", "frame_timeout", sync(lambda g, v: meshio.set_limits(frame_timeout=v)),
          none=True),
    Place("set_limits", "busy_poll", sync(lambda g, v: meshio.set_limits(busy_poll=v)),
          zero=True, none=True),
    Place("WeightStore.read", "timeout", store_read, zero=True, none=True),
    Place("WeightStore.read_into", "timeout", store_read_into, zero=True, none=True),
    Place("ProcessJob", "idle_timeout", sync(lambda g, v: ProcessJob(
        meshes={"a": 1}, cache_dir=g.tmp_path, idle_timeout=v))),
    Place("SlurmJob", "idle_timeout", sync(lambda g, v: SlurmJob(
        meshes={"a": 1}, cache_dir=g.tmp_path, idle_timeout=v))),
    Place("SlurmJob", "start_timeout", sync(lambda g, v: SlurmJob(
        meshes={"a": 1}, cache_dir=g.tmp_path, start_timeout=v))),
    Place("KubernetesJob", "idle_timeout", sync(lambda g, v: KubernetesJob(
        meshes={"a": 1}, image="i", cache_dir=g.tmp_path, idle_timeout=v)), none=True),
    # (finite: the watch of the pods takes whole seconds)
    Place("KubernetesJob", "start_timeout", sync(lambda g, v: KubernetesJob(
        meshes={"a": 1}, image="i", cache_dir=g.tmp_path, start_timeout=v)), inf=False),
    Place("serve_agent", "idle_timeout", agent, none=True),
    Place("doctor", "timeout", doctor, inf=False),
    Place("wait_exited", "timeout", exited),
]


def bad_values(place: Place) -> list[tuple[str, object, type[Exception]]]:
    """(case, value, the error it gets) for every value ``place`` refuses."""
    cases: list[tuple[str, object, type[Exception]]] = [
        ("str", "1", ValueError if place.str_is_value else TypeError),
        ("bool", True, TypeError),
        ("negative", -1.0, ValueError),
        ("nan", math.nan, ValueError),
        ("10**400", HUGE, ValueError),
    ]
    if not place.zero:
        cases.append(("zero", 0, ValueError))
    if not place.inf:
        cases.append(("inf", math.inf, ValueError))
    if not place.none:
        cases.append(("None", None, TypeError))
    return cases


CASES = [(place, value, error) for place in PLACES for _, value, error in bad_values(place)]
IDS = [f"{place}-{case}" for place in PLACES for case, _, _ in bad_values(place)]


@pytest.mark.parametrize(("place", "value", "error"), CASES, ids=IDS)
async def test_what_is_no_seconds_is_refused_naming_the_argument(
        given: Given, place: Place, value: object, error: type[Exception]) -> None:
    children = child_pids()
    with pytest.raises(error) as refused:
        await place.call(given, value)
    message = str(refused.value)
    assert type(refused.value) is error, message
    assert message.startswith(f"{place.where}({place.arg}=...) must be "), message
    assert repr(value) in message, message
    if value is HUGE:
        assert "too large, more than a float holds" in message, message
    assert child_pids() == children  # nothing was started


def env(name: str) -> str | None:
    return os.environ.get(f"MESHIO_{name.upper()}")


#: (the place and value, the call, a value it takes, what the result is
#: then) where taking it is cheap and ends at once
TAKEN: list[tuple[str, Call, object, Callable[[Any], bool]]] = [
    ("Endpoint.options(timeout=inf)", endpoint_options, math.inf,
     lambda ep: isinstance(ep, meshio.Endpoint)),
    ("Endpoint.options(timeout=None)", endpoint_options, None,
     lambda ep: isinstance(ep, meshio.Endpoint)),
    ("ProcMesh.options(stall_after=0.5)", procs_options, 0.5,
     lambda procs: isinstance(procs, meshio.ProcMesh)),
    ("stacks(timeout=inf)", actors_stacks, math.inf,
     lambda stacks: [a.rank for a in stacks.actors] == [0] and not stacks.errors),
    ("stats(timeout=inf)", stats, math.inf, lambda s: isinstance(s, meshio.Stats)),
    ("RDMABuffer.options(timeout=inf)", rdma_options, math.inf,
     lambda buf: isinstance(buf, RDMABuffer)),
    ("Retry(backoff=0)", sync(lambda g, v: meshio.Retry(backoff=v)), 0,
     lambda r: r.delay(1) == 0),
    ("Supervisor(within=inf)", sync(lambda g, v: meshio.Supervisor(within=v)), math.inf,
     lambda s: s.within == math.inf),
    ("Supervisor(heartbeat_timeout=None)",
     sync(lambda g, v: meshio.Supervisor(heartbeat_timeout=v)), None,
     lambda s: s.heartbeat_timeout == 3 * s.heartbeat_interval),
    ("set_limits(busy_poll=0)", sync(lambda g, v: meshio.set_limits(busy_poll=v)), 0,
     lambda _: env("busy_poll") == "0"),
    ("set_limits(frame_timeout=inf)", sync(lambda g, v: meshio.set_limits(frame_timeout=v)),
     math.inf, lambda _: env("frame_timeout") == "inf"),
    ("ProcessJob(idle_timeout=inf)", sync(lambda g, v: ProcessJob(
        meshes={"a": 1}, cache_dir=g.tmp_path, idle_timeout=v)), math.inf,
     lambda job: job.idle_timeout == math.inf),
    ("SlurmJob(start_timeout=inf)", sync(lambda g, v: SlurmJob(
        meshes={"a": 1}, cache_dir=g.tmp_path, start_timeout=v)), math.inf,
     lambda job: job.start_timeout == math.inf),
    ("KubernetesJob(idle_timeout=None)", sync(lambda g, v: KubernetesJob(
        meshes={"a": 1}, image="i", cache_dir=g.tmp_path, idle_timeout=v)), None,
     lambda job: job.idle_timeout is None),
]


@pytest.mark.parametrize(("what", "call", "value", "then"), TAKEN,
                         ids=[row[0] for row in TAKEN])
async def test_what_each_place_took_it_still_takes(given: Given, what: str, call: Call,
                                                   value: object,
                                                   then: Callable[[Any], bool]) -> None:
    result = await call(given, value)
    assert then(result), (what, result)


async def test_a_call_with_an_infinite_or_int_timeout_still_answers(given: Given) -> None:
    echo = await given.echo()
    assert set((await echo.echo.options(timeout=math.inf).call(3)).values()) == {3}
    assert set((await echo.echo.options(timeout=30).call(4)).values()) == {4}


async def test_a_store_read_with_no_time_to_wait_times_out_at_once(given: Given) -> None:
    with pytest.raises(TimeoutError):  # nothing published: 0 s is a wait that ends at once
        await WeightStore("weights").read(timeout=0)


@pytest.mark.parametrize("value", [np.float32(0.5), np.float16(2), np.float64(0.25),
                                   np.int64(3), np.uint8(1), np.int32(0)],
                         ids=lambda v: f"{type(v).__name__}({v})")
def test_numpy_scalars_are_seconds_taken_as_floats(value: object) -> None:
    taken = check_seconds(value, "f", "timeout", zero=True)
    assert type(taken) is float
    assert taken == float(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "error"), [
    (np.bool_(True), TypeError), (np.complex64(1), TypeError), (1j, TypeError),
    (np.float32("nan"), ValueError), (np.float32(-1), ValueError), (np.int64(0), ValueError),
    (np.float64("inf"), ValueError)], ids=repr)
def test_numpy_values_that_are_no_seconds_are_refused(value: object,
                                                      error: type[Exception]) -> None:
    with pytest.raises(error) as refused:
        check_seconds(value, "f", "timeout", inf=False)
    assert type(refused.value) is error
    assert str(refused.value).startswith("f(timeout=...) must be "), refused.value
    assert repr(value) in str(refused.value)


async def test_a_call_with_a_numpy_timeout_answers(given: Given) -> None:
    echo = await given.echo()
    # (Any: typed, these arguments are floats; a NumPy scalar passes as one at run time)
    f32: Any = np.float32(30)
    i64: Any = np.int64(30)
    assert set((await echo.echo.options(timeout=f32).call(3)).values()) == {3}
    assert set((await echo.echo.options(timeout=i64).call(4)).values()) == {4}
    half: Any = np.float32(0.5)
    assert meshio.Retry(backoff=half).delay(1) == 0.5
    job = ProcessJob(meshes={"a": 1}, cache_dir=given.tmp_path, idle_timeout=i64)
    assert type(job.idle_timeout) is float and job.idle_timeout == 30.0
