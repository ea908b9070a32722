"""The ``same_host`` backend: one copy straight between the two address
spaces by cross-memory attach (:func:`meshio._transport._bulk.cma`, the
copy large message values use too); the owner's code does not run.  A
token word in the owner's memory, read the same way, tells whether the
buffer was dropped; a lock on the owner's fence, held from before that
check to after the copy, keeps a drop from returning meanwhile
(:mod:`._fence`)."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import sys
from collections.abc import Mapping
from typing import Final

from .._exceptions import RDMAError
from .._transport._bulk import (
    CAP_SYS_PTRACE,
    HOST_ID,
    capable,
    cma,
    copied,
    executor,
    halves,
    ptrace_scope,
)
from .._transport._messages import RdmaOpName, Transfer
from .._transport._runtime import runtime
from ._fence import Held, HolderFences
from ._memory import Memory
from ._registry import DROPPED, Handle, OwnerSide

__all__ = ("HOST_ID", "SERVES", "status", "transfer")

#: nothing: the owner's code does not run
SERVES: Final[Mapping[RdmaOpName, OwnerSide]] = {}


def status() -> tuple[bool, str]:
    """Whether this process can use the backend, and what allows it or why
    not: Linux, and a Yama ``ptrace_scope`` that lets it read the memory of
    other processes of this host."""
    if sys.platform != "linux":
        return False, f"needs Linux cross-memory attach (process_vm_readv); this is {sys.platform}"
    if not os.path.isdir("/proc/self/fd"):
        return False, ("needs /proc (a transfer locks its owner's drop fence through "
                       "/proc/<pid>/fd): mount it")
    scope = ptrace_scope()
    how = "cross-memory attach (process_vm_readv)"
    if scope is None or scope == 0:
        return True, f"{how}; no Yama ptrace restriction"
    if scope == 1:
        return True, (f"{how}; Yama ptrace_scope=1: workers let their parent and its other "
                      "children in (PR_SET_PTRACER), no other process")
    if scope == 2 and capable(CAP_SYS_PTRACE):
        return True, f"{how}; Yama ptrace_scope=2, and this process has CAP_SYS_PTRACE"
    if scope == 2:
        return False, ("Yama ptrace_scope=2 (/proc/sys/kernel/yama/ptrace_scope) lets only "
                       "processes with CAP_SYS_PTRACE use process_vm_readv: run as root or "
                       "lower it (sysctl kernel.yama.ptrace_scope=1)")
    return False, (f"Yama ptrace_scope={scope} (/proc/sys/kernel/yama/ptrace_scope) forbids "
                   "process_vm_readv between all processes until the next reboot")


def _cma(op: Transfer, h: Handle, local: int, remote: int, n: int) -> None:
    """:func:`cma` on ``h``'s owner, its errors as :class:`RDMAError`."""
    try:
        cma(op, h.pid, local, remote, n)
    except OSError as e:
        raise _error(e, op, h) from None


def _error(e: OSError, op: Transfer, h: Handle) -> RDMAError:
    """The :class:`RDMAError` of a failed copy of the transfer ``op`` on ``h``."""
    where = f"RDMA {op} on buffer {h.buf} of pid {h.pid} (same_host)"
    if e.errno == errno.ESRCH:
        return RDMAError(f"{where}: its owner is gone (its process exited or was killed)")
    if e.errno == errno.EFAULT:  # unmapped in the owner
        return RDMAError(f"{where}: no longer mapped in its owner: dropped and freed")
    return RDMAError(f"{where}: {e.strerror}")


def _check_token(h: Handle, op: Transfer) -> None:
    """Refuse the transfer ``op`` on ``h`` if its buffer was dropped (its
    token word, read from the owner, changed)."""
    cell = ctypes.c_uint64(0)
    try:
        cma("read", h.pid, ctypes.addressof(cell), h.token_addr, 8)
    except OSError as e:
        raise _error(e, op, h) from None
    if cell.value != h.token:
        raise RDMAError(f"RDMA {op} on buffer {h.buf} of pid {h.pid} (same_host): {DROPPED}")


def _fenced(h: Handle, op: Transfer) -> Held:
    """A lock on ``h``'s buffer in its owner's fence (:mod:`._fence`), to
    hold from before its token check to after its copy: a drop returns only
    once it is let go (:meth:`Held.release`)."""
    if h.fence is None:
        raise RDMAError(f"RDMA {op} on buffer {h.buf} of pid {h.pid} (same_host): its owner "
                        "has no drop fence (not on Linux)")
    try:
        held = runtime().state(HolderFences).lock(h.pid, h.fence, h.buf)
    except OSError as e:
        _check_token(h, op)  # its owner is gone, or dropped it (closing its runtime): say so
        raise RDMAError(f"RDMA {op} on buffer {h.buf} of pid {h.pid} (same_host): its owner's "
                        f"drop fence (/proc/{h.pid}/fd/{h.fence[0]}) does not open: "
                        f"{e.strerror}") from None
    if held is None:  # the owner holds the whole range: it is dropping it
        raise RDMAError(f"RDMA {op} on buffer {h.buf} of pid {h.pid} (same_host): {DROPPED}")
    return held


async def transfer(h: Handle, op: Transfer, local: Memory, offset: int, length: int) -> None:
    """``op`` ("read": owner → local, "write": local → owner) of ``length``
    bytes at ``offset`` of ``h``'s buffer, by cross-memory attach: in the
    copying threads from 1 MiB on (the loop stays free), split in two
    halves, one per thread, when large.  Its buffer is checked and copied
    under the fence's lock, let go once the copy threads are done."""
    held = _fenced(h, op)
    try:
        _check_token(h, op)
        remote = h.addr + offset
        if length < 1 << 20:
            _cma(op, h, local.addr, remote, length)
            return
        loop = asyncio.get_running_loop()
        await copied([loop.run_in_executor(executor(), _cma, op, h, local.addr + at, remote + at,
                                           n) for at, n in halves(length)])
    finally:
        held.release()
