"""Inspecting a running controller from another process: ``meshio stacks``.

A controller (a process that started a proc mesh, not a worker) listens
for inspection clients on a Unix name of its own
(:meth:`~meshio._transport._runtime.Runtime.listen_inspection`), with a
secret of its own, and publishes both in a file readable by this user
only: ``$XDG_RUNTIME_DIR/meshio/<pid>-<loop>.json``, or
``/tmp/meshio-<uid>/<pid>-<loop>.json`` without ``XDG_RUNTIME_DIR`` (the
directory mode 0700, the file 0600; removed when the controller's loop
ends).  A process that runs several event loops at once (threads, each
with its ``asyncio.run``) has a runtime, a listener and a file per loop,
numbered in the order they started a proc mesh (``loop``).  An
inspection client proves that secret, not the job's, and may only send
inspection messages: :class:`JobStacks` (``meshio stacks``),
:class:`ServeDashboard` (``meshio dashboard``: the dashboard served) and
:class:`DebugIO` (``meshio debug``, :mod:`meshio._debug`: it drives the
pdb sessions of actors paused in ``breakpoint()``, where pdb runs any
code the user types); it can never call an actor, spawn, or pose as a
worker.  Other users are
refused by the file's and the directory's modes and by the handshake's
peer-uid check.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from ._stacks import Stacks, gather
from ._transport._connection import Connection, Pending
from ._transport._handshake import new_secret
from ._transport._messages import ErrorInfo, Fail, JobStacks, Message, Reply, ServeDashboard
from ._transport._runtime import Runtime, register_handler
from ._transport._serial import Buffers
from ._transport._tasks import TaskOwner

if TYPE_CHECKING:
    from ._proc_state import ProcState

__all__ = ("ANSWER_GRACE", "ASK_TIMEOUT", "Controller", "Inspection", "ask", "ask_stacks",
           "controllers", "from_inspection", "inspection_dir", "private_dir")

_T = TypeVar("_T")

log = logging.getLogger("meshio")

#: seconds a client waits for the controller beyond the processes' timeout
ANSWER_GRACE = 10.0
#: seconds ``meshio dashboard`` and ``meshio debug`` wait for the controller's answer
ASK_TIMEOUT = 10.0

_encode = msgspec.msgpack.Encoder().encode
#: numbers this process's controller runtimes (``Controller.loop``), 1 up
#: (``next`` on it is atomic: loops in threads may start together)
_loops = itertools.count(1)
_stacks_decoder = msgspec.msgpack.Decoder(Stacks)


def inspection_dir() -> Path:
    """Where this user's controllers publish themselves."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    return Path(base, "meshio") if base else Path(tempfile.gettempdir(), f"meshio-{os.getuid()}")


def private_dir() -> Path:
    """:func:`inspection_dir`, made if missing.

    Raises:
        PermissionError: it is another user's, or others may use it.
    """
    path = inspection_dir()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return _checked(path)


def _checked(path: Path) -> Path:
    """``path``, the inspection directory, once known to be this user's
    and closed to others (what it holds is only as private as it is).

    Raises:
        PermissionError: it is another user's, or others may use it.
    """
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{path} belongs to uid {st.st_uid} with mode "
                              f"{st.st_mode & 0o777:o}; meshio needs it to be yours, mode 700")
    return path


class Inspection:
    """A controller runtime's side of inspection: its listener, its
    published file, the proc meshes it answers for (``rt.state(Inspection)``,
    made when the controller starts its first proc mesh)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.procs: list[ProcState] = []
        #: answers under way (cancelled when the runtime closes)
        self.tasks = TaskOwner("the inspection server", rt.loop)
        secret = new_secret()
        addr = rt.sockets.listen_inspection(secret)
        #: how an inspection client reaches this controller (its own
        #: terminal's ``meshio debug`` too: :mod:`meshio._debug`)
        self.controller = Controller(os.getpid(), next(_loops), threading.current_thread().name,
                                     addr, secret, sys.argv, time.time())
        self.path: Path | None = None
        try:
            self.path = _publish(self.controller)
        except OSError as e:  # the controller works on; only `meshio stacks` cannot find it
            log.warning("meshio: cannot publish this controller for `meshio stacks` (%s)", e)

    def watch(self, state: ProcState) -> None:
        """Answer for the proc mesh of ``state`` until it is released."""
        self.procs.append(state)
        state.on_release.append(lambda: self.procs.remove(state))

    def answer(self, conn: Connection, msg: JobStacks) -> None:
        self.tasks.start(self._answer(conn, msg))

    async def stacks(self, timeout: float) -> Stacks:
        """The stacks of every actor of the proc meshes answered for.

        Raises:
            ValueError: ``timeout`` is not a positive number.
        """
        asks = [(w.addr, "", f"proc mesh {state.name!r}", state.region.point(w.rank))
                for state in self.procs if not state.stopped for w in state.workers]
        return await gather(self.rt, asks, timeout)

    async def _answer(self, conn: Connection, msg: JobStacks) -> None:
        try:
            stacks = await self.stacks(msg.timeout)
        except ValueError as e:
            conn.send_message(Fail(msg.req, ErrorInfo("schema", "ValueError", str(e))))
            return
        conn.send_message(Reply(msg.req, msgspec.Raw(_encode(stacks))))

    def close(self) -> None:
        self.tasks.cancel()
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def _publish(controller: Controller) -> Path:
    """Write this controller runtime's file (one per event loop, so that
    the runtimes of one process neither hide nor remove each other's); its
    path."""
    path = private_dir() / f"{controller.pid}-{controller.loop}.json"
    tmp = path.with_suffix(f".tmp{time.monotonic_ns()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"meshio_controller": 1, "pid": controller.pid, "loop": controller.loop,
                   "thread": controller.thread, "address": controller.address,
                   "secret": controller.secret.hex(), "argv": controller.argv,
                   "started": controller.started}, f)
    os.replace(tmp, path)
    return path


def from_inspection(rt: Runtime, conn: Connection, msg: JobStacks | ServeDashboard) -> bool:
    """Whether ``msg`` came from an inspection client; if not (a peer of
    the job: not for it), its sender is told so."""
    if conn.job is not None and conn.job is rt.inspection:
        return True
    conn.send_message(Fail(msg.req, ErrorInfo(
        "protocol", "ProtocolError", f"{type(msg).__name__} is asked on a controller's "
        "inspection listener only (meshio stacks, meshio dashboard)")))
    return False


def _on_job_stacks(rt: Runtime, conn: Connection, msg: JobStacks, bufs: Buffers) -> None:
    if from_inspection(rt, conn, msg):
        rt.state(Inspection).answer(conn, msg)


register_handler(JobStacks, _on_job_stacks, inspection=True)


# ------------------------------------------------------------------ client

@dataclass(frozen=True)
class Controller:
    """A running controller of this user, as it published itself: one
    event loop of that process (its runtime), with the proc meshes that
    loop started.

    Attributes:
        pid: the controller's process.
        loop: which of that process's runtimes: 1 for the first to start
            a proc mesh, 2 for the next (a second ``asyncio.run``, or
            another thread's), and so on.
        thread: the name of the thread that runs that loop.
    """

    pid: int
    loop: int
    thread: str
    address: str
    secret: bytes
    argv: list[str]
    started: float

    def name(self) -> str:
        """``pid 4242 loop 1``, and the loop's thread unless it is the main
        one: ``pid 4242 loop 2 (thread 'loader')``."""
        thread = "" if self.thread == "MainThread" else f" (thread {self.thread!r})"
        return f"pid {self.pid} loop {self.loop}{thread}"

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"{self.name()} started {when}: {' '.join(self.argv) or '?'}"


def controllers() -> list[Controller]:
    """This user's running controllers (each event loop of a process that
    runs several is one), oldest first; the files of controllers that are
    gone are removed.

    Raises:
        PermissionError: the inspection directory is another user's, or
            others may use it: what it names (addresses, secrets) could be
            planted there.
    """
    path = inspection_dir()
    found: list[Controller] = []
    for entry in sorted(_checked(path).glob("*.json")) if path.is_dir() else []:
        try:
            data: Any = json.loads(entry.read_text())
            controller = Controller(int(data["pid"]), int(data["loop"]), str(data["thread"]),
                                    str(data["address"]),
                                    bytes.fromhex(data["secret"]),
                                    [str(a) for a in data["argv"]], float(data["started"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ours to read
        try:
            os.kill(controller.pid, 0)
        except ProcessLookupError:  # killed before it could remove its file
            entry.unlink(missing_ok=True)
            continue
        except PermissionError:
            continue
        found.append(controller)
    return sorted(found, key=lambda c: c.started)


async def ask(controller: Controller, message: Callable[[int], Message],
              decode: Callable[[Any, Buffers], _T], what: str, timeout: float) -> _T:
    """Send ``controller`` the inspection message ``message(req)``; its
    answer, decoded by ``decode`` (``what`` names the request in errors).

    Raises:
        MeshioError: the controller could not be reached or refused us.
        TimeoutError: it did not answer in ``timeout`` seconds.
    """
    loop = asyncio.get_running_loop()
    rt = Runtime(loop, secret=controller.secret)
    try:
        rt.pids[controller.address] = controller.pid  # the listener proves it is that process
        conn = rt.connect(controller.address)
        fut: asyncio.Future[_T] = loop.create_future()
        req = conn.next_req(Pending(fut, decode, what, f"controller pid {controller.pid}",
                                    controller.address))
        conn.send_message(message(req))
        async with asyncio.timeout(timeout):
            return await fut
    finally:
        rt.close()


async def ask_stacks(controller: Controller, timeout: float) -> Stacks:
    """The stacks of every actor of ``controller``'s proc meshes.

    Raises:
        MeshioError: the controller could not be reached or refused us.
        TimeoutError: it did not answer in ``timeout`` + :data:`ANSWER_GRACE`.
    """
    return await ask(controller, lambda req: JobStacks(req, timeout),
                     lambda raw, bufs: _stacks_decoder.decode(raw), "stacks",
                     timeout + ANSWER_GRACE)
