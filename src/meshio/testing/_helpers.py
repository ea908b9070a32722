"""Helpers for tests of meshio programs: process leak checks, waiting on
process exit without sleeping, and raw connections to a job's processes."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from .._actor import Actor
from .._actor_mesh import ActorMesh
from .._transport._handshake import CHALLENGE_SIZE, Handshake, listening_end
from .._transport._runtime import runtime, sockaddr

__all__ = ("child_pids", "open_job_connection", "wait_exited")


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


def child_pids() -> set[int]:
    """Live (non-zombie) child processes of this process, e.g. workers a test
    forgot to stop (Linux ``/proc``)."""
    me = str(os.getpid())
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            found.add(int(entry))
    return found


async def wait_exited(pidfd: int, timeout: float) -> None:
    """Wait on the running loop until the process behind ``pidfd``
    (``os.pidfd_open``) has exited.

    Raises:
        TimeoutError: it is still running after ``timeout`` seconds.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        await asyncio.wait_for(fut, timeout)
    finally:
        loop.remove_reader(pidfd)


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
