"""``procs.options(restart=...)``: meshio's spawn options kept apart from the
constructor arguments of the user's class, on a proc mesh and on a reference
to one held by an actor."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import AsyncIterator

import pytest

import meshio
from meshio import Actor, ProcMesh, SchemaError, endpoint
from meshio.supervision import ManualClock, SupervisionEvent

#: generous bound on any single wait on a loaded machine
DEADLINE = 30.0


class W(Actor):
    def __init__(self, k: int) -> None:
        self.k = k

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Spawner(Actor):
    @endpoint
    async def spawn_temporary(self, procs: ProcMesh) -> W:
        return await procs.options(restart="temporary").spawn("temp", W, 2)



async def next_restart(events: AsyncIterator[SupervisionEvent]) -> SupervisionEvent:
    """The next ``"restart"`` event of a supervisor's ``events()``."""
    async for event in events:
        if event.kind == "restart":
            return event
    raise AssertionError("events() ended")

async def test_restart_option_through_a_reference() -> None:
    """issue 9 (types): ``options(restart=...)`` on a proc mesh reference held
    by an actor reaches the owning controller: a temporary actor mesh spawned
    that way is not rebuilt when its process is restarted."""
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0, clock=ManualClock())
    events = sup.events()
    async with meshio.this_host().spawn_procs(name="w", supervisor=sup) as procs, \
            meshio.this_host().spawn_procs(name="spawner") as other:
        keep = await procs.spawn("keep", W, 1)  # permanent: the process is restarted
        spawner = await other.spawn("spawner", Spawner)
        temp = await spawner.spawn_temporary.call_one(procs)
        old = await temp.pid.call_one()
        os.kill(old, signal.SIGKILL)
        restart = await asyncio.wait_for(next_restart(events), DEADLINE)
        assert await keep.pid.call_one() == restart.pid != old
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(temp.pid.call_one(), DEADLINE)
        assert "temporary" in str(ei.value)
    await events.aclose()


class Options(Actor):
    """Takes any keyword, ``restart`` too."""

    def __init__(self, k: int, **options: str) -> None:
        self.options = options

    @endpoint
    def options_given(self) -> dict[str, str]:
        return self.options


async def test_restart_keyword_goes_to_the_constructor() -> None:
    """issue 9 (types): ``spawn(..., restart=...)`` no longer means a meshio
    option: it is a constructor argument, so a class without one fails with a
    SchemaError naming it (the old form does not silently succeed) and saying
    where the option went; a class that takes it gets it, and its other
    errors say nothing of the option."""
    async with meshio.this_host().spawn_procs() as procs:
        with pytest.raises(SchemaError, match=r"W\.__init__\(\).*unexpected.*'restart'.*; "
                           r"restart is no argument of spawn.*procs\.options\("
                           r"restart='transient'\)\.spawn\('w', W, \.\.\.\)"):
            await procs.spawn("w", W, 1, restart="transient")  # type: ignore[call-arg]
        taken = await procs.spawn("o", Options, 1, restart="transient")
        assert await taken.options_given.call_one() == {"restart": "transient"}
        with pytest.raises(SchemaError, match=r"missing required argument") as missing:
            await procs.spawn("p", Options, restart="transient")  # type: ignore[call-arg]
        assert "procs.options" not in str(missing.value)
        with pytest.raises(ValueError, match=r"options\(restart=\.\.\.\) must be"):
            procs.options(restart="sometimes")  # type: ignore[arg-type]


def _name_limit() -> int:
    """The most bytes a proc mesh's name may have, as spawn_procs says when
    it refuses one (its workers' Unix socket addresses hold the name)."""
    with pytest.raises(ValueError, match=r"at most (\d+) fit") as refused:
        meshio.this_host().spawn_procs(name="n" * 300)
    found = re.search(r"at most (\d+) fit", str(refused.value))
    assert found is not None
    return int(found.group(1))


async def test_a_name_too_long_for_the_workers_sockets_is_refused_by_the_call() -> None:
    """A name longer than its workers' Unix socket addresses hold was taken,
    and then every worker failed to start (``OSError: AF_UNIX path too
    long``, a traceback each: ProcessStartError).  The call itself raises
    ValueError now, before any process starts, saying how long the name is
    and how long it may be (in bytes: ``é`` is two)."""
    host = meshio.this_host()
    with pytest.raises(ValueError) as refused:
        host.spawn_procs(per_host={"procs": 2}, name="n" * 300)  # not even awaited
    message = str(refused.value)
    assert message.startswith("spawn_procs: proc mesh name 'nnn"), message
    assert "is 300 bytes long; at most" in message and "108 bytes" in message, message
    limit = _name_limit()
    assert 30 < limit < 100
    with pytest.raises(ValueError, match=rf"is {limit + 1} bytes long; at most {limit} fit"):
        host.spawn_procs(name="n" * (limit + 1), keep_alive=30)
    wide = "é" * (limit // 2 + 1)
    with pytest.raises(ValueError, match=rf"is {2 * len(wide)} bytes long; at most {limit}"):
        host.spawn_procs(name=wide)
    with pytest.raises(ValueError, match=r"spawn_procs: a proc mesh's name cannot have a NUL"):
        host.spawn_procs(name="a\0b")


async def test_the_longest_name_serves_grows_and_restarts() -> None:
    """The limit is the workers' real one: a mesh with a name of exactly as
    many bytes starts, grows (a grown process's address has the grow's
    number) and has a grown process replaced (a replacement listens at a
    longer address yet) under a supervisor."""
    name = "n" * _name_limit()
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0, clock=ManualClock())
    events = sup.events()
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name=name,
                                              supervisor=sup) as procs:
        w = await procs.spawn("w", W, 1)
        await asyncio.wait_for(procs.grow(procs=1), DEADLINE)
        grown = procs.pids[1]
        assert list((await w.pid.call()).values()) == procs.pids
        os.kill(grown, signal.SIGKILL)
        restart = await asyncio.wait_for(next_restart(events), DEADLINE)
        assert (restart.mesh, restart.rank) == (name, 1) and restart.pid != grown
        assert list((await w.pid.call()).values()) == [procs.pids[0], restart.pid]
    await events.aclose()


async def test_a_name_that_is_no_str_is_a_type_error() -> None:
    """``spawn_procs(name=123, keep_alive=5)`` raised ``TypeError: argument of
    type 'int' is not iterable`` (from the file-name check); without
    ``keep_alive`` a name of any type was taken.  Now a TypeError names the
    argument and what it got."""
    host = meshio.this_host()
    for bad in (123, None, b"procs"):
        for keep_alive in (None, 5.0):
            with pytest.raises(TypeError) as refused:
                host.spawn_procs(name=bad, keep_alive=keep_alive)  # type: ignore[arg-type]
            assert str(refused.value) == (
                f"spawn_procs: name must be a str, got {type(bad).__name__} {bad!r}")
    # bytes that were not UTF-8, as os.fsdecode gives them (a lone surrogate):
    # a UnicodeEncodeError out of the launcher, the workers half started
    for keep_alive in (None, 5.0):
        with pytest.raises(ValueError, match=r"spawn_procs: a proc mesh's name must be text "
                                             r"UTF-8 can encode, got 'caf\\udce9'"):
            host.spawn_procs(name=os.fsdecode(b"caf\xe9"), keep_alive=keep_alive)


async def test_a_supervisor_that_is_no_supervisor_is_a_type_error() -> None:
    """``spawn_procs(supervisor=5)`` failed with ``AttributeError: 'int'
    object has no attribute 'clock'``; ``reattach`` the same."""
    host = meshio.this_host()
    with pytest.raises(TypeError, match=r"spawn_procs: supervisor must be a meshio\.Supervisor "
                       r"or None, got int 5"):
        host.spawn_procs(supervisor=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"reattach: supervisor must be a meshio\.Supervisor "
                       r"or None, got str 'sup'"):
        await host.reattach("procs", supervisor="sup")  # type: ignore[arg-type]
