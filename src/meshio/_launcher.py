"""Starting worker processes: the one seam a host agent takes over.

A :class:`ProcLauncher` starts ``python -m meshio.worker`` processes on one
host and hands back :class:`ProcHandle`\\ s to watch and signal them.  The
controller's own host uses :class:`LocalLauncher`; a per-host agent (for
remote hosts) implements the same two methods.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

__all__ = ("LocalLauncher", "LocalProc", "ProcHandle", "ProcLauncher", "WorkerSpec",
           "describe_exit")


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to start: its id, where it listens, whom it reports to."""

    worker: str
    listen: str
    controller: str
    env: Mapping[str, str] = field(default_factory=dict)
    #: a replacement for a failed worker (its actors are being rebuilt)
    restart: bool = False
    #: prefix of the worker's forwarded output lines, e.g. ``"[trainers gpus=1]"``
    label: str = ""
    #: the job secret; a launcher hands it over out of band (stdin), never in
    #: argv or the environment
    secret: bytes = field(default=b"", repr=False)

    def restarted(self) -> WorkerSpec:
        return replace(self, restart=True)


class ProcHandle(Protocol):
    """A started worker process."""

    pid: int
    host: str

    @property
    def returncode(self) -> int | None: ...
    async def wait(self) -> int:
        """Wait for the process to exit; its return code (negative: signal)."""
        ...
    def send_signal(self, sig: int) -> None: ...


class ProcLauncher(Protocol):
    """Starts worker processes on one host."""

    host: str

    async def launch(self, spec: WorkerSpec) -> ProcHandle: ...


def describe_exit(rc: int | None) -> str:
    """Human words for a return code."""
    if rc is None:
        return "connection lost (process still running)"
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return "exited normally" if rc == 0 else f"exited with code {rc}"


class LocalProc:
    """A worker on this host, watched with a pidfd (no thread, no SIGCHLD)."""

    def __init__(self, popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop,
                 label: str = "") -> None:
        self._popen = popen
        for pipe, name in ((popen.stdout, "stdout"), (popen.stderr, "stderr")):
            if pipe is not None:
                loop.create_task(loop.connect_read_pipe(
                    functools.partial(_Forward, label, name), pipe))
        self.pid = popen.pid
        self.host = socket.gethostname()
        self._loop = loop
        self._exit: asyncio.Future[int] = loop.create_future()
        try:
            self._fd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):  # no pidfd: a thread waits instead
            self._fd = -1
            fut = loop.run_in_executor(None, popen.wait)
            fut.add_done_callback(lambda f: self._set(f.result()))
        else:
            loop.add_reader(self._fd, self._reap)

    def _reap(self) -> None:
        rc = self._popen.poll()
        if rc is not None:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._set(rc)

    def _set(self, rc: int) -> None:
        if not self._exit.done():
            self._exit.set_result(rc)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode if self._exit.done() else self._popen.poll()

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    def send_signal(self, sig: int) -> None:
        if self._popen.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


class _Forward(asyncio.Protocol):
    """Copies a worker's stdout or stderr to the controller's, line by line,
    each line prefixed with the worker's label."""

    def __init__(self, label: str, stream: str) -> None:
        self._prefix = f"{label} ".encode()
        self._stream = stream
        self._partial = b""

    def data_received(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        if lines:
            self._write(b"".join(self._prefix + line + b"\n" for line in lines))

    def eof_received(self) -> bool | None:
        if self._partial:
            self._write(self._prefix + self._partial + b"\n")
            self._partial = b""
        return None

    def _write(self, data: bytes) -> None:
        out = getattr(sys, self._stream)  # looked up each time: follows redirection
        try:
            out.write(data.decode(errors="replace"))
            out.flush()
        except (OSError, ValueError):  # the controller's stream is closed: drop it
            pass


class LocalLauncher:
    """Starts workers on this host as child processes of the controller."""

    def __init__(self) -> None:
        self.host = socket.gethostname()

    async def launch(self, spec: WorkerSpec) -> LocalProc:
        import meshio

        src = os.path.dirname(os.path.dirname(os.path.abspath(meshio.__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [src] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["MESHIO_SYS_PATH"] = json.dumps([p for p in sys.path if p])
        env["PYTHONUNBUFFERED"] = "1"  # lines reach the controller as they are printed
        env.update(spec.env)
        popen = subprocess.Popen(
            [sys.executable, "-m", "meshio.worker", "--controller", spec.controller,
             "--listen", spec.listen, "--worker", spec.worker, "--parent", str(os.getpid()),
             *(["--restart"] if spec.restart else [])],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            close_fds=True)
        assert popen.stdin is not None
        try:  # 32 bytes fit in any pipe buffer: never blocks
            popen.stdin.write(spec.secret)
            popen.stdin.close()
        except BrokenPipeError:  # died at once: waiting for its hello reports why
            pass
        return LocalProc(popen, asyncio.get_running_loop(), spec.label or spec.worker)
