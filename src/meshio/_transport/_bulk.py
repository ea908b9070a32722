"""Large data: memory another process reads at memory speed, one layer.

Large message values and ``RDMABuffer`` (:mod:`meshio.rdma`) share what is
here: the address of a buffer (:func:`address_of`), this machine's identity
(:data:`HOST_ID`), the one-copy move between two processes of one host
(:func:`cma`: Linux cross-memory attach, the owner's code does not run); the
memory a received value lives in is :mod:`._pool`'s.

A large value on a connection between two processes of one host
(:class:`Exports`): each out-of-band part of a frame from :data:`THRESHOLD`
bytes on (text aside) travels as a 24-byte descriptor (export id, length,
where it starts within a cache line) with the :data:`REMOTE` flag on its
kind.  The receiver finds memory for each part and sends its addresses
back (``Fill``); the sender writes the parts there with cross-memory attach
in its copy threads, off its event loop, then says so (``Filled``), and the
receiver delivers the frame.  The sender writes nothing else on that
connection meanwhile (but ``Fill``, ``Ping`` and ``Pong``), so frames keep
their order; it keeps the parts alive (their registration) until they are
written or the connection ends.  The sender writes, rather than the
receiver reading, because the kernel pins the pages of the *other* process
one at a time: the receiver's pool is huge pages, a tensor's own memory is
4 KiB pages (PyTorch's allocator), and writing from it runs twice as fast
as reading it (16-17 against 8.5 GiB/s for 64 MiB, two threads, on the
2-core VM).  Nothing is named in ``/dev/shm`` or anywhere: a crash on either
side leaves nothing behind (a receiver killed mid-transfer fails the write,
and the sender drops that connection; a sender killed mid-transfer ends the
connection, and the receiver drops the frame, as it would a truncated one).

Tensor storage, NumPy arrays and ``memoryview`` values (kind
:data:`~._serial.KIND_BUFFER`) land in memory of the receiver's pool and stay
there: the value aliases it, with no further copy, and gives it back to the
pool when the receiver drops the value.  Pooled memory is already mapped, so
a copy into it runs at memcpy speed (a fresh allocation pays a page fault per
page first, 3x slower on a VM).  ``bytes`` and ``bytearray`` values are
objects of their own and are written into a new one.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import functools
import itertools
import logging
import os
import socket
import struct
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final, Literal

from .._exceptions import ProtocolError
from ._frames import _LEN_MASK, _PEEK, _allocate
from ._handshake import peer_creds
from ._messages import Fill
from ._pool import THRESHOLD, pool_view
from ._serial import (
    KIND_ASCII,
    KIND_BUFFER,
    KIND_BYTEARRAY,
    KIND_BYTES,
    Buffers,
    Handing,
    OutBuffers,
    limits,
)
from ._tasks import finished

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ("CAP_IPC_LOCK", "CAP_SYS_PTRACE", "HOST_ID", "REMOTE", "Exports", "address_of",
           "capable", "cma", "exports_for", "ptrace_scope", "quarantine", "snapshot")

log = logging.getLogger("meshio")

#: the kind flag of a part that is a descriptor
REMOTE: Final = 0x80
_DESC: Final = struct.Struct("<QQQ")
#: a copy between two places that differ within a cache line runs a third
#: slower: a part lands where it starts within one in the sender's memory
_LINE: Final = 64
#: the kinds whose large parts travel by descriptor (text goes in the
#: stream, where its bytes are checked as they arrive)
_BY_DESCRIPTOR: Final = frozenset((KIND_BYTEARRAY, KIND_BYTES, KIND_BUFFER))
#: copies at least this large are split in two halves, one per thread
_SPLIT: Final = 8 << 20


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _netns() -> str:
    try:
        return str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        return ""


#: identifies this host: the machine (same kernel: cross-memory attach works)
#: and its network namespace (a namespace is a host of its own, as the
#: simulated hosts of the tests are: what crosses it goes over the network)
HOST_ID: Final = f"{socket.gethostname()}/{_boot_id()}/{_netns()}"


# ------------------------------------------------------------ addresses

class _PyBuffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int),
                ("ndim", ctypes.c_int), ("format", ctypes.c_char_p),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = (ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int)
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = (ctypes.POINTER(_PyBuffer),)
_PyBUF_WRITABLE: Final = 0x0001


def address_of(view: memoryview, *, writable: bool = False) -> int:
    """The address of the first byte of ``view`` (C-contiguous); it stays
    valid while ``view`` lives."""
    pb = _PyBuffer()
    _get_buffer(view, ctypes.byref(pb), _PyBUF_WRITABLE if writable else 0)
    try:
        return int(pb.buf or 0)
    finally:
        _release_buffer(ctypes.byref(pb))


# ------------------------------------------------------- the one copy

class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
for _name in ("process_vm_readv", "process_vm_writev"):
    _fn = getattr(_libc, _name, None)
    if _fn is not None:
        _fn.restype = ctypes.c_ssize_t
        _fn.argtypes = (ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                        ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong)


def cma(op: Literal["read", "write"], pid: int, local: int, remote: int, n: int) -> None:
    """Copy ``n`` bytes between ``local`` (this process) and ``remote`` (in
    process ``pid``) by cross-memory attach (``process_vm_readv``/``writev``;
    no GIL held while it copies), looping over partial copies.

    Raises:
        OSError: with the copy's ``errno`` (``ESRCH``: the process is gone;
            ``EFAULT``: the range is not mapped there).
    """
    fn = _libc.process_vm_readv if op == "read" else _libc.process_vm_writev
    done = 0
    while done < n:
        liov = _IoVec(local + done, n - done)
        riov = _IoVec(remote + done, n - done)
        got = fn(pid, ctypes.byref(liov), 1, ctypes.byref(riov), 1, 0)
        if got <= 0:
            err = ctypes.get_errno() or errno.EIO
            raise OSError(err, os.strerror(err))
        done += got


def halves(n: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of the pieces one copy of ``n`` bytes is split
    into, one per thread: two halves (page-aligned) from :data:`_SPLIT` on."""
    if n < _SPLIT:
        return [(0, n)]
    half = (n // 2) & ~4095
    return [(0, half), (half, n - half)]


_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def executor() -> ThreadPoolExecutor:
    """The threads that copy large data (two: the copy runs without the GIL)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(2, thread_name_prefix="meshio-copy")
        return _executor


async def copied(jobs: Sequence[asyncio.Future[Any]]) -> None:
    """Await copies running in the copy threads (:func:`executor`), which
    nothing can stop: cancelled meanwhile, it waits for them all the same,
    then raises ``CancelledError``.  Once it returns or raises, no thread
    reads or writes the memory they were given by address, which the caller
    may then free or reuse (a destination written after a cancelled read
    returned would be written after its owner dropped it)."""
    try:
        await finished(jobs)
    finally:
        errors = [e for job in jobs if not job.cancelled() and (e := job.exception())]
    if errors:
        raise errors[0]


# ------------------------------------------------ values on a connection

@functools.cache
def ptrace_scope() -> int | None:
    """This machine's Yama ``ptrace_scope`` (None: no Yama), which decides
    whose memory :func:`cma` may read: 0 any process of the same user, 1
    only descendants and processes that declared this one their tracer
    (``PR_SET_PTRACER``, as workers do for their parent), 2 only with
    ``CAP_SYS_PTRACE``, 3 none; read once."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


#: capability bits (``linux/capability.h``) that lift the limits on reading
#: another process's memory and on pinning memory (``RLIMIT_MEMLOCK``)
CAP_IPC_LOCK: Final = 14
CAP_SYS_PTRACE: Final = 19


def capable(cap: int) -> bool:
    """Whether this process holds capability ``cap`` (its effective set)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> cap & 1)
    except (OSError, ValueError):
        pass
    return os.geteuid() == 0


def _cross_memory_attach() -> bool:
    """Whether this machine lets a process copy from a sibling of the same
    user (no Yama restriction on ``ptrace``)."""
    return ptrace_scope() in (None, 0)


class Exports:
    """The large-value side of one connection to a process of this host:
    the parts this process sends by descriptor, held until it has written
    them into the peer's memory (:meth:`fill`), and the memory the peer's
    parts land in (:meth:`land`)."""

    __slots__ = ("held", "ids", "pid")

    def __init__(self, pid: int) -> None:
        self.pid: int = pid
        #: by export id: the parts lent, until written into the peer
        self.held: dict[int, list[memoryview]] = {}
        self.ids: Iterator[int] = itertools.count(1)

    # --------------------------------------------------------- sending

    def export(self, out: OutBuffers) -> tuple[OutBuffers, int]:
        """``out`` with each part of :data:`THRESHOLD` bytes or more (text
        aside) replaced by a descriptor, and the export id they are held
        under until written (0: none was large)."""
        views = [memoryview(b) for b, _ in out]
        if all(v.nbytes < THRESHOLD for v in views):
            return out, 0
        eid = next(self.ids)
        keep: list[memoryview] = []
        sent: OutBuffers = []
        for (buf, kind), view in zip(out, views, strict=True):
            if view.nbytes < THRESHOLD or kind == KIND_ASCII:
                sent.append((buf, kind))
                continue
            if not view.c_contiguous:  # (a sender's own buffers are contiguous)
                view = memoryview(view.tobytes())
            keep.append(view.cast("B"))
            sent.append((_DESC.pack(eid, view.nbytes, address_of(view) % _LINE), kind | REMOTE))
        if not keep:
            return out, 0
        self.held[eid] = keep
        return sent, eid

    def fill(self, conn: Connection, msg: Fill) -> None:
        """The handler of :class:`Fill`: write export ``msg.export``'s parts
        at the peer's addresses in the copy threads, then let the frames
        queued behind it go (:meth:`Connection.filled`).  A ``Fill`` that
        names another export than the one whose frame the peer has
        (:meth:`Connection.waiting_export`), or the wrong number of parts,
        drops the connection before anything is written; so does a write
        that fails (the peer died, or named memory it does not have)."""
        waiting = conn.waiting_export()
        views = self.held.pop(msg.export, None) if msg.export == waiting else None
        if views is None or (msg.to and len(msg.to) != len(views)):
            what = (f"the export whose frame it has is {waiting or 'none'}" if views is None
                    else f"{len(views)} parts")
            log.warning("meshio: a Fill from %s for export %d with %d addresses (%s); "
                        "dropping the connection", conn.who,
                        msg.export, len(msg.to), what)
            conn.abort()
            return
        if not msg.to:  # refused: nothing to write
            conn.filled(False)
            return
        loop = conn.rt.loop
        jobs = [loop.run_in_executor(executor(), cma, "write", self.pid,
                                     address_of(view) + at, to + at, m)
                for view, to in zip(views, msg.to, strict=True)
                for at, m in halves(view.nbytes)]

        def written(done: asyncio.Future[list[BaseException | None]]) -> None:
            views.clear()  # (alive until now: the threads read them)
            error = next((e for e in done.result() if isinstance(e, BaseException)), None)
            if conn.closed:
                return
            if error is not None:
                log.warning("meshio: writing a large value into pid %d failed (%s); "
                            "dropping the connection to %s", self.pid, error,
                            conn.who)
                conn.abort()
                return
            conn.filled(True)

        asyncio.gather(*jobs, return_exceptions=True).add_done_callback(written)

    def close(self) -> None:
        """The connection ended: nothing is lent any more."""
        self.held.clear()

    # ------------------------------------------------------- receiving

    @staticmethod
    def described(descs: tuple[int, ...]) -> bool:
        """Whether every part of a frame header is a known kind, or a
        descriptor of a kind that travels by one."""
        return all(d >> 56 <= KIND_BUFFER or (
            d >> 56 & ~REMOTE in _BY_DESCRIPTOR and d & _LEN_MASK == _DESC.size)
            for d in descs)

    def land(self, conn: Connection, parts: tuple[int, ...], got: list[Any]) -> int | None:
        """Memory for the described parts of a complete frame (``got``, the
        body first, each descriptor replaced by its memory), and the peer
        asked to write them there (:class:`Fill`).  The export id the frame
        waits on until the peer's :class:`Filled`; None: it describes
        nothing (deliver it now); 0: refused (over the size limit), answered
        already.

        Raises:
            ProtocolError: a descriptor under :data:`THRESHOLD` bytes, or
                the parts of more than one export.
        """
        if not any(d >> 56 & REMOTE for d in parts):
            return None
        eid = 0
        size = len(got[0])
        wanted: list[tuple[int, int, int, int]] = []
        for i, d in enumerate(parts):
            if d >> 56 & REMOTE:
                part, n, start = _DESC.unpack(got[i])
                if n < THRESHOLD or start >= _LINE or part < 1 or eid not in (0, part):
                    raise ProtocolError(
                        f"malformed frame (a descriptor of {n} bytes from byte {start} of a "
                        f"line, of export {part}, in a frame of export {eid or part})")
                eid = part
                wanted.append((i, d >> 56 & ~REMOTE, n, start))
                size += n
            elif i:
                size += d & _LEN_MASK
        if size > limits.max_message:
            conn.send_control(Fill(eid, []))
            conn._refuse(bytes(got[0][:_PEEK]), size)
            return 0
        to: list[int] = []
        for i, kind, n, start in wanted:
            if kind == KIND_BUFFER:
                view = pool_view(n, start)
                got[i] = view
            else:
                got[i], view = _allocate(kind, n)
            to.append(address_of(view, writable=True))
        conn.send_control(Fill(eid, to))
        return eid


#: landing memory a peer may still be writing into, though its connection
#: ended (:func:`quarantine`), until that peer exits.  Held here, not by a
#: loop: one closed first never releases it, and it is then held until this
#: process exits.
_quarantined: dict[int, Buffers] = {}


def quarantine(loop: asyncio.AbstractEventLoop, pid: int, memory: Buffers) -> None:
    """Keep ``memory``, which process ``pid`` was asked to write into
    (:class:`Fill`) and may still be writing in its copy threads, which
    nothing stops, until ``pid`` exits (its pidfd, watched on ``loop``): a
    pool block given back, or freed memory, would take that write into
    another value or this process's heap.  A peer gone already: nothing."""
    try:
        pidfd = -1 if pid == os.getpid() else os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:  # (no pidfd: kept until this process exits)
        pidfd = -1
    key = id(memory)
    _quarantined[key] = memory
    log.warning("meshio: keeping the %d bytes of a frame whose large parts pid %d was asked "
                "to write, until it exits: its connection ended, its copy may go on",
                sum(len(b) for b in memory), pid)
    if pidfd < 0:  # (this process's own copy threads, a connection to itself)
        return

    def exited() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        del _quarantined[key]

    try:
        loop.add_reader(pidfd, exited)
    except RuntimeError:  # (the loop is closed: kept until this process exits)
        os.close(pidfd)


def snapshot(out: OutBuffers) -> OutBuffers:
    """``out`` with each part that could change in place copied (all but
    ``bytes`` and text), whatever its size: for a message whose sender does
    not wait for its delivery (a broadcast, a port's ``send``), so that
    changing the value afterwards cannot reach a receiver, however long its
    frame waits to be written (a connection being made, from an actor's
    thread, a full window) or read (a large part, by descriptor)."""
    copy = [(b if type(b) is bytes or kind == KIND_ASCII else bytes(memoryview(b)), kind)
            for b, kind in out]
    if type(out) is Handing:  # (the ports it holds go with it)
        handing = Handing(copy)
        handing.ports = out.ports
        return handing
    return copy


def exports_for(transport: asyncio.BaseTransport) -> Exports | None:
    """The large-value side of a new connection: None unless its peer is a
    process of this host this one can copy from."""
    creds = peer_creds(transport)  # None: not a Unix socket
    return Exports(creds[0]) if creds and creds[0] > 0 and _cross_memory_attach() else None


def fill(rt: Any, conn: Connection, msg: Fill, bufs: Any) -> None:
    """The handler of :class:`Fill`: the peer has memory for an export."""
    if conn.bulk is not None:
        conn.bulk.fill(conn, msg)
    else:
        log.warning("meshio: a Fill from %s, which sends nothing by descriptor; "
                    "dropping the connection", conn.who)
        conn.abort()
