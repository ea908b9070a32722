"""``await actor_mesh.stacks()`` / ``await proc_mesh.stacks()``: every
actor's current Python stacks, answered by its process's loop while the
actor is busy (a ``def`` endpoint blocked in its thread, an ``async`` one
awaiting forever), grouped as text, and as JSON."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import meshio
import stacks_controller
from meshio import Actor, ActorStacks, Channel, StackFrame, Stacks, TaskStack, endpoint
from meshio._inspect import ask_stacks, controllers
from meshio._stacks import _ranks, decode_actors, encode_actors
from meshio._transport._connection import Pending
from meshio._transport._messages import GetStacks, JobStacks, decode_message, encode_message
from meshio._transport._runtime import Runtime, close_runtime, runtime
from stacks_controller import BLOCK_LINE, HANG_LINE, SPIN_LINE, Busy, meshio_cli, until_blocked

GUARD = 30.0
#: the busy actors' module, also a controller script for ``meshio stacks``
CONTROLLER = Path(stacks_controller.__file__).resolve()
HERE = str(CONTROLLER)


class Idle(Actor):
    @endpoint
    async def ping(self) -> int:
        return 1


def user_frame(frames: tuple[StackFrame, ...], line: int) -> StackFrame:
    return next(f for f in frames if f.file == HERE and f.line == line)


@pytest.mark.meshio_transports("processes", "in-process")
@pytest.mark.meshio_procs(per_host={"gpus": 4})
async def test_busy_actors_show_their_file_line_and_endpoint(
        procs: meshio.ProcMesh, meshio_transport: str) -> None:
    busy = await procs.spawn("busy", Busy)
    idle = await procs.spawn("idle", Idle)
    blocked, hung = busy.slice(gpus=slice(0, 2)), busy.slice(gpus=slice(2, 4))
    port, started = Channel[int].open()
    calls = [asyncio.ensure_future(blocked.block.call(port)),
             asyncio.ensure_future(hung.hang.call(port))]
    try:
        async with asyncio.timeout(GUARD):
            assert sorted([await started.recv() for _ in range(4)]) == [0, 1, 2, 3]
            block_line, hang_line = BLOCK_LINE, HANG_LINE
            stacks = await until_blocked(busy)

            assert [a.rank for a in stacks.actors] == [0, 1, 2, 3]
            assert [a.point for a in stacks.actors] == [{"gpus": r} for r in range(4)]
            assert [a.pid for a in stacks.actors] == (
                procs.pids if meshio_transport == "processes" else [os.getpid()] * 4)
            for a in stacks.actors[:2]:  # in the actor's thread, not in a task
                assert a.endpoint == "Busy.block" and a.running_for is not None
                assert a.running_for >= 0 and not a.tasks
                frame = user_frame(a.thread, block_line)
                assert frame.function == "Busy.block"
                assert frame.code.startswith("self.released.wait()")
                assert a.innermost() == frame  # threading's frames below it are not the user's
            for a in stacks.actors[2:]:  # in the mailbox task, its thread idle
                assert a.endpoint == "Busy.hang" and not a.thread
                [task] = a.tasks
                assert task.name == "mailbox"
                assert task.frames[0] == user_frame(task.frames, hang_line)  # meshio's cut off
                assert task.frames[0].function == "Busy.hang"

            text = stacks.text()
            assert f"busy ranks 0-1: in Busy.block at stacks_controller.py:{block_line} " \
                   "(endpoint Busy.block, running for " in text
            assert f"busy ranks 2-3: in Busy.hang at stacks_controller.py:{hang_line} " \
                   "(endpoint Busy.hang, running for " in text
            assert text.count(f'File "{HERE}", line {block_line}, in Busy.block') == 1
            assert text.count(f'File "{HERE}", line {hang_line}, in Busy.hang') == 1
            assert str(stacks) == text

            assert Stacks.from_json(stacks.json()) == stacks
            assert msgspec.json.decode(stacks.json())["actors"][0]["endpoint"] == "Busy.block"

            one = await busy.slice(gpus=3).stacks()
            assert [(a.actor, a.rank, a.endpoint) for a in one.actors] == [("busy", 3, "Busy.hang")]

            everything = await procs.stacks()  # both meshes, by mesh then rank
            assert [(a.actor, a.rank) for a in everything.actors] == [
                *[("busy", r) for r in range(4)], *[("idle", r) for r in range(4)]]
            assert all(a.endpoint is None for a in everything.actors[4:])
            assert not everything.errors
            assert "idle ranks 0-3: idle" in everything.text()
            await idle.ping.call()  # the idle actors were never disturbed
    finally:
        await busy.release.call()
    unblocked, woken = await asyncio.gather(*calls)
    assert list(unblocked.values()) == ["unblocked"] * 2
    assert list(woken.values()) == ["woken"] * 2


async def test_an_actor_spinning_in_python_holds_the_gil_and_still_answers(
        procs: meshio.ProcMesh) -> None:
    busy = await procs.spawn("busy", Busy)
    port, started = Channel[int].open()
    spinning = asyncio.ensure_future(busy.spin.call(port))
    try:
        async with asyncio.timeout(GUARD):
            assert sorted([await started.recv(), await started.recv()]) == [0, 1]
            while True:  # in their loop a moment after they told us they started
                stacks = await busy.stacks()
                frames = [[f for f in a.thread if f.function == "Busy.spin"]
                          for a in stacks.actors]
                if all(f and f[0].line in (SPIN_LINE, SPIN_LINE + 1) for f in frames):
                    break
        assert [a.endpoint for a in stacks.actors] == ["Busy.spin"] * 2
        assert all(f[0].file == HERE for f in frames)
    finally:
        await busy.release.call()
    assert all(turns > 0 for turns in (await spinning).values())


async def test_idle_actor_shows_no_running_endpoint(procs: meshio.ProcMesh) -> None:
    idle = await procs.spawn("idle", Idle)
    await idle.ping.call()
    stacks = await idle.stacks()
    assert [a.rank for a in stacks.actors] == [0, 1]
    for a in stacks.actors:
        assert a.endpoint is None and a.running_for is None
        assert a.tasks == () and a.thread == () and a.idle and a.innermost() is None
    assert stacks.text() == "idle ranks 0-1: idle\n"
    assert Stacks.from_json(stacks.json()) == stacks


async def test_a_dead_or_stopped_process_is_an_error_line_not_a_hang(
        procs: meshio.ProcMesh) -> None:
    idle = await procs.spawn("idle", Idle)
    os.kill(procs.pids[1], signal.SIGSTOP)  # a hung process: no answer
    try:
        stacks = await idle.stacks(timeout=0.5)
    finally:
        os.kill(procs.pids[1], signal.SIGCONT)
    assert [a.rank for a in stacks.actors] == [0]
    [error] = stacks.errors
    assert error.startswith(f"actor mesh 'idle' rank 1 (pid {procs.pids[1]}) did not answer "
                            "within 0.5 s: ")
    assert stacks.text().endswith(f"error: {error}\n")

    os.kill(procs.pids[1], signal.SIGKILL)
    async with asyncio.timeout(GUARD):
        stacks = await procs.stacks()  # the lost connection answers for it
    assert [a.rank for a in stacks.actors] == [0]
    [error] = stacks.errors
    assert error == f"proc mesh 'procs' rank 1 (pid {procs.pids[1]}): killed by signal SIGKILL"


async def test_bad_timeout_is_a_clear_error(procs: meshio.ProcMesh) -> None:
    idle = await procs.spawn("idle", Idle)
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match=r"stacks\(timeout=...\) must be seconds > 0"):
            await idle.stacks(timeout=bad)
    for wrong in (True, "1"):
        with pytest.raises(TypeError, match=r"stacks\(timeout=...\) must be a number of"):
            await idle.stacks(timeout=wrong)  # type: ignore[arg-type]


def test_endpoint_named_stacks_is_refused() -> None:
    with pytest.raises(TypeError, match=r"\['stacks'\] clash with mesh operations"):
        class Clash(Actor):
            @endpoint
            async def stacks(self) -> None: ...


# ------------------------------------------------------------- rendering

def test_ranks_are_written_as_ranges() -> None:
    assert _ranks([3]) == "rank 3"
    assert _ranks([3, 0, 1, 2]) == "ranks 0-3"
    assert _ranks([0, 1, 4, 6, 7]) == "ranks 0-1,4,6-7"


def _actor(rank: int, line: int, actor: str = "t") -> ActorStacks:
    frames = (StackFrame("/x/train.py", line, "Trainer.step", "loss.backward()"),)
    return ActorStacks(actor, rank, {"gpus": rank}, "h", 100 + rank, "Trainer.step",
                       1.0 + rank / 10, (), frames)


def test_identical_stacks_are_one_group_per_mesh() -> None:
    stacks = Stacks((*[_actor(r, 41) for r in (0, 1, 2, 5)], _actor(3, 44), _actor(4, 41, "u")),
                    ("proc mesh 'p' rank 6: gone",))
    assert stacks.text().splitlines() == [
        "t ranks 0-2,5: in Trainer.step at train.py:41 (endpoint Trainer.step, running for "
        "1.0-1.5 s)",
        "  thread:",
        '    File "/x/train.py", line 41, in Trainer.step',
        "      loss.backward()",
        "t rank 3: in Trainer.step at train.py:44 (endpoint Trainer.step, running for 1.3 s)",
        "  thread:",
        '    File "/x/train.py", line 44, in Trainer.step',
        "      loss.backward()",
        "u rank 4: in Trainer.step at train.py:41 (endpoint Trainer.step, running for 1.4 s)",
        "  thread:",
        '    File "/x/train.py", line 41, in Trainer.step',
        "      loss.backward()",
        "error: proc mesh 'p' rank 6: gone",
    ]
    assert Stacks(()).text() == "no actors\n"


def test_a_notebook_shows_stacks_as_print_does() -> None:
    """``await mesh.stacks()`` as a cell's last line: IPython shows the
    grouped text, as ``print`` does, not a dump of the dataclasses."""
    pretty = pytest.importorskip("IPython.lib.pretty").pretty
    stacks = Stacks((_actor(0, 41), _actor(1, 41)), ("proc mesh 'p' rank 2: gone",))
    assert pretty(stacks) == str(stacks).rstrip("\n") == stacks.text().rstrip("\n")
    assert pretty(stacks).startswith("t ranks 0-1: in Trainer.step at train.py:41 ")
    assert repr(stacks).startswith("Stacks(actors=(ActorStacks(")  # (unchanged)


def test_from_json_rejects_what_is_not_stacks() -> None:
    with pytest.raises(ValueError, match=r"Object missing required field `actors`"):
        Stacks.from_json("{}")
    with pytest.raises(ValueError, match=r"Expected `int`, got `str` - at `\$.actors\[0\].rank`"):
        Stacks.from_json('{"actors": [{"actor": "a", "rank": "0"}]}')


# ------------------------------------------------------------------ wire

frames = st.builds(StackFrame, st.text(), st.integers(0, 2**31), st.text(), st.text())
actors = st.builds(
    ActorStacks, st.text(), st.integers(0, 2**31), st.dictionaries(st.text(), st.integers(0, 99)),
    st.text(), st.integers(0, 2**22), st.none() | st.text(),
    st.none() | st.floats(0, 1e9), st.lists(st.builds(TaskStack, st.text(), st.lists(
        frames, max_size=3).map(tuple)), max_size=2).map(tuple),
    st.lists(frames, max_size=3).map(tuple))


@given(req=st.integers(0, 2**63 - 1), target=st.text(),
       timeout=st.floats(allow_nan=False))
def test_stacks_requests_round_trip(req: int, target: str, timeout: float) -> None:
    for msg in (GetStacks(req, target), JobStacks(req, timeout)):
        assert decode_message(encode_message(msg)) == msg


@given(st.lists(actors, max_size=3))
def test_stacks_reply_round_trips(values: list[ActorStacks]) -> None:
    assert decode_actors(encode_actors(values), []) == values
    stacks = Stacks(tuple(values))
    assert Stacks.from_json(stacks.json()) == stacks


@given(st.binary(max_size=256))
def test_stacks_reply_decoder_takes_any_bytes(body: bytes) -> None:
    try:
        decoded = decode_actors(body, [])
    except msgspec.DecodeError:  # a ValueError: what gather() reports for that process
        return
    assert all(isinstance(a, ActorStacks) for a in decoded)


# ------------------------------------------------------------------- CLI

def test_meshio_stacks_reads_a_running_controller(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    none = meshio_cli("stacks", env=env)
    assert none.returncode == 1 and none.stdout == ""
    assert "no running meshio controller of yours found in" in none.stderr

    with subprocess.Popen([sys.executable, str(CONTROLLER)], env=env, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as controller:
        assert controller.stdin is not None and controller.stdout is not None
        check_cli(controller, env, tmp_path / "meshio" / f"{controller.pid}-1.json")


def test_meshio_stacks_refuses_an_inspection_dir_others_may_write(tmp_path: Path) -> None:
    # a controller's file planted by another user: a live pid of ours, their
    # address and secret; a directory others may write cannot vouch for it
    shared = tmp_path / "meshio"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / f"{os.getpid()}-1.json").write_text(json.dumps({
        "meshio_controller": 1, "pid": os.getpid(), "loop": 1, "thread": "MainThread",
        "address": "tcp://127.0.0.1:9",
        "secret": bytes(32).hex(), "argv": ["planted"], "started": 0.0}))
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    for command in ("stacks", "dashboard"):
        refused = meshio_cli(command, env=env)
        assert refused.returncode == 1 and refused.stdout == ""
        assert f"meshio {command}: {shared} belongs to uid {os.getuid()} with mode 777; " \
               "meshio needs it to be yours, mode 700" in refused.stderr
        assert "planted" not in refused.stderr
    shared.chmod(0o700)  # closed to others: the same file is read
    found = meshio_cli("stacks", env=env)
    assert found.returncode == 1 and "planted" in found.stderr


def check_cli(controller: subprocess.Popen[str], env: dict[str, str], published: Path) -> None:
    assert controller.stdin is not None and controller.stdout is not None
    try:
        assert controller.stdout.readline() == "ready\n"
        assert stat.S_IMODE(published.stat().st_mode) == 0o600
        assert stat.S_IMODE(published.parent.stat().st_mode) == 0o700

        text = meshio_cli("stacks", env=env)
        assert text.returncode == 0, text.stderr
        block_line, hang_line = BLOCK_LINE, HANG_LINE
        assert f"busy ranks 0-1: in Busy.block at stacks_controller.py:{block_line} " \
               "(endpoint Busy.block, running for " in text.stdout
        assert f"busy ranks 2-3: in Busy.hang at stacks_controller.py:{hang_line} " \
               "(endpoint Busy.hang, running for " in text.stdout

        as_json = meshio_cli("stacks", "--json", "--pid", str(controller.pid), env=env)
        assert as_json.returncode == 0, as_json.stderr
        stacks = Stacks.from_json(as_json.stdout)
        assert [(a.actor, a.rank, a.endpoint) for a in stacks.actors] == [
            ("busy", 0, "Busy.block"), ("busy", 1, "Busy.block"),
            ("busy", 2, "Busy.hang"), ("busy", 3, "Busy.hang")]
        assert stacks.errors == ()

        other = meshio_cli("stacks", "--pid", "1", env=env)
        assert other.returncode == 1 and "has pid 1" in other.stderr
        assert f"pid {controller.pid} loop 1 started" in other.stderr
    finally:
        controller.stdin.close()  # the actors are released and the controller ends
        assert controller.wait(GUARD) == 0
    assert not published.exists()


#: a controller of two idle actors (no call in flight that a stopped one
#: would fail) until its stdin closes
IDLE_CONTROLLER = """
import asyncio, sys, meshio
from meshio import Actor

class Idle(Actor):
    pass

async def main():
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        await procs.spawn("idle", Idle)
        print(*procs.pids, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

meshio.run(main())
"""


def test_meshio_stacks_exits_1_when_a_process_did_not_answer(tmp_path: Path) -> None:
    """A process that does not answer (stopped) is an error line after the
    others' stacks, and the exit status is 1 (it was 0: a script could not
    tell a partial answer from a whole one)."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    with subprocess.Popen([sys.executable, "-c", IDLE_CONTROLLER], env=env, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as controller:
        assert controller.stdin is not None and controller.stdout is not None
        try:
            _, stopped = map(int, controller.stdout.readline().split())
            os.kill(stopped, signal.SIGSTOP)
            try:
                text = meshio_cli("stacks", "--timeout", "1", env=env)
                as_json = meshio_cli("stacks", "--timeout", "1", "--json", env=env)
            finally:
                os.kill(stopped, signal.SIGCONT)
            whole = meshio_cli("stacks", env=env)
        finally:
            controller.stdin.close()
        assert controller.wait(GUARD) == 0
    assert text.returncode == 1 and text.stderr == ""
    printed, error = text.stdout.splitlines()
    assert printed == "idle rank 0: idle"
    assert error.startswith(f"error: proc mesh 'procs' rank 1 (pid {stopped}) did not answer "
                            "within 1 s: ")
    assert as_json.returncode == 1 and as_json.stderr == ""
    partial = Stacks.from_json(as_json.stdout)
    assert [a.rank for a in partial.actors] == [0] and len(partial.errors) == 1
    assert whole.returncode == 0 and whole.stdout == "idle ranks 0-1: idle\n"


#: a controller running two event loops, in threads ``loopA`` and ``loopB``,
#: each with a proc mesh and an idle actor mesh (``idleA``, ``idleB``); a
#: line ``A`` on stdin ends loop A (``ended A`` once its thread has)
TWO_LOOPS_CONTROLLER = """
import asyncio, sys, threading, meshio
from meshio import Actor

class Idle(Actor):
    pass

def serve(tag, end):
    async def main():
        mesh = meshio.this_host().spawn_procs(per_host={"procs": 1}, name=f"procs{tag}")
        async with mesh as procs:
            await procs.spawn(f"idle{tag}", Idle)
            print("ready", flush=True)
            await asyncio.to_thread(end.wait)
    asyncio.run(main())

ends = {tag: threading.Event() for tag in "AB"}
threads = {tag: threading.Thread(target=serve, args=(tag, ends[tag]), name=f"loop{tag}")
           for tag in "AB"}
for thread in threads.values():
    thread.start()
for line in sys.stdin:
    tag = line.strip()
    ends[tag].set()
    threads[tag].join()
    print("ended", tag, flush=True)
for tag in "AB":
    ends[tag].set()
    threads[tag].join()
"""


def test_meshio_stacks_shows_every_event_loop_of_a_controller(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller with two event loops (a runtime each) publishes each;
    ``meshio stacks`` shows both, ``--loop`` one; when one loop ends the
    other is still found (they shared ``<pid>.json``: only the last loop
    was seen, and none once the other ended)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    env = dict(os.environ)
    with subprocess.Popen([sys.executable, "-c", TWO_LOOPS_CONTROLLER], env=env, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as controller:
        assert controller.stdin is not None and controller.stdout is not None
        try:
            assert [controller.stdout.readline() for _ in "AB"] == ["ready\n"] * 2
            loops = {c.thread: c for c in controllers()}
            assert sorted(loops) == ["loopA", "loopB"]
            assert {c.pid for c in loops.values()} == {controller.pid}
            a, b = loops["loopA"], loops["loopB"]

            both = meshio_cli("stacks", env=env)
            assert both.returncode == 0, both.stderr
            assert sorted(both.stdout.split("\n")[:-1]) == sorted([
                f"pid {controller.pid} loop {a.loop} (thread 'loopA'):", "idleA rank 0: idle",
                f"pid {controller.pid} loop {b.loop} (thread 'loopB'):", "idleB rank 0: idle"])
            as_json = meshio_cli("stacks", "--json", "--pid", str(controller.pid), env=env)
            assert as_json.returncode == 0, as_json.stderr
            assert sorted(s.actor for s in Stacks.from_json(as_json.stdout).actors) == [
                "idleA", "idleB"]
            one = meshio_cli("stacks", "--loop", str(b.loop), env=env)
            assert (one.returncode, one.stdout) == (0, "idleB rank 0: idle\n"), one.stderr
            refused = meshio_cli("dashboard", env=env)
            assert refused.returncode == 1 and refused.stdout == ""
            assert refused.stderr.startswith(
                f"meshio dashboard: controller pid {controller.pid} runs 2 event loops with "
                "proc meshes; choose one with --loop")
            assert f"pid {controller.pid} loop {a.loop} (thread 'loopA') started" \
                in refused.stderr

            controller.stdin.write("A\n")
            controller.stdin.flush()
            assert controller.stdout.readline() == "ended A\n"
            assert controllers() == [b]
            left = meshio_cli("stacks", "--pid", str(controller.pid), env=env)
            assert (left.returncode, left.stdout) == (0, "idleB rank 0: idle\n"), left.stderr
        finally:
            controller.stdin.close()
        assert controller.wait(GUARD) == 0
    assert controllers() == []


async def test_an_inspection_client_may_read_stacks_and_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        await procs.spawn("idle", Idle)
        [me] = controllers()
        assert me.pid == os.getpid()
        stacks = await ask_stacks(me, GUARD)
        assert [(a.actor, a.rank, a.endpoint) for a in stacks.actors] == [
            ("idle", 0, None), ("idle", 1, None)]

        async def ask(secret: bytes, msg: GetStacks | JobStacks) -> object:
            loop = asyncio.get_running_loop()
            client = Runtime(loop, secret=secret)
            try:
                conn = client.connect(me.address)
                fut: asyncio.Future[object] = loop.create_future()
                conn.send_message(type(msg)(conn.next_req(
                    Pending(fut, lambda raw, bufs: raw, "test", "controller", me.address)),
                    *msgspec.structs.astuple(msg)[1:]))
                async with asyncio.timeout(GUARD):
                    try:
                        return await fut
                    except meshio.MeshioError as e:
                        return e
            finally:
                assert client.addr not in runtime().conns  # its Hello made it nobody
                client.close()

        assert isinstance(await ask(me.secret, JobStacks(0, GUARD)), msgspec.Raw)
        dropped = await ask(me.secret, GetStacks(0, ""))  # a worker's message: not for it
        assert isinstance(dropped, meshio.SupervisionError)
        assert "connection lost" in str(dropped) or "connection closed" in str(dropped)
        refused = await ask(bytes(32), JobStacks(0, GUARD))
        assert isinstance(refused, meshio.AuthenticationError)
        job = await ask(runtime().secret, JobStacks(0, GUARD))  # the job's own secret either
        assert isinstance(job, meshio.AuthenticationError)
    assert controllers() == [me]  # published while its runtime lives ...
    close_runtime()
    assert controllers() == []  # ... and no longer


def test_meshio_help_lists_stacks() -> None:
    out = meshio_cli("--help", env=dict(os.environ))
    assert out.returncode == 0 and "stacks" in out.stdout
    sub = meshio_cli("stacks", "--help", env=dict(os.environ))
    assert sub.returncode == 0
    assert all(flag in sub.stdout for flag in ("--pid", "--json", "--timeout"))
    for timeout in ("0", "inf", "nan"):  # (an infinite one could wait forever)
        bad = meshio_cli("stacks", "--timeout", timeout, env=dict(os.environ))
        assert bad.returncode == 2, bad.stderr
        assert bad.stderr.splitlines()[-1] == ("meshio stacks: error: argument --timeout: "
                                               f"must be finite seconds > 0, got {timeout!r}")
