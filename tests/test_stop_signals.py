"""Issue 15 item 11: SIGTERM stops a ``meshio.run`` controller as Ctrl-C
does, and more signals during that stop are safe.

Real processes and real signals: a controller script in its own process
group, with workers whose actors write a file in ``__cleanup__``; signals
sent as a terminal (Ctrl-C to the group), ``timeout`` (to the controller,
then to its group, back to back) and Kubernetes (to the controller only)
send them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from meshio.testing._helpers import wait_exited

#: generous bound on any single wait: a regression fails instead of hanging
DEADLINE = 60.0

CONTROLLER = '''
import asyncio
import os
import sys

import meshio
from meshio import Actor, endpoint


class Tidy(Actor):
    def __init__(self, out: str) -> None:
        self.out = out

    @endpoint
    async def ping(self, x: int) -> int:
        return x

    def __cleanup__(self, exc: BaseException | None) -> None:
        with open(os.path.join(self.out, str(os.getpid())), "w") as f:
            f.write("cleaned up")


async def main(out: str) -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        tidy = await procs.spawn("tidy", Tidy, out)
        print("ready", *procs.pids, flush=True)
        while True:  # traffic: the loop is busy in its transports when signals land
            await tidy.ping.call(1)


meshio.run(main(sys.argv[1]))
'''


class Controller:
    """A controller script running in a process group of its own."""

    def __init__(self, proc: asyncio.subprocess.Process, out: Path, pids: list[int]) -> None:
        self.proc = proc
        self.out = out
        self.pids = pids
        self.fds = [os.pidfd_open(pid) for pid in pids]

    @classmethod
    async def start(cls, tmp_path: Path, name: str) -> Controller:
        script = tmp_path / "controller.py"
        if not script.exists():
            script.write_text(textwrap.dedent(CONTROLLER))
        out = tmp_path / name
        out.mkdir()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(script), str(out), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True)
        assert proc.stdout is not None
        try:
            ready = await asyncio.wait_for(proc.stdout.readline(), DEADLINE)
        except BaseException:
            proc.kill()
            await proc.wait()
            raise
        assert ready.startswith(b"ready "), ready
        return cls(proc, out, [int(p) for p in ready.split()[1:]])

    async def first_line(self) -> bytes:
        """The first line on stderr: the controller has taken the signal."""
        assert self.proc.stderr is not None
        return await asyncio.wait_for(self.proc.stderr.readline(), DEADLINE)

    async def end(self) -> tuple[int, str]:
        """Exit status and the rest of stderr, once every worker is gone too."""
        try:
            _, err = await asyncio.wait_for(self.proc.communicate(), DEADLINE)
            for fd in self.fds:
                await wait_exited(fd, DEADLINE)
        finally:
            self.close()
        assert self.proc.returncode is not None
        return self.proc.returncode, err.decode()

    def close(self) -> None:
        if self.proc.returncode is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def cleaned_up(self) -> list[int]:
        return sorted(int(p.name) for p in self.out.iterdir()
                      if p.read_text() == "cleaned up")


@pytest.mark.parametrize("how", ["timeout", "kubernetes"])
async def test_sigterm_stops_the_controller_gracefully(tmp_path: Path, how: str) -> None:
    """SIGTERM as ``timeout`` sends it (to the controller, then at once to
    its whole group, which the workers are not in) or as Kubernetes does (to the
    controller only): one line, the actors' ``__cleanup__`` ran in every
    worker, every worker exited, and the controller exits with 143."""
    c = await Controller.start(tmp_path, "run")
    try:
        os.kill(c.proc.pid, signal.SIGTERM)
        if how == "timeout":
            os.killpg(c.proc.pid, signal.SIGTERM)
        code, err = await c.end()
    finally:
        c.close()
    assert err == "meshio: terminated (SIGTERM); stopping worker processes\n"
    assert code == 128 + signal.SIGTERM
    assert c.cleaned_up() == sorted(c.pids)


async def test_sighup_stops_the_controller_gracefully(tmp_path: Path) -> None:
    """SIGHUP, as a closing terminal or ssh session sends it to the
    controller's group (the workers lead groups of their own): stopped as
    by SIGTERM, its actors' ``__cleanup__`` ran, exit status 129 (it died by
    the signal, nothing cleaned up)."""
    c = await Controller.start(tmp_path, "run")
    try:
        os.killpg(c.proc.pid, signal.SIGHUP)
        code, err = await c.end()
    finally:
        c.close()
    assert err == "meshio: hung up (SIGHUP: its terminal closed); stopping worker processes\n"
    assert code == 128 + signal.SIGHUP
    assert c.cleaned_up() == sorted(c.pids)


async def test_more_ctrl_c_during_the_stop_is_safe(tmp_path: Path) -> None:
    """Ctrl-C again while the stop runs, after its line is out (a user
    pressing twice), and two SIGINTs back to back (``timeout -s INT``:
    to the controller, then to its group), several controllers at once to
    catch races: each prints its one line and nothing else (no traceback,
    no "Fatal error on transport"), exits with 130, its workers exit."""
    async def twice_after_the_line(name: str) -> tuple[Controller, int, str]:
        c = await Controller.start(tmp_path, name)
        try:
            os.killpg(c.proc.pid, signal.SIGINT)
            first = await c.first_line()
            os.killpg(c.proc.pid, signal.SIGINT)
            os.killpg(c.proc.pid, signal.SIGINT)
            code, err = await c.end()
        finally:
            c.close()
        return c, code, first.decode() + err

    async def back_to_back(name: str) -> tuple[Controller, int, str]:
        c = await Controller.start(tmp_path, name)
        try:
            os.kill(c.proc.pid, signal.SIGINT)
            os.killpg(c.proc.pid, signal.SIGINT)
            code, err = await c.end()
        finally:
            c.close()
        return c, code, err

    runs = await asyncio.gather(*(twice_after_the_line(f"after{i}") for i in range(3)),
                                *(back_to_back(f"pair{i}") for i in range(3)))
    for c, code, err in runs:
        assert err == "meshio: interrupted (Ctrl-C); stopping worker processes\n", err
        assert code == 128 + signal.SIGINT
        assert c.cleaned_up() == sorted(c.pids)
