"""The fence between ``drop()`` and ``same_host`` transfers.

A ``same_host`` transfer runs none of the owner's code: it reads the
buffer's token word in the owner's memory, then copies by cross-memory
attach.  For ``drop()`` to return only once no such transfer still copies
(the owner may then change or free the memory), each transfer holds a lock
that the drop must take, on a file both processes reach:

- the owner's runtime keeps one memfd (:class:`OwnerFence`: no name in any
  file system, gone with the process), named in each handle by its fd
  number and inode;
- a holder's runtime opens it once per owner, through
  ``/proc/<pid>/fd/<n>`` (an open file description of its own:
  :class:`HolderFences`), and holds a shared OFD lock (``F_OFD_SETLK``) on a
  byte of the buffer's range from before its token check to after its copy
  (a byte for each of its transfers under way: one open file description's
  locks on one byte merge, and unlocking one would unlock the other);
- a drop sets the token to 0, then takes an exclusive lock on the buffer's
  whole range, which the kernel grants only once every shared lock on it
  is released (:meth:`OwnerFence.quiet`, polled), and lets it go.

A transfer that locked first is done when the drop returns; one that locks
after it reads the token 0 (taking and releasing the kernel's lock orders
the drop's store before the transfer's load), or finds the exclusive lock
taken: the buffer is being dropped.  Nobody waits on a lock: the holder
fails, the owner polls.  A holder killed mid-transfer releases its locks as
the kernel closes its files; a stopped one holds the drop, which gives up
after ``LEND_TIMEOUT`` seconds with a warning, as for the ``tcp`` reads it
served before.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .._transport._runtime import Runtime

__all__ = ("Held", "HolderFences", "OwnerFence")

#: the memfd's name, as ``/proc/<pid>/fd/<n>`` shows it (``/memfd:<name> (deleted)``)
NAME: Final = "meshio-rdma-fence"
#: ``struct flock``: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks)
_FLOCK: Final = struct.Struct("hhqqi4x")
#: bytes of each buffer's range (from ``id * _SPAN``): the most transfers one
#: holder process has under way on it at once
_SPAN: Final = 1 << 24


def _lock(fd: int, kind: int, start: int, length: int) -> bool:
    """Take (``F_RDLCK``, ``F_WRLCK``) or release (``F_UNLCK``) ``fd``'s OFD
    lock on ``length`` bytes from ``start``, never waiting: False if
    another open file description holds one in the way."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(kind, os.SEEK_SET, start, length, 0))
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


class OwnerFence:
    """The owner's side: the memfd its buffers' holders lock (one per
    runtime, made with its first buffer, closed with it)."""

    __slots__ = ("fd", "ino")

    def __init__(self) -> None:
        self.fd = os.memfd_create(NAME, os.MFD_CLOEXEC)
        self.ino = os.fstat(self.fd).st_ino

    def quiet(self, buf: int) -> bool:
        """Whether no transfer on buffer ``buf`` holds its lock (the whole
        range locked, and let go at once); ask once its token is 0."""
        if not _lock(self.fd, fcntl.F_WRLCK, buf * _SPAN, _SPAN):
            return False
        _lock(self.fd, fcntl.F_UNLCK, buf * _SPAN, _SPAN)
        return True

    def close(self) -> None:
        os.close(self.fd)


class _Opened:
    """A holder's open file description of one owner's fence, and the bytes
    its transfers under way lock (their slots)."""

    __slots__ = ("fd", "free", "made")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.free: list[int] = []
        self.made = 0

    def busy(self) -> bool:
        return len(self.free) < self.made


class Held:
    """A transfer's lock on its byte of a buffer's range (:meth:`release` it)."""

    __slots__ = ("at", "opened", "slot")

    def __init__(self, opened: _Opened, slot: int, at: int) -> None:
        self.opened, self.slot, self.at = opened, slot, at

    def release(self) -> None:
        if self.opened.fd >= 0:  # (else its runtime closed it, and the lock with it)
            _lock(self.opened.fd, fcntl.F_UNLCK, self.at, 1)
        self.opened.free.append(self.slot)


class HolderFences:
    """A holder's side: the owners' fences its runtime's ``same_host``
    transfers lock (``rt.state(HolderFences)``), each opened once; those of
    owners gone are closed when another is opened, and all with the runtime."""

    __slots__ = ("by_owner",)

    def __init__(self, rt: Runtime) -> None:
        #: by owner pid, and its fence's fd number and inode
        self.by_owner: dict[tuple[int, tuple[int, int]], _Opened] = {}

    def lock(self, pid: int, fence: tuple[int, int], buf: int) -> Held | None:
        """A shared lock on a byte of buffer ``buf``'s range in the fence
        ``fence`` (fd number, inode) of process ``pid``; None if its owner
        is dropping it (it holds the whole range).

        Raises:
            OSError: the fence cannot be opened: the owner is gone (its pid
                reused: not the fence there), or closed its runtime.
        """
        key = (pid, fence)
        opened = self.by_owner.get(key) or self._open(key)
        if opened.free:
            slot = opened.free.pop()
        else:
            slot = opened.made
            opened.made += 1
        at = buf * _SPAN + slot
        if not _lock(opened.fd, fcntl.F_RDLCK, at, 1):
            opened.free.append(slot)
            return None
        return Held(opened, slot, at)

    def _open(self, key: tuple[int, tuple[int, int]]) -> _Opened:
        pid, (n, ino) = key
        path = f"/proc/{pid}/fd/{n}"
        # (checked before opening it: a reused pid's fd n could be a device)
        if not os.readlink(path).startswith(f"/memfd:{NAME} "):
            raise OSError(errno.ESRCH, f"{path} is not a meshio fence")
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        if os.fstat(fd).st_ino != ino:
            os.close(fd)
            raise OSError(errno.ESRCH, f"{path} is another meshio fence")
        self._close_gone()
        opened = self.by_owner[key] = _Opened(fd)
        return opened

    def _close_gone(self) -> None:
        """Close the fences, not in use, of owners gone (or whose runtime closed)."""
        for key, opened in list(self.by_owner.items()):
            pid, (n, ino) = key
            try:
                here = os.stat(f"/proc/{pid}/fd/{n}").st_ino == ino
            except OSError:
                here = False
            if not here and not opened.busy():
                os.close(opened.fd)
                del self.by_owner[key]

    def close(self) -> None:
        opened, self.by_owner = self.by_owner, {}
        for o in opened.values():
            os.close(o.fd)
            o.fd = -1
