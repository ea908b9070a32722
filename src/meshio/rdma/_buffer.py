"""``RDMABuffer``: register memory once, let other processes read or write it.

The owner registers a buffer in its process and hands out a small handle
(the buffer itself is a value: pickle it into an argument or result).  A
holder reads or writes it one-sidedly through the best backend between the
two processes:

- ``same_host``: one copy straight between the two address spaces with
  Linux cross-memory attach (``process_vm_readv``/``process_vm_writev``);
  the owner's code does not run.  A token word in the owner's memory,
  read the same way, tells whether the buffer was dropped.
- ``ibverbs``: RDMA READ/WRITE on a reliable-connected queue pair
  (:mod:`._ibverbs_qp` over our typed cffi binding, present only when built
  against libibverbs and a device exists); the owner's code does not run.
- ``tcp``: chunks over the meshio connection, served by the owner's
  runtime (not its actors); a :class:`RDMAFallbackWarning` is emitted once.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import socket
import sys
import warnings
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import msgspec

from .._constants import MSGPACK_NIL
from .._context import _context
from .._exceptions import (
    CallTimeout,
    RDMAError,
    RDMAFallbackWarning,
    RDMASizeError,
    SupervisionError,
)
from .._transport._connection import Connection
from .._transport._messages import ErrorInfo, Fail, RdmaOp, Reply, Transfer
from .._transport._runtime import Runtime, register_handler, runtime
from .._transport._serial import KIND_BYTEARRAY, Buffers
from ._registry import (
    BACKENDS,
    Backend,
    Handle,
    Registration,
    Registry,
    _ids,
    _Memory,
    _request,
)

if TYPE_CHECKING:
    import torch
    from typing_extensions import Buffer

__all__ = ("BACKENDS", "Backend", "RDMABuffer", "available_backends", "backend_for", "serve_op")

#: memory an ``RDMABuffer`` registers or copies to or from: an object with the
#: buffer protocol (``bytearray``, ``memoryview``, numpy array...) or a CPU tensor
BufferLike: TypeAlias = "Buffer | torch.Tensor"
#: bytes per TCP chunk, and chunks in flight
TCP_CHUNK: Final = 8 << 20
TCP_WINDOW: Final = 4
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


# ------------------------------------------------------------ raw memory

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
_PyBUF_WRITABLE = 0x0001


def _memory(obj: Any, what: str, *, writable: bool) -> _Memory:
    """The bytes behind a tensor or buffer object, with clear errors."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu":
            raise RDMAError(
                f"{what}: a {obj.device.type} tensor; GPU memory needs GPUDirect RDMA "
                "(nvidia-peermem or dma-buf) with the ibverbs backend, which this host does "
                "not offer. Copy it to a CPU tensor first.")
        if not obj.is_contiguous():
            raise RDMASizeError(f"{what}: the tensor is not contiguous; call .contiguous() first")
        size = obj.numel() * obj.element_size()
        if size == 0:
            raise RDMASizeError(f"{what}: the tensor is empty")
        return _Memory(obj, obj.data_ptr(), size, True)
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(f"{what}: expected a CPU torch.Tensor, bytearray, memoryview or "
                        f"another buffer object, got {type(obj).__name__}") from None
    if not view.c_contiguous:
        raise RDMASizeError(f"{what}: the buffer is not contiguous")
    if view.nbytes == 0:
        raise RDMASizeError(f"{what}: the buffer is empty")
    if writable and view.readonly:
        raise RDMAError(f"{what}: the buffer is read-only ({type(obj).__name__}); use a "
                        "bytearray, a writable memoryview or a tensor")
    pb = _PyBuffer()
    _get_buffer(view, ctypes.byref(pb), _PyBUF_WRITABLE if writable else 0)
    try:
        addr = int(pb.buf or 0)
    finally:
        _release_buffer(ctypes.byref(pb))
    return _Memory(view, addr, view.nbytes, not view.readonly)


@functools.cache
def available_backends() -> tuple[Backend, ...]:
    """Backends this process can use, in order of preference."""
    found: list[Backend] = ["same_host"] if sys.platform == "linux" else []
    try:
        # deferred: imports the cffi module (absent without libibverbs)
        from ._ibverbs_device import devices
    except ImportError:
        pass
    else:
        if devices():
            found.append("ibverbs")
    found.append("tcp")
    return tuple(found)


def _backend_from_env() -> Backend | None:
    """``MESHIO_RDMA_BACKEND``, checked against :data:`Backend` (unset or empty: None)."""
    name = os.environ.get("MESHIO_RDMA_BACKEND") or None
    try:
        backend: Backend | None = msgspec.convert(name, Backend | None)
    except msgspec.ValidationError:
        raise RDMAError(f"MESHIO_RDMA_BACKEND={name!r} is not an RDMA backend; use one of "
                        f"{list(BACKENDS)} or unset it") from None
    return backend


def backend_for(handle: Handle | RDMABuffer) -> Backend:
    """The backend a transfer on ``handle`` uses from this process.

    Automatic choice: ``same_host`` when the owner runs on this machine,
    else ``ibverbs`` when both sides have a device, else ``tcp``.  Override
    with ``RDMABuffer(obj, backend=...)`` or the ``MESHIO_RDMA_BACKEND``
    environment variable.
    """
    h = handle.handle if isinstance(handle, RDMABuffer) else handle
    forced = h.backend or _backend_from_env()
    have = available_backends()
    if forced is not None:
        if forced not in have:
            raise RDMAError(f"RDMA backend {forced!r} is not available in this process "
                            f"(available: {list(have)})")
        if forced == "same_host" and h.host != HOST_ID:
            raise RDMAError(f"RDMA backend 'same_host' needs the owner on this machine; it "
                            f"runs on {h.host.split('/')[0]}")
        if forced == "ibverbs" and h.ib is None:
            raise RDMAError("RDMA backend 'ibverbs': the owner registered the buffer "
                            "without an ibverbs device")
        return forced
    if h.host == HOST_ID and "same_host" in have:
        return "same_host"
    if h.ib is not None and "ibverbs" in have:
        return "ibverbs"
    return "tcp"


# ------------------------------------------------------------ the buffer

class RDMABuffer:
    """Memory registered for one-sided reads and writes by other processes.

    ``RDMABuffer(obj)`` registers ``obj`` — a contiguous CPU ``torch.Tensor``,
    ``bytearray``, writable ``memoryview`` or other writable buffer — in this
    process (it stays alive while registered).  The buffer is a value: send
    it in an endpoint argument or result and use it from the other side.

    Args:
        obj: the memory to register.
        backend: force ``"same_host"``, ``"ibverbs"`` or ``"tcp"`` for every
            holder (default: chosen per holder, see :func:`backend_for`).
    """

    __slots__ = ("_handle", "_timeout")

    def __init__(self, obj: BufferLike, *, backend: Backend | None = None) -> None:
        if backend is not None and backend not in BACKENDS:  # a caller without a type checker
            raise ValueError(f"RDMABuffer: backend must be one of {list(BACKENDS)}, "
                             f"got {backend!r}")
        memory = _memory(obj, "RDMABuffer", writable=True)
        rt = runtime()
        ctx = _context.get(None)
        reg = Registration(next(_ids), memory, ctx.mesh._target if ctx else "")
        ib: bytes | None = None
        if "ibverbs" in available_backends():
            # deferred: imports the cffi module (absent without libibverbs)
            from ._ibverbs_device import register

            reg.ib = register(memory.addr, memory.size)
            ib = reg.ib.describe()
        rt.state(Registry).by_id[reg.id] = reg
        self._handle = Handle(rt.addr, os.getpid(), HOST_ID, reg.id, reg.token, reg.token_addr,
                              memory.addr, memory.size, ib, backend)
        self._timeout: float | None = None

    @classmethod
    def _from_handle(cls, handle: Handle, timeout: float | None = None) -> RDMABuffer:
        buf = cls.__new__(cls)
        buf._handle = handle
        buf._timeout = timeout
        return buf

    def __reduce__(self) -> tuple[Any, ...]:
        return (RDMABuffer._from_handle, (self._handle,))

    def __repr__(self) -> str:
        h = self._handle
        return (f"<RDMABuffer {h.buf} of {h.size} bytes, owner pid {h.pid} on "
                f"{h.host.split('/')[0]}>")

    @property
    def handle(self) -> Handle:
        return self._handle

    @property
    def size(self) -> int:
        """Size of the registered memory in bytes."""
        return self._handle.size

    @property
    def backend(self) -> Backend:
        """The backend a transfer from this process uses (see :func:`backend_for`)."""
        return backend_for(self._handle)

    def options(self, *, timeout: float | None = None) -> RDMABuffer:
        """The same buffer with per-transfer options.

        Args:
            timeout: seconds before a transfer (any backend) or :meth:`drop`
                raises :class:`~meshio.CallTimeout`.
        """
        if timeout is not None and not timeout > 0:
            raise ValueError(f"options(timeout=...) must be positive, got {timeout!r}")
        return RDMABuffer._from_handle(self._handle, timeout)

    # ------------------------------------------------------- transfers

    def _range(self, offset: int, length: int | None, what: str) -> int:
        size = self._handle.size
        if not isinstance(offset, int) or offset < 0:
            raise RDMASizeError(f"{what}: offset must be an int >= 0, got {offset!r}")
        if length is None:
            length = size - offset
        if not isinstance(length, int) or length < 0 or offset + length > size:
            raise RDMASizeError(f"{what}: offset {offset} + length {length} exceeds the "
                                f"buffer's {size} bytes")
        return length

    async def read_into(self, dst: BufferLike, *, offset: int = 0,
                        length: int | None = None) -> int:
        """Copy ``length`` bytes (default: to the end) from ``offset`` of this
        buffer into ``dst`` (a writable buffer or CPU tensor of at least that
        size).  Returns the number of bytes copied."""
        length = self._range(offset, length, "read_into")
        local = _memory(dst, "read_into destination", writable=True)
        if local.size < length:
            raise RDMASizeError(f"read_into: destination holds {local.size} bytes, "
                                f"{length} requested")
        await self._run("read", local, offset, length)
        return length

    async def write_from(self, src: BufferLike, *, offset: int = 0) -> int:
        """Copy all of ``src`` into this buffer at ``offset``.  Returns the
        number of bytes copied."""
        local = _memory(src, "write_from source", writable=False)
        self._range(offset, local.size, "write_from")
        await self._run("write", local, offset, local.size)
        return local.size

    async def drop(self) -> None:
        """Release the registration (in the owner, wherever this is called);
        later transfers raise :class:`~meshio.RDMAError`.  Idempotent.

        Raises:
            CallTimeout: the owner did not answer within ``options(timeout=...)``.
        """
        h = self._handle
        rt = runtime()
        if h.owner == rt.addr:
            rt.state(Registry).release(h.buf)
            return
        try:
            await _request(rt, h, RdmaOp(0, "drop", h.buf, h.token), self._timeout)
        except (SupervisionError, RDMAError):
            pass  # the owner is gone: so is the registration

    async def _run(self, op: Transfer, local: _Memory, offset: int, length: int) -> None:
        backend = backend_for(self._handle)
        if length == 0:
            return
        coro: Awaitable[None]
        match backend:
            case "same_host":
                coro = _same_host(self._handle, op, local, offset, length)
            case "ibverbs":
                # deferred: imports the cffi module (absent without libibverbs)
                from ._ibverbs_qp import transfer

                coro = transfer(runtime(), self._handle, op, local.addr, offset, length)
            case "tcp":
                coro = _tcp(self._handle, op, local, offset, length)
        if self._timeout is None:
            await coro
            return
        try:
            await asyncio.wait_for(coro, self._timeout)
        except TimeoutError:
            raise CallTimeout(
                f"RDMA {op} of {length} bytes on {self!r} ({backend}) took longer than "
                f"{self._timeout}s", endpoint=f"RDMABuffer.{op}") from None


# ------------------------------------------------------------- same host

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
            if err == 3:  # ESRCH
                raise RDMAError(f"RDMA {op}: the owner of buffer {h.buf} (pid {h.pid}) is gone")
            if err == 14:  # EFAULT: unmapped in the owner
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


async def _same_host(h: Handle, op: Transfer, local: _Memory, offset: int, length: int) -> None:
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


# ------------------------------------------------------------------ tcp

_warned = False


def _warn_tcp(h: Handle) -> None:
    global _warned
    if not _warned:
        _warned = True
        why = ("the tcp backend was forced" if h.backend or os.environ.get("MESHIO_RDMA_BACKEND")
               else "no same-host path or ibverbs device between these processes")
        warnings.warn(f"meshio RDMA: {why}; transfers go over TCP (slower)",
                      RDMAFallbackWarning, stacklevel=4)


async def _tcp(h: Handle, op: Transfer, local: _Memory, offset: int, length: int) -> None:
    """Chunks over the meshio connection (the transfer's timeout is applied
    around the whole transfer by :meth:`RDMABuffer._run`)."""
    _warn_tcp(h)
    rt = runtime()
    view = memoryview((ctypes.c_char * local.size).from_address(local.addr)).cast("B")
    sem = asyncio.Semaphore(TCP_WINDOW)

    async def chunk(start: int, n: int) -> None:
        async with sem:
            if op == "read":
                data = await _request(rt, h, RdmaOp(0, "read", h.buf, h.token, offset + start,
                                                    n), None)
                view[start:start + n] = data
            else:
                await _request(rt, h, RdmaOp(0, "write", h.buf, h.token, offset + start, n),
                               None, [(view[start:start + n], KIND_BYTEARRAY)])

    await asyncio.gather(*(chunk(s, min(TCP_CHUNK, length - s))
                           for s in range(0, length, TCP_CHUNK)))


def serve_op(rt: Runtime, conn: Connection, msg: RdmaOp, bufs: Buffers) -> None:
    """The owner's side of a TCP transfer or set-up (runs in its runtime, not an actor)."""
    registry = rt.state(Registry)
    reg = registry.by_id.get(msg.buf)
    if reg is None or reg.token != msg.token:
        if msg.op != "drop":
            conn.send_message(Fail(msg.req, ErrorInfo(
                "rdma", "RDMAError", f"RDMA {msg.op}: buffer {msg.buf} of pid {os.getpid()} "
                "was dropped")))
        else:
            conn.send_message(Reply(msg.req, MSGPACK_NIL))
        return
    size = reg.memory.size
    if msg.op in ("read", "write") and (msg.offset < 0 or msg.offset + msg.length > size):
        conn.send_message(Fail(msg.req, ErrorInfo(
            "rdma", "RDMASizeError", f"RDMA {msg.op}: offset {msg.offset} + length "
            f"{msg.length} exceeds buffer {msg.buf}'s {size} bytes")))
        return
    match msg.op:
        case "read":
            conn.send_message(Reply(msg.req, MSGPACK_NIL),
                              [(reg.view()[msg.offset:msg.offset + msg.length], KIND_BYTEARRAY)])
        case "write":
            reg.view()[msg.offset:msg.offset + msg.length] = bufs[0]
            conn.send_message(Reply(msg.req, MSGPACK_NIL))
        case "drop":
            registry.release(msg.buf)
            conn.send_message(Reply(msg.req, MSGPACK_NIL))
        case "connect":
            # deferred: imports the cffi module (absent without libibverbs)
            from ._ibverbs_qp import accept

            conn.send_message(Reply(msg.req, MSGPACK_NIL),
                              [(accept(rt, conn, msg.info), KIND_BYTEARRAY)])


register_handler(RdmaOp, serve_op)
