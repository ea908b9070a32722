"""``tcp`` transfers whose frames still read memory when it is let go.

A chunk's frame is read from memory after it was sent (written into a peer
of this host by cross-memory attach once the peer asks, or queued): a
registration dropped while its reply is in flight must stay mapped until
the frame is sent, and a write given up, whose caller then frees its
source or changes it, must land the source's bytes as they were (its
frames send copies).  Else the reader got freed memory as the buffer's
bytes, or the copy failed and the whole connection between the two
processes was cut (other calls on it failed as if a process had died) with
the landing memory kept for good, or the owner got bytes its writer put in
the source after the write had returned.  The owner's loop is held on a
FIFO gate so that the requests, the drop and the frames meet in a known
order (no timing)."""

from __future__ import annotations

import asyncio
import gc
import os
from pathlib import Path

import pytest
from supervision_helpers import until

import meshio
import meshio._transport._bulk
import meshio._transport._runtime
from fifo_gate import Gate, hold
from meshio import Actor, RDMABuffer, endpoint
from meshio.rdma import RDMAError
from meshio.rdma._tcp import TCP_CHUNK, TCP_WINDOW

#: guard on a wait that should end long before it (a regression fails, not hangs)
GUARD = 45.0
#: above glibc's largest mmap threshold (32 MiB): freeing it unmaps it
UNMAPPED = 64 << 20

pytestmark = pytest.mark.filterwarnings("ignore::meshio.RDMAFallbackWarning")


def pattern(size: int) -> bytes:
    return bytes(range(251)) * (size // 251) + bytes(size % 251)


class SoleOwner(Actor):
    """Registers memory that only its buffer keeps: a drop frees it."""

    @endpoint
    async def register(self, size: int) -> RDMABuffer:
        self.buf = RDMABuffer(bytearray(pattern(size)), backend="tcp")
        return self.buf

    @endpoint
    async def block(self, ready: str, release: str) -> None:
        hold(ready, release)

    @endpoint
    async def quarantined(self) -> int:
        return len(meshio._transport._bulk._quarantined)

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


class Overwriter(SoleOwner):
    """Keeps the memory it registers, and changes it once dropped."""

    @endpoint
    async def register(self, size: int) -> RDMABuffer:
        self.data = bytearray(pattern(size))
        self.buf = RDMABuffer(self.data, backend="tcp")
        return self.buf

    @endpoint
    async def drop_and_overwrite(self) -> None:
        await self.buf.drop()
        self.data[:] = bytes(len(self.data))


def _requests(buf: RDMABuffer, op: str) -> int:
    """The requests ``op`` on ``buf``'s owner this process has sent and
    waits on."""
    conn = meshio._transport._runtime.runtime().connect(buf.handle.owner)
    return sum(p.endpoint == f"RDMA {op}" for p in conn.pending.values())


@pytest.mark.parametrize("size", [TCP_CHUNK, UNMAPPED], ids=["one-chunk", "unmapped"])
async def test_drop_while_a_read_is_in_flight(procs: meshio.ProcMesh, tmp_path: Path,
                                              size: int) -> None:
    """The owner serves the read's chunks, then the drop, before any frame
    reached the reader: the chunks served read the bytes the buffer held,
    the chunks after the drop fail "dropped", and the connection stays up."""
    owner = await procs.slice(procs=0).spawn("owner", SoleOwner)
    buf = await owner.register.call_one(size)
    assert buf.backend == "tcp"
    kept = len(meshio._transport._bulk._quarantined)
    gate = Gate(tmp_path)
    blocked = asyncio.ensure_future(owner.block.call_one(gate.ready, gate.release))
    reading: asyncio.Future[int] | None = None
    try:
        await gate.wait_held(GUARD)
        dst = bytearray(size)
        reading = asyncio.ensure_future(buf.read_into(dst))
        # the chunks' requests, then the drop, are on the connection in that
        # order, ahead of anything the reader sends once the replies come
        in_flight = min(TCP_WINDOW, size // TCP_CHUNK)
        await until(lambda: _requests(buf, "read") == in_flight, GUARD)
        dropping = asyncio.ensure_future(buf.drop())
        await until(lambda: _requests(buf, "drop") == 1, GUARD)
        later = asyncio.ensure_future(owner.pid.call_one())  # in flight across it all
    finally:
        await gate.open()
    await asyncio.wait_for(blocked, GUARD)
    await asyncio.wait_for(dropping, GUARD)
    if size > TCP_WINDOW * TCP_CHUNK:  # chunks asked for after the drop
        with pytest.raises(RDMAError, match="dropped"):
            await asyncio.wait_for(reading, GUARD)
    else:  # every chunk served before the drop: the buffer's bytes, none other
        assert await asyncio.wait_for(reading, GUARD) == size
        assert dst == pattern(size)
    assert await asyncio.wait_for(later, GUARD) > 0  # the connection stayed up
    with pytest.raises(RDMAError, match="dropped"):
        await asyncio.wait_for(buf.read_into(bytearray(8), length=8), GUARD)
    assert len(meshio._transport._bulk._quarantined) == kept


@pytest.mark.parametrize(("how", "then"), [("timeout", "freed"), ("timeout", "overwritten"),
                                          ("cancel", "overwritten")])
async def test_a_write_given_up_lands_its_source_as_it_was(procs: meshio.ProcMesh,
                                                           tmp_path: Path, how: str,
                                                           then: str) -> None:
    """A write given up (timed out, or cancelled) with its chunks' frames
    still to be sent, whose caller then frees its source or writes other
    bytes into it (as a learner reuses a tensor): the owner, resuming, gets
    the source's bytes as they were while the write ran (the request "may
    still take effect", as documented) — not the bytes written into it
    after the write returned, nor a failed copy that cuts the connection."""
    owner = await procs.slice(procs=0).spawn("owner", SoleOwner)
    buf = await owner.register.call_one(UNMAPPED)
    gate = Gate(tmp_path)
    blocked = asyncio.ensure_future(owner.block.call_one(gate.ready, gate.release))
    try:
        await gate.wait_held(GUARD)
        src = bytearray(b"\xa5") * UNMAPPED
        if how == "timeout":
            with pytest.raises(meshio.CallTimeout):
                await buf.options(timeout=0.5).write_from(src)
        else:
            writing = asyncio.ensure_future(buf.write_from(src))
            await until(lambda: _requests(buf, "write") == TCP_WINDOW, GUARD)
            writing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(writing, GUARD)
        if then == "overwritten":
            src[:] = b"\x5a" * UNMAPPED
        else:
            del src
            gc.collect()  # (the timeout's traceback held it too)
        later = asyncio.ensure_future(owner.pid.call_one())
    finally:
        await gate.open()
    await asyncio.wait_for(blocked, GUARD)  # the connection stayed up
    assert await asyncio.wait_for(later, GUARD) > 0
    # the chunks sent before it was given up landed, from the source's bytes then
    sent = TCP_WINDOW * TCP_CHUNK
    dst = bytearray(UNMAPPED)
    await asyncio.wait_for(buf.read_into(dst), GUARD)
    assert dst[:sent] == b"\xa5" * sent
    assert dst[sent:] == pattern(UNMAPPED)[sent:]
    assert await owner.quarantined.call_one() == 0


async def test_a_drop_returns_once_the_reads_served_before_are_done(
        procs: meshio.ProcMesh, tmp_path: Path) -> None:
    """The owner serves a read, then drops the buffer and at once changes
    its memory in place (as a learner reuses a tensor): the drop returns
    only once the read's frame no longer reads that memory, so the reader
    gets the bytes the buffer held when it served the read, not the new
    ones (the frame is read from the owner's memory after it is sent)."""
    owner = await procs.slice(procs=0).spawn("overwriter", Overwriter)
    buf = await owner.register.call_one(TCP_CHUNK)
    gate = Gate(tmp_path)
    blocked = asyncio.ensure_future(owner.block.call_one(gate.ready, gate.release))
    try:
        await gate.wait_held(GUARD)
        dst = bytearray(TCP_CHUNK)
        reading = asyncio.ensure_future(buf.read_into(dst))
        await until(lambda: _requests(buf, "read") == 1, GUARD)
        overwriting = asyncio.ensure_future(owner.drop_and_overwrite.call_one())
    finally:
        await gate.open()
    await asyncio.wait_for(blocked, GUARD)
    await asyncio.wait_for(overwriting, GUARD)
    assert await asyncio.wait_for(reading, GUARD) == TCP_CHUNK
    assert dst == pattern(TCP_CHUNK)
    with pytest.raises(RDMAError, match="dropped"):
        await asyncio.wait_for(buf.read_into(bytearray(8), length=8), GUARD)
