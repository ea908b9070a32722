"""Controllers (and host agents) started in process environments a
developer's shell does not give: what they inherit must not change what
meshio reports or crash it.

A controller that ignores SIGCHLD (``SIG_IGN``: set by the program or a
library, or inherited across ``exec`` from a parent that ignored it): the
kernel reaps its children at once, so a worker's exit status is gone before
meshio reads it.  ``subprocess`` then reports 0, and a SIGKILLed worker was
called "exited normally": a ``transient`` actor was not restarted.  Now the
status is said to be lost (and counts as abnormal), and a worker does not
pass the ignored SIGCHLD on to what its actors run.  Nor does a host agent
(``meshio agent``) keep one it inherited: every exit status of its host's
workers was lost, and the cause told the controller to stop ignoring it.

A ``meshio.run`` controller started with stdin or stdout closed (``cmd
<&-``): a socket of its loop took descriptor 0 or 1 and libuv aborted the
process as it closed it at the end (a core dump, status 134)."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import meshio
from meshio import Actor, endpoint
from script_run import DEADLINE, run_script

SCRIPT = """
import asyncio
import os
import signal
import subprocess

signal.signal(signal.SIGCHLD, signal.SIG_IGN)

import meshio
from meshio import Actor, endpoint


class A(Actor):
    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def killed_child(self) -> int:
        return subprocess.run(["sh", "-c", "kill -KILL $$"]).returncode


async def main() -> None:
    sup = meshio.Supervisor(max_restarts=3, within=60.0)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, supervisor=sup) as procs:
        a = await procs.options(restart="transient").spawn("a", A)
        print("CHILD", await a.killed_child.call_one(), flush=True)
        pid = await a.pid.call_one()
        events = sup.events()
        os.kill(pid, signal.SIGKILL)
        async with asyncio.timeout(30):  # (before: no restart came)
            async for ev in events:
                if ev.kind in ("failure", "restart"):
                    print("EVENT", ev.kind, ev.cause, flush=True)
                if ev.kind == "restart":
                    break
        print("NEW PID", await a.pid.call_one() != pid, flush=True)


asyncio.run(main())
"""


def test_a_worker_killed_under_an_ignored_sigchld_is_not_called_a_normal_exit(
        tmp_path: Path) -> None:
    lines = run_script(tmp_path, SCRIPT)
    assert lines[0] == "CHILD -9", lines  # the worker's own children keep their statuses
    failure = next(x for x in lines if x.startswith("EVENT failure"))
    assert "exited (its status was lost: something else reaped it; SIGCHLD is ignored" in \
        failure, lines
    assert "EVENT restart one_for_one restart" in lines, lines  # transient: abnormal
    assert lines[-1] == "NEW PID True", lines


class Pid(Actor):
    @endpoint
    async def pid(self) -> int:
        return os.getpid()


#: ``meshio agent`` run by a parent that ignores SIGCHLD (``exec`` keeps it
#: ignored)
IGNORING_AGENT = ("import os, signal, sys; signal.signal(signal.SIGCHLD, signal.SIG_IGN); "
                  "os.execv(sys.executable, [sys.executable, '-m', 'meshio', 'agent', "
                  "*sys.argv[1:]])")


async def test_an_agent_started_with_sigchld_ignored_keeps_its_workers_statuses(
        tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(secrets.token_hex(32))
    secret_file.chmod(0o600)
    agent = subprocess.Popen(
        [sys.executable, "-c", IGNORING_AGENT, "--listen", "127.0.0.1:0", "--secret-file",
         str(secret_file)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        assert agent.stdout is not None
        line = (await asyncio.wait_for(asyncio.to_thread(agent.stdout.readline),
                                       DEADLINE)).decode()
        assert line.startswith("meshio agent listening on "), line
        hosts = meshio.attach([line.split()[-1]], secret_file=secret_file)
        sup = meshio.Supervisor(max_restarts=3, within=60.0)
        async with hosts.spawn_procs(per_host={"procs": 1}, supervisor=sup) as procs:
            a = await procs.options(restart="transient").spawn("a", Pid)
            pid = await a.pid.call_one()
            events = sup.events()
            os.kill(pid, signal.SIGKILL)
            async with asyncio.timeout(DEADLINE):
                failure = await anext(ev async for ev in events if ev.kind == "failure")
        # (before: "exited (its status was lost: ... SIGCHLD is ignored in this process")
        assert "killed by signal SIGKILL" in failure.cause, failure.cause
    finally:
        agent.terminate()
        agent.wait(DEADLINE)
        if agent.stdout is not None:
            agent.stdout.close()


STDIO = """
import sys

import meshio
from meshio import Actor, endpoint


class A(Actor):
    @endpoint
    async def double(self, x: int) -> int:
        return 2 * x


async def main() -> list[int]:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        a = await procs.spawn("a", A)
        return list((await a.double.call(21)).values())


with open(sys.argv[1], "w") as out:
    out.write(repr(meshio.run(main())))
"""


@pytest.mark.parametrize("closed", ["<&-", ">&-", "<&- >&-"])
def test_a_meshio_run_controller_started_with_stdio_closed_exits_cleanly(
        tmp_path: Path, closed: str) -> None:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(STDIO))
    result = tmp_path / "result"
    proc = subprocess.run(["sh", "-c", f'exec "$0" "$1" "$2" {closed}', sys.executable,
                           str(script), str(result)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=DEADLINE)
    assert proc.returncode == 0, proc.stderr
    assert result.read_text() == "[42, 42]"
