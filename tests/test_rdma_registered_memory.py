"""An ``RDMABuffer`` keeps the memory it was registered over, whatever its
owner then does with the object: a tensor given other storage
(``t.data = other``, ``t.set_(other)``) leaves the buffer on the old
storage, kept alive until the buffer is dropped, not on freed memory whose
bytes are whatever the process allocated there since; a registered
``bytearray`` or NumPy array cannot be resized under it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import meshio
from meshio import Actor, RDMABuffer, endpoint
from meshio.rdma import Backend

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.filterwarnings("ignore::meshio.RDMAFallbackWarning")

#: what the owner's tensor holds when registered, and after the swap
OLD, NEW, JUNK = 7, 9, 42


class Owner(Actor):
    @endpoint
    async def register(self, size: int, backend: Backend) -> RDMABuffer:
        self.t = torch.full((size,), OLD, dtype=torch.uint8)
        self.buf = RDMABuffer(self.t, backend=backend)
        return self.buf

    @endpoint
    async def swap(self, how: str) -> list[int]:
        """Give the registered tensor other storage, drop every other
        reference to the old one, then allocate as a training step would
        (what would reuse the old storage's memory, were it freed)."""
        size = self.t.numel()
        new = torch.full((size,), NEW, dtype=torch.uint8)
        if how == "data":
            self.t.data = new
        else:
            self.t.set_(new)
        del new
        self.junk = [torch.full((size,), JUNK, dtype=torch.uint8) for _ in range(64)]
        values: list[int] = self.t.unique().tolist()
        return values


class Peer(Actor):
    @endpoint
    async def read(self, buf: RDMABuffer) -> list[int]:
        dst = bytearray(buf.size)
        await buf.read_into(dst)
        return sorted(set(dst))


@pytest.mark.parametrize("backend", ["same_host", "tcp"])
async def test_a_tensor_given_other_storage_keeps_its_registered_memory(
        procs: meshio.ProcMesh, backend: Backend) -> None:
    """Probe p05: after ``t.data = torch.full(..., 9)`` and some allocations,
    a reader got ``[0, 1, 7, 32, 127, 144]`` (freed memory, reused), or for
    1 MiB an RDMAError "no longer mapped in its owner" though nothing was
    dropped.  It reads the registered memory, unchanged: the old values.
    Sizes: a block of malloc's arena, and one of its own mapping."""
    peer = await procs.slice(procs=1).spawn("peer", Peer)
    for how, size in itertools.product(("data", "set_"), (4096, 1 << 20)):
        owner = await procs.slice(procs=0).spawn(f"owner_{how}_{size}", Owner)
        buf = await owner.register.call_one(size, backend)
        assert await peer.read.call_one(buf) == [OLD]
        assert await owner.swap.call_one(how) == [NEW]
        assert await peer.read.call_one(buf) == [OLD], (how, size)
        await buf.drop()


async def test_a_registered_bytearray_or_array_cannot_be_resized() -> None:
    """Registration holds the buffer's export, which bytearray and NumPy
    refuse to resize under (their memory would move); drop() lets it go."""
    data = bytearray(64)
    array = np.zeros(64, np.uint8)
    bufs = [RDMABuffer(data), RDMABuffer(array)]
    with pytest.raises(BufferError):
        data.extend(bytes(64))
    with pytest.raises(ValueError, match="cannot resize"):
        array.resize(128)
    for buf in bufs:
        await buf.drop()
    data.extend(bytes(64))
    array.resize(128)
    assert (len(data), array.size) == (128, 128)
