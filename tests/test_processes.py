"""Real process faults: workers killed, exiting or crashing mid-call, and
controllers killed or exiting without cleaning up.

Nothing here sleeps to wait: deaths are observed through pidfds, replies
through futures, subprocess progress through lines on a pipe, each with a
generous deadline so that a regression fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import resource
import select
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import meshio
from log_watch import loop_reports
from meshio import Actor, endpoint
from meshio.testing import child_pids, wait_exited

#: generous bound on any single wait on a loaded machine
DEADLINE = 30.0
#: a dead worker's callers must hear about it well within this
PROMPT = 10.0


class Victim(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def echo(self, x: int) -> int:
        return x

    @endpoint
    async def hang(self) -> None:
        await asyncio.Event().wait()

    @endpoint
    async def exit(self, code: int) -> None:
        os._exit(code)

    @endpoint
    async def segfault(self) -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
        ctypes.string_at(0)


class DiesInInit(Actor):
    def __init__(self, rank: int, code: int) -> None:
        if meshio.current_rank().rank == rank:
            os._exit(code)

    @endpoint
    async def echo(self, x: int) -> int:
        return x


class Sink(Actor):
    @endpoint
    async def length(self, data: bytes) -> int:
        return len(data)


# ----------------------------------------------------------------- helpers


class PidWatch:
    """pidfds opened while the processes are known alive (no pid reuse race)."""

    def __init__(self, pids: list[int]) -> None:
        self.fds: dict[int, int] = {}
        self.gone: set[int] = set()  # already gone when we looked
        for pid in pids:
            try:
                self.fds[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                self.gone.add(pid)

    def exited(self) -> set[int]:
        ready, _, _ = select.select(list(self.fds.values()), [], [], 0)
        return self.gone | {pid for pid, fd in self.fds.items() if fd in ready}

    def wait_all(self, deadline: float = DEADLINE) -> set[int]:
        """Block until every process has exited or ``deadline`` passes; the
        pids still running."""
        end = time.monotonic() + deadline
        alive = dict(self.fds)
        while alive:
            left = end - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select(list(alive.values()), [], [], left)
            for pid in [p for p, fd in alive.items() if fd in ready]:
                del alive[pid]
        return set(alive)

    async def wait_one(self, pid: int, deadline: float = DEADLINE) -> None:
        await wait_exited(self.fds[pid], deadline)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)


@pytest.fixture
def watch() -> Iterator[list[PidWatch]]:
    made: list[PidWatch] = []
    yield made
    for w in made:
        w.close()


def watch_pids(made: list[PidWatch], pids: list[int]) -> PidWatch:
    w = PidWatch(pids)
    made.append(w)
    return w


@pytest.fixture
async def victims() -> AsyncIterator[tuple[meshio.ProcMesh, Victim]]:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, name="doomed") as pm:
        yield pm, await pm.spawn("victims", Victim)


async def start_hang(mesh: Victim, rank: int) -> asyncio.Future[None]:
    """A call to ``hang`` on ``rank``, known to be running in the actor: a
    later call queued behind it would not be answered, so we prove the hang
    started by seeing an earlier call to the same actor answered first."""
    one = mesh.slice(procs=rank)
    assert await asyncio.wait_for(one.echo.call_one(x=1), DEADLINE) == 1
    fut = asyncio.ensure_future(one.hang.call_one())
    return fut


async def check_dead_rank(mesh: Victim, pm: meshio.ProcMesh, rank: int, pid: int,
                          err: meshio.SupervisionError, cause: str) -> None:
    """What every death must look like to the caller, and afterwards."""
    text = str(err)
    assert not isinstance(err, meshio.ActorError)
    assert cause in text and cause in err.cause
    assert str(pid) in text and err.pid == pid
    assert "victims" in text and err.actor == "victims"  # the actor mesh
    assert f"proc mesh 'doomed' rank {rank}" in text
    # later calls to the dead rank fail at once, with the same kind of error
    t0 = time.monotonic()
    for adverb in ("call_one", "choose"):
        with pytest.raises(meshio.SupervisionError) as again:
            await asyncio.wait_for(getattr(mesh.slice(procs=rank).echo, adverb)(x=2), DEADLINE)
        assert str(pid) in str(again.value)
    # nothing restarts it: a call to the whole mesh has it as a hole (its
    # value raises the error), the other rank's value is there
    values = await asyncio.wait_for(mesh.echo.call(x=3), DEADLINE)
    assert [p.rank for p in values.holes] == [rank] and values.values() == [3]
    with pytest.raises(meshio.SupervisionError) as whole:
        values.item(procs=rank)
    assert whole.value.rank == rank and str(pid) in str(whole.value)
    assert time.monotonic() - t0 < PROMPT
    # the other rank is unaffected
    other = 1 - rank
    assert await asyncio.wait_for(mesh.slice(procs=other).echo.call_one(x=4), DEADLINE) == 4
    assert await asyncio.wait_for(mesh.slice(procs=other).pid.call_one(), DEADLINE) \
        == pm.pids[other]


# ------------------------------------------------------ deaths mid-call


async def test_sigkill_during_call(victims: tuple[meshio.ProcMesh, Victim],
                                   watch: list[PidWatch]) -> None:
    pm, mesh = victims
    pid = await asyncio.wait_for(mesh.slice(procs=0).pid.call_one(), DEADLINE)
    assert pid == pm.pids[0]
    w = watch_pids(watch, [pid])
    fut = await start_hang(mesh, 0)
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(meshio.SupervisionError) as info:
        await asyncio.wait_for(fut, DEADLINE)
    assert time.monotonic() - t0 < PROMPT
    assert w.exited() == {pid}
    await check_dead_rank(mesh, pm, 0, pid, info.value, "SIGKILL")


async def test_os_exit_inside_endpoint(victims: tuple[meshio.ProcMesh, Victim]) -> None:
    pm, mesh = victims
    pid = pm.pids[1]
    t0 = time.monotonic()
    with pytest.raises(meshio.SupervisionError) as info:
        await asyncio.wait_for(mesh.slice(procs=1).exit.call_one(code=3), DEADLINE)
    assert time.monotonic() - t0 < PROMPT
    await check_dead_rank(mesh, pm, 1, pid, info.value, "exited with code 3")


async def test_segfault_inside_endpoint(victims: tuple[meshio.ProcMesh, Victim]) -> None:
    pm, mesh = victims
    pid = pm.pids[0]
    t0 = time.monotonic()
    with pytest.raises(meshio.SupervisionError) as info:
        await asyncio.wait_for(mesh.slice(procs=0).segfault.call_one(), DEADLINE)
    assert time.monotonic() - t0 < PROMPT
    await check_dead_rank(mesh, pm, 0, pid, info.value, "SIGSEGV")


async def test_death_fails_every_call_in_flight_on_that_rank(
        victims: tuple[meshio.ProcMesh, Victim], watch: list[PidWatch]) -> None:
    """A whole-mesh call whose ranks die one after the other (nothing
    restarts them): both are holes of its ValueMesh, each value raising its
    own cause; calls queued behind a hang on a dying rank fail."""
    pm, mesh = victims
    w = watch_pids(watch, pm.pids)
    hang = await start_hang(mesh, 1)
    queued: list[asyncio.Future[Any]] = [
        asyncio.ensure_future(mesh.slice(procs=1).echo.call_one(x=i)) for i in range(5)]
    whole = asyncio.ensure_future(mesh.exit.call(code=7))
    await w.wait_one(pm.pids[0])  # rank 0 exits by itself...
    assert not whole.done()  # ...rank 1 cannot: its exit is queued behind the hang
    os.kill(pm.pids[1], signal.SIGKILL)
    values = await asyncio.wait_for(whole, DEADLINE)
    assert [p.rank for p in values.holes] == [0, 1] and values.values() == []
    for rank, cause in ((0, "exited with code 7"), (1, "SIGKILL")):
        with pytest.raises(meshio.SupervisionError, match=cause):
            values.item(procs=rank)
    for f in [hang, *queued]:
        with pytest.raises(meshio.SupervisionError) as each:
            await asyncio.wait_for(f, DEADLINE)
        assert "SIGKILL" in str(each.value)


async def test_killed_idle_worker_fails_next_call(victims: tuple[meshio.ProcMesh, Victim],
                                                  watch: list[PidWatch]) -> None:
    pm, mesh = victims
    pid = pm.pids[1]
    w = watch_pids(watch, [pid])
    os.kill(pid, signal.SIGKILL)
    await w.wait_one(pid)
    with pytest.raises(meshio.SupervisionError) as info:
        await asyncio.wait_for(mesh.slice(procs=1).echo.call_one(x=1), DEADLINE)
    assert str(pid) in str(info.value)
    assert await asyncio.wait_for(mesh.slice(procs=0).echo.call_one(x=5), DEADLINE) == 5


async def test_stop_after_worker_death_is_clean(watch: list[PidWatch]) -> None:
    pm = await meshio.this_host().spawn_procs(per_host={"procs": 2})
    try:
        w = watch_pids(watch, pm.pids)
        os.kill(pm.pids[0], signal.SIGKILL)
        await w.wait_one(pm.pids[0])
    finally:
        await asyncio.wait_for(pm.stop(), DEADLINE)
    assert w.exited() == set(pm.pids)


async def test_death_in_constructor_fails_spawn(watch: list[PidWatch]) -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, name="doomed") as pm:
        w = watch_pids(watch, pm.pids)
        t0 = time.monotonic()
        with pytest.raises(meshio.SupervisionError) as info:
            await asyncio.wait_for(pm.spawn("dies", DiesInInit, 1, 5), DEADLINE)
        assert time.monotonic() - t0 < PROMPT
        text = str(info.value)
        assert "exited with code 5" in text and str(pm.pids[1]) in text
        assert "DiesInInit.__init__" in text and "doomed" in text
        assert w.exited() == {pm.pids[1]}
        # the surviving process still hosts new actors (the failed mesh is gone)
        ok = await asyncio.wait_for(pm.slice(procs=0).spawn("dies", DiesInInit, 1, 5), DEADLINE)
        assert await asyncio.wait_for(ok.echo.call_one(x=8), DEADLINE) == 8


async def test_stream_with_dying_rank(victims: tuple[meshio.ProcMesh, Victim]) -> None:
    """Ranks dying mid-call with nothing to restart them are holes: the
    stream skips them; a later stream has nothing to yield."""
    pm, mesh = victims
    got = [point.rank async for point, _ in mesh.exit.stream(code=9)]
    assert got == [] and [p.rank for p in pm.holes] == [0, 1]
    assert [point async for point, _ in mesh.echo.stream(x=1)] == []


async def test_large_payload_to_dying_worker(watch: list[PidWatch]) -> None:
    """Calls carrying 32 MiB each, queued behind a call that kills the
    process: every one fails with SupervisionError; none hangs."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name="doomed") as pm:
        w = watch_pids(watch, pm.pids)
        sink = await pm.spawn("sink", Sink)
        victim = await pm.spawn("victims", Victim)
        data = b"x" * (32 << 20)
        assert await asyncio.wait_for(sink.length.call_one(data), DEADLINE) == len(data)
        dying = asyncio.ensure_future(victim.exit.call_one(code=4))
        big = [asyncio.ensure_future(sink.length.call_one(data)) for _ in range(4)]
        results = await asyncio.wait_for(
            asyncio.gather(dying, *big, return_exceptions=True), DEADLINE)
        assert isinstance(results[0], meshio.SupervisionError)
        assert "exited with code 4" in str(results[0])
        # each big call either got through before the exit or failed cleanly
        for r in results[1:]:
            assert r == len(data) or isinstance(r, meshio.SupervisionError), r
        assert w.exited() == set(pm.pids)


async def test_broadcast_to_dead_rank_is_quiet(victims: tuple[meshio.ProcMesh, Victim],
                                               watch: list[PidWatch]) -> None:
    """Fire and forget to a dead process neither raises nor leaves an
    unretrieved-exception report behind; the live rank still gets it."""
    import gc

    pm, mesh = victims
    w = watch_pids(watch, [pm.pids[0]])
    with pytest.raises(meshio.SupervisionError):
        await asyncio.wait_for(mesh.slice(procs=0).exit.call_one(code=2), DEADLINE)
    assert w.exited() == {pm.pids[0]}
    loop = asyncio.get_running_loop()
    reports: list[dict[str, Any]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: reports.append(ctx))
    try:
        mesh.echo.broadcast(x=1)
        mesh.slice(procs=0).echo.broadcast(x=2)
        gc.collect()
        # ordering: a call after the broadcast is answered after it
        assert await asyncio.wait_for(mesh.slice(procs=1).echo.call_one(x=3), DEADLINE) == 3
        gc.collect()
    finally:
        loop.set_exception_handler(old)
    assert reports == []


# ---------------------------------------------------- shutdown, no orphans


async def test_async_with_exit_stops_workers(watch: list[PidWatch]) -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as pm:
        mesh = await pm.spawn("v", Victim)
        pids = pm.pids
        assert sorted((await mesh.pid.call()).values()) == sorted(pids)
        w = watch_pids(watch, pids)
        assert w.exited() == set()
    assert w.exited() == set(pids)  # stopped and reaped by the time __aexit__ returns


async def test_async_with_exit_on_error_stops_workers(watch: list[PidWatch]) -> None:
    with pytest.raises(KeyError, match="boom"):
        async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as pm:
            w = watch_pids(watch, pm.pids)
            raise KeyError("boom")
    assert w.exited() == set(pm.pids)


async def test_explicit_stop_stops_workers(watch: list[PidWatch]) -> None:
    pm = await meshio.this_host().spawn_procs(per_host={"procs": 2})
    mesh = await pm.spawn("v", Victim)
    w = watch_pids(watch, pm.pids)
    hanging = asyncio.ensure_future(mesh.hang.call())
    await asyncio.wait_for(pm.stop(), DEADLINE)
    assert w.exited() == set(pm.pids)
    # a call in flight when the mesh stops fails, and so does any later call
    with pytest.raises(meshio.SupervisionError):
        await asyncio.wait_for(hanging, DEADLINE)
    with pytest.raises(meshio.SupervisionError):
        await asyncio.wait_for(mesh.echo.call(x=1), DEADLINE)
    await asyncio.wait_for(pm.stop(), DEADLINE)  # idempotent


async def test_cancelled_task_inside_async_with_stops_workers(watch: list[PidWatch]) -> None:
    started: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()

    async def body() -> None:
        async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as pm:
            mesh = await pm.spawn("v", Victim)
            await mesh.echo.call(x=1)
            started.set_result(pm.pids)
            await mesh.hang.call()  # forever

    task = asyncio.ensure_future(body())
    pids = await asyncio.wait_for(asyncio.shield(started), DEADLINE)
    w = watch_pids(watch, pids)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, DEADLINE)
    assert w.exited() == set(pids)


async def test_cancelled_while_starting_leaves_no_worker(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled inside ``__aenter__`` once a worker is launched: every
    worker started is stopped (the autouse leak check also verifies this)."""
    from meshio._launcher import LocalLauncher

    before = child_pids()
    launched = asyncio.Event()
    entered = asyncio.Event()
    real_launch = LocalLauncher.launch

    async def launch(self: LocalLauncher, spec: Any) -> Any:
        handle = await real_launch(self, spec)
        launched.set()
        return handle

    monkeypatch.setattr(LocalLauncher, "launch", launch)

    async def body() -> None:
        async with meshio.this_host().spawn_procs(per_host={"procs": 2}):
            entered.set()

    task = asyncio.ensure_future(body())
    await asyncio.wait_for(launched.wait(), DEADLINE)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, DEADLINE)
    assert not entered.is_set()
    assert child_pids() - before == set()


# ------------------------------------------- controllers that die or forget

CONTROLLER = """
import asyncio, os, select, sys
import meshio
from meshio import Actor, endpoint

def say(*words):  # one write(2) per line: lines from several processes never interleave
    os.write(1, (" ".join(map(str, words)) + "\\n").encode())

class Blocker(Actor):
    @endpoint
    def block(self) -> None:
        say("BLOCKING", os.getpid())
        select.select([], [], [])  # blocks the worker's event loop for good

async def main():
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 2})
    say("PIDS", *procs.pids)
    mode = sys.argv[1]
    if mode == "blocked":
        b = await procs.spawn("b", Blocker)
        b.block.broadcast()
    say("READY")
    if mode != "exit":
        await asyncio.Event().wait()
    # mode "exit": return without stopping the procs

meshio.run(main())
say("CONTROLLER DONE")
"""


async def _start_controller(tmp_path: Path, mode: str
                            ) -> tuple[asyncio.subprocess.Process, list[int], list[str]]:
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent(CONTROLLER))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), mode, stdout=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL, cwd=tmp_path)
    assert proc.stdout is not None
    pids: list[int] = []
    lines: list[str] = []
    blocking = 0
    try:
        while True:
            raw = await asyncio.wait_for(proc.stdout.readline(), DEADLINE)
            assert raw, f"controller ended early: {lines}"
            line = raw.decode().strip()
            lines.append(line)
            if line.startswith("PIDS"):
                pids = [int(x) for x in line.split()[1:]]
            elif line.startswith("[procs procs=") and "] BLOCKING " in line:  # worker output
                blocking += 1
            if "READY" in lines and (mode != "blocked" or blocking == 2):
                break
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"controller stalled after printing {lines}") from None
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    assert len(pids) == 2
    return proc, pids, lines


@pytest.mark.parametrize("mode", ["idle", "blocked"])
async def test_sigkilled_controller_leaves_no_orphans(tmp_path: Path, mode: str,
                                                      watch: list[PidWatch]) -> None:
    proc, pids, _ = await _start_controller(tmp_path, mode)
    try:
        w = watch_pids(watch, pids)
        assert w.exited() == set()
        proc.kill()
        assert await asyncio.wait_for(proc.wait(), DEADLINE) == -signal.SIGKILL
        alive = await asyncio.to_thread(w.wait_all)
        assert alive == set(), f"workers {sorted(alive)} outlived their controller"
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


async def test_controller_returning_without_stop_leaves_no_orphans(
        tmp_path: Path, watch: list[PidWatch]) -> None:
    proc, pids, _ = await _start_controller(tmp_path, "exit")
    try:
        w = watch_pids(watch, pids)  # may already be racing with their exit
        assert proc.stdout is not None
        rest = await asyncio.wait_for(proc.stdout.read(), DEADLINE)
        assert b"CONTROLLER DONE" in rest
        assert await asyncio.wait_for(proc.wait(), DEADLINE) == 0
        alive = await asyncio.to_thread(w.wait_all)
        assert alive == set(), f"workers {sorted(alive)} outlived their controller"
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"heartbeat_interval": None}, TypeError,
     r"\(heartbeat_interval=\.\.\.\) must be a number of seconds"),
    ({"heartbeat_timeout": "3"}, TypeError,
     r"\(heartbeat_timeout=\.\.\.\) must be a number of seconds"),
    ({"heartbeat_interval": 0}, ValueError, r"\(heartbeat_interval=\.\.\.\) must be seconds > 0"),
    ({"per_host": {"gpus": 0}}, ValueError, ": per_host must map dim names to ints"),
    ({"per_host": {"gpus": "2"}}, TypeError, r": per_host must map dim names \(str\) to ints"),
    ({"per_host": {"gpus": True}}, TypeError, r": per_host must map dim names \(str\) to ints"),
    ({"per_host": {"gpus": 10**9}}, ValueError, ": per_host .* is 1000000000 processes on each"),
    ({"shutdown": "gently"}, ValueError, r"\(shutdown=\.\.\.\) must be seconds >= 0 or 'brutal"),
    ({"restart": "always"}, ValueError, ": restart must be 'permanent'"),
    ({"restart": 3}, TypeError, ": restart must be 'permanent', .*, got int 3"),
    ({"per_host": "gpus"}, TypeError, r": per_host must be a mapping of dim names \(str\) to "
                                      r"ints >= 1, e\.g\. \{'gpus': 4\}, got str 'gpus'"),
    ({"per_host": ["gpus", 2]}, TypeError, ": per_host must be a mapping .*, got list")])
async def test_spawn_procs_rejects_bad_arguments_before_starting_anything(
        kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    """issue 7: a wrong argument type or value is a clear TypeError/ValueError
    naming it, raised at once; no process is started."""
    before = child_pids()
    with pytest.raises(error, match=f"spawn_procs{match}"):
        meshio.this_host().spawn_procs(**kwargs)
    assert child_pids() == before


async def test_options_and_spawn_reject_a_wrong_type_with_type_error(
        procs: meshio.ProcMesh) -> None:
    """issue 9: a wrong argument type is a TypeError naming the argument (a
    wrong value of the right type stays a ValueError)."""
    with pytest.raises(TypeError, match=r"options\(restart=\.\.\.\) must be 'permanent', "
                                        r".*, got int 3"):
        procs.options(restart=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"options\(restart=\.\.\.\) .*, got str 'always'"):
        procs.options(restart="always")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="spawn: actor mesh name must be a non-empty str "
                                        "without '/' that UTF-8 can encode, got int 5"):
        await procs.spawn(5, Victim)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"spawn: actor mesh name .*, got str 'a/b'"):
        await procs.spawn("a/b", Victim)
    # a name of bytes that were not UTF-8 (os.fsdecode: a lone surrogate) was
    # a UnicodeEncodeError from the message encoder, the spawn half made
    with loop_reports() as reported:
        with pytest.raises(ValueError, match=r"spawn: actor mesh name .*, got str 'caf\\udce9'"):
            await procs.spawn(os.fsdecode(b"caf\xe9"), Victim)
    assert reported == []
    accented = await procs.spawn("caf\u00e9", Victim)  # (UTF-8 that is not ASCII: fine)
    assert (await accented.echo.call(3)).values() == [3] * len(procs)
