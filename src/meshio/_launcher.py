"""Starting worker processes: the one seam a host agent takes over.

A :class:`ProcLauncher` starts ``python -m meshio.worker`` processes on one
host and hands back :class:`ProcHandle`\\ s to watch and signal them.  The
controller's own host uses :class:`LocalLauncher`; a per-host agent (for
remote hosts) implements the same two methods.

What a worker must not get on its command line or in its environment (the
job secret) and what may be too big for either (the pickled ``bootstrap``)
it reads from its stdin, a Unix socket the launcher writes
:func:`start_payload` to; the worker answers on the same socket only if its
bootstrap fails (:attr:`ProcHandle.start_failure`).

Each worker leads a process group of its own (a worker's own workers, a
nested proc mesh, join its group): what its actors start (a
``subprocess.Popen``, an ``os.fork()`` child, a ``multiprocessing`` pool)
is in that group, and goes with the worker: a SIGKILL of the worker goes
to the whole group, and once the worker has exited, what is left of its
group is killed before the worker is reaped (while its pid, the group's
id, is still its own, never another process's).  Where nothing is left to
do so (the controller or host agent SIGKILLed, its worker killed by
``PR_SET_PDEATHSIG``), a keeper the worker starts in its group does
(``meshio.worker``).  A child that leaves the
group (``start_new_session=True``, ``os.setsid()``) is on its own.  A
terminal's Ctrl-C, and Jupyter's interrupt, signal the controller's group
only: the controller stops its workers itself.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import contextvars
import ctypes
import functools
import io
import itertools
import json
import operator
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import IO, Any, Final, Literal, Protocol, cast

from ._transport._credentials import Credentials
from ._transport._messages import Stream
from ._transport._runtime import runtime
from ._transport._tasks import TaskOwner
from ._transport._tls import TLSConfig

__all__ = ("BOOTSTRAP_FAILED", "EXIT_UNKNOWN", "PAYLOAD_HEADER", "RESERVED_ENV_PREFIX",
           "AdoptedProc", "ExitWatch", "Forward",
           "LocalLauncher", "LocalProc", "Output", "ProcHandle", "ProcLauncher", "WorkerSpec",
           "check_env", "describe_exit", "forward_text", "group_nested_workers",
           "layout_sharing", "random_layouts_for_children", "start_payload")

#: exit status of a worker whose ``bootstrap`` raised (sysexits' EX_CONFIG)
BOOTSTRAP_FAILED = 78
#: head of what a worker reads on stdin: lengths of the secret and of the
#: pickled bootstrap that follow it
PAYLOAD_HEADER = struct.Struct("!IQ")
#: environment variables meshio sets for its workers; ``spawn_procs(env=...)``
#: may not set these
RESERVED_ENV_PREFIX = "MESHIO_"
#: set by a ``gpus`` dim in each worker's spec: its index on the dim, which
#: its host's launcher turns into ``CUDA_VISIBLE_DEVICES`` (:func:`visible_device`)
GPU_ENV: Final = "MESHIO_GPU"
#: ``personality(2)``'s flag for a program whose address space is laid out
#: without randomization (``setarch -R``)
_ADDR_NO_RANDOMIZE: Final = 0x0040000


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to start: its id, where it listens, whom it reports to."""

    worker: str
    listen: str
    controller: str
    #: variables set in the worker's environment: ``spawn_procs(env=...)``,
    #: then meshio's own per worker (``MESHIO_WORKER``, :data:`GPU_ENV`)
    env: Mapping[str, str] = field(default_factory=dict[str, str])
    #: a replacement for a failed worker (its actors are being rebuilt)
    restart: bool = False
    #: prefix of the worker's forwarded output lines, e.g. ``"[trainers gpus=1]"``
    label: str = ""
    #: the job secret; a launcher hands it over out of band (stdin), never in
    #: argv or the environment
    secret: bytes = field(default=b"", repr=False)
    #: ``spawn_procs(bootstrap=...)`` pickled (by value where it must be), run
    #: by every new process before anything else; handed over with the secret
    bootstrap: bytes = field(default=b"", repr=False)
    #: TLS of the worker's TCP connections (workers on other hosts; paths only)
    tls: TLSConfig | None = None
    #: the address the worker answers to, when it listens elsewhere (a
    #: replacement: its predecessor's; see :meth:`restarted`)
    addr: str = ""
    #: ``spawn_procs(partition_timeout=...)``: seconds the worker's host
    #: agent keeps it without contact with the controller before it kills
    #: it (self-fencing); local launchers, which have no agent, ignore it
    partition_timeout: float | None = None
    #: seconds the worker outlives a lost controller, waiting for a new one
    #: to re-attach (``spawn_procs(keep_alive=...)``); None: it exits at once
    keep_alive: float | None = None

    def restarted(self, addr: str) -> WorkerSpec:
        """The spec of a replacement for the worker answering to ``addr``: it
        listens on a fresh random name (on another host: a fresh port), never
        its predecessor's, which another user may have bound meanwhile
        (abstract socket names have no permissions)."""
        listen = "" if addr.startswith("tcp://") else f"{addr}.{secrets.token_hex(8)}"
        return replace(self, restart=True, listen=listen, addr=addr)


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """``spawn_procs(env=...)`` checked before any process starts; a copy.

    Raises:
        TypeError: ``env`` is not a mapping, or a key or value is not a ``str``.
        ValueError: a key is empty, has ``=``, or starts with ``MESHIO_``
            (meshio's own); a key or value has a NUL character.
    """
    if not isinstance(env, Mapping):
        raise TypeError(f"spawn_procs: env must be a mapping of str to str, got "
                        f"{type(env).__name__}")
    checked: dict[str, str] = {}
    for k, v in cast(Mapping[object, object], env).items():
        if not isinstance(k, str):
            raise TypeError(f"spawn_procs: env keys must be str, got {type(k).__name__} {k!r}")
        if not isinstance(v, str):
            raise TypeError(f"spawn_procs: env[{k!r}] must be a str, got "
                            f"{type(v).__name__} {v!r}; convert it with str()")
        if not k or "=" in k or "\0" in k or "\0" in v:
            raise ValueError(f"spawn_procs: env[{k!r}]: a variable name must be non-empty "
                             f"without '=' or NUL, and its value without NUL")
        if k.startswith(RESERVED_ENV_PREFIX):
            raise ValueError(f"spawn_procs: env[{k!r}]: variables {RESERVED_ENV_PREFIX}* are "
                             f"meshio's own, set per worker; use another name")
        checked[k] = v
    return checked


class LaunchRefused(Exception):
    """A launcher cannot start the worker as its spec says (the start
    fails naming why; nothing was started)."""


def visible_device(index: int, visible: str | None, host: str) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the worker at ``index`` on a ``gpus``
    dim: the ``index``-th device of ``visible``, the list the worker would
    see otherwise (``spawn_procs(env=...)``'s, else its host's launcher's
    own: Slurm and schedulers set it to the devices a job holds), or the
    index itself where no list is set.

    Raises:
        LaunchRefused: the list names fewer devices.
    """
    if visible is None:
        return str(index)
    devices = [d.strip() for d in visible.split(",") if d.strip()]
    if index >= len(devices):
        raise LaunchRefused(
            f"its gpus index {index} is beyond the {len(devices)} device(s) that "
            f"CUDA_VISIBLE_DEVICES={visible!r} lists on {host}; make the gpus dim at most "
            f"{len(devices)} long there, or set CUDA_VISIBLE_DEVICES in spawn_procs(env=...)")
    return devices[index]


def start_payload(spec: WorkerSpec) -> bytes:
    """What a launcher writes to a new worker's stdin (then closes it for
    writing): :data:`PAYLOAD_HEADER`, the job secret, the pickled bootstrap.
    ``meshio.worker`` reads it before anything else."""
    return PAYLOAD_HEADER.pack(len(spec.secret), len(spec.bootstrap)) + spec.secret \
        + spec.bootstrap


class ProcHandle(Protocol):
    """A started worker process."""

    pid: int
    host: str
    #: what the process reported before it exited without starting (its
    #: ``bootstrap`` raised: ``"bootstrap mod.setup() raised ValueError: ..."``);
    #: None otherwise.  Known once :meth:`wait` has returned.
    start_failure: str | None
    #: why the process counts as dead though its host never reported its
    #: exit: its host was downed (unreachable longer than
    #: ``partition_timeout``; its agent kills its workers itself); None otherwise
    downed: str | None

    @property
    def returncode(self) -> int | None: ...
    async def wait(self) -> int:
        """Wait for the process to exit; its return code (negative: signal)."""
        ...
    def send_signal(self, sig: int) -> None: ...


class ProcLauncher(Protocol):
    """Starts worker processes on one host."""

    host: str
    #: its workers are runtimes of this process (the in-process transport of
    #: :mod:`meshio.testing`), not processes: ``spawn_procs`` refuses there
    #: what only a process can apply
    in_process: bool

    async def launch(self, spec: WorkerSpec) -> ProcHandle: ...

    def reach(self, secret: bytes) -> tuple[Credentials, str]:
        """For a controller re-attaching to a kept-alive proc mesh spawned
        by a controller whose secret was ``secret``: what its workers on
        this host prove (that secret here; a job's own credentials on its
        hosts), and the address at which they reach this controller
        (listened on from now on).

        Raises:
            ValueError: no kept-alive mesh can be re-attached on this host.
        """
        ...

    async def adopt(self, spec: WorkerSpec, pid: int) -> ProcHandle:
        """Watch the worker of ``spec`` (``pid``), started on this host by
        another controller, as if this one had launched it from ``spec``
        (its ``partition_timeout`` fences it again, where a launcher does)."""
        ...


#: the return code of a worker of a proc mesh re-attached to that exited,
#: its status unknown: on this host it is no child of this process; on a
#: job's host it exited before the re-attach, and its agent kept no status
EXIT_UNKNOWN: Final = -256
#: the return code of a child whose exit status was lost: something else
#: reaped it (this process ignores SIGCHLD, so the kernel reaps children at
#: once; or an ``os.wait()`` of the program's own)
EXIT_LOST: Final = -257


def describe_exit(rc: int | None) -> str:
    """Human words for a return code."""
    if rc is None:
        return "connection lost (process still running)"
    if rc == EXIT_UNKNOWN:
        return ("exited (its exit status is unknown: another controller started it, before "
                "this one re-attached to it)")
    if rc == EXIT_LOST:
        return ("exited (its status was lost: something else reaped it; SIGCHLD is ignored "
                "in this process, or its own os.wait() took it; signal.signal(signal.SIGCHLD, "
                "signal.SIG_DFL) before starting meshes keeps statuses)")
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return "exited normally" if rc == 0 else f"exited with code {rc}"


class LocalProc:
    """A worker on this host, watched with a pidfd (no thread, no SIGCHLD).

    ``stdin`` is the controller's end of the worker's stdin socket:
    ``payload`` (:func:`start_payload`) is written to it from the loop, as
    fast as the worker reads (a pickled bootstrap may be far bigger than a
    socket buffer), then closed for writing; a worker that dies first just
    stops the writing.  At its exit, what the worker wrote back (a failed
    bootstrap) becomes :attr:`start_failure`.

    ``group``: the worker leads a process group of its own (see the module
    docstring): SIGKILL goes to the group, and the group is killed once the
    worker has exited, before it is reaped.  Only this object reaps the
    worker, so while :meth:`wait` has not returned its pid is its own.
    ``dies_with_us``: the worker dies with this process (not kept alive):
    unless reaped, its group is killed when this process exits, even if
    nothing watches it any more (its loop ended without a stop).

    What it holds on the loop (the pidfd it waits on, the transports of
    the worker's output pipes, the stdin socket) belongs to its tasks,
    which close it as they end: at the worker's exit (the pipes at their
    end), or when its loop ends first (``asyncio.run``, ``meshio.run`` and
    pytest-asyncio cancel the tasks left; the worker then exits as its
    runtime's connections drop, and :func:`_reap_abandoned` reaps it).
    """

    def __init__(self, popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop,
                 label: str, stdin: socket.socket, payload: bytes,
                 output: Output | None = None, worker: str = "", *, group: bool = False,
                 dies_with_us: bool = False) -> None:
        self._popen = popen
        #: forwarding its output, handing the payload over its stdin, waiting for its exit
        self._tasks = TaskOwner(f"the watch of {label}", loop)
        self.pid = popen.pid
        self.host = socket.gethostname()
        self.start_failure: str | None = None
        self.downed: str | None = None  # a local process is never behind a partition
        self._group = group
        self._loop = loop
        self._stdin = stdin
        streams: tuple[tuple[IO[bytes] | None, Stream], ...] = ((popen.stdout, "stdout"),
                                                                (popen.stderr, "stderr"))
        for pipe, name in streams:
            if pipe is not None:
                protocol = (Forward(label, name) if output is None
                            else _Relay(worker, name, output))
                # (its transport closes it; this, where the loop ended before it began)
                self._tasks.start(self._forward(pipe, protocol)).add_done_callback(
                    functools.partial(_close_pipe, pipe))
        self._handing_over = self._tasks.start(self._hand_over(payload))
        self._exit: asyncio.Future[int] = loop.create_future()
        if dies_with_us:
            _unreaped[popen.pid] = _Unreaped(popen, group, os.getpid(), weakref.ref(self))
        self._watch = self._tasks.start(self._wait_exit())
        self._watch.add_done_callback(self._watch_ended)

    @property
    def watched(self) -> bool:
        """Whether its loop still watches it: False once it is reaped, or
        once its loop ended first."""
        return not self._watch.done()

    async def _wait_exit(self) -> None:
        """Wait until it has exited (its pidfd is readable, or a thread saw
        it), then reap it.  The pidfd is open only while this waits."""
        if self._exit.done():  # reaped already (:attr:`returncode`): its pid may be another's
            return
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # no pidfd: a thread waits instead
            await self._loop.run_in_executor(None, _wait_exited, self.pid)
        else:
            exited: asyncio.Future[None] = self._loop.create_future()
            try:
                self._loop.add_reader(fd, _settle, exited)
                await exited
            finally:  # (also when cancelled: its loop ended first)
                self._loop.remove_reader(fd)
                os.close(fd)
        self._reap()

    def _watch_ended(self, _: object) -> None:
        """Its loop ended before it exited (its watch was cancelled): the
        stdin socket is closed; :func:`_reap_abandoned` reaps it."""
        if not self._exit.done():
            self._close_stdin()

    def _reap(self) -> None:
        """It has exited: what is left of its group goes, then it is reaped."""
        if self._exit.done():
            return
        # Not reaped yet (nor by _reap_abandoned, once its loop ended): its
        # pid, the id of its group, names nothing else.
        lost = False
        if self._popen.returncode is None:
            lost = _reaped_elsewhere(self.pid)
            if self._group:
                _kill_group(self.pid)
            _unreaped.pop(self.pid, None)
        # (at once: it has exited; subprocess calls a child reaped elsewhere's status 0)
        rc = EXIT_LOST if lost else self._popen.wait()
        # Whatever it wrote back before it exited is in the socket already.
        self.start_failure = _read_report(self._stdin)
        self._close_stdin()
        self._exit.set_result(rc)

    def _close_stdin(self) -> None:
        """Close the stdin socket, once the loop no longer watches it for
        writing (the hand-over to a worker that never read it is cancelled)."""
        self._handing_over.cancel()
        if self._handing_over.done():
            self._stdin.close()
        else:
            self._handing_over.add_done_callback(lambda _: self._stdin.close())

    async def _forward(self, pipe: IO[bytes], protocol: asyncio.Protocol) -> None:
        """Hand what the worker writes to ``pipe`` to ``protocol`` until the
        pipe's end (the worker gone, and whatever it started that shares
        the pipe), or until cancelled (its loop ended first): its transport
        is closed either way."""
        ended: asyncio.Future[None] = self._loop.create_future()
        transport, _ = await self._loop.connect_read_pipe(lambda: _Piped(protocol, ended), pipe)
        try:
            await ended
        finally:
            transport.close()

    async def _hand_over(self, payload: bytes) -> None:
        try:
            await self._loop.sock_sendall(self._stdin, payload)
            self._stdin.shutdown(socket.SHUT_WR)
        except OSError:  # it died before reading it all: its exit status says why
            pass

    @property
    def returncode(self) -> int | None:
        if not self._exit.done() and _has_exited(self.pid):
            self._reap()  # (its pidfd says so on the loop's next turn)
        return self._exit.result() if self._exit.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the worker; SIGKILL to its whole group (see the
        class docstring).  Nothing once it has been reaped (its pid may be
        another process's)."""
        if self._popen.returncode is not None:
            return
        try:
            if self._group and sig == signal.SIGKILL:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass


@dataclass(frozen=True)
class _Unreaped:
    """A worker started here that dies with this process, not reaped yet."""

    popen: subprocess.Popen[bytes]
    #: it leads a process group of its own
    group: bool
    #: the process that started it (a fork of that one does not own it)
    parent: int
    #: its watcher: collected, or no longer :attr:`~LocalProc.watched`,
    #: once its loop ended without a stop
    proc: weakref.ref[LocalProc]

    def end(self) -> None:
        """SIGKILL it, its group with it (not reaped: its pid is its own)."""
        if self.group:
            _kill_group(self.popen.pid)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGKILL)


#: by pid.  Holding its ``Popen`` keeps ``subprocess`` from reaping it
#: behind our back (it does for a ``Popen`` collected unreaped), so its pid
#: stays its own until :meth:`LocalProc._reap`, or :func:`_reap_abandoned`.
_unreaped: dict[int, _Unreaped] = {}
#: this process is a worker leading a process group of its own: the workers
#: it starts (a nested proc mesh) join its group (:func:`group_nested_workers`)
_nested_in_group = False


@atexit.register
def _kill_groups_left() -> None:
    """This process exits: the workers it started that are not reaped (still
    running, or exited while no loop watched them) go now with their groups
    (``PR_SET_PDEATHSIG`` kills a worker a moment later, then its keeper
    the group: this does it at once, and also where no keeper runs)."""
    for w in list(_unreaped.values()):
        if w.parent == os.getpid() and w.popen.returncode is None:
            w.end()


def _reap_abandoned() -> None:
    """Reap the workers that exited after their loop ended (nothing watched
    them), what is left of their groups killed first, as :meth:`LocalProc._reap`
    does: at each start of a worker, so a long-lived process (a notebook's
    kernel, a test run) keeps no zombies, nor what they started."""
    for pid, w in list(_unreaped.items()):
        proc = w.proc()
        if (proc is None or not proc.watched) and w.parent == os.getpid() and _has_exited(pid):
            if w.group:
                _kill_group(pid)
            w.popen.wait()
            del _unreaped[pid]


def group_nested_workers() -> None:
    """Called by a worker as it starts: if it leads a process group of its
    own (its launcher made one), the workers it starts itself (a nested
    proc mesh) join that group rather than making their own, so the
    group's end (the worker killed, or exited) ends them and what they
    started too."""
    global _nested_in_group
    _nested_in_group = os.getpgrp() == os.getpid()


def default_sigchld() -> None:
    """SIGCHLD back to its default where this process inherited it ignored
    (``SIG_IGN`` survives ``exec``: a worker started by a controller that
    ignores it, an agent started by a parent that did): the kernel would
    reap what it starts at once, workers and the programs their actors run,
    and their exit statuses would be lost (``subprocess`` calls such a
    child's status 0, even one killed; :data:`EXIT_LOST`).  Called as a
    worker or a host agent starts."""
    if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def _kill_group(pgid: int) -> None:
    """SIGKILL every process of group ``pgid``; none left: nothing to do."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # (only processes we may not signal)
        pass


def _has_exited(pid: int) -> bool:
    """Whether our child ``pid`` has exited, without reaping it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already (by this object: see LocalProc)
        return True


def _reaped_elsewhere(pid: int) -> bool:
    """Whether our child ``pid``, exited and not reaped by us, was reaped by
    something else: its exit status is lost (:data:`EXIT_LOST`)."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return False


def _wait_exited(pid: int) -> None:
    """Block until our child ``pid`` has exited, without reaping it (in a
    thread, where there is no pidfd)."""
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


class ExitWatch:
    """The exit of a process a :class:`ProcHandle` learns of by other means
    than waiting for a child: ``_exit`` holds its return code once known."""

    _exit: asyncio.Future[int]

    @property
    def returncode(self) -> int | None:
        return self._exit.result() if self._exit.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)


class AdoptedProc(ExitWatch):
    """A worker on this host started by another controller (a kept-alive
    proc mesh re-attached to), watched with a pidfd.  It is not our child:
    its exit status stays unknown (:data:`EXIT_UNKNOWN`).  Its process
    group (see the module docstring) is killed with it and after its exit,
    as a :class:`LocalProc`'s is: its parent reaps it, but its pid names its
    group while any process of the group is left, and is given to no other
    process until the whole range of pids has gone round."""

    start_failure: str | None = None
    downed: str | None = None  # (on this host: never behind a partition)

    def __init__(self, pid: int, host: str, loop: asyncio.AbstractEventLoop) -> None:
        self.pid = pid
        self.host = host
        self._loop = loop
        self._exit = loop.create_future()
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:  # gone already
            self._fd = -1
            self._exit.set_result(EXIT_UNKNOWN)
        else:
            loop.add_reader(self._fd, self._reap)

    def _reap(self) -> None:
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1
        if not self._exit.done():
            _kill_group(self.pid)
            self._exit.set_result(EXIT_UNKNOWN)

    def send_signal(self, sig: int) -> None:
        if self._fd != -1:  # (the pidfd: never a process that reused the pid)
            if sig == signal.SIGKILL:
                _kill_group(self.pid)  # (a worker started before groups: no such group)
            try:
                signal.pidfd_send_signal(self._fd, sig)
            except ProcessLookupError:  # exited, not seen yet
                pass


def _read_report(stdin: socket.socket) -> str | None:
    """What a worker wrote on its stdin socket before exiting (non-blocking)."""
    chunks: list[bytes] = []
    while True:
        try:
            chunk = stdin.recv(1 << 16)
        except OSError:  # BlockingIOError: nothing more
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace").strip() or None


def _close_pipe(pipe: IO[bytes], _: object) -> None:
    """Close ``pipe`` once its forwarding has ended (a no-op where its transport did)."""
    pipe.close()


class _Piped(asyncio.Protocol):
    """``protocol`` fed by a read pipe's transport; ``ended`` is done once
    that transport has closed (the pipe's end read, or closed)."""

    def __init__(self, protocol: asyncio.Protocol, ended: asyncio.Future[None]) -> None:
        self._protocol = protocol
        self._ended = ended

    def data_received(self, data: bytes) -> None:
        self._protocol.data_received(data)

    def eof_received(self) -> bool | None:
        return self._protocol.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        _settle(self._ended)


def _settle(fut: asyncio.Future[None]) -> None:
    """``fut`` done, unless it is already (a reader's callback runs on
    every turn of the loop while its fd is readable)."""
    if not fut.done():
        fut.set_result(None)


#: where a host agent sends its workers' output: ``output(worker, stream, data)``
Output = Callable[[str, Stream, bytes], None]


class _Relay(asyncio.Protocol):
    """Hands a worker's stdout or stderr, as it comes, to ``output`` (a
    host agent sends it on to the controller, which prints it with
    :class:`Forward`)."""

    def __init__(self, worker: str, stream: Stream, output: Output) -> None:
        self._worker = worker
        self._stream: Stream = stream
        self._output = output

    def data_received(self, data: bytes) -> None:
        self._output(self._worker, self._stream, data)


class Forward(asyncio.Protocol):
    """Copies a worker's stdout or stderr to the controller's, line by line,
    each line prefixed with the worker's label.

    The line being written is held until its newline comes, in linear time
    (only new data is searched), and never more than :data:`LINE_LIMIT`
    bytes of it: past that, what is held goes out as a line of its own and
    the rest follows on the next ones (cut between UTF-8 characters).  A
    ``\\r`` within a line (a progress bar redrawn in place, as tqdm does)
    is honoured as a terminal would show it: text after it replaces what is
    held, so such a line goes out as it last looked when it ends, and
    while it is redrawn, as it looked then, every :data:`REDRAW_EVERY`
    seconds (a bar that runs for an hour is seen moving)."""

    #: bytes of an unfinished line held at most before they go out
    LINE_LIMIT = 1 << 16
    #: seconds between the drawings of a redrawn line that go out before it ends
    REDRAW_EVERY = 5.0

    def __init__(self, label: str, stream: Stream) -> None:
        self._prefix = f"{label} ".encode()
        self._stream: Stream = stream
        #: the unfinished line's pieces (the last text after a CR), their length
        self._held: list[bytes] = []
        self._held_len = 0
        #: a CR came after what is held: new text replaces it
        self._redraw = False
        #: when the line being held started, or last went out redrawn
        self._shown = 0.0
        _LineGate.install(stream)
        _watch_cells()

    def data_received(self, data: bytes) -> None:
        out: list[bytes] = []
        *ends, rest = data.split(b"\n")
        for piece in ends:
            self._hold(piece, out)
            out.append(self._prefix + b"".join(self._held) + b"\n")
            self._held, self._held_len, self._redraw = [], 0, False
        self._hold(rest, out)
        if out:
            self._write(b"".join(out))

    def eof_received(self) -> bool | None:
        if self._held:
            self._write(self._prefix + b"".join(self._held) + b"\n")
            self._held, self._held_len, self._redraw = [], 0, False
        return None

    def _hold(self, piece: bytes, out: list[bytes]) -> None:
        """Add ``piece`` (no newline in it) to the unfinished line; lines
        of it that went over :data:`LINE_LIMIT` to ``out``."""
        for i, text in enumerate(piece.split(b"\r") if b"\r" in piece else (piece,)):
            if i:
                self._redraw = bool(self._held)
            if not text:
                continue
            if self._redraw:  # (what is held is a whole drawing)
                if time.monotonic() - self._shown >= self.REDRAW_EVERY:
                    out.append(self._prefix + b"".join(self._held) + b"\n")
                    self._shown = time.monotonic()
                self._held, self._held_len, self._redraw = [], 0, False
            elif not self._held:  # a line starts
                self._shown = time.monotonic()
            self._held.append(text)
            self._held_len += len(text)
        while self._held_len > self.LINE_LIMIT:
            held = b"".join(self._held)
            cut = self.LINE_LIMIT
            while cut > self.LINE_LIMIT - 3 and held[cut] & 0xC0 == 0x80:
                cut -= 1  # (not within a UTF-8 character)
            out.append(self._prefix + held[:cut] + b"\n")
            self._held, self._held_len = [held[cut:]], len(held) - cut

    def _write(self, data: bytes) -> None:
        forward_text(self._stream, data.decode(errors="replace"))


def forward_text(stream: Stream, text: str) -> None:
    """Write whole lines of a worker's output (``text``, ending in a
    newline) to the controller's ``stream``: between the controller's own
    lines (:class:`_LineGate`), in a Jupyter kernel to the last cell run."""
    out = getattr(sys, stream)  # looked up each time: follows redirection
    try:
        # Worker output belongs to no task of the controller, so it is
        # written from an empty context: a context-local redirection made
        # by whichever task started this reader (Jupyter's per-cell output
        # target) falls back to the stream's global one (in Jupyter: the
        # request being handled, the running cell; see _to_last_cell).
        contextvars.Context().run(_emit, out, text)
    except (OSError, ValueError):  # the controller's stream is closed: drop it
        pass


def say(line: str) -> None:
    """Write ``meshio: <line>`` on the controller's stderr, as its own
    line (after the worker lines that came before it): what happened in
    its processes (one lost or not responding, an actor that failed with
    nobody to tell, one paused at a breakpoint).  In a Jupyter kernel it
    goes where worker output does (:func:`_to_last_cell`): to the running
    cell, else the last one run, not to the cell whose context the task
    telling it began in (the cell that started the runtime)."""
    out = sys.stderr
    if out is None:  # (pythonw, a closed descriptor)
        return
    try:
        contextvars.Context().run(_said, out, f"meshio: {line}\n")
    except (OSError, ValueError):  # the controller's stream is closed: drop it
        pass


def _said(out: Any, text: str) -> None:
    _to_last_cell(out)
    out.write(text)
    out.flush()


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


class _Line:
    """The line the controller's output ends on, in one file: whether it is
    unfinished, and the worker lines held until it ends.  A gate has one of
    its own, or shares its sibling's where ``sys.stdout`` and ``sys.stderr``
    are the same file (a terminal, ``2>&1``): there a line begun on either
    stream is ended on either, and holds worker lines of both."""

    def __init__(self, stream: io.TextIOWrapper) -> None:
        self.lock = threading.RLock()  # a signal handler may print mid-write
        #: the thread inside a gate's write (a signal handler's print waits for no one)
        self.owner: int | None = None
        self.mid = False
        #: worker lines held, each with the stream it goes to; their characters
        self.held: list[tuple[io.TextIOWrapper, str]] = []
        self.held_len = 0
        #: the streams that write to this file
        self.streams = [stream]

    def put(self, stream: io.TextIOWrapper, text: str) -> None:
        """Write ``text`` to ``stream`` after what the file's other streams
        have buffered (a block-buffered stdout may have sent part of a line)."""
        for other in self.streams:
            if other is not stream:
                with contextlib.suppress(OSError, ValueError):  # (closed: nothing buffered)
                    other.flush()
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):  # the stream is closed: nowhere to go
            pass

    def write_held(self, before: str) -> None:
        held, self.held, self.held_len = self.held, [], 0
        for stream, run in itertools.groupby(held, key=operator.itemgetter(0)):
            self.put(stream, before + "".join(text for _, text in run))
            before = ""


class _LineGate:
    """The controller's ``sys.stdout`` or ``sys.stderr`` while workers' output
    is forwarded to it: whole lines of worker output wait while the
    controller is in the middle of a line of its own (``print(..., end="")``)
    and follow that line once it ends, so neither splits the other.  Where
    stdout and stderr are the same file (same device and inode: one
    terminal, ``2>&1``; decided when a gate is installed), the two gates
    share one :class:`_Line`: a partial line on either stream holds worker
    lines of both.

    Worker lines are written by a thread of the gate's own, never by the
    event loop: a stream nobody reads (a pipe into a stalled consumer, a
    terminal on hold) blocks that thread, not the controller's calls and
    heartbeats.  At most :data:`BACKLOG` characters wait for it; past that,
    lines are dropped, and a line in their place says how many.  The
    controller's own writes first wait for the worker lines that came
    before them, so output keeps the order it reached the controller in.

    Installed over a plain text file (a terminal, a pipe, a file; not
    Jupyter's per-cell streams, where each cell has its own output); every
    other attribute is the wrapped stream's.  Held lines are written at the
    latest at interpreter exit, or on a new line once :data:`HOLD_LIMIT`
    characters wait.  Writes that bypass it (``sys.stdout.buffer``, a logging
    handler holding the original stream) are not seen.
    """

    #: characters of worker output held back before they go out on a new line
    HOLD_LIMIT = 1 << 20
    #: characters of worker output waiting for the stream before lines are dropped
    BACKLOG = 1 << 24

    def __init__(self, stream: io.TextIOWrapper) -> None:
        self._stream = stream
        self.start_over()

    def start_over(self) -> None:
        """Nothing queued or held, no writer thread, a line of its own: a new
        gate, or one in a child forked from this process (the parent writes
        what it had; :func:`_forked` shares lines again)."""
        self._line = _Line(self._stream)
        #: worker lines for the writer thread; their characters; lines dropped
        self._queue: collections.deque[str] = collections.deque()
        self._queued = 0
        self._dropped = 0
        #: lines queued and lines written so far (what a writer waits for)
        self._put = self._done = 0
        self._moved = threading.Condition(threading.Lock())
        self._writer: threading.Thread | None = None

    @classmethod
    def install(cls, name: str) -> None:
        stream = getattr(sys, name)
        if isinstance(stream, io.TextIOWrapper):  # not already a gate
            gate = cls(cast(io.TextIOWrapper, stream))
            gate.share_line()
            setattr(sys, name, gate)

    def share_line(self) -> None:
        """Share the other gate's line where both write to the same file
        (this gate is new, or was started over: nothing of its own is held)."""
        for other in _gates():
            if other is not self and self._same_file(other):
                self._line = other._line
                self._line.streams.append(self._stream)

    def _same_file(self, other: _LineGate) -> bool:
        try:
            return os.path.samestat(os.fstat(self._stream.fileno()),
                                    os.fstat(other._stream.fileno()))
        except (OSError, ValueError):  # no descriptor (pytest's capture), or closed
            return False

    def write(self, text: str) -> int:
        """The controller's own output."""
        self._wait_written()
        line = self._line
        with line.lock:
            owner, line.owner = line.owner, threading.get_ident()
            try:
                n = self._stream.write(text)
                if text:
                    line.mid = not text.endswith("\n")
                    if not line.mid and line.held:
                        line.write_held("")
                return n
            finally:
                line.owner = owner

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def forward(self, text: str) -> None:
        """Whole lines of a worker's output, written by the gate's thread."""
        with self._moved:
            if self._queued + len(text) > self.BACKLOG:
                self._dropped += text.count("\n")
                return
            self._queue.append(text)
            self._queued += len(text)
            self._put += 1
            if self._writer is None or not self._writer.is_alive():  # (or forked)
                self._writer = threading.Thread(
                    target=self._write_queued, name="meshio-output", daemon=True)
                self._writer.start()
            self._moved.notify_all()

    def flush(self) -> None:
        """Flush the stream, once the worker lines that reached this process
        so far are written (``sys.stdout.flush()``: what the workers printed
        before is out)."""
        self._wait_written()
        self._stream.flush()

    def release(self) -> None:
        """Writes what is queued and what is held, on a new line (at exit)."""
        self._wait_written()
        line = self._line
        with line.lock:
            if line.held:
                line.write_held("\n")
                line.mid = False

    def _wait_written(self) -> None:
        """Until the worker lines queued so far are written (unless this
        thread is the writer, or interrupted one of its writes)."""
        if threading.get_ident() in (self._line.owner, self._writer and self._writer.ident):
            return
        with self._moved:
            upto = self._put
            while self._done < upto and self._writer is not None and self._writer.is_alive():
                self._moved.wait()

    def _write_queued(self) -> None:
        while True:
            with self._moved:
                while not self._queue:
                    self._moved.wait()
                text = self._queue.popleft()
                dropped, self._dropped = self._dropped, 0
            try:
                self._forward_now(text if not dropped else (
                    f"meshio: {dropped} lines of worker output dropped here: more than "
                    f"{self.BACKLOG:,} characters of it waited for this stream to be read\n"
                    f"{text}"))
            finally:  # (a stream raising what no stream should: the next line starts a writer)
                with self._moved:
                    self._queued -= len(text)
                    self._done += 1
                    self._moved.notify_all()

    def _forward_now(self, text: str) -> None:
        line = self._line
        with line.lock:
            if not line.mid:
                line.put(self._stream, text)
                return
            line.held.append((self._stream, text))
            line.held_len += len(text)
            if line.held_len > self.HOLD_LIMIT:
                line.write_held("\n")
                line.mid = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _gates() -> list[_LineGate]:
    return [gate for gate in (sys.stdout, sys.stderr) if isinstance(gate, _LineGate)]


@atexit.register
def _release_held() -> None:
    for gate in _gates():
        gate.release()


def _forked() -> None:
    for gate in _gates():
        gate.start_over()
    for gate in _gates()[1:]:
        gate.share_line()


os.register_at_fork(after_in_child=_forked)


class LocalLauncher:
    """Starts workers on this host as child processes of the controller (or
    of a host agent, which passes ``output`` to relay their output)."""

    in_process = False

    def __init__(self, output: Output | None = None) -> None:
        self.host = socket.gethostname()
        self._output = output

    def reach(self, secret: bytes) -> tuple[Credentials, str]:
        job = Credentials(secret)
        return job, runtime().sockets.listen_job(job)

    async def adopt(self, spec: WorkerSpec, pid: int) -> AdoptedProc:
        return AdoptedProc(pid, self.host, asyncio.get_running_loop())

    async def launch(self, spec: WorkerSpec) -> LocalProc:
        src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {**os.environ, **spec.env}
        gpu = env.pop(GPU_ENV, None)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible_device(
                int(gpu), env.get("CUDA_VISIBLE_DEVICES"), self.host)
        env["PYTHONPATH"] = os.pathsep.join(  # meshio's first: `-m meshio.worker` finds it
            [src] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        # the controller's import path (sent by a remote controller), then ours
        paths = [*json.loads(spec.env.get("MESHIO_SYS_PATH", "[]")), *sys.path]
        env["MESHIO_SYS_PATH"] = json.dumps([p for p in dict.fromkeys(paths) if p])
        env["PYTHONUNBUFFERED"] = "1"  # lines reach the controller as they are printed
        _reap_abandoned()
        ours, theirs = socket.socketpair()
        try:
            with _one_layout(_local_only(spec)) as shared:
                popen = subprocess.Popen(
                    [sys.executable, "-m", "meshio.worker", "--controller", spec.controller,
                     "--listen", spec.listen, "--worker", spec.worker, "--parent", str(os.getpid()),
                     *(["--restart"] if spec.restart else []),
                     *(["--one-layout"] if shared else []),
                     *(["--addr", spec.addr] if spec.addr else []),
                     *([] if spec.keep_alive is None else ["--keep-alive", repr(spec.keep_alive)]),
                     *_tls_args(spec.tls)],
                    env=env, stdin=theirs.fileno(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    close_fds=True,
                    # the leader of a group of its own (in a worker: that worker's group)
                    process_group=None if _nested_in_group else 0)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        # (as the worker decides: a kept-alive one outlives a controller on
        # this host, never a host agent, which starts its workers over TCP)
        dies_with_us = spec.keep_alive is None or spec.controller.startswith("tcp://")
        return LocalProc(popen, asyncio.get_running_loop(), spec.label or spec.worker, ours,
                         start_payload(spec), self._output, spec.worker,
                         group=not _nested_in_group, dies_with_us=dies_with_us)


def _local_only(spec: WorkerSpec) -> bool:
    """Whether the worker is reached only through Unix sockets of this host
    (it listens on one and reports to a controller on this host), never
    over TCP."""
    return not (spec.listen.startswith("tcp://") or spec.controller.startswith("tcp://"))


@contextlib.contextmanager
def _one_layout(on: bool) -> Generator[bool]:
    """Processes started within (``on``) get one address-space layout, the
    same in each of them, rather than a random one each; yields whether
    they do.  On a core shared by several processes (more of them than
    cores), the same code at the same addresses keeps the core's branch
    predictor trained for all of them: a call to 4 actors on 2 cores took
    ~150 µs with random layouts and ~90-115 µs with the workers' alike
    (benchmarks/README.md).  Only for workers reached through Unix sockets
    alone: other users' processes cannot talk to them (the handshake checks
    the peer's uid first), and the user's own can read any layout in
    ``/proc/<pid>/maps``, so randomizing hides nothing there; a worker with
    a TCP port keeps a random layout, and the worker gives random ones back
    to what it starts itself (:func:`random_layouts_for_children`).  Linux
    only; where ``personality(2)`` refuses (a seccomp profile), nothing
    changes.  The flag is this thread's (the loop's), set around the start
    of a worker and restored: this process's own layout, and what its other
    threads start, are untouched."""
    was = _personality(_ASK) if on else -1
    if was == -1 or was & _ADDR_NO_RANDOMIZE or _personality(was | _ADDR_NO_RANDOMIZE) == -1:
        yield False  # (off, refused, or set already: a user's setarch -R is left as it is)
        return
    try:
        yield True
    finally:
        _personality(was)


def layout_sharing() -> Literal["shared", "inherited", "refused", "unavailable"]:
    """What :func:`_one_layout` does for workers started here: ``shared``
    (they get one layout); ``inherited`` (this process runs without
    randomization, e.g. under ``setarch -R``: they get its layout);
    ``refused`` (``personality(2)`` may not set the flag: a seccomp profile);
    ``unavailable`` (not Linux)."""
    was = _personality(_ASK)
    if was == -1:
        return "unavailable"
    if was & _ADDR_NO_RANDOMIZE:
        return "inherited"
    with _one_layout(True) as shared:
        return "shared" if shared else "refused"


def random_layouts_for_children() -> None:
    """In a worker started with :func:`_one_layout`'s layout: the processes
    it starts (the user's servers, tools) get random layouts again."""
    was = _personality(_ASK)
    if was != -1:
        _personality(was & ~_ADDR_NO_RANDOMIZE)


#: ``personality(2)``'s argument that only asks
_ASK: Final = 0xFFFFFFFF


def _personality(persona: int) -> int:
    """``personality(2)`` (this thread's execution domain and flags): the
    one before; -1 where there is none (not Linux) or it refused."""
    if sys.platform != "linux":
        return -1
    return int(ctypes.CDLL(None, use_errno=True).personality(persona))


def _tls_args(tls: TLSConfig | None) -> list[str]:
    """A worker's command-line TLS options (file paths, no secrets)."""
    if tls is None:
        return []
    return ["--tls-cert", os.fspath(tls.cert), "--tls-key", os.fspath(tls.key),
            "--tls-ca", os.fspath(tls.ca), *([] if tls.mutual else ["--tls-no-mutual"]),
            *([] if tls.check_hostname else ["--tls-no-check-hostname"])]
