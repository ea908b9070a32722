"""The actors of the RDMA suite, in a module of their own: the worker
processes import it to build them, so it imports nothing heavy (torch
stays out: under the emulated soft-RoCE VM its import alone takes a
minute)."""

from __future__ import annotations

import os

from fifo_gate import hold
from meshio import Actor, RDMABuffer, endpoint

N = 1 << 20


class Owner(Actor):
    def __init__(self) -> None:
        self.data = bytearray(os.urandom(N))

    @endpoint
    async def register(self, backend: str) -> RDMABuffer:
        self.buf = RDMABuffer(self.data, backend=backend)
        return self.buf

    @endpoint
    async def content(self, offset: int, length: int) -> bytes:
        return bytes(self.data[offset:offset + length])

    @endpoint
    async def block(self, ready: str, release: str) -> None:
        """Block this process's event loop (see fifo_gate): an ``async def``,
        since a plain ``def`` endpoint would run in the actor's thread."""
        hold(ready, release)

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


class Peer(Actor):
    @endpoint
    async def read(self, buf: RDMABuffer, offset: int, length: int) -> bytes:
        dst = bytearray(length)
        assert await buf.read_into(dst, offset=offset, length=length) == length
        return bytes(dst)

    @endpoint
    async def write(self, buf: RDMABuffer, data: bytes, offset: int) -> int:
        return await buf.write_from(data, offset=offset)

    @endpoint
    async def backend(self, buf: RDMABuffer) -> str:
        return buf.backend

    @endpoint
    async def drop(self, buf: RDMABuffer) -> None:
        await buf.drop()
