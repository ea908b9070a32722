"""An actor that starts processes of its own, as user code does (a helper
server with ``subprocess``, a ``multiprocessing`` child with the fork start
method): tests of what becomes of them when their worker goes
(``tests/test_worker_groups.py``, and the controller scripts it runs)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import meshio
from meshio import Actor, endpoint


class Starter(Actor):
    def __init__(self) -> None:
        self.children: list[subprocess.Popen[bytes]] = []

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def start(self, leave_group: bool) -> list[int]:
        """Start a ``sleep`` (a subprocess) and an ``os.fork()`` child that
        sleeps in Python holding the worker's sockets, its connections
        included; with ``leave_group`` both leave the worker's process group
        (each a session of its own) and its output (as a daemon does: the
        worker's stdout and stderr are pipes its controller reads to their
        end).  Their pids, once both are as said."""
        out = subprocess.DEVNULL if leave_group else None
        sleeper = subprocess.Popen(["sleep", "300"], start_new_session=leave_group,
                                   stdout=out, stderr=out)
        self.children.append(sleeper)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # (only os calls and a sleep: a fork of a threaded process)
            if leave_group:
                os.setsid()
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
            os.write(w, b"x")
            time.sleep(300)
            os._exit(0)
        os.close(w)
        os.read(r, 1)  # it has left the group if it was to
        os.close(r)
        return [sleeper.pid, pid]

    @endpoint
    async def deaf(self) -> int:
        """Start a Python child that ignores SIGTERM (as a server that
        drains for minutes does); its pid, once it ignores it."""
        child = subprocess.Popen(
            [sys.executable, "-c", "import signal; signal.signal(signal.SIGTERM, "
             "signal.SIG_IGN); print(flush=True); signal.pause()"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        self.children.append(child)
        assert child.stdout is not None
        child.stdout.readline()  # (its SIGTERM is ignored from now on)
        return child.pid


class Nester(Actor):
    """Starts a proc mesh of its own (nested), whose actor starts processes."""

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def nest(self) -> list[int]:
        """The nested worker's pid, then those of its actor's children."""
        self.procs = await meshio.this_host().spawn_procs(per_host={"procs": 1}, name="nested")
        s = await self.procs.spawn("s", Starter)
        return [await s.pid.call_one(), *await s.start.call_one(False)]
