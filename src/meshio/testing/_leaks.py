"""What a process holds open, described for a leak report (Linux ``/proc``)."""

from __future__ import annotations

import os
import socket

__all__ = ("open_fds",)


def open_fds() -> dict[int, str]:
    """This process's open file descriptors, each with what it is: a path,
    ``pipe:[inode]``, ``anon_inode:[pidfd]``, or for a socket its family,
    type and address (``socket AF_UNIX SOCK_STREAM /tmp/x.sock``).

    Compare two snapshots to find what a piece of code left open; the
    ``meshio_leak_check`` of meshio's pytest plugin does.
    """
    found: dict[int, str] = {}
    for entry in os.listdir("/proc/self/fd"):
        fd = int(entry)
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the directory listing's own fd, closed by now
        found[fd] = _describe_socket(fd, target) if target.startswith("socket:") else target
    return found


def _describe_socket(fd: int, target: str) -> str:
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return target
    with sock:
        try:
            local = sock.getsockname()
        except OSError:
            local = "?"
        family = getattr(sock.family, "name", sock.family)
        kind = getattr(sock.type, "name", sock.type)
        return f"socket {family} {kind} {local or 'unbound'} ({target})"
