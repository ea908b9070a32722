"""A registered tensor grown by ``resize_()`` past its storage moves: torch
allocates new memory and frees the registered one.  Over the ``tcp``
backend the owner's runtime serves every chunk, so it sees the storage no
longer holds the registered range and refuses the transfer with an
``RDMAError`` saying so (it read, and wrote, freed memory).  The other
backends reach the memory without the owner's code: they cannot tell."""

from __future__ import annotations

import pytest

import meshio
from meshio import Actor, RDMABuffer, endpoint

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.filterwarnings("ignore::meshio.RDMAFallbackWarning")

SIZE = 1 << 16
MOVED = (r"^meshio\.RDMAError: RDMA {op} on buffer \d+ of pid \d+ on .* \(tcp\): its "
         r"memory moved \(the registered tensor was resized past its storage, and torch "
         r"freed the registered memory\): drop the buffer and register the tensor again ")


class Owner(Actor):
    @endpoint
    async def register(self) -> RDMABuffer:
        self.t = torch.full((SIZE,), 7, dtype=torch.uint8)
        self.buf = RDMABuffer(self.t, backend="tcp")
        return self.buf

    @endpoint
    async def shrink_and_grow_back(self) -> None:
        """Within its storage: the tensor's memory stays where it is."""
        self.t.resize_(SIZE // 2)
        self.t.resize_(SIZE)

    @endpoint
    async def grow(self) -> None:
        """Past its storage (the new bytes are 9)."""
        self.t.resize_(16 * SIZE)
        self.t[SIZE:] = 9

    @endpoint
    async def register_again(self) -> RDMABuffer:
        await self.buf.drop()
        self.buf = RDMABuffer(self.t, backend="tcp")
        return self.buf


class Peer(Actor):
    @endpoint
    async def read(self, buf: RDMABuffer) -> list[int]:
        dst = bytearray(buf.size)
        await buf.read_into(dst)
        return sorted(set(dst))

    @endpoint
    async def write(self, buf: RDMABuffer) -> None:
        await buf.write_from(bytearray(b"\x05") * buf.size)


async def test_a_tensor_resized_past_its_storage_is_refused_over_tcp(
        procs: meshio.ProcMesh) -> None:
    owner = await procs.slice(procs=0).spawn("owner", Owner)
    peer = await procs.slice(procs=1).spawn("peer", Peer)
    buf = await owner.register.call_one()
    # shrunk, then grown back within its storage: the memory did not move
    await owner.shrink_and_grow_back.call_one()
    assert await peer.read.call_one(buf) == [7]
    # grown past it: torch moved the tensor and freed the registered memory
    await owner.grow.call_one()
    with pytest.raises(meshio.ActorError, match=MOVED.format(op="read")):
        await peer.read.call_one(buf)
    with pytest.raises(meshio.ActorError, match=MOVED.format(op="write")):
        await peer.write.call_one(buf)
    # registered again, it is the tensor's new memory
    buf = await owner.register_again.call_one()
    assert buf.size == 16 * SIZE
    assert await peer.read.call_one(buf) == [7, 9]
    await peer.write.call_one(buf)
    assert await peer.read.call_one(buf) == [5]
    await buf.drop()
