"""``RDMABuffer``: register memory once, let other processes read or write it.

The owner registers a buffer in its process and hands out a small handle
(the buffer itself is a value: pickle it into an argument or result).  A
holder reads or writes it one-sidedly through the best backend between the
two processes:

- ``same_host`` (:mod:`._same_host`): one copy straight between the two
  address spaces with Linux cross-memory attach; the owner's code does not
  run.
- ``ibverbs``: RDMA READ/WRITE on a reliable-connected queue pair
  (:mod:`._ibverbs_qp` over our typed cffi binding, present only when built
  against libibverbs and a device exists); the owner's code does not run.
- ``tcp`` (:mod:`._tcp`): chunks over the meshio connection, served by
  the owner's runtime (not its actors); a :class:`RDMAFallbackWarning` is
  emitted once.

Each backend module implements one Protocol (:class:`._registry.RdmaBackend`:
its status, the holder's transfer, the owner's side of the requests it
serves); :mod:`._backends` names them and serves the owner's side.  This
module is the front: :class:`RDMABuffer` and the choice of backend.  The
backends below it (and :mod:`._memory`, :mod:`._registry`) never import it.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import operator
import os
from typing import Any, SupportsIndex

import msgspec

from .._checks import check_seconds
from .._context import _context
from .._exceptions import CallTimeout, RDMAError, RDMASizeError, SupervisionError
from .._transport._messages import RdmaOp, Transfer
from .._transport._runtime import runtime
from .._transport._tasks import when_done, within
from . import _backends, _same_host, _tcp
from ._memory import BufferLike, Memory, memory_of
from ._registry import (
    BACKENDS,
    LENT_LATE,
    Backend,
    Handle,
    Registration,
    Registry,
    _ids,
    ask_owner,
    owner_may_live,
)

__all__ = ("BACKENDS", "Backend", "RDMABuffer", "available_backends", "backend_for",
           "backend_status")


@functools.cache
def backend_status() -> dict[Backend, tuple[bool, str]]:
    """For each backend, in order of preference: whether this process can
    use it, and what it found or why not (``meshio doctor`` shows these)."""
    status: dict[Backend, tuple[bool, str]] = {}
    for name in BACKENDS:
        try:
            status[name] = _backends.backend(name).status()
        except ImportError as e:  # ibverbs
            if importlib.util.find_spec("meshio._ibverbs_ffi") is None:
                status[name] = (False, (
                    "meshio was installed without its ibverbs binding (no "
                    "/usr/include/infiniband/verbs.h at build time): install libibverbs-dev "
                    "(Debian) or rdma-core-devel, then reinstall meshio"))
            else:
                status[name] = (False, f"meshio's ibverbs binding does not load: {e}")
    return status


def available_backends() -> tuple[Backend, ...]:
    """Backends this process can use, in order of preference."""
    return tuple(b for b, (usable, _) in backend_status().items() if usable)


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
        if forced == "same_host" and h.host != _same_host.HOST_ID:
            raise RDMAError(f"RDMA backend 'same_host' needs the owner on this machine; it "
                            f"runs on {h.host.split('/')[0]}")
        if forced == "ibverbs" and h.ib is None:
            raise RDMAError("RDMA backend 'ibverbs': the owner registered the buffer "
                            "without an ibverbs device")
        return forced
    if h.host == _same_host.HOST_ID and "same_host" in have:
        return "same_host"
    if h.ib is not None and "ibverbs" in have:
        return "ibverbs"
    return "tcp"


def _index(value: SupportsIndex, what: str, arg: str, also: str = "") -> int:
    """``value``, the argument ``arg`` of ``what``, as an int: anything
    :func:`operator.index` takes (an ``int``, ``numpy.int64(5)``,
    ``torch.tensor(5)``), as Python's slicing does, but never a bool
    (``True``, ``numpy.True_``, ``torch.tensor(True)``) — it would be taken
    for 1, a shifted transfer — as meshio's other checks refuse bools.

    Raises:
        TypeError: ``value`` is no integer (``also``: what else the
            argument takes, for the message).
    """
    if not isinstance(value, bool) and str(getattr(value, "dtype", "")) not in (
            "bool", "torch.bool"):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{what}: {arg} must be an integer (an int, a NumPy or torch integer, "
                    f"not a bool){also}, got {value!r} ({type(value).__name__})")


# ------------------------------------------------------------ the buffer

class RDMABuffer:
    """Memory registered for one-sided reads and writes by other processes.

    ``RDMABuffer(obj)`` registers ``obj`` — a contiguous CPU ``torch.Tensor``,
    ``bytearray``, writable ``memoryview`` or other writable buffer — in this
    process.  The buffer is a value: send it in an endpoint argument or
    result and use it from the other side.  A tensor over read-only memory
    (``torch.frombuffer(some_bytes)``, ``torch.from_numpy`` of a read-only
    array) cannot be told from a writable one and is written into: register
    a copy (``t.clone()``).

    What is registered is the memory ``obj`` has now, kept alive until the
    buffer is dropped: a tensor given other storage (``t.data = other``,
    ``t.set_(other)``) leaves the buffer on its old storage, which transfers
    still read and write; a ``bytearray`` or NumPy array cannot be resized
    while registered.  Growing a tensor past its storage with ``resize_()``
    moves it to new memory and frees the registered one: don't; drop the
    buffer and register the tensor again.

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
        memory = memory_of(obj, "RDMABuffer", writable=True)
        rt = runtime()
        registry = rt.state(Registry)
        fence = registry.fence_id()
        ctx = _context.get(None)
        reg = Registration(next(_ids), memory, ctx.mesh._target if ctx else "")
        ib: bytes | None = None
        if "ibverbs" in available_backends():
            # deferred: imports the cffi module (absent without libibverbs)
            from ._ibverbs_device import register

            reg.ib = register(memory.addr, memory.size)
            ib = reg.ib.describe()
        registry.by_id[reg.id] = reg
        self._handle = Handle(rt.addr, os.getpid(), _same_host.HOST_ID, reg.id, reg.token,
                              reg.token_addr, memory.addr, memory.size, ib, backend, fence)
        self._timeout: float | None = None

    @classmethod
    def _from_handle(cls, handle: Handle, timeout: float | None = None) -> RDMABuffer:
        buf = cls.__new__(cls)
        buf._handle = handle
        buf._timeout = timeout
        return buf

    def __reduce__(self) -> tuple[Any, ...]:
        return (RDMABuffer._from_handle, (self._handle, self._timeout))  # (options travel)

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
        """The same buffer with per-transfer options.  They travel with it:
        sent to another process (in an argument or result), its transfers
        and :meth:`drop` there keep them.

        Args:
            timeout: seconds before a transfer (any backend) or :meth:`drop`
                raises :class:`~meshio.CallTimeout`; what the owner had been
                sent may still take effect if it resumes (a write: see
                :meth:`write_from`).  An owner found not
                responding first (its proc mesh's ``heartbeat_timeout``, 3 s
                by default) fails them sooner, as calls to it fail:
                :meth:`drop` with :class:`~meshio.SupervisionError`, a
                ``tcp`` transfer with :class:`~meshio.RDMAError`.

        Raises:
            TypeError: ``timeout`` is not a number (a str, a bool).
            ValueError: ``timeout`` is not seconds > 0 (NaN, or an int no
                float holds; ``math.inf`` is no bound).
        """
        if timeout is not None:
            timeout = check_seconds(timeout, "RDMABuffer.options", "timeout", also=" or None")
        return RDMABuffer._from_handle(self._handle, timeout)

    # ------------------------------------------------------- transfers

    def _range(self, offset: SupportsIndex, length: SupportsIndex | None,
               what: str) -> tuple[int, int]:
        """The offset and the length of the transfer ``what`` asks for.

        Raises:
            TypeError: ``offset`` or ``length`` is not an integer (see
                :func:`_index`).
            RDMASizeError: the range does not fit the buffer.
        """
        size = self._handle.size
        offset = _index(offset, what, "offset")
        if length is not None:
            length = _index(length, what, "length", also=" or None")
        if offset < 0:
            raise RDMASizeError(f"{what}: offset must be an int >= 0, got {offset!r}")
        if length is not None and length < 0:
            raise RDMASizeError(f"{what}: length must be >= 0 (or None: to the end), got "
                                f"{length!r}")
        if offset > size:
            raise RDMASizeError(f"{what}: offset {offset} is past the end of the buffer "
                                f"({size} bytes)")
        if length is None:
            length = size - offset
        if offset + length > size:
            raise RDMASizeError(f"{what}: offset {offset} + length {length} exceeds the "
                                f"buffer's {size} bytes")
        return offset, length

    async def read_into(self, dst: BufferLike, *, offset: SupportsIndex = 0,
                        length: SupportsIndex | None = None) -> int:
        """Copy ``length`` bytes (default: to the end) from ``offset`` of this
        buffer into ``dst`` (a writable buffer or CPU tensor of at least that
        size).  Returns the number of bytes copied.  ``offset`` and ``length``
        are integers: an ``int``, a NumPy integer, a one-element integer
        tensor (not a bool).  Copying 0 bytes (``length=0``,
        ``offset=buf.size``) copies nothing, into an empty ``dst`` too, but
        fails as any transfer on a dropped buffer or a gone owner does."""
        offset, length = self._range(offset, length, "read_into")
        # (empty for 0 bytes: nothing lands; the owner still refuses a dropped buffer)
        local = memory_of(dst, "read_into destination", writable=True, empty=length == 0)
        if local.size < length:
            raise RDMASizeError(f"read_into: destination holds {local.size} bytes, "
                                f"{length} requested")
        await self._run("read", local, offset, length)
        return length

    async def write_from(self, src: BufferLike, *, offset: SupportsIndex = 0) -> int:
        """Copy all of ``src`` (not empty) into this buffer at ``offset`` (an
        integer, as :meth:`read_into` takes).  Returns the number of bytes
        copied.

        ``src`` is the caller's again once this returns or raises, also on
        a timeout or a cancellation: a write given up may still land, when
        the owner resumes, what it had sent (``src``'s bytes as they were
        during the call), but never bytes put into ``src`` after it ended
        (``tcp`` sends a copy of each chunk; ``same_host`` returns once its
        copy threads are done)."""
        local = memory_of(src, "write_from source", writable=False)
        offset, _ = self._range(offset, local.size, "write_from")
        await self._run("write", local, offset, local.size)
        return local.size

    async def drop(self) -> None:
        """Release the registration (in the owner, wherever this is called);
        later transfers raise :class:`~meshio.RDMAError`.  Idempotent.

        Returns once the owner released it (or had already) and the
        transfers begun before are done with its memory (the ``tcp`` reads
        it served, the ``same_host`` copies under way: the owner changing it
        then reaches none of them; at most 10 s, with a warning, for a
        reader not responding), or once the owner's process is gone —
        exited, killed (a supervisor kills a hung one), its proc mesh
        stopped, its host downed: its registrations went with it.

        Raises:
            CallTimeout: the owner did not answer within ``options(timeout=...)``
                (stopped, or its event loop blocked); the drop takes effect
                if it resumes.
            SupervisionError: the owner's process is alive but found not
                responding (no heartbeat answer for the proc mesh's
                ``heartbeat_timeout``, 3 s by default, when that comes before
                the timeout, or without one), as calls to it are; or it could
                not be reached.  The buffer stays registered; a drop already
                sent takes effect when the owner answers again, and one made
                meanwhile is not sent.  Call ``drop()`` again once it answers.
        """
        h = self._handle
        rt = runtime()
        if h.owner == rt.addr:  # (once the reads served before are done with its memory)
            done: asyncio.Future[None] = rt.loop.create_future()

            def released() -> None:
                if not done.done():  # (not if this drop was cancelled meanwhile)
                    done.set_result(None)

            if when_done(rt.state(Registry).release(h.buf), released, LENT_LATE):
                await done
            return
        try:
            await ask_owner(rt, h, RdmaOp(0, "drop", h.buf, h.token), self._timeout)
        except SupervisionError as e:
            if not owner_may_live(e):
                return  # its process is gone, and the registration with it
            raise SupervisionError(
                f"RDMABuffer.drop() of buffer {h.buf}: its owner (pid {h.pid} on "
                f"{h.host.split('/')[0]}) does not answer and is not known to be gone, so the "
                f"buffer stays registered there (a drop it received takes effect when it "
                f"resumes); call drop() again once it answers, or stop its proc mesh, which "
                f"releases every buffer in it. {e}",
                actor=e.actor, rank=e.rank, host=e.host, pid=e.pid, cause=e.cause) from e

    async def _run(self, op: Transfer, local: Memory, offset: int, length: int) -> None:
        name = backend_for(self._handle)
        if name == "tcp":  # warned here, at a fixed depth: it names the caller's line
            _tcp.warn_fallback(self._handle, stacklevel=3)
        coro = _backends.backend(name).transfer(self._handle, op, local, offset, length)
        if self._timeout is None:
            await coro
            return
        try:
            await within(coro, self._timeout)
        except TimeoutError:
            raise CallTimeout(
                f"RDMA {op} of {length} bytes on {self!r} ({name}) took longer than "
                f"{self._timeout}s", endpoint=f"RDMABuffer.{op}") from None
