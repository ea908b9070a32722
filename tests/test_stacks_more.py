"""``stacks()`` sees every actor of a process: one whose constructor is
still running (a model loading in ``__init__``) shows where it is, and a
frame whose file name UTF-8 cannot carry does not lose the process's
stacks."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import FrameType

import pytest

import meshio
from fifo_gate import Gate, hold
from meshio import Actor, ActorStacks, StackFrame, Stacks, endpoint
from meshio.testing import in_process_host

GUARD = 30.0
HERE = str(Path(__file__).resolve())
#: a file name decoded from bytes that are not UTF-8 (``b"caf\xe9.py"``), as
#: Python decodes file names (``surrogateescape``)
UNDECODABLE = "caf\udce9.py"

pytestmark = pytest.mark.meshio_transports("processes", "in-process")


def load_model(ready: str, release: str) -> None:
    hold(ready, release)  # the constructor waits here


class Loading(Actor):
    """Its ``__init__`` waits at the gate (as loading a model takes long)."""

    def __init__(self, ready: str, release: str) -> None:
        load_model(ready, release)

    @endpoint
    async def ping(self) -> int:
        return 1


class Ready(Actor):
    @endpoint
    async def ping(self) -> int:
        return 2


class Strange(Actor):
    """Runs code compiled from a file whose name UTF-8 cannot carry."""

    @endpoint
    def block(self, where: str, ready: str, release: str) -> None:
        source = "def blocked(hold, ready, release):\n    hold(ready, release)\n"
        ns: dict[str, object] = {}
        exec(compile(source, f"{where}/{UNDECODABLE}", "exec"), ns)
        ns["blocked"](hold, ready, release)  # type: ignore[operator]


def frame_at(frames: tuple[StackFrame, ...], function: str) -> StackFrame:
    return next(f for f in frames if f.function == function)


@pytest.mark.meshio_procs(per_host={"procs": 1})
async def test_an_actor_whose_constructor_runs_shows_where_it_is(
        procs: meshio.ProcMesh, tmp_path: Path) -> None:
    """While ``Loading.__init__`` waits in the actor's thread, the
    process's stacks list it, constructing, with its thread's frames, beside
    the actors already built; once built it is an ordinary idle actor."""
    gate = Gate(tmp_path)
    ready = await procs.spawn("ready", Ready)
    spawning = asyncio.ensure_future(procs.spawn("loading", Loading, gate.ready, gate.release))
    try:
        async with asyncio.timeout(GUARD):
            await gate.wait_held(GUARD)
            stacks = await procs.stacks()
    finally:
        await gate.open()
    loading = await asyncio.wait_for(spawning, GUARD)

    assert not stacks.errors
    assert [(a.actor, a.rank) for a in stacks.actors] == [("loading", 0), ("ready", 0)]
    assert [a.constructing for a in stacks.actors] == [True, False]
    building, built = stacks.actors
    assert building.endpoint is None and building.running_for is not None
    assert building.running_for >= 0 and not building.idle and built.idle
    assert building.pid == procs.pids[0] and building.point == {"procs": 0}
    init = frame_at(building.thread, "Loading.__init__")
    assert init.file == HERE and init.code == "load_model(ready, release)"
    load = frame_at(building.thread, "load_model")
    assert load.file == HERE and load.code.startswith("hold(ready, release)")
    innermost = building.innermost()
    assert innermost is not None and innermost.function == "hold"
    text = stacks.text()
    assert text.startswith("loading rank 0: constructing, in hold at fifo_gate.py:"), text
    assert f'File "{HERE}", line {load.line}, in load_model' in text
    assert "  thread:\n" in text and "ready rank 0: idle\n" in text
    assert Stacks.from_json(stacks.json()) == stacks

    after = await procs.stacks()
    assert [(a.actor, a.constructing, a.idle) for a in after.actors] == [
        ("loading", False, True), ("ready", False, True)]
    assert await loading.ping.call_one() == 1 and await ready.ping.call_one() == 2


@pytest.mark.meshio_procs(per_host={"procs": 1})
async def test_a_file_name_utf8_cannot_carry_loses_no_stacks(
        procs: meshio.ProcMesh, tmp_path: Path) -> None:
    """A frame of a file whose name holds undecodable bytes is sent with
    those bytes escaped; the process's other actors and frames come too."""
    gate = Gate(tmp_path)
    strange = await procs.spawn("strange", Strange)
    await procs.spawn("ready", Ready)
    call = asyncio.ensure_future(
        strange.block.call_one(str(tmp_path), gate.ready, gate.release))
    try:
        async with asyncio.timeout(GUARD):
            await gate.wait_held(GUARD)
            stacks = await procs.stacks()
            own = await strange.stacks()
    finally:
        await gate.open()
    await asyncio.wait_for(call, GUARD)

    assert not stacks.errors and not own.errors
    assert [a.actor for a in stacks.actors] == ["ready", "strange"]
    blocking: ActorStacks = stacks.actors[1]
    assert blocking.endpoint == "Strange.block"
    frame = frame_at(blocking.thread, "blocked")
    assert frame.file == f"{tmp_path}/caf\\xe9.py" and frame.line == 2
    assert frame_at(blocking.thread, "Strange.block").file == HERE
    [alone] = own.actors
    assert frame_at(alone.thread, "blocked") == frame
    assert f'File "{tmp_path}/caf\\xe9.py", line 2, in blocked' in stacks.text()
    assert Stacks.from_json(stacks.json()) == stacks


class Idle(Actor):
    @endpoint
    async def ping(self) -> int:
        return 1


async def test_the_stacks_of_many_actors_read_the_threads_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every actor has a thread of its own, and each one's stacks read the
    frames of every thread of the process (``sys._current_frames()``): once
    per actor, a process of 2,000 actors took 2 s to answer, its loop held
    (past the heartbeat timeout at ~3,000).  Now once per request (in-process
    workers: this process's threads are theirs)."""
    async with in_process_host().spawn_procs(per_host={"procs": 2}) as procs:
        for i in range(10):
            await procs.spawn(f"idle{i}", Idle)
        reads = 0
        current_frames = sys._current_frames

        def counted() -> dict[int, FrameType]:
            nonlocal reads
            reads += 1
            return current_frames()
        monkeypatch.setattr(sys, "_current_frames", counted)
        stacks = await asyncio.wait_for(procs.stacks(), GUARD)
    assert not stacks.errors and len(stacks.actors) == 20
    assert reads == 2, reads  # one per process asked, not one per actor


async def test_the_stacks_of_a_stopped_actor_mesh_say_it_was_stopped() -> None:
    """The stacks of a stopped actor, as its calls, say it was stopped (they
    listed no actor and no error line), and once its proc mesh is stopped
    say that, as the proc mesh's stacks do (they said "connection
    refused")."""
    async with in_process_host().spawn_procs(per_host={"procs": 3}) as procs:
        idle = await procs.spawn("idle", Idle)
        await idle.slice(procs=1).stop()
        some = await asyncio.wait_for(idle.stacks(), GUARD)
        assert [a.rank for a in some.actors] == [0, 2]
        assert some.errors == ("actor mesh 'idle' rank 1 was stopped",)
        await idle.stop()
        stopped = await asyncio.wait_for(idle.stacks(), GUARD)
        assert stopped == Stacks((), ("actor mesh 'idle' was stopped",))
        assert "error: actor mesh 'idle' was stopped" in stopped.text()
        with pytest.raises(ValueError, match="timeout"):
            await idle.stacks(timeout=0)
    gone = await asyncio.wait_for(idle.stacks(), GUARD)
    assert gone == Stacks((), ("actor mesh 'idle': proc mesh 'procs' was stopped",))
    assert (await procs.stacks()).errors == ("proc mesh 'procs' was stopped",)
