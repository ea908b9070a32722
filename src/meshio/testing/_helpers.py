"""Helpers for tests of meshio programs: process leak checks, waiting on
process exit without sleeping, and raw connections to a job's processes."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from .._actor import Actor
from .._actor_mesh import ActorMesh
from .._checks import check_seconds
from .._constants import KEEPER
from .._proc_mesh import ProcMesh
from .._transport._handshake import CHALLENGE_SIZE, Handshake, listening_end
from .._transport._runtime import runtime
from .._transport._sockets import sockaddr
from .._transport._tasks import within
from ..jobs._job import ProcessJob
from ..jobs._slurm import SlurmJob

__all__ = ("WorkerProcess", "actor_target", "child_pids", "cut_connection", "forged_mesh",
           "job_record", "open_job_connection", "proc_mesh", "process_address", "wait_exited",
           "worker_processes")

A = TypeVar("A", bound=Actor)


def process_address(mesh: Actor | ActorMesh[Any], index: int = 0) -> str:
    """The address of the worker process hosting the actor at ``index`` of
    ``mesh`` (a mesh or a view of one): what a test that speaks meshio's
    wire protocol dials (see ``open_job_connection``)."""
    if not isinstance(mesh, ActorMesh):
        raise TypeError(f"process_address: an actor mesh, got {type(mesh).__name__}")
    return mesh._addrs[mesh._region.ranks[index]]


def actor_target(mesh: Actor | ActorMesh[Any]) -> str:
    """The id a raw ``Call`` frame names to reach the actors of ``mesh``."""
    if not isinstance(mesh, ActorMesh):
        raise TypeError(f"actor_target: an actor mesh, got {type(mesh).__name__}")
    return mesh._target


def forged_mesh(mesh: Actor | ActorMesh[Any], cls: type[A], *, target: str | None = None,
                addrs: Sequence[str] | None = None) -> ActorMesh[A]:
    """A reference shaped as ``mesh`` that names another class (``cls``),
    other actors (``target``, see :func:`actor_target`) or other processes
    (``addrs``, one per rank of the proc mesh): what a stale, mistaken or
    hostile reference looks like to the processes it reaches."""
    if not isinstance(mesh, ActorMesh):
        raise TypeError(f"forged_mesh: an actor mesh, got {type(mesh).__name__}")
    return ActorMesh(mesh._target if target is None else target, mesh._name, cls,
                     mesh._region, list(mesh._addrs if addrs is None else addrs))


def proc_mesh(mesh: Actor | ActorMesh[Any]) -> ProcMesh:
    """The proc mesh the actors of ``mesh`` were spawned on.

    Raises:
        ValueError: ``mesh`` is a reference received from another process
            (it knows its actors, not their proc mesh).
    """
    if not isinstance(mesh, ActorMesh):
        raise TypeError(f"proc_mesh: an actor mesh, got {type(mesh).__name__}")
    if mesh._procs is None:
        raise ValueError(f"proc_mesh: {mesh._name!r} is a reference received from another "
                         "process; its proc mesh is known where it was spawned")
    return mesh._procs


class WorkerProcess(Protocol):
    """A worker process as its launcher started it."""

    @property
    def pid(self) -> int: ...
    @property
    def host(self) -> str: ...
    @property
    def returncode(self) -> int | None:
        """Its exit status once it exited (negative: the signal), else None."""
        ...
    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to it (nothing once it has exited).  On the
        in-process transport, a signal that would end a worker process
        (SIGKILL) ends the worker as that process's death would: its calls
        in flight fail, and ``returncode`` becomes ``-sig``; one a worker
        process ignores (SIGINT, SIGTERM) or that cannot stop an in-process
        worker (SIGSTOP) does nothing."""
        ...


def worker_processes(procs: ProcMesh) -> list[WorkerProcess]:
    """The current process of each rank of ``procs`` (rank order): a test
    keeps them to see how each exited (the runtime reaps its workers, so
    ``os.waitpid`` cannot)."""
    return [w.handle for w in sorted(procs._state.workers, key=lambda w: w.rank)]


def cut_connection(procs: ProcMesh, rank: int) -> None:
    """Abort this process's connection to the worker at ``rank`` of
    ``procs`` (a network fault: the worker lives on)."""
    conn = procs._state.worker(rank).conn
    if conn is None:
        raise ValueError(f"cut_connection: rank {rank} of proc mesh {procs._state.name!r} "
                         "has no connection (not started, or down)")
    conn.abort()


def job_record(job: ProcessJob | SlurmJob) -> dict[str, Any] | None:
    """The record of ``job`` as its cache holds it (None until it started):
    per host mesh, each host's agent (``node``, ``pid``, ``addr``), and
    ``extra`` (a Slurm job's further allocations): what a test that takes
    down an agent or a node needs."""
    return job._entry


def child_pids() -> set[int]:
    """Live (non-zombie) child processes of this process, e.g. workers a test
    forgot to stop (Linux ``/proc``); in a worker, not the keeper of its
    process group (meshio's own: it goes with the worker)."""
    me = str(os.getpid())
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[1] != me or fields[0] == "Z":
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if KEEPER.encode() in f.read():
                    continue
        except OSError:
            continue
        found.add(int(entry))
    return found


async def wait_exited(pidfd: int, timeout: float) -> None:
    """Wait on the running loop until the process behind ``pidfd``
    (``os.pidfd_open``) has exited.  Several may wait on one pidfd at once:
    each waits on a duplicate of it of its own.

    Raises:
        TimeoutError: it is still running after ``timeout`` seconds.
        TypeError: ``pidfd`` is not an int (a str, a bool), or ``timeout``
            is not a number (a str, a bool).
        ValueError: ``pidfd`` is no open pidfd (closed, a file, a pipe), or
            ``timeout`` is not seconds > 0 (NaN, or an int no float holds;
            ``math.inf``: no bound).
    """
    if isinstance(pidfd, bool) or not isinstance(pidfd, int):
        raise TypeError(f"wait_exited(pidfd=...) must be a pidfd (an int, from "
                        f"os.pidfd_open), got {type(pidfd).__name__} {pidfd!r}")
    timeout = check_seconds(timeout, "wait_exited", "timeout")
    try:  # (a pidfd's fdinfo names its process: a "Pid:" line, -1 once reaped)
        with open(f"/proc/self/fdinfo/{pidfd}") as f:
            is_pidfd = any(line.startswith("Pid:") for line in f)
    except OSError:
        raise ValueError(f"wait_exited(pidfd={pidfd}): no such open file descriptor in "
                         f"process {os.getpid()} (closed?)") from None
    if not is_pidfd:
        raise ValueError(f"wait_exited(pidfd={pidfd}): not a pidfd (a file, a pipe or a "
                         "socket?); pass one from os.pidfd_open(pid)")
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not fut.done():
            fut.set_result(None)

    # (one reader per fd and loop: another waiter's would replace this one's)
    fd = os.dup(pidfd)
    try:
        loop.add_reader(fd, readable)
        try:
            await within(fut, timeout)
        except TimeoutError:
            raise TimeoutError(f"wait_exited: pidfd {pidfd} did not become readable (the "
                               f"process did not exit) within {timeout:g} s") from None
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


async def open_job_connection(addr: str, secret: bytes | None = None
                              ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw stream to the meshio process at ``addr``, past the job handshake
    (with ``secret``, by default the running loop's runtime's): what follows
    is the framed protocol, for tests that speak it by hand.

    Raises:
        AuthenticationError: the process there is not of this job.
    """
    reader, writer = await asyncio.open_unix_connection(sockaddr(addr))
    try:
        hs = Handshake(runtime().secret if secret is None else secret, dialler=True,
                       end=listening_end(writer.get_extra_info("socket"), dialler=True))
        writer.write(hs.start())
        writer.write(hs.feed(await reader.readexactly(CHALLENGE_SIZE)))
    except BaseException:
        writer.close()
        raise
    return reader, writer
