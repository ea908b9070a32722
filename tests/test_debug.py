"""``breakpoint()`` in actors and ``meshio debug``, driven through
pseudo-terminals (``pexpect``): a controller script (``debug_controller.py``)
in one, ``meshio debug`` in another, as a user would type."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pexpect
import pytest

import debug_controller
from meshio._inspect import ASK_TIMEOUT
from stacks_controller import running

CONTROLLER = Path(debug_controller.__file__).resolve()
#: generous bound on one expected answer (a loaded 2-core machine)
EXPECT_TIMEOUT = 60
PROMPT = "(meshio debug) "
PDB = "(Pdb) "
#: pdb stops on the line after ``breakpoint()`` (or ``pdb.set_trace()``)
#: before Python 3.13, on the call's own line from 3.13 on
STOPS_AFTER = sys.version_info < (3, 13)

pytestmark = pytest.mark.timeout(240)


def line_of(text: str) -> int:
    """The line of ``debug_controller.py`` holding ``text``, 1-based."""
    lines = CONTROLLER.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def spawn(*args: str, env: dict[str, str]) -> pexpect.spawn:
    child = pexpect.spawn(sys.executable, list(args), env=env, encoding="utf-8",
                          timeout=EXPECT_TIMEOUT, dimensions=(50, 200))
    child.logfile_read = io.StringIO()  # everything it showed (see seen_on)
    return child


def seen_on(child: pexpect.spawn) -> str:
    """Everything ``child`` has shown so far."""
    return cast(io.StringIO, child.logfile_read).getvalue()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a controller and its ``meshio debug``: a
    directory of published controllers of their own; the controller's own
    terminal does not debug (``meshio debug`` does)."""
    yield {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path), "MESHIO_DEBUG_TERMINAL": "0"}


def ask(debug: pexpect.spawn, line: str, until: str = PDB) -> list[str]:
    """Type ``line`` in ``debug``; the lines it shows before ``until``."""
    debug.sendline(line)
    debug.expect_exact(until)
    return debug.before.splitlines()[1:]  # (after the echo of what was typed)


def exited_cleanly(child: pexpect.spawn) -> None:
    """Wait for ``child`` to end; it must exit with 0."""
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def close(*children: pexpect.spawn) -> None:
    """End ``children`` if still running, and close their terminals."""
    for child in children:
        child.close(force=True)


def test_the_controller_s_own_terminal_debugs(env: dict[str, str]) -> None:
    """A controller on a terminal debugs its paused actors there, with
    ``meshio debug``'s commands: both pauses announced, the listing and its
    prompt, attach, print, continue one; ``continue all`` hands the
    terminal back to the program, whose calls return."""
    controller = spawn(str(CONTROLLER), "terminal", env={**env, "MESHIO_DEBUG_TERMINAL": ""})
    try:
        seen = set()
        for _ in range(2):  # in either order, the console opening at the first
            controller.expect(r"meshio: steppers rank (\d) paused at (\S+):\d+ in \S+ "
                              r"\(pid \d+ on \S+\); debug it on this terminal")
            seen.add(controller.match.group(1))
            assert controller.match.group(2) == str(CONTROLLER)
        assert seen == {"0", "1"}
        assert "attached to steppers rank 0" in "\n".join(ask(controller, "attach steppers 0"))
        assert ask(controller, "p doubled") == ["20"]
        assert ask(controller, "c", PROMPT) == ["meshio: steppers rank 0 continued"]
        listing = "\n".join(ask(controller, "list", PROMPT))
        assert "steppers rank 1: " in listing and "steppers rank 0" not in listing
        # the actor alone: its only paused rank
        assert "attached to steppers rank 1" in "\n".join(ask(controller, "attach steppers"))
        assert ask(controller, "p doubled") == ["60"]
        assert ask(controller, "detach", PROMPT) == [
            "meshio: detached from steppers rank 1 (it stays paused)"]
        controller.sendline("continue all")
        controller.expect_exact("meshio: back to the program")
        controller.expect(r"results \[21, 61\]")
        exited_cleanly(controller)
    finally:
        close(controller)


#: a controller on its own terminal (``python -c`` this) whose rank 1 stays
#: paused in ``step_sync`` while rank 0 pauses in ``step``, is continued and
#: pauses again, the terminal's console open meanwhile
PAUSES_AGAIN = """
import asyncio
import meshio
from debug_controller import Paused


async def main() -> None:
    async with meshio.this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        paused = await procs.spawn("steppers", Paused)
        held = asyncio.ensure_future(paused.slice(gpus=1).step_sync.call_one(20))
        first = await paused.slice(gpus=0).step.call_one(10)
        second = await paused.slice(gpus=0).step.call_one(first)
        print(f"results {[first, second, await held]}", flush=True)

meshio.run(main())
"""


def test_a_pause_is_announced_once_on_the_controller_s_terminal(env: dict[str, str]) -> None:
    """A pause while the controller's terminal debugs another one is
    announced there once (its stderr line), not once more by the console."""
    path = os.pathsep.join(filter(None, [str(CONTROLLER.parent), env.get("PYTHONPATH")]))
    controller = spawn("-c", PAUSES_AGAIN,
                       env={**env, "MESHIO_DEBUG_TERMINAL": "", "PYTHONPATH": path})
    try:
        # (pexpect matches with re.DOTALL: ``.*`` would take both lines when both are in)
        announced = r"meshio: steppers rank {} paused at [^\r\n]*; debug it on this terminal"
        for _ in range(2):  # in either order, the console opening at the first
            controller.expect(announced.format(r"\d"))
        ask(controller, "attach steppers 0")
        since = len(seen_on(controller))
        controller.sendline("c")
        controller.expect(announced.format(0))  # it paused again
        controller.sendline("list")  # (its answer follows whatever the console was sent)
        controller.expect(r"oldest first:\r\n  steppers rank 1: [^\r]*\r\n"
                          r"  steppers rank 0: [^\r]*\r\n" + re.escape(PROMPT))
        again = seen_on(controller)[since:]
        assert "meshio: steppers rank 0 continued" in again
        assert again.count("steppers rank 0 paused at") == 1, again
        controller.sendline("continue all")
        controller.expect_exact("meshio: back to the program")
        controller.expect(r"results \[21, 43, 61\]")
        exited_cleanly(controller)
    finally:
        close(controller)


def test_attach_print_step_continue(env: dict[str, str]) -> None:
    """Two ranks paused (an ``async`` endpoint in ``breakpoint()``, a
    ``def`` one in ``pdb.set_trace()``), each announced once with actor,
    rank, host and file:line; ``meshio debug`` lists both, attaches to
    one, prints a local, steps, detaches, attaches to the other, continues
    it, then ``continue all``: the controller's calls return.  Meanwhile
    another actor of the process paused in the ``def`` endpoint answers."""
    controller = spawn(str(CONTROLLER), "pair", env=env)
    debug = None
    try:
        host = os.uname().nodename
        seen = set()
        for _ in range(2):
            controller.expect(r"meshio: steppers rank (\d) paused at (\S+):(\d+) in (\S+) "
                              r"\(pid \d+ on (\S+)\); attach with `meshio debug`")
            rank, file, line, function, where = controller.match.groups()
            seen.add(rank)
            assert (file, where) == (str(CONTROLLER), host)
            expected = ("step", "# async breakpoint") if rank == "0" else \
                       ("step_sync", "# def breakpoint")
            assert function == f"Paused.{expected[0]}"
            assert int(line) == line_of(expected[1]) + STOPS_AFTER
        assert seen == {"0", "1"}
        controller.sendline("go")  # another actor of the process paused in a def endpoint
        controller.expect_exact("bystander 1 answered")

        debug = spawn("-m", "meshio", "debug", env=env)
        debug.expect("paused actors, oldest first:\r\n(.*?)" + re.escape(PROMPT))
        listing = debug.match.group(1)
        assert "steppers rank 0: " in listing and "steppers rank 1: " in listing

        shown = "\n".join(ask(debug, "attach steppers 0"))
        assert "attached to steppers rank 0" in shown
        if not STOPS_AFTER:  # at the breakpoint: one step to where older versions stop
            assert "-> breakpoint()  # async breakpoint" in shown
            shown = "\n".join(ask(debug, "n"))
        assert "-> shifted = doubled + 1" in shown
        assert ask(debug, "p doubled") == ["20"]
        assert "-> await asyncio.sleep(0)  # the loop runs other tasks meanwhile" in \
            ask(debug, "n")
        assert ask(debug, "p shifted") == ["21"]
        assert "-> return shifted  # async" in ask(debug, "n")  # over an await
        innermost = ask(debug, "bt")[-2]  # (then its line of code)
        assert innermost == f"> {CONTROLLER}({line_of('return shifted  # async')})step()"
        assert ask(debug, "detach", PROMPT) == [
            "meshio: detached from steppers rank 0 (it stays paused)"]

        assert "rank 1 stops here" in ask(debug, "attach steppers 1")
        assert ask(debug, "p doubled") == ["60"]
        assert ask(debug, "c", PROMPT) == ["meshio: steppers rank 1 continued"]
        listing = "\n".join(ask(debug, "list", PROMPT))
        assert "steppers rank 0: " in listing and "steppers rank 1" not in listing

        debug.sendline("continue all")
        controller.expect(r"results \[21, 61\]")
        exited_cleanly(controller)
        assert controller.before.count("paused at") == 0  # each pause announced once
        assert "has been running for" not in seen_on(controller)  # paused, not stalled
        debug.expect(pexpect.EOF)
    finally:
        close(controller, *([debug] if debug is not None else []))


def step_out(debug: pexpect.spawn) -> list[str]:
    """Type pdb's ``n`` in ``debug`` until its session ends (its prompt is
    ``meshio debug``'s again); the lines it showed.  Each stop is in the
    endpoint stepped in: none in meshio's own code, none in another call."""
    shown: list[str] = []
    for _ in range(8):
        debug.sendline("n")
        ended = debug.expect_exact([PDB, PROMPT]) == 1
        lines = debug.before.splitlines()[1:]
        shown += lines
        stops = [line for line in lines if line.startswith("> ")]
        assert all(stop.startswith(f"> {CONTROLLER}(") for stop in stops), shown
        assert not any(stop.endswith("ping()") for stop in stops), shown
        assert "--Call--" not in lines, shown
        if ended:
            return shown
    raise AssertionError(f"still in pdb after 8 `n`: {shown}")


@pytest.mark.parametrize("rank", [0, 1], ids=["async", "def"])
def test_stepping_out_of_the_endpoint_continues(env: dict[str, str], rank: int) -> None:
    """pdb's ``n`` past the end of the endpoint (``async`` on rank 0, ``def``
    on rank 1) ends the session as ``c`` does: the call returns, pdb stops
    neither in meshio's frames nor in the actor's next call (which answers,
    unannounced), and ``meshio debug``'s prompt is back."""
    controller = spawn(str(CONTROLLER), "pair", env=env)
    debug = None
    try:
        for _ in range(2):
            controller.expect(r"meshio: steppers rank \d paused at ")
        controller.sendline("go")
        controller.expect_exact("bystander 1 answered")
        debug = spawn("-m", "meshio", "debug", env=env)
        debug.expect_exact(PROMPT)
        other = 1 - rank  # continued first: stepping out returns the last paused call
        ask(debug, f"attach steppers {other}")
        assert ask(debug, "c", PROMPT) == [f"meshio: steppers rank {other} continued"]
        ask(debug, f"attach steppers {rank}")
        assert step_out(debug)[-1] == f"meshio: steppers rank {rank} continued"
        controller.expect(r"results \[21, 61\]")
        controller.expect(r"steppers answered \[0, 1\]")
        exited_cleanly(controller)
        assert "paused at" not in seen_on(controller).split("bystander 1 answered")[1]
    finally:
        close(controller, *([debug] if debug is not None else []))


def test_attach_again_shows_where_pdb_stands(env: dict[str, str]) -> None:
    """A session attached to again (after ``detach``, or after its
    ``meshio debug`` was killed) shows where pdb stands and its prompt, as
    at the first attach; a killed client's session is not listed as
    attached any more."""
    controller = spawn(str(CONTROLLER), "pair", env=env)
    debugs: list[pexpect.spawn] = []
    where = f"> {CONTROLLER}({line_of('# def breakpoint') + STOPS_AFTER})step_sync()"
    try:
        for _ in range(2):
            controller.expect(r"meshio: steppers rank \d paused at ")
        for _ in range(2):
            debug = spawn("-m", "meshio", "debug", env=env)
            debugs.append(debug)
            debug.expect("paused actors, oldest first:\r\n(.*?)" + re.escape(PROMPT))
            assert "(attached)" not in debug.match.group(1)
            assert where in "\n".join(ask(debug, "attach steppers 1"))
            assert ask(debug, "p doubled") == ["60"]
            debug.kill(signal.SIGKILL)
            debug.expect(pexpect.EOF)
        debug = debugs[-1] = spawn("-m", "meshio", "debug", env=env)
        debug.expect_exact(PROMPT)
        ask(debug, "attach steppers 1")
        assert ask(debug, "detach", PROMPT) == [
            "meshio: detached from steppers rank 1 (it stays paused)"]
        assert where in "\n".join(ask(debug, "attach steppers 1"))
        assert ask(debug, "c", PROMPT) == ["meshio: steppers rank 1 continued"]
        debug.sendline("continue all")
        controller.sendline("go")
        controller.expect(r"results \[21, 61\]")
        exited_cleanly(controller)
    finally:
        close(controller, *debugs)


def test_attach_names_what_exists(env: dict[str, str]) -> None:
    """``attach`` of an actor mesh or a rank this controller does not have
    says so, naming those it has, instead of waiting for it to pause;
    ``attach <actor>`` with several of its ranks paused, or none, names
    them (or says none is), not the whole help; waiting for one that has
    not paused stops at a line typed or at the end of ``meshio debug``'s
    input; ``detach`` with nothing attached says what it is for."""
    controller = spawn(str(CONTROLLER), "pair", env=env)
    debug = None

    def answer(line: str) -> list[str]:
        """``ask(debug, line, PROMPT)``, failing at once if it waits instead."""
        assert debug is not None
        debug.sendline(line)
        assert debug.expect_exact([PROMPT, "to pause"]) == 0, debug.before
        return cast(str, debug.before).splitlines()[1:]
    try:
        for _ in range(2):
            controller.expect(r"meshio: steppers rank \d paused at ")
        debug = spawn("-m", "meshio", "debug", env=env)
        debug.expect_exact(PROMPT)
        assert answer("detach") == ["meshio debug: not attached to any actor: `detach` leaves a "
                                    "pdb session (`attach <actor> <rank>` starts one)"]
        assert answer("attach nosuch 99") == [
            f"meshio debug: no actor mesh named 'nosuch' in the proc meshes of this controller "
            f"(pid {controller.pid}); its actor meshes: bystanders (ranks 0-1), "
            "steppers (ranks 0-1)"]
        assert answer("attach steppers 7") == [
            "meshio debug: actor mesh 'steppers' has no rank 7 (it has ranks 0-1)"]
        assert answer("attach steppers") == [
            "meshio debug: 2 ranks of 'steppers' are paused (0, 1): `attach steppers <rank>` "
            "picks one"]
        assert answer("attach bystanders") == [
            "meshio debug: no rank of 'bystanders' is paused (`attach bystanders <rank>` waits "
            "for that rank)"]
        assert answer("attach nosuch")[0].startswith(
            "meshio debug: no actor mesh named 'nosuch' in the proc meshes of this controller")
        waiting = "meshio: waiting for bystanders rank 1 to pause (`detach` stops waiting)"
        debug.sendline("attach bystanders 1")  # (it never pauses)
        debug.expect_exact(waiting)
        listing = "\n".join(answer("list"))
        assert "meshio: stopped waiting for bystanders rank 1" in listing
        assert "steppers rank 0: " in listing and "steppers rank 1: " in listing
        assert answer("continue all") == ["meshio: continuing 2 paused actor(s)"]
        debug.sendline("attach bystanders 1")
        debug.expect_exact(waiting)
        debug.sendeof()
        exited_cleanly(debug)
        controller.sendline("go")
        controller.expect(r"results \[21, 61\]")
        exited_cleanly(controller)
    finally:
        close(controller, *([debug] if debug is not None else []))


def test_paused_actor_answers_heartbeats(env: dict[str, str]) -> None:
    """An ``async`` endpoint paused in ``breakpoint()`` holds its worker's
    loop, yet its process answers heartbeats (through its debug link) for
    three heartbeat timeouts: the controller does not call it not
    responding, the actor of another process answers calls meanwhile, and
    the paused call returns once continued."""
    controller = spawn(str(CONTROLLER), "heartbeats", env=env)
    debug = None
    try:
        controller.expect("meshio: steppers rank 0 paused at ")
        controller.expect(r"other process answered (\d+) calls")
        assert int(controller.match.group(1)) > 0
        assert "not responding" not in controller.before
        debug = spawn("-m", "meshio", "debug", env=env)
        debug.expect_exact(PROMPT)
        debug.sendline("continue all")
        controller.expect(r"result (\d+)")
        assert controller.match.group(1) == "11"
        assert "not responding" not in controller.before
        assert "has been running for" not in seen_on(controller)  # paused, not stalled
        exited_cleanly(controller)
    finally:
        close(controller, *([debug] if debug is not None else []))


def test_actor_of_a_host_agent(env: dict[str, str], tmp_path: Path) -> None:
    """An actor on another host (a host agent's worker, whose debug link
    reaches the controller over TCP with the job's secret) is driven the
    same way: ``attach`` given before it pauses waits for it; pdb's ``q``
    makes its endpoint raise ``BdbQuit`` to the caller."""
    controller = spawn(str(CONTROLLER), "agents", str(tmp_path / ".meshio"), env=env)
    debug = None
    try:
        controller.expect_exact("spawned")
        debug = spawn("-m", "meshio", "debug", env=env)
        debug.expect_exact(PROMPT)
        debug.sendline("attach remote 0")
        debug.expect_exact("meshio: waiting for remote rank 0 to pause (`detach` stops waiting)")
        controller.sendline("go")
        debug.expect_exact(PDB)
        assert "meshio: attached to remote rank 0 at " in debug.before
        assert ask(debug, "p doubled") == ["14"]
        assert ask(debug, "q", PROMPT)[-1] == \
            "meshio: remote rank 0 quit (its endpoint raises bdb.BdbQuit)"
        controller.expect_exact("failed: bdb.BdbQuit")
        exited_cleanly(controller)
    finally:
        close(controller, *([debug] if debug is not None else []))


def test_a_controller_that_does_not_answer_is_given_up(env: dict[str, str]) -> None:
    """``meshio debug`` against a controller that does not answer (stopped:
    SIGSTOP) says so in one line and exits 1 once :data:`ASK_TIMEOUT` has
    passed, as ``meshio dashboard`` does; it waited, silent, for ever."""
    with running(env) as controller:
        os.kill(controller.pid, signal.SIGSTOP)
        try:
            out = subprocess.run(
                [sys.executable, "-m", "meshio", "debug", "--pid", str(controller.pid)],
                env=env, text=True, capture_output=True, stdin=subprocess.DEVNULL,
                timeout=ASK_TIMEOUT + EXPECT_TIMEOUT)
        finally:
            os.kill(controller.pid, signal.SIGCONT)
    assert out.returncode == 1 and out.stdout == ""
    assert re.fullmatch(rf"meshio debug: controller pid {controller.pid} loop 1 started [^\n]* did "
                        rf"not answer within {ASK_TIMEOUT:g} s\n", out.stderr), out.stderr


def test_cli(env: dict[str, str]) -> None:
    """``meshio --help`` lists ``debug``, ``meshio debug --help`` its
    commands' words and ``--pid``; without a controller (or with a pid no
    controller has) it says where it looked and exits 1."""
    def meshio(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "meshio", *args], env=env, text=True,
                              capture_output=True, stdin=subprocess.DEVNULL)
    helped = meshio("--help")
    assert helped.returncode == 0
    assert re.search(r"^\s+debug\s+attach to the actors of a running controller paused",
                     helped.stdout, re.M)
    sub = meshio("debug", "--help")
    assert sub.returncode == 0
    assert all(word in " ".join(sub.stdout.split()) for word in (
        "--pid", "breakpoint()", "pdb.set_trace()", "`attach <actor> <rank>`", "`detach`",
        "`continue all`"))
    none = meshio("debug")
    assert none.returncode == 1
    assert none.stderr.startswith("meshio debug: no running meshio controller of yours found")
    other = meshio("debug", "--pid", "1")
    assert other.returncode == 1
    assert other.stderr.startswith("meshio debug: no running meshio controller of yours has "
                                   "pid 1")
