"""Starting worker processes: the one seam a host agent takes over.

A :class:`ProcLauncher` starts ``python -m meshio.worker`` processes on one
host and hands back :class:`ProcHandle`\\ s to watch and signal them.  The
controller's own host uses :class:`LocalLauncher`; a per-host agent (for
remote hosts) implements the same two methods.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import functools
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

__all__ = ("LocalLauncher", "LocalProc", "ProcHandle", "ProcLauncher", "WorkerSpec",
           "describe_exit")


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to start: its id, where it listens, whom it reports to."""

    worker: str
    listen: str
    controller: str
    env: Mapping[str, str] = field(default_factory=dict[str, str])
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
        _LineGate.install(stream)
        _watch_cells()

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
            # Worker output belongs to no task of the controller, so it is
            # written from an empty context: a context-local redirection made
            # by whichever task started this reader (Jupyter's per-cell output
            # target) falls back to the stream's global one (in Jupyter: the
            # request being handled, the running cell; see _to_last_cell).
            contextvars.Context().run(_emit, out, data.decode(errors="replace"))
        except (OSError, ValueError):  # the controller's stream is closed: drop it
            pass


def _emit(out: Any, text: str) -> None:
    if out is None:  # no stream at all (pythonw, a closed descriptor)
        return
    if isinstance(out, _LineGate):
        out.forward(text)
        return
    _to_last_cell(out)
    out.write(text)
    out.flush()


#: in a Jupyter kernel: the header of the last cell run (its execute request)
_last_cell: dict[str, Any] = {}


def _watch_cells() -> None:
    """In a Jupyter kernel, notes each cell as it starts (IPython's
    ``pre_run_cell`` event), from now on and the one running now."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or getattr(shell, "_meshio_cells_watched", False):
        return
    shell._meshio_cells_watched = True
    shell.events.register("pre_run_cell", _cell_started)
    _cell_started(None)


def _cell_started(info: Any) -> None:
    header = getattr(sys.stdout, "parent_header", None)  # in the cell's context
    if isinstance(header, dict) and cast("dict[str, Any]", header).get(
            "msg_type") == "execute_request":
        _last_cell.clear()
        _last_cell.update(cast("dict[str, Any]", header))


def _to_last_cell(out: Any) -> None:
    """In a Jupyter kernel (ipykernel's ``OutStream``), worker output goes
    to the last cell started: the running one, or after it ended the last
    one run, rather than to the request the kernel handled last (a
    completion, an inspection), for which a frontend shows no output.  Set
    for this write only (it runs in a context of its own)."""
    set_parent = getattr(out, "set_thread_parent", None)
    if _last_cell and set_parent is not None:
        set_parent(dict(_last_cell))


class _LineGate:
    """The controller's ``sys.stdout`` or ``sys.stderr`` while workers' output
    is forwarded to it: whole lines of worker output wait while the
    controller is in the middle of a line of its own (``print(..., end="")``)
    and follow that line once it ends, so neither splits the other.

    Installed over a plain text file (a terminal, a pipe, a file; not
    Jupyter's per-cell streams, where each cell has its own output); every
    other attribute is the wrapped stream's.  Held lines are written at the
    latest at interpreter exit, or on a new line once :data:`HOLD_LIMIT`
    characters wait.  Writes that bypass it (``sys.stdout.buffer``, a logging
    handler holding the original stream) are not seen.
    """

    #: characters of worker output held back before they go out on a new line
    HOLD_LIMIT = 1 << 20

    def __init__(self, stream: io.TextIOWrapper) -> None:
        self._stream = stream
        self._lock = threading.RLock()  # a signal handler may print mid-write
        self._mid_line = False
        self._held: list[str] = []
        self._held_len = 0

    @classmethod
    def install(cls, name: str) -> None:
        stream = getattr(sys, name)
        if isinstance(stream, io.TextIOWrapper):  # not already a gate
            setattr(sys, name, cls(cast(io.TextIOWrapper, stream)))

    def write(self, text: str) -> int:
        """The controller's own output."""
        with self._lock:
            n = self._stream.write(text)
            if text:
                self._mid_line = not text.endswith("\n")
                if not self._mid_line and self._held:
                    self._write_held("")
            return n

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def forward(self, text: str) -> None:
        """Whole lines of a worker's output."""
        with self._lock:
            if not self._mid_line:
                self._stream.write(text)
                self._stream.flush()
                return
            self._held.append(text)
            self._held_len += len(text)
            if self._held_len > self.HOLD_LIMIT:
                self._write_held("\n")
                self._mid_line = False

    def release(self) -> None:
        """Writes what is held, on a new line (at exit)."""
        with self._lock:
            if self._held:
                self._write_held("\n")
                self._mid_line = False

    def _write_held(self, before: str) -> None:
        held, self._held, self._held_len = "".join(self._held), [], 0
        try:
            self._stream.write(before + held)
            self._stream.flush()
        except (OSError, ValueError):  # the stream is closed: nowhere to go
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@atexit.register
def _release_held() -> None:
    for name in ("stdout", "stderr"):
        gate = getattr(sys, name)
        if isinstance(gate, _LineGate):
            gate.release()


class LocalLauncher:
    """Starts workers on this host as child processes of the controller."""

    def __init__(self) -> None:
        self.host = socket.gethostname()

    async def launch(self, spec: WorkerSpec) -> LocalProc:
        src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
