"""The memory large values live in: views of it that keep their owner
alive (:func:`owned_view`), and the pool of mapped blocks a received value
lands in and aliases (:func:`pool_view`), page-locked for CUDA where a GPU
copies to or from it (:func:`pin_for_cuda`).  Below both the serializer
(:mod:`._serial`, which stages accelerator tensors here) and the moves
between processes (:mod:`._bulk`): it imports neither."""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import threading
import time
from collections import deque
from typing import Any, Final

__all__ = ("IDLE_CAP", "IDLE_KEEP", "THRESHOLD", "owned_view", "pin_for_cuda", "pool_view",
           "trimming")

#: blocks from this size on ask for transparent huge pages
_HUGE: Final = 4 << 20
#: bytes of idle pool memory a process keeps for the next values
IDLE_CAP: Final = 1 << 30
#: seconds an idle pool block waits for a value before it is unmapped
#: (:meth:`_Pool.trim`: a burst of large values leaves nothing mapped)
IDLE_KEEP: Final = 10.0
#: ``cudaHostRegisterPortable``: registered for every CUDA context of the process
_PORTABLE: Final = 1

#: large: values from this size on land in the pool, travel by descriptor
#: between processes of one host (:mod:`._bulk`), and are pinned for CUDA
THRESHOLD: Final = 1 << 20


def owned_view(addr: int, n: int, owner: object) -> memoryview:
    """A writable byte view of the ``n`` bytes at ``addr``, which keeps
    ``owner`` (what holds that memory: a tensor, a str, a pool lease) alive
    while it, or a slice of it, lives: a frame lending it reads it after
    the send returned, so the memory goes only once nothing reads it."""
    array: Any = (ctypes.c_char * n).from_address(addr)
    array._meshio_owner = owner
    return memoryview(array).cast("B")


class _Block:
    """One anonymous mapping of the pool, its address, and whether it is
    registered with CUDA (:func:`pin_for_cuda`)."""

    __slots__ = ("addr", "idle_since", "map", "pinned", "size")

    def __init__(self, size: int) -> None:
        self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if size >= _HUGE:  # fewer page faults on first touch, where THP is "madvise"
            self.map.madvise(mmap.MADV_HUGEPAGE)
        self.size = size
        probe = ctypes.c_char.from_buffer(self.map)
        self.addr = ctypes.addressof(probe)
        del probe  # (an exported buffer would keep the map from closing)
        self.pinned = False
        self.idle_since = 0.0

    def close(self) -> None:
        if self.pinned:
            _cudart().cudaHostUnregister(self.addr)
        self.map.close()


class _Lease:
    """Held by a view of a block lent out: the block goes back to the pool
    when the last user of the view drops it (whichever thread does)."""

    __slots__ = ("block", "pool")

    def __init__(self, pool: _Pool, block: _Block) -> None:
        self.pool = pool
        self.block = block

    def __del__(self) -> None:
        self.pool.returned.append(self.block)  # a deque: safe without a lock


class _Pool:
    """Mapped memory for received values: a value aliases a block until it
    is dropped; idle blocks, up to :data:`IDLE_CAP` bytes, serve the next
    values without page faults (the blocks given back last: the next values
    are likelier of their sizes than of older ones), for up to
    :data:`IDLE_KEEP` seconds (:meth:`trim`)."""

    def __init__(self) -> None:
        self.idle: list[_Block] = []
        self.idle_bytes = 0
        self.returned: deque[_Block] = deque()
        self.lock = threading.Lock()

    def view(self, n: int, start: int = 0) -> memoryview:
        """A writable ``n``-byte view of a block, from byte ``start`` of it,
        lent until it is dropped."""
        n += start
        with self.lock:
            self._collect(time.monotonic())
            fits = [b for b in self.idle if n <= b.size <= 2 * n]
            if fits:
                block = min(fits, key=lambda b: b.size)
                self.idle.remove(block)
                self.idle_bytes -= block.size
            else:
                block = _Block(-(-n // mmap.PAGESIZE) * mmap.PAGESIZE)
        return owned_view(block.addr + start, n - start, _Lease(self, block))

    def _collect(self, now: float) -> None:
        """Take the blocks given back since (under the lock) into the idle
        ones: the latest kept, the oldest idle making room."""
        while self.returned:
            block = self.returned.popleft()
            if block.size > IDLE_CAP:
                block.close()
                continue
            while self.idle_bytes + block.size > IDLE_CAP:
                self._unmap(self.idle.pop(0))
            block.idle_since = now
            self.idle.append(block)
            self.idle_bytes += block.size

    def _unmap(self, block: _Block) -> None:
        self.idle_bytes -= block.size
        block.close()

    def trim(self, now: float | None = None) -> None:
        """Unmap the blocks idle for :data:`IDLE_KEEP` seconds by ``now``
        (``time.monotonic()``; None: now), given back since too: what
        each runtime does every ``IDLE_KEEP / 2`` seconds
        (:func:`trimming`), so memory no value took again goes back to
        the system, not kept up to :data:`IDLE_CAP` for good."""
        now = time.monotonic() if now is None else now
        with self.lock:
            self._collect(now)
            stale = [b for b in self.idle if now - b.idle_since >= IDLE_KEEP]
            if stale:
                self.idle = [b for b in self.idle if now - b.idle_since < IDLE_KEEP]
                for block in stale:
                    self._unmap(block)


_pool = _Pool()
#: a writable ``n``-byte view of mapped memory, lent until it is dropped
pool_view: Final = _pool.view


async def trimming() -> None:
    """Trim the pool (:meth:`_Pool.trim`) every ``IDLE_KEEP / 2`` seconds,
    for ever: a task of each runtime's."""
    while True:
        await asyncio.sleep(IDLE_KEEP / 2)
        _pool.trim()


def pin_for_cuda(memory: object) -> None:
    """Register the pool block under ``memory`` (a view of it) with CUDA
    (page-locked), for the block's life, before a GPU copies to or from
    it: from pageable memory the device copies at a fraction of the bus's
    speed (2.5x slower round trips of 16-256 MiB on an H200). Idle blocks
    keep their registration, so a steady stream of GPU values pays it once.
    Memory not from the pool, a block under :data:`THRESHOLD`, or a
    registration CUDA refuses: nothing (the copy runs from pageable
    memory)."""
    block = _block_of(memory)
    if block is None or block.pinned or block.size < THRESHOLD:
        return
    block.pinned = int(_cudart().cudaHostRegister(block.addr, block.size, _PORTABLE)) == 0
    if not block.pinned:
        _clear_cuda_error()


def _block_of(memory: object) -> _Block | None:
    """The pool block ``memory`` (a view of it) lies in, or None."""
    lease = getattr(getattr(memory, "obj", None), "_meshio_owner", None)
    return lease.block if isinstance(lease, _Lease) else None


def _clear_cuda_error() -> None:
    """Take back the error a refused registration left pending in the CUDA
    runtime torch loaded (``cudaGetLastError``): torch's next kernel launch
    would raise it as its own."""
    with open("/proc/self/maps") as maps:
        libraries = {line.split()[-1] for line in maps if "/libcudart.so" in line}
    for path in libraries:
        ctypes.CDLL(path).cudaGetLastError()


def _cudart() -> Any:
    """torch's bindings of the CUDA runtime (torch is imported wherever a
    block is registered)."""
    import torch

    cuda: Any = torch.cuda  # (``cudart`` is untyped)
    return cuda.cudart()
