"""Workers that outlive their controller: ``spawn_procs(name=...,
keep_alive=...)`` and ``this_host().reattach(name)`` (issue 18 §8).

Each test runs the first controller as a script (``reattach_controller.py``)
and SIGKILLs it once it has trained a little; a second script, or the test
itself, re-attaches.  Every test has a records directory of its own
(``XDG_RUNTIME_DIR``), so that names never meet another test's."""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from supervision_helpers import until

import meshio
import reattach_controller
from meshio._flock import LOCK_POLL, flocked_file
from meshio._keep_alive import KeptMesh, started_at
from meshio.jobs import ProcessJob
from meshio.jobs._job import write_secret
from meshio.supervision import SupervisionEvent
from netns_hosts import netns_hosts, requires_netns
from reattach_controller import SlowInit, Trainer
from test_netns import DEADLINE, INTERVAL, wait_pid_gone
from test_partitions import PARTITION

GUARD = 60.0
SCRIPT = Path(reattach_controller.__file__).resolve()


@pytest.fixture(autouse=True)
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's records directory (the scripts it runs inherit it)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return tmp_path / "meshio" / "procs"


class Controller:
    """A first controller, run as a script: it spawns, trains three steps
    and waits to be killed."""

    def __init__(self, name: str, keep_alive: float | None, *args: str) -> None:
        """``args``: the script's further arguments (see its docstring)."""
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), "spawn", name,
             "none" if keep_alive is None else str(keep_alive), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        ready = _readline(self.proc.stdout.fileno())
        assert ready.startswith("ready "), ready
        #: its workers' pids
        self.pids: list[int] = json.loads(ready.removeprefix("ready "))

    def sigkill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(GUARD) == -signal.SIGKILL

    def close(self) -> None:
        if self.proc.poll() is None:
            self.sigkill()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def controller() -> Iterator[type[Controller]]:
    started: list[Controller] = []

    class Started(Controller):
        def __init__(self, name: str, keep_alive: float | None, *args: str) -> None:
            super().__init__(name, keep_alive, *args)
            started.append(self)

    yield Started
    for c in started:
        c.close()


def _readline(fd: int) -> str:
    """One line from ``fd`` (waited on, with a guard against a hang)."""
    data = b""
    deadline = time.monotonic() + GUARD
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
        assert ready, f"no line within {GUARD} s (so far: {data!r})"
        chunk = os.read(fd, 1)
        assert chunk, f"end of output before a line (so far: {data!r})"
        data += chunk
    return data.decode().strip()


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it has exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def go_together(racers: list[subprocess.Popen[str]]) -> list[list[str]]:
    """Once every racing controller is ready, let them all go at once; what
    each then says (its first word, and the rest)."""
    for racer in racers:
        assert racer.stdout is not None
        assert _readline(racer.stdout.fileno()) == "ready"
    for racer in racers:
        assert racer.stdin is not None
        racer.stdin.write("go\n")
        racer.stdin.flush()
    said = []
    for racer in racers:
        assert racer.stdout is not None
        said.append(_readline(racer.stdout.fileno()).split(" ", 1))
    return said


def let_go(racers: list[subprocess.Popen[str]]) -> None:
    """Tell each racing controller to finish (its stdin closed); each exits 0."""
    for racer in racers:
        assert racer.stdin is not None
        racer.stdin.close()
        assert racer.wait(GUARD) == 0


def reap(racers: list[subprocess.Popen[str]]) -> None:
    """Kill the racing controllers still running, and close their pipes."""
    for racer in racers:
        if racer.poll() is None:
            racer.kill()
            racer.wait()
        for pipe in (racer.stdin, racer.stdout):
            if pipe is not None:
                pipe.close()


def wait_exited(pids: list[int], timeout: float = GUARD) -> None:
    """Wait until every process of ``pids`` (not our children) has exited."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:  # gone already
            pass
    try:
        deadline = time.monotonic() + timeout
        waiting = list(fds)
        while waiting:
            ready, _, _ = select.select(waiting, [], [], max(deadline - time.monotonic(), 0))
            assert ready, f"processes {pids} did not all exit within {timeout} s"
            waiting = [fd for fd in waiting if fd not in ready]
    finally:
        for fd in fds:
            os.close(fd)


def record(records: Path, name: str) -> KeptMesh:
    from meshio._keep_alive import _decode  # the record as reattach reads it

    return _decode((records / f"{name}.json").read_bytes())


def test_a_second_script_reattaches_after_sigkill_and_trains_on(
        controller: type[Controller], records: Path) -> None:
    first = controller("train", 60)
    kept = record(records, "train")
    assert (kept.name, kept.labels, kept.sizes) == ("train", ["gpus"], [2])
    assert sorted(w.pid for w in kept.workers) == sorted(first.pids)
    assert [a.name for a in kept.actors] == ["trainers"]
    assert (records / "train.json").stat().st_mode & 0o777 == 0o600
    assert records.parent.stat().st_mode & 0o777 == 0o700

    first.sigkill()
    assert all(running(pid) for pid in first.pids)  # kept alive, not killed with it

    # a second controller re-attaches, trains a step and is lost in turn
    second = subprocess.run([sys.executable, str(SCRIPT), "step", "train"],
                            capture_output=True, text=True, timeout=GUARD, check=False)
    assert (second.returncode, second.stdout) == (0, "stepped\n"), second.stderr
    third = subprocess.run([sys.executable, str(SCRIPT), "resume", "train"],
                           capture_output=True, text=True, timeout=GUARD, check=False)
    assert third.returncode == 0, third.stderr
    lines = dict(line.split(" ", 1) for line in third.stdout.splitlines())
    assert json.loads(lines["before"]) == [[4, 2.0], [4, 2.0]]  # their state, intact
    assert json.loads(lines["after"]) == [[6, 3.0], [6, 3.0]]  # and training goes on
    # their logging records reach the controller serving them now
    assert json.loads(lines["records"]) == ["trainer at step 6"] * 2
    wait_exited(first.pids)  # the second controller stopped them
    assert not (records / "train.json").exists()


async def test_a_call_in_flight_when_the_controller_dies_is_cancelled(
        controller: type[Controller]) -> None:
    """docs/howto/reattach.md: the calls the lost controller had in flight
    are cancelled on the workers (the endpoint gets CancelledError: the
    caller is gone, as for any cancelled call); the state made before stays."""
    first = controller("in-flight", 60, "{}", "in-flight")
    first.sigkill()
    procs = await meshio.this_host().reattach("in-flight")
    try:
        trainers = procs.actors("trainers", Trainer)
        async with asyncio.timeout(GUARD):  # (cancelled as each saw the controller gone)
            while not all((await trainers.was_cancelled.call()).values()):
                pass
        assert list((await trainers.state.call()).values()) == [(3, 1.5), (3, 1.5)]
    finally:
        await procs.stop()
    wait_exited(first.pids)


def test_without_keep_alive_workers_exit_with_the_controller(
        controller: type[Controller], records: Path) -> None:
    first = controller("plain", None)
    assert not (records / "plain.json").exists()  # nothing published
    first.sigkill()
    wait_exited(first.pids)


async def test_workers_exit_once_keep_alive_runs_out(
        controller: type[Controller], records: Path) -> None:
    first = controller("short", 2)
    first.sigkill()
    killed = time.monotonic()
    assert all(running(pid) for pid in first.pids)
    await asyncio.to_thread(wait_exited, first.pids)
    assert time.monotonic() - killed >= 1.5  # they waited for a controller first
    with pytest.raises(meshio.UnknownProcMeshError, match=r"no proc mesh named 'short'"):
        await meshio.this_host().reattach("short")
    assert not (records / "short.json").exists()  # a record of nobody: removed


async def test_reattach_errors_name_what_exists(controller: type[Controller]) -> None:
    first = controller("named", 60)
    with pytest.raises(meshio.UnknownProcMeshError,
                       match=r"reattach\('nope'\).*kept-alive proc meshes: 'named'"):
        await meshio.this_host().reattach("nope")
    assert issubclass(meshio.UnknownProcMeshError, LookupError)
    # its controller still runs: it keeps its workers
    with pytest.raises(meshio.ProcMeshTakenError,
                       match=r"cannot be re-attached: it serves the controller that spawned "
                             r"it, at .*, still connected"):
        await meshio.this_host().reattach("named")
    assert issubclass(meshio.ProcMeshTakenError, meshio.SupervisionError)
    first.sigkill()
    procs = await meshio.this_host().reattach("named")
    try:
        # (before, it said to use what spawn_procs returned: this one never called it)
        with pytest.raises(ValueError, match=r"^reattach\('named'\): this process is the "
                           r"controller of proc mesh 'named' already; use the ProcMesh it has "
                           r"\(the one spawn_procs or reattach returned\)$"):
            await meshio.this_host().reattach("named")
        with pytest.raises(meshio.UnknownActorError, match=r"its actor meshes: 'trainers'"):
            procs.actors("learners", Trainer)
        with pytest.raises(TypeError, match=r"are of class __main__\.Trainer"):
            procs.actors("trainers", meshio.Actor)
        trainers = procs.actors("trainers", Trainer)
        assert list((await trainers.state.call()).values()) == [(3, 1.5), (3, 1.5)]
    finally:
        await procs.stop()
    wait_exited(first.pids)


@pytest.mark.parametrize("on", ["this host", "a job"])
async def test_a_supervisor_given_to_reattach_restarts_a_killed_worker(
        controller: type[Controller], records: Path, tmp_path: Path, on: str) -> None:
    cache = str(tmp_path / ".meshio")
    job = ProcessJob(meshes={"hosts": 2}, cache_dir=cache)
    first = controller("supervised", 60, *(["--job", cache] if on == "a job" else []))
    first.sigkill()
    hosts = meshio.this_host() if on == "this host" else (await job.state()).hosts
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0, name="after")
    events = sup.events()
    procs = await hosts.reattach("supervised", supervisor=sup)
    try:
        trainers = procs.actors("trainers", Trainer)
        await trainers.train.call(steps=1)
        os.kill(first.pids[1], signal.SIGKILL)

        seen: list[SupervisionEvent] = []
        async with asyncio.timeout(GUARD):
            async for ev in events:
                seen.append(ev)
                if ev.kind == "restart":
                    break
        assert [(e.kind, e.mesh, e.rank) for e in seen] == [
            ("failure", "supervised", 1), ("restart", "supervised", 1)]
        await procs.ready()
        assert list((await trainers.state.call()).values()) == [(4, 2.0), (0, 0.0)]  # rebuilt
        new_pid = list((await trainers.pid.call()).values())[1]
        assert new_pid not in first.pids
        assert {w.pid for w in record(records, "supervised").workers} == {first.pids[0], new_pid}
    finally:
        await events.aclose()
        await procs.stop()
        await job.kill()
    wait_exited(first.pids)
    assert not (records / "supervised.json").exists()


@pytest.mark.parametrize("on", ["this host", "a job"])
@pytest.mark.parametrize("supervised", [False, True])
async def test_reattach_to_a_mesh_that_lost_a_worker_meanwhile(
        controller: type[Controller], records: Path, tmp_path: Path, supervised: bool,
        on: str) -> None:
    """A worker of a kept-alive mesh dies while no controller serves it: the
    others are re-attached, and the dead one fails as if after it (a
    supervisor restarts it and rebuilds its actors; without one it is a
    hole), so the mesh serves and stops.  Before, reattach refused
    ("Connection refused"), and so did spawn_procs of that name (it told
    the user to reattach and stop it): the survivors ran unreachable until
    their keep_alive ran out.  On a job's hosts, reattach failed for good
    ("host agent at ... has no worker ... (it has exited)")."""
    cache = str(tmp_path / ".meshio")
    job = ProcessJob(meshes={"hosts": 2}, cache_dir=cache)
    first = controller("half", 60, *(["--job", cache] if on == "a job" else []))
    first.sigkill()
    os.kill(first.pids[1], signal.SIGKILL)
    wait_exited([first.pids[1]])
    hosts = meshio.this_host() if on == "this host" else (await job.state()).hosts
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0) if supervised else None
    events = sup.events() if sup is not None else None
    procs = await hosts.reattach("half", supervisor=sup)
    try:
        trainers = procs.actors("trainers", Trainer)
        if events is not None:
            seen: list[tuple[str, int]] = []
            async with asyncio.timeout(GUARD):
                async for ev in events:
                    seen.append((ev.kind, ev.rank))
                    if ev.kind == "restart":
                        break
            assert seen == [("failure", 1), ("restart", 1)]
            await procs.ready()
            assert list((await trainers.state.call()).values()) == [(3, 1.5), (0, 0.0)]
        else:
            states = await trainers.state.call()
            assert [p.rank for p in states.holes] == [1] and states.values() == [(3, 1.5)]
            # its exit status is nobody's now, on either kind of host (it said
            # it was known to the controller that started it: on a job's host
            # its agent started it, and kept none)
            failure = await asyncio.wait_for(procs.wait_failed(), GUARD)
            assert (failure.rank, failure.pid, failure.cause) == (1, first.pids[1], (
                "exited (its exit status is unknown: another controller started it, before "
                "this one re-attached to it)"))
    finally:
        if events is not None:
            await events.aclose()
        await procs.stop()
        await job.kill()
    wait_exited(first.pids)
    assert not (records / "half.json").exists()


async def test_a_reattached_mesh_keeps_its_spawn_options(
        controller: type[Controller], records: Path) -> None:
    """``spawn_procs``' options (restart type, shutdown, heartbeats,
    partition_timeout) hold after a re-attach too.  Before, the re-attached
    mesh had the defaults (a heartbeat_timeout of 3 s instead of the 30
    asked for), and its processes were restarted though spawned
    ``restart="temporary"``."""
    options = {"restart": "temporary", "shutdown": "brutal_kill", "heartbeat_interval": 2.0,
               "heartbeat_timeout": 30.0, "partition_timeout": 20.0}
    first = controller("opts", 60, json.dumps(options))
    first.sigkill()
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0)
    events = sup.events()
    procs = await meshio.this_host().reattach("opts", supervisor=sup)
    try:
        os.kill(first.pids[1], signal.SIGKILL)
        async with asyncio.timeout(GUARD):
            ev = await anext(events)
        assert (ev.kind, ev.rank) == ("failure", 1)
        # temporary: its supervisor restarts nothing, the process is a hole
        states = await procs.actors("trainers", Trainer).state.call()
        assert [p.rank for p in states.holes] == [1] and states.values() == [(3, 1.5)]
        kept = record(records, "opts").options  # as the re-attached mesh has them
        assert kept is not None
        assert (kept.restart, kept.shutdown, kept.partition_timeout) == (
            "temporary", "brutal_kill", 20.0)
    finally:
        await events.aclose()
        await procs.stop()
    wait_exited(first.pids)
    # without a supervisor, the heartbeats are those spawn_procs was given
    second = controller("beats", 60, json.dumps(options))
    second.sigkill()
    procs = await meshio.this_host().reattach("beats")
    try:
        kept = record(records, "beats").options
        assert kept is not None
        assert (kept.heartbeat_interval, kept.heartbeat_timeout) == (2.0, 30.0)
    finally:
        await procs.stop()
    wait_exited(second.pids)


async def test_a_spawn_the_lost_controller_did_not_finish_is_stopped(
        controller: type[Controller], tmp_path: Path) -> None:
    """The controller is lost while the constructors of ``procs.spawn("slow",
    ...)`` run: the re-attach stops those actors (nobody ever got them), and
    the name can be spawned again.  Before, the record did not know of that
    spawn: ``procs.actors("slow", ...)`` said there was no such mesh, and
    ``procs.spawn("slow", ...)`` failed on every rank ("an actor mesh named
    'slow' already lives in this process"), for good."""
    hold = str(tmp_path / "hold.sock")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(hold)
        listener.listen()
        listener.settimeout(GUARD)
        first = controller("cut", 60, "{}", hold)
        held = [listener.accept()[0] for _ in first.pids]  # both constructors run
    try:
        first.sigkill()
        procs = await meshio.this_host().reattach("cut")
        try:
            with pytest.raises(meshio.UnknownActorError,
                               match=r"no actors named 'slow' .*its spawn was interrupted by "
                                     r"the lost controller"):
                procs.actors("slow", SlowInit)
            slow = await procs.spawn("slow", SlowInit, None)
            assert sorted((await slow.pid.call()).values()) == sorted(first.pids)
            trainers = procs.actors("trainers", Trainer)
            assert list((await trainers.state.call()).values()) == [(3, 1.5), (3, 1.5)]
        finally:
            for conn in held:  # the held constructors end: those actors stop once built
                conn.close()
            await procs.stop()
    finally:
        for conn in held:  # (closed already, unless the re-attach failed)
            conn.close()
    wait_exited(first.pids)


async def test_keep_alive_arguments_and_names_are_checked(records: Path) -> None:
    host = meshio.this_host()
    with pytest.raises(TypeError, match=r"keep_alive=\.\.\.\) must be a number of seconds"):
        host.spawn_procs(keep_alive="600")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"keep_alive=\.\.\.\) must be seconds > 0"):
        host.spawn_procs(keep_alive=0)
    with pytest.raises(ValueError, match="a kept-alive proc mesh's name is a file name"):
        host.spawn_procs(name="a/b", keep_alive=5)
    async with host.spawn_procs(name="mine", keep_alive=30) as procs:
        assert (records / "mine.json").exists()
        with pytest.raises(ValueError, match=r"a proc mesh named 'mine' is kept alive"):
            host.spawn_procs(name="mine", keep_alive=30)
        with pytest.raises(ValueError, match=r"this process is the controller of proc mesh"):
            await host.reattach("mine")
        pids = procs.pids
    assert not (records / "mine.json").exists()  # stopped normally: the record goes
    wait_exited(pids)


async def test_reattach_refuses_a_name_that_no_proc_mesh_can_have(records: Path) -> None:
    """``reattach(None)`` and ``reattach(123)`` raised UnknownProcMeshError,
    whose hint told the user to spawn a proc mesh of that name; a name
    longer than any proc mesh's got a message with it three times over.
    Now a name of another type is a TypeError naming what it got, and one
    that ``spawn_procs(name=..., keep_alive=...)`` refuses a ValueError
    saying why, as there."""
    host = meshio.this_host()
    for bad in (None, 123, b"train"):
        with pytest.raises(TypeError) as refused:
            await host.reattach(bad)  # type: ignore[arg-type]
        assert str(refused.value) == (
            f"reattach: name must be a str, got {type(bad).__name__} {bad!r}")
    with pytest.raises(ValueError, match=r"reattach: proc mesh name 'xxx.*' is 300 bytes "
                                         r"long; at most \d+ fit"):
        await host.reattach("x" * 300)
    for bad_name in ("", "a/b", ".hidden"):
        with pytest.raises(ValueError, match=r"reattach: a kept-alive proc mesh's name is a "
                                             r"file name"):
            await host.reattach(bad_name)
    with pytest.raises(ValueError, match=r"reattach: a proc mesh's name cannot have a NUL"):
        await host.reattach("a\0b")
    with pytest.raises(meshio.UnknownProcMeshError, match=r"no proc mesh named 'x'"):
        await host.reattach("x")  # a name that can be, but is not


async def test_reattach_on_a_jobs_hosts(controller: type[Controller], records: Path,
                                        tmp_path: Path) -> None:
    """The same on the two hosts of a ProcessJob (host agents): the workers
    are the agents' children and reach the controller over TCP."""
    cache = str(tmp_path / ".meshio")
    job = ProcessJob(meshes={"hosts": 2}, cache_dir=cache)
    try:
        first = controller("jobtrain", 60, "--job", cache)
        kept = record(records, "jobtrain")
        assert (kept.labels, kept.sizes) == (["hosts", "gpus"], [2, 1])
        assert all(w.addr.startswith("tcp://") for w in kept.workers)
        first.sigkill()
        assert all(running(pid) for pid in first.pids)
        resumed = subprocess.run([sys.executable, str(SCRIPT), "resume", "jobtrain", "--job",
                                  cache], capture_output=True, text=True, timeout=GUARD,
                                 check=False)
        assert resumed.returncode == 0, resumed.stderr
        lines = dict(line.split(" ", 1) for line in resumed.stdout.splitlines())
        assert json.loads(lines["before"]) == [[3, 1.5], [3, 1.5]]
        assert json.loads(lines["after"]) == [[5, 2.5], [5, 2.5]]
        await asyncio.to_thread(wait_exited, first.pids)
        assert not (records / "jobtrain.json").exists()
    finally:
        await job.kill()


async def test_a_refused_reattach_on_a_jobs_hosts_takes_nothing(
        controller: type[Controller], records: Path, tmp_path: Path) -> None:
    """A second controller re-attaching a mesh this one serves on a job's
    hosts is refused (ProcMeshTakenError) and takes nothing of it: the host
    agents still tell this one of its workers' exits.  Before, its agents
    told the refused controller from then on (lost once it exited), and,
    re-attached workers being fenced for their controller now, they would
    have fenced them for it."""
    cache = str(tmp_path / ".meshio")
    job = ProcessJob(meshes={"hosts": 2}, cache_dir=cache)
    first = controller("served", 60, "--job", cache)
    first.sigkill()
    procs = await (await job.state()).hosts.reattach("served")
    try:
        second = await asyncio.to_thread(
            subprocess.run, [sys.executable, str(SCRIPT), "step", "served", "--job", cache],
            capture_output=True, text=True, timeout=GUARD, check=False)
        assert second.returncode == 1, second.stderr
        assert "meshio.ProcMeshTakenError: host agent at " in second.stderr, second.stderr
        assert "cannot be re-attached: the controller at " in second.stderr
        os.kill(first.pids[1], signal.SIGKILL)
        failure = await asyncio.wait_for(procs.wait_failed(), GUARD)
        assert (failure.rank, failure.cause) == (1, "killed by signal SIGKILL")
        trainers = procs.actors("trainers", Trainer)
        assert await trainers.slice(hosts=0).state.call_one() == (3, 1.5)
    finally:
        await procs.stop()
        await job.kill()
    wait_exited(first.pids)


async def test_two_tasks_reattaching_at_once_one_wins(controller: type[Controller],
                                                      records: Path) -> None:
    """Two tasks of this controller re-attach one mesh at once: one does, and
    its calls work; the other waits for it, then raises ProcMeshTakenError.
    Before, each adopted what it reached first: the second failed (a worker
    "cannot be re-attached: its controller ... is still connected") and, giving
    up, dropped the connections and credentials of the workers the first
    had, so the first's calls failed too (AuthenticationError)."""
    first = controller("race", 60)
    first.sigkill()
    host = meshio.this_host()
    results = await asyncio.gather(host.reattach("race"), host.reattach("race"),
                                   return_exceptions=True)
    won = [r for r in results if isinstance(r, meshio.ProcMesh)]
    taken = [r for r in results if isinstance(r, meshio.ProcMeshTakenError)]
    assert len(won) == 1 and len(taken) == 1, results
    procs = won[0]
    try:
        assert str(taken[0]) == (
            "reattach('race'): proc mesh 'race' was re-attached by another task of this "
            "process while this re-attach waited for it; it serves that controller now. "
            "Re-attach once that controller is gone, or stop the mesh from there")
        trainers = procs.actors("trainers", Trainer)
        await trainers.train.call(steps=1)
        assert list((await trainers.state.call()).values()) == [(4, 2.0), (4, 2.0)]
        assert record(records, "race").controller_pid == os.getpid()
    finally:
        await procs.stop()
    wait_exited(first.pids)
    assert list(records.iterdir()) == []  # no lock file left either


def test_two_controllers_reattaching_at_once_one_wins(controller: type[Controller],
                                                      records: Path) -> None:
    """Two controller processes re-attach one mesh at once: exactly one
    does (its calls work), the other raises ProcMeshTakenError; never both
    failing, never a mesh split between them.  Before, each could adopt some
    of its workers, and both failed."""
    first = controller("duel", 60)
    first.sigkill()
    racers = [subprocess.Popen([sys.executable, str(SCRIPT), "race", "duel"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
              for _ in range(2)]
    try:
        said = go_together(racers)
        assert sorted(word for word, _ in said) == ["taken", "won"], said
        (states,), (error,) = ([json.loads(rest) for w, rest in said if w == word]
                               for word in ("won", "taken"))
        assert states == [[4, 2.0], [4, 2.0]]
        winner = racers[[w for w, _ in said].index("won")]
        assert record(records, "duel").controller_pid == winner.pid
        # (it waited for the winner, or, started after it, was refused by a worker)
        assert (f"was re-attached by the controller with pid {winner.pid} while this "
                f"re-attach waited for it" in error
                or "it serves a controller that re-attached to it" in error), error
        let_go(racers)  # the winner stops the mesh
    finally:
        reap(racers)
    wait_exited(first.pids)
    assert list(records.iterdir()) == []  # no record, no lock file left


async def test_the_reattach_lock_file_goes_with_its_holder(tmp_path: Path) -> None:
    """A re-attach's lock file (``<name>.lock`` beside the record) is
    removed as its holder lets it go (one per name re-attached stayed
    forever), and turns still hold: here ``a`` holds it while ``b`` waits on
    that file; ``a`` lets it go (the file goes) and ``c`` takes the lock of
    a new file at once; ``b``, which then gets the lock of the file removed,
    sees that and waits for ``c`` on the new one."""
    path = tmp_path / "turns.lock"
    holding: list[str] = []
    together: list[list[str]] = []
    b_waits = asyncio.Event()

    async def hold(who: str, until: asyncio.Event | None = None,
                   for_polls: int = 0) -> None:
        async with flocked_file(path, b_waits.set if who == "b" else lambda: None):
            holding.append(who)
            if len(holding) > 1:
                together.append(list(holding))
            if until is not None:
                await until.wait()
            # (long enough for b's next try: b must not get in meanwhile)
            await asyncio.sleep(for_polls * LOCK_POLL)
            holding.remove(who)

    a = asyncio.create_task(hold("a", until=b_waits))
    b = asyncio.create_task(hold("b"))
    await a
    assert not path.exists()
    await asyncio.gather(b, hold("c", for_polls=4))
    assert together == []
    assert not path.exists()


def workers_of(name: str) -> set[int]:
    """The pids of the workers of proc meshes named ``name`` that run on this
    host (any controller's: their worker ids are ``<name>-<8 hex>-<rank>``)."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # (not a process, or gone)
            continue
        if b"meshio.worker" in args and b"--worker" in args:
            worker = args[args.index(b"--worker") + 1].decode()
            if worker.rpartition("-")[0].rpartition("-")[0] == name and running(int(entry.name)):
                found.add(int(entry.name))
    return found


async def test_two_tasks_spawning_one_kept_alive_name_at_once_one_starts(
        records: Path) -> None:
    """Two tasks of this controller spawn a kept-alive mesh of one name at
    once: one starts it, the other is refused (ValueError) and starts no
    process.  Before, the name was checked, not reserved, until the record
    was written once the processes were up: both started, the last record
    written won, and the other mesh's workers were out of every re-attach's
    reach until their keep_alive ran out."""
    host = meshio.this_host()

    async def spawn() -> meshio.ProcMesh:
        return await host.spawn_procs(per_host={"gpus": 1}, name="twin", keep_alive=30)

    results = await asyncio.gather(spawn(), spawn(), return_exceptions=True)
    started = [r for r in results if isinstance(r, meshio.ProcMesh)]
    try:
        assert len(started) == 1, results
        (refused,) = [r for r in results if not isinstance(r, meshio.ProcMesh)]
        assert isinstance(refused, ValueError), results
        assert str(refused) == (
            "spawn_procs(name='twin', keep_alive=...): a proc mesh named 'twin' is being "
            "started on this host by this process; wait for that spawn and stop its mesh, "
            "or choose another name")
        assert workers_of("twin") == set(started[0].pids)  # the refused one started none
        kept = record(records, "twin")
        assert sorted(w.pid for w in kept.workers) == started[0].pids
    finally:
        for procs in started:
            await procs.stop()
    assert not (records / "twin.json").exists()


def test_two_controllers_spawning_one_kept_alive_name_at_once_one_starts(
        records: Path) -> None:
    """The same for two controller processes: exactly one starts the mesh,
    the other is refused and starts no process."""
    racers = [subprocess.Popen([sys.executable, str(SCRIPT), "claim", "twins"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
              for _ in range(2)]
    try:
        said = go_together(racers)
        assert sorted(word for word, _ in said) == ["refused", "started"], said
        (pids,), (error,) = ([json.loads(rest) for w, rest in said if w == word]
                             for word in ("started", "refused"))
        winner = racers[[w for w, _ in said].index("started")]
        assert ("a proc mesh named 'twins' is being started on this host by the controller "
                f"with pid {winner.pid}" in error
                or f"a proc mesh named 'twins' is kept alive on this host already (controller "
                   f"pid {winner.pid})" in error), error
        assert workers_of("twins") == set(pids)  # the refused one started none
        assert record(records, "twins").controller_pid == winner.pid
        let_go(racers)  # the winner stops the mesh
    finally:
        reap(racers)
    wait_exited(pids)
    assert not (records / "twins.json").exists()


async def test_a_kept_alive_name_is_free_once_its_controller_and_workers_are_gone(
        records: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A record whose controller runs keeps its name (one that is starting
    its mesh has no workers yet); one whose controller and workers are all
    gone (killed in the middle of a spawn) is taken over.  A spawn that
    fails gives its name back.  A controller rewrites its record only while
    the name is its mesh's: one another controller has now is left as it
    is (that one re-attached to the mesh), with a warning."""
    host = meshio.this_host()
    gone = subprocess.Popen(["true"])
    gone.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        async with host.spawn_procs(per_host={"gpus": 1}, name="held", keep_alive=30) as procs:
            mine = record(records, "held")
            assert mine.controller_pid == os.getpid() and len(mine.workers) == 1

            def starting(name: str, pid: int) -> KeptMesh:
                """A record of mesh ``name`` being started by process ``pid``."""
                return msgspec.structs.replace(
                    mine, name=name, id=f"{name}-00000000", workers=[], controller_pid=pid,
                    controller_started=started_at(pid) or 1)

            (records / "busy.json").write_bytes(msgspec.json.encode(starting("busy", alive.pid)))
            with pytest.raises(ValueError, match=(
                    r"a proc mesh named 'busy' is being started on this host by the controller "
                    rf"with pid {alive.pid}; wait for that spawn")):
                host.spawn_procs(name="busy", keep_alive=30)
            with pytest.raises(meshio.ProcMeshTakenError, match=(
                    rf"reattach\('busy'\): proc mesh 'busy' is being started by the "
                    rf"controller with pid {alive.pid}")):
                await host.reattach("busy")

            (records / "stale.json").write_bytes(msgspec.json.encode(starting("stale", gone.pid)))
            with pytest.raises(meshio.ProcessStartError):
                await host.spawn_procs(name="stale", keep_alive=30, bootstrap=_no_start)
            assert not (records / "stale.json").exists()  # taken over, then given back
            async with host.spawn_procs(name="stale", keep_alive=30) as taken:
                assert [w.pid for w in record(records, "stale").workers] == taken.pids

            other = starting("held", alive.pid)
            (records / "held.json").write_bytes(msgspec.json.encode(other))
            with caplog.at_level(logging.WARNING, "meshio"):
                await procs.spawn("trainers", Trainer, lr=0.5)  # (its record is rewritten)
            assert record(records, "held") == other
            assert (f"meshio: proc mesh 'held' is not published for reattach any more: the "
                    f"controller with pid {alive.pid} re-attached to it") in caplog.text
        assert record(records, "held") == other  # nor removed by the stop
    finally:
        alive.communicate(b"")


def _no_start() -> None:
    """A bootstrap that fails the start of its process."""
    raise RuntimeError("no start here")


@pytest.mark.timeout(300)
async def test_a_reattach_given_up_leaves_the_workers_free(
        controller: type[Controller], records: Path) -> None:
    """A re-attach given up at any point (``asyncio.wait_for`` running out
    after 0 to 10 ms) leaves the workers waiting for a controller: a plain
    re-attach of the same controller then succeeds, and nothing of the one
    given up runs on (its task's error, retrieved by nobody, would reach
    the loop's exception handler).  Before, one given up in its first
    milliseconds left the workers bound to this controller: the next
    re-attach was refused (ProcMeshTakenError naming this controller's own
    address), and the given-up one's task failed later (an AssertionError)."""
    first = controller("given", 60)
    first.sigkill()
    outcomes: list[str] = []
    for ms in range(11):
        run = await asyncio.to_thread(
            subprocess.run, [sys.executable, str(SCRIPT), "give-up", "given", str(ms / 1000)],
            capture_output=True, text=True, timeout=GUARD, check=False)
        assert run.returncode == 0, f"after {ms} ms: {run.stderr}"
        said = json.loads(run.stdout)
        assert said["errors"] == [], f"after {ms} ms: {said}"
        outcomes.append(said["outcome"])
    assert outcomes[0] == "given up", outcomes  # (wait_for(..., 0) never lets it start)
    procs = await meshio.this_host().reattach("given")
    try:
        trainers = procs.actors("trainers", Trainer)
        assert list((await trainers.state.call()).values()) == [(14, 7.0), (14, 7.0)]
    finally:
        await procs.stop()
    wait_exited(first.pids)


@requires_netns
@pytest.mark.timeout(120)
async def test_a_reattached_worker_on_a_cut_off_host_is_fenced(
        controller: type[Controller], tmp_path: Path) -> None:
    """Re-attached on job hosts (agents in network namespaces), a worker
    keeps the partition_timeout it was spawned with: its host cut off, the
    new controller downs it ("partitioned") and its agent kills it while the
    host is still cut off.  Before, neither happened after a re-attach: the
    agent no longer fenced it (its controller, the lost one, was gone) and
    the new controller did not watch its agent, so the worker ran on, a
    second incarnation waiting to meet a replacement after the heal."""
    secret = tmp_path / "job.secret"
    write_secret(secret, secrets.token_bytes(32))
    with netns_hosts(2, secret) as hosts:
        agents = [h.agent_addr for h in hosts]
        options = {"partition_timeout": PARTITION, "heartbeat_interval": INTERVAL,
                   "heartbeat_timeout": 10 * DEADLINE}  # (heartbeats too slow to judge)
        first = controller("fenced", 60, json.dumps(options), "--attach",
                           json.dumps({"addresses": agents, "secret_file": str(secret)}))
        first.sigkill()
        procs = await meshio.attach(agents, secret_file=secret).reattach("fenced")
        try:
            trainers = procs.actors("trainers", Trainer)
            assert list((await trainers.state.call()).values()) == [(3, 1.5), (3, 1.5)]
            hosts[1].partition()
            try:
                failure = await asyncio.wait_for(procs.wait_failed(), DEADLINE)
                assert (failure.rank, failure.cause, failure.pid) == (
                    1, "partitioned", first.pids[1])
                assert f"partition_timeout={PARTITION:g} s" in str(failure)
                await wait_pid_gone(first.pids[1])  # fenced by its agent while cut off
            finally:
                hosts[1].heal()
            assert await trainers.slice(hosts=0).state.call_one() == (3, 1.5)
        finally:
            await procs.stop()
        wait_exited(first.pids)


async def test_a_controller_killed_while_its_kept_alive_workers_start_leaves_them_found(
        tmp_path: Path, records: Path) -> None:
    """Killed after launching its workers, before they said hello: their
    record lists them, so a re-attach finds and stops them.  (It listed
    none: the record was taken for a dead mesh's, removed, and the workers
    ran unreachable for their whole keep_alive.)"""
    hold = str(tmp_path / "hold")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(hold)
        server.listen(8)
        server.settimeout(GUARD)
        first = subprocess.Popen([sys.executable, str(SCRIPT), "spawn-held", "held", hold])
        try:
            held = [server.accept()[0] for _ in range(2)]  # both workers in their bootstrap
            first.send_signal(signal.SIGKILL)
            assert first.wait(GUARD) == -signal.SIGKILL
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        addrs = [w.addr for w in record(records, "held").workers]
        assert len(addrs) == 2
        for conn in held:  # let them go on: their controller is gone
            conn.close()
    # (they listen for a controller once their bootstrap returns)
    await until(lambda: all(a in Path("/proc/net/unix").read_text() for a in addrs), GUARD)
    procs = await asyncio.wait_for(meshio.this_host().reattach("held"), GUARD)
    pids = procs.pids
    assert len(pids) == 2
    await asyncio.wait_for(procs.stop(), GUARD)
    wait_exited(pids)


async def test_the_records_lock_held_elsewhere_is_waited_for_a_bounded_time(
        records: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process stopped while it holds the records' lock (SIGSTOP, Ctrl-Z)
    holds others' loops RECORDS_WAIT seconds at most, then they say so (it
    was waited for without bound, the loop blocked)."""
    from meshio import _keep_alive

    monkeypatch.setattr(_keep_alive, "RECORDS_WAIT", 0.2)
    fd = os.open(_keep_alive._dir(), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # (another open file: it excludes this process too)
        with pytest.raises(OSError, match=r"held the lock of the kept-alive records .* for "
                                          r"0\.2 s \(is it stopped\?\)"):
            await asyncio.wait_for(meshio.this_host().reattach("nobody"), GUARD)
    finally:
        os.close(fd)
    with pytest.raises(meshio.UnknownProcMeshError):  # (free again)
        await asyncio.wait_for(meshio.this_host().reattach("nobody"), GUARD)

