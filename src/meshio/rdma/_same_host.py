"""The ``same_host`` backend: one copy straight between the two address
spaces with Linux cross-memory attach (``process_vm_readv``/
``process_vm_writev``); the owner's code does not run.  A token word in the
owner's memory, read the same way, tells whether the buffer was dropped."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import socket
from typing import Final

from .._exceptions import RDMAError
from .._transport._messages import Transfer
from ._memory import Memory
from ._registry import Handle

#: transfers at least this large run in worker threads (the loop stays free)
THREADED: Final = 1 << 20


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


#: identifies this machine (same kernel ⇒ cross-memory attach works)
HOST_ID: Final = f"{socket.gethostname()}/{_boot_id()}"


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
for _name in ("process_vm_readv", "process_vm_writev"):
    _fn = getattr(_libc, _name, None)
    if _fn is not None:
        _fn.restype = ctypes.c_ssize_t
        _fn.argtypes = (ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                        ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong)


def _cma(op: Transfer, h: Handle, local: int, remote: int, n: int) -> None:
    """Cross-memory attach, looping over partial transfers."""
    fn = _libc.process_vm_readv if op == "read" else _libc.process_vm_writev
    done = 0
    while done < n:
        liov = _IoVec(local + done, n - done)
        riov = _IoVec(remote + done, n - done)
        got = fn(h.pid, ctypes.byref(liov), 1, ctypes.byref(riov), 1, 0)
        if got <= 0:
            err = ctypes.get_errno()
            if err == errno.ESRCH:
                raise RDMAError(f"RDMA {op}: the owner of buffer {h.buf} (pid {h.pid}) is gone")
            if err == errno.EFAULT:  # unmapped in the owner
                raise RDMAError(f"RDMA {op}: buffer {h.buf} is no longer mapped in its owner "
                                f"(pid {h.pid}): dropped and freed")
            raise RDMAError(f"RDMA {op} on buffer {h.buf} of pid {h.pid} (same_host): "
                            f"{os.strerror(err)}")
        done += got


def _check_token(h: Handle) -> None:
    cell = ctypes.c_uint64(0)
    _cma("read", h, ctypes.addressof(cell), h.token_addr, 8)
    if cell.value != h.token:
        raise RDMAError(f"RDMA: buffer {h.buf} of pid {h.pid} was dropped")


async def transfer(h: Handle, op: Transfer, local: Memory, offset: int, length: int) -> None:
    """``op`` ("read": owner → local, "write": local → owner) of ``length``
    bytes at ``offset`` of ``h``'s buffer, by cross-memory attach."""
    _check_token(h)
    remote = h.addr + offset
    if length < THREADED:
        _cma(op, h, local.addr, remote, length)
        return
    # Two threads, two halves: cross-memory attach runs without the GIL.
    half = (length // 2) & ~4095
    await asyncio.gather(
        asyncio.to_thread(_cma, op, h, local.addr, remote, half),
        asyncio.to_thread(_cma, op, h, local.addr + half, remote + half, length - half))
