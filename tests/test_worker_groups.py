"""A worker's death is seen from its process, and what its actors started
goes with it (probe reports: hygiene defects 1 and 2, docs item 6).

- A worker whose actor forked a child that lives on (a ``multiprocessing``
  child, the fork start method) shares its sockets with that child, so its
  connection to the controller stays open after its death: the death was
  reported as "not responding", ``wait_failed()`` never returned, a
  supervisor restarted it only when heartbeats timed out.  Its exit (its
  pidfd, or its host agent's report) now ends its connection, and it is
  lost as any process whose connection closed.
- Each worker leads a process group of its own: what its actors start
  (``subprocess.Popen``, ``os.fork()``) is killed with it, once it exits,
  and when the controller exits; what leaves the group is on its own.
- A terminal's Ctrl-C (SIGINT to the controller's group) while workers
  start reaches the controller only, which stops them: no worker prints a
  ``KeyboardInterrupt`` traceback.

Real processes and real signals.  Nothing sleeps to wait: pidfds, a FIFO
gate, the supervisor's events, ``wait_failed``, each under a deadline.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from supervision_helpers import supervised

import meshio
from fifo_gate import Gate
from meshio.jobs import ProcessJob
from meshio.testing import wait_exited
from starter_actors import Nester, Starter

#: generous bound on any single wait on a loaded machine (each is prompt)
DEADLINE = 20.0
TESTS = Path(__file__).resolve().parent
KILLED = "killed by signal SIGKILL"


class Others:
    """Processes the test did not start (a worker's children), watched with
    pidfds; those left at the end are killed."""

    def __init__(self) -> None:
        self.fds: dict[int, int] = {}

    def watch(self, pids: list[int]) -> None:
        for pid in pids:
            self.fds[pid] = os.pidfd_open(pid)

    async def gone(self, pids: list[int]) -> None:
        for pid in pids:
            await wait_exited(self.fds[pid], DEADLINE)

    def running(self, pid: int) -> bool:
        poll = select.poll()
        poll.register(self.fds[pid], select.POLLIN)
        return not poll.poll(0)

    def close(self) -> None:
        for fd in self.fds.values():
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(fd)
        self.fds.clear()


@pytest.fixture
def others() -> Iterator[Others]:
    o = Others()
    try:
        yield o
    finally:
        o.close()


async def test_stop_ends_what_actors_started(others: Others) -> None:
    """``procs.stop()``: the worker exits, and its sleep and fork child go too."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        s = await procs.spawn("s", Starter)
        children = await asyncio.wait_for(s.start.call_one(False), DEADLINE)
        others.watch(children)
    await others.gone(children)


@pytest.mark.parametrize("leave_group", [False, True], ids=["in_its_group", "left_its_group"])
async def test_sigkilled_worker_whose_child_holds_its_sockets_is_lost(
        others: Others, leave_group: bool) -> None:
    """A SIGKILLed worker whose fork child lives on (holding its sockets)
    is reported killed, not "not responding": ``wait_failed()`` returns,
    calls fail saying so.  Its children go with it; a child that left its
    group (here: a session of its own) lives on, its connection with it,
    so only the worker's exit can have said it died."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        s = await procs.spawn("s", Starter)
        worker = await asyncio.wait_for(s.pid.call_one(), DEADLINE)
        children = await asyncio.wait_for(s.start.call_one(leave_group), DEADLINE)
        others.watch(children)
        os.kill(worker, signal.SIGKILL)
        failure = await asyncio.wait_for(procs.wait_failed(), DEADLINE)
        assert (failure.cause, failure.pid, failure.rank) == (KILLED, worker, 0)
        with pytest.raises(meshio.SupervisionError) as ei:
            await asyncio.wait_for(s.pid.call_one(), DEADLINE)
        assert ei.value.cause == KILLED, ei.value
        if leave_group:
            assert all(others.running(pid) for pid in children)
        else:
            await others.gone(children)


def signal_masks(pid: int) -> tuple[int, int]:
    """The signals the process ``pid`` ignores and those it catches (bit
    ``n - 1`` for signal ``n``)."""
    status = dict(line.split(":\t", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
    return int(status["SigIgn"], 16), int(status["SigCgt"], 16)


def bit(sig: signal.Signals) -> int:
    return 1 << (sig - 1)


async def test_what_actors_start_takes_sigint_and_sigterm(others: Others) -> None:
    """A worker ignores SIGINT and SIGTERM (its controller stops it), but
    what its actors start does not: a program inherited ``SIG_IGN`` (an
    actor's ``Popen(...).terminate()`` did nothing), an ``os.fork()`` child
    the worker's ignoring."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        s = await procs.spawn("s", Starter)
        worker = await asyncio.wait_for(s.pid.call_one(), DEADLINE)
        children = await asyncio.wait_for(s.start.call_one(False), DEADLINE)
        others.watch(children)
        sleeper, child = children
        assert signal_masks(sleeper)[0] & (bit(signal.SIGINT) | bit(signal.SIGTERM)) == 0
        ignored, caught = signal_masks(child)
        assert ignored & (bit(signal.SIGINT) | bit(signal.SIGTERM)) == 0
        assert caught & bit(signal.SIGTERM) == 0  # (Python's default: none of its own)
        for pid in children:
            os.kill(pid, signal.SIGTERM)
        await others.gone(children)
        os.kill(worker, signal.SIGTERM)
        os.kill(worker, signal.SIGINT)
        assert await asyncio.wait_for(s.pid.call_one(), DEADLINE) == worker


async def test_nested_workers_go_with_their_worker(others: Others) -> None:
    """The workers of a proc mesh an actor started join its worker's group:
    SIGKILL that worker, and they go, with what their own actors started."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        n = await procs.spawn("n", Nester)
        worker = await asyncio.wait_for(n.pid.call_one(), DEADLINE)
        nested = await asyncio.wait_for(n.nest.call_one(), DEADLINE)
        others.watch(nested)
        os.kill(worker, signal.SIGKILL)
        await others.gone(nested)


async def test_supervisor_restarts_a_worker_whose_child_holds_its_sockets(
        others: Others) -> None:
    """Under a supervisor (heartbeats on a manual clock: they never time
    out) the SIGKILL is a failure at once, and the worker is restarted;
    what it started in its group (a child that ignores SIGTERM too) goes."""
    async with supervised(1) as sup:
        s = await sup.procs.spawn("s", Starter)
        others.watch(await asyncio.wait_for(s.start.call_one(True), DEADLINE))
        kept = [await asyncio.wait_for(s.deaf.call_one(), DEADLINE)]
        others.watch(kept)
        os.kill(sup.old[0], signal.SIGKILL)
        failure, restart = await sup.restarted(0)
        assert failure.cause == KILLED
        assert await asyncio.wait_for(s.pid.call_one(), DEADLINE) == restart.pid
        await others.gone(kept)


async def test_host_agent_workers(tmp_path: Path, others: Others) -> None:
    """Workers a host agent started: one SIGKILLed whose child holds its
    connection is lost at its agent's report of its exit; stopping the
    mesh ends what the other's actor started."""
    job = ProcessJob(meshes={"agents": 1}, cache_dir=tmp_path / ".meshio")
    try:
        state = await asyncio.wait_for(job.state(), DEADLINE)
        async with state.agents.spawn_procs(per_host={"procs": 2}) as procs:
            s = await procs.spawn("s", Starter)
            kept = await asyncio.wait_for(s.slice(procs=0).start.call_one(False), DEADLINE)
            left = await asyncio.wait_for(s.slice(procs=1).start.call_one(True), DEADLINE)
            others.watch(kept + left)
            worker = await asyncio.wait_for(s.slice(procs=1).pid.call_one(), DEADLINE)
            os.kill(worker, signal.SIGKILL)
            failure = await asyncio.wait_for(procs.wait_failed(), DEADLINE)
            assert (failure.cause, failure.pid, failure.rank) == (KILLED, worker, 1)
            assert all(others.running(pid) for pid in kept)
        await others.gone(kept)
    finally:
        await job.kill()


RETURNS_WITHOUT_STOP = '''
import meshio
from starter_actors import Nester, Starter


async def main() -> None:
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 1})
    s = await procs.spawn("s", Starter)
    print("PIDS", *await s.start.call_one(False), flush=True)
    # returns without stopping the mesh: the program ends while its worker runs


meshio.run(main())
'''


async def test_controller_exit_ends_what_actors_started(tmp_path: Path,
                                                        others: Others) -> None:
    """A controller that ends without stopping its proc mesh: its worker's
    children go with the worker."""
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent(RETURNS_WITHOUT_STOP))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), stdout=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL, env=_with_tests_path())
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), DEADLINE)
        assert line.startswith(b"PIDS "), line
        children = [int(p) for p in line.split()[1:]]
        others.watch(children)
        await asyncio.wait_for(proc.communicate(), DEADLINE)
        assert proc.returncode == 0
        await others.gone(children)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


KILLED_WHILE_RUNNING = '''
import asyncio
import sys

import meshio
from starter_actors import Starter


async def main(keep_alive: float | None) -> None:
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 1}, keep_alive=keep_alive)
    s = await procs.spawn("s", Starter)
    print("PIDS", await s.pid.call_one(), *await s.start.call_one(False),
          await s.deaf.call_one(), flush=True)
    await asyncio.get_running_loop().create_future()  # until the test SIGKILLs us


meshio.run(main(float(sys.argv[1]) if len(sys.argv) > 1 else None))
'''


@pytest.mark.parametrize("keep_alive", [None, 0.5], ids=["dies_with_it", "kept_alive"])
async def test_sigkilled_controller_ends_what_actors_started(
        tmp_path: Path, others: Others, keep_alive: float | None) -> None:
    """A controller SIGKILLed (nothing of it runs again): its worker goes
    (at once; kept alive, once ``keep_alive`` has passed without a new
    controller), and with it what its actors started, a child that ignores
    SIGTERM too; before, the worker died alone and its children lived on."""
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent(KILLED_WHILE_RUNNING))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), *([] if keep_alive is None else [str(keep_alive)]),
        stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
        env=_with_tests_path())
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), DEADLINE)
        assert line.startswith(b"PIDS "), line
        pids = [int(p) for p in line.split()[1:]]
        others.watch(pids)
        proc.kill()
        await asyncio.wait_for(proc.wait(), DEADLINE)
        await others.gone(pids)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def parent_of(pid: int) -> int:
    """The parent of process ``pid`` (``/proc``)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def test_sigkilled_host_agent_ends_what_actors_started(
        tmp_path: Path, others: Others) -> None:
    """A host agent SIGKILLed: its workers die with it, and what their
    actors started goes too (a child that ignores SIGTERM included)."""
    job = ProcessJob(meshes={"agents": 1}, cache_dir=tmp_path / ".meshio")
    try:
        state = await asyncio.wait_for(job.state(), DEADLINE)
        procs = await state.agents.spawn_procs(per_host={"procs": 1})
        s = await procs.spawn("s", Starter)
        worker = await asyncio.wait_for(s.pid.call_one(), DEADLINE)
        children = [*await asyncio.wait_for(s.start.call_one(False), DEADLINE),
                    await asyncio.wait_for(s.deaf.call_one(), DEADLINE)]
        agent = parent_of(worker)
        others.watch([agent, worker, *children])
        os.kill(agent, signal.SIGKILL)
        await others.gone([agent, worker, *children])
        await asyncio.wait_for(procs.wait_failed(), DEADLINE)
    finally:
        await job.kill()


LOOP_ENDS_WITHOUT_STOP = '''
import gc
import os
import select
import sys

import meshio
from starter_actors import Starter


async def first() -> None:
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 1})
    s = await procs.spawn("s", Starter)
    print("WORKER", await s.pid.call_one(), flush=True)
    print("PIDS", *await s.start.call_one(False), flush=True)
    # returns without stopping the mesh: its worker exits once its loop ends


async def second() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}):
        pass


meshio.run(first())
worker = int(sys.stdin.readline())  # (the test opened its pidfd: safe to reap)
try:
    fd = os.pidfd_open(worker)
except ProcessLookupError:  # (it exited while the first loop was ending, which reaped it)
    pass
else:
    select.select([fd], [], [])  # it exited (its connection lost); nothing watched it
gc.collect()  # (the first run's objects, cycles included, are gone)
meshio.run(second())
print("SECOND", flush=True)
sys.stdin.read()  # until the test is done: no exit (atexit) before that
'''


async def test_a_worker_left_by_an_ended_loop_is_reaped_with_its_group(
        tmp_path: Path, others: Others) -> None:
    """A controller whose loop ended without stopping its proc mesh, and
    that goes on (a second ``meshio.run``): its worker exits (its
    connection lost) with nothing to watch it; the next worker started
    reaps it, and kills what its actors started."""
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent(LOOP_ENDS_WITHOUT_STOP))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), stdout=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.PIPE, env=_with_tests_path())
    assert proc.stdout is not None and proc.stdin is not None
    try:
        worker = await asyncio.wait_for(proc.stdout.readline(), DEADLINE)
        assert worker.startswith(b"WORKER "), worker
        line = await asyncio.wait_for(proc.stdout.readline(), DEADLINE)
        assert line.startswith(b"PIDS "), line
        children = [int(p) for p in line.split()[1:]]
        others.watch(children)
        proc.stdin.write(worker.split()[1] + b"\n")
        assert await asyncio.wait_for(proc.stdout.readline(), DEADLINE) == b"SECOND\n"
        await others.gone(children)  # (the controller still runs: not its exit)
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), DEADLINE)
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def _with_tests_path() -> dict[str, str]:
    """This environment, with this folder on the import path (the actors)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])}


CTRL_C_WHILE_STARTING = '''
import sys

import meshio


async def main(site: str, gate: str) -> None:
    async with meshio.this_host().spawn_procs(
            per_host={"procs": 1}, env={"PYTHONPATH": site, "GATE_DIR": gate}):
        pass


meshio.run(main(sys.argv[1], sys.argv[2]))
'''

#: imported by the worker's interpreter as it starts, long before the
#: worker's own code runs: holds it there (a slow start, caught by Ctrl-C)
SITECUSTOMIZE = '''
import os
import signal

gate = os.environ.get("GATE_DIR")
if gate:
    def interrupted(signum, frame):
        with open(os.path.join(gate, "interrupted"), "w") as f:
            f.write(str(os.getpid()))
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupted)
    with open(os.path.join(gate, "pid"), "w") as f:
        f.write(str(os.getpid()))
    os.close(os.open(os.path.join(gate, "ready"), os.O_WRONLY))  # until the test looks
    os.read(os.open(os.path.join(gate, "release"), os.O_RDONLY), 1)  # until killed
'''


async def test_ctrl_c_while_workers_start_is_quiet(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the controller's process group, as a terminal
    sends it; Jupyter's interrupt does the same to the kernel's) while a
    worker is still starting: the controller's one line and exit status
    130, nothing from the worker, which never got the signal, and is gone."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent(CTRL_C_WHILE_STARTING))
    gate = Gate(tmp_path)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(site), str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
    fd = -1
    try:
        await gate.wait_held(DEADLINE)  # the worker is in its interpreter's start
        worker = int((tmp_path / "pid").read_text())
        fd = os.pidfd_open(worker)
        assert os.getpgid(worker) == worker  # (not the controller's: a signal to that misses it)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), DEADLINE)
        await wait_exited(fd, DEADLINE)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        if fd != -1:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(fd)
    assert not (tmp_path / "interrupted").exists(), "the worker got the SIGINT"
    assert err.decode() == "meshio: interrupted (Ctrl-C); stopping worker processes\n"
    assert out == b""
    assert proc.returncode == 128 + signal.SIGINT
