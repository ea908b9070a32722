"""``drop()`` against ``same_host`` transfers in flight.

A ``same_host`` transfer runs none of the owner's code: it checks the
buffer's token word in the owner's memory, then copies by cross-memory
attach.  A drop that returned while such a transfer, past its check, still
copied let it write into memory the owner had since changed, freed or given
to new objects, or read it (a read that *succeeded* returned the owner's
new bytes).  Now ``drop()`` returns only once every transfer that found the
buffer registered is done; one that starts after finds it dropped.  A
reader's copy is held by a FIFO gate (no timing) to meet the drop."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from supervision_helpers import until

import meshio
import meshio._transport._tasks as _tasks
from fifo_gate import Gate, hold
from gone import killed
from log_watch import LogWatch
from meshio import Actor, RDMABuffer, endpoint
from meshio.rdma import RDMAError, _same_host, available_backends
from meshio.testing import open_fds

#: guard on a wait that should end long before it (a regression fails, not hangs)
GUARD = 45.0
#: what the buffer holds, what a writer writes, what the owner puts in its
#: memory (or in new objects) once drop() returned
HELD, WRITTEN, REUSED = 0x11, 0xAB, 0x22
#: copied in one syscall on the loop, and in the copy threads (two halves)
SIZES = [256 << 10, 16 << 20]
SIZE_IDS = ["single-syscall", "threads"]

pytestmark = pytest.mark.skipif("same_host" not in available_backends(),
                                reason="no same_host backend here")


class Reusing(Actor):
    """Registers memory, drops it, then reuses it or frees it for new objects."""

    @endpoint
    async def register(self, size: int) -> RDMABuffer:
        self.data = bytearray([HELD]) * size
        self.buf = RDMABuffer(self.data, backend="same_host")
        return self.buf

    @endpoint
    async def drop_then_reuse(self) -> bool:
        """Start a drop that, once returned, fills the memory with REUSED
        (as a learner reuses a tensor); whether it returned within a few
        turns of this loop."""

        async def drop_and_reuse() -> None:
            await self.buf.drop()
            self.data[:] = bytes([REUSED]) * len(self.data)

        self.dropping = asyncio.ensure_future(drop_and_reuse())
        for _ in range(3):
            await asyncio.sleep(0)
        return self.dropping.done()

    @endpoint
    async def reused(self) -> int:
        """Once the drop returned and the memory was filled: its bytes
        that are not REUSED (a transfer reached it after)."""
        await self.dropping
        return len(self.data) - self.data.count(REUSED)

    @endpoint
    async def drop_then_free(self) -> None:
        """Drop, free the memory and make new objects of its size (filled
        with REUSED): the allocator often puts one where it was."""
        size = len(self.data)
        await self.buf.drop()
        del self.data
        self.fresh = [bytearray([REUSED]) * size for _ in range(3)]

    @endpoint
    async def foreign(self) -> int:
        """Bytes of the new objects that are not REUSED."""
        return sum(len(f) - f.count(REUSED) for f in self.fresh)

    @endpoint
    async def fds(self) -> int:
        return len(open_fds())


class HeldReader(Actor):
    """A holder whose first copy is held by a gate, past the token check."""

    @endpoint
    async def transfer(self, buf: RDMABuffer, op: str, ready: str, release: str) -> int:
        """``op`` on all of ``buf``, its first data copy held until the gate
        opens (``hold``: blocks this loop, or a copy thread); a read: the
        bytes it got that are not HELD."""
        real = _same_host._cma
        first = threading.Lock()

        def held(*args: Any) -> None:
            if first.acquire(blocking=False):
                hold(ready, release)
            real(*args)

        _same_host._cma = held
        try:
            if op == "write":
                return await buf.write_from(bytes([WRITTEN]) * buf.size)
            dst = bytearray(buf.size)
            await buf.read_into(dst)
            return len(dst) - dst.count(HELD)
        finally:
            _same_host._cma = real

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
@pytest.mark.parametrize("op", ["read", "write"])
async def test_drop_waits_for_a_transfer_past_its_check(procs: meshio.ProcMesh,
                                                        tmp_path: Path, op: str,
                                                        size: int) -> None:
    """A transfer has checked the token and is about to copy when the owner
    drops the buffer, then fills the memory with other bytes: ``drop()``
    returns only once the copy is done, so a read gets the buffer's bytes
    and a write lands before the owner's new bytes, never over them."""
    owner = await procs.slice(procs=0).spawn("owner", Reusing)
    reader = await procs.slice(procs=1).spawn("reader", HeldReader)
    buf = await owner.register.call_one(size)
    gate = Gate(tmp_path)
    moving = asyncio.ensure_future(reader.transfer.call_one(buf, op, gate.ready, gate.release))
    try:
        await gate.wait_held(GUARD)
        returned = await asyncio.wait_for(owner.drop_then_reuse.call_one(), GUARD)
    finally:
        await gate.open()
    assert not returned  # it waits for the copy the gate holds
    got = await asyncio.wait_for(moving, GUARD)
    assert got == (size if op == "write" else 0)  # a read: the buffer's bytes, all of them
    assert await asyncio.wait_for(owner.reused.call_one(), GUARD) == 0
    with pytest.raises(RDMAError, match="dropped"):
        await asyncio.wait_for(buf.read_into(bytearray(8), length=8), GUARD)


async def _race(owner: Reusing, op: str, size: int) -> tuple[int, int]:
    """One round of the race below: the reads that succeeded with other
    bytes than the buffer's, and the bytes written found in the owner's new
    objects."""
    buf = await asyncio.wait_for(owner.register.call_one(size), GUARD)
    local = bytearray(size) if op == "read" else bytearray([WRITTEN]) * size
    done, wrong = 0, 0

    async def hammer() -> None:
        nonlocal done, wrong
        while True:
            try:
                if op == "read":
                    await buf.read_into(local)
                else:
                    await buf.write_from(local)
            except RDMAError as e:
                assert "dropped" in str(e)
                return
            done += 1
            wrong += op == "read" and local.count(HELD) != size
            await asyncio.sleep(0)  # (a small transfer never yields to the loop)

    hammering = asyncio.ensure_future(hammer())
    await until(lambda: done > 0 or hammering.done(), GUARD)
    await asyncio.wait_for(owner.drop_then_free.call_one(), GUARD)
    await asyncio.wait_for(hammering, GUARD)
    return wrong, await asyncio.wait_for(owner.foreign.call_one(), GUARD)


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
@pytest.mark.parametrize("op", ["read", "write"])
async def test_transfers_racing_drop_never_reach_reused_memory(procs: meshio.ProcMesh, op: str,
                                                               size: int) -> None:
    """The auditor's race: this process reads or writes the buffer in a
    loop while its owner drops it, frees its memory and makes new objects
    of its size.  No byte written ever lands in them, and every read that
    succeeds returned the buffer's bytes; each loop ends with "dropped"."""
    owner = await procs.slice(procs=0).spawn("owner", Reusing)
    for _ in range(10):
        assert await _race(owner, op, size) == (0, 0)


async def test_a_reader_killed_mid_copy_does_not_hold_the_drop(procs: meshio.ProcMesh,
                                                               tmp_path: Path) -> None:
    """A reader killed (SIGKILL) while its copy is held: its process's
    lock on the buffer went with it, so the owner's drop returns at once."""
    owner = await procs.slice(procs=0).spawn("owner", Reusing)
    reader = await procs.slice(procs=1).spawn("reader", HeldReader)
    pid = await reader.pid.call_one()
    buf = await owner.register.call_one(SIZES[0])
    gate = Gate(tmp_path)
    moving = asyncio.ensure_future(reader.transfer.call_one(buf, "read", gate.ready,
                                                            gate.release))
    await gate.wait_held(GUARD)
    await killed(pid, GUARD)
    assert await asyncio.wait_for(owner.drop_then_reuse.call_one(), GUARD)  # returned at once
    assert await asyncio.wait_for(owner.reused.call_one(), GUARD) == 0
    with pytest.raises(meshio.SupervisionError):
        await asyncio.wait_for(moving, GUARD)


async def test_a_reader_that_never_ends_holds_the_drop_a_bounded_time(
        procs: meshio.ProcMesh, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        controller_log: LogWatch) -> None:
    """A reader whose copy does not end (stopped, here held by the gate):
    the drop, here in this process, gives up waiting after the bound
    (``LEND_TIMEOUT``, 10 s; shortened here) with a warning saying so, as
    for the ``tcp`` reads it served before."""
    monkeypatch.setattr(_tasks, "LEND_TIMEOUT", 0.2)
    reader = await procs.slice(procs=1).spawn("reader", HeldReader)
    data = bytearray([HELD]) * SIZES[0]
    buf = RDMABuffer(data, backend="same_host")
    gate = Gate(tmp_path)
    moving = asyncio.ensure_future(reader.transfer.call_one(buf, "read", gate.ready,
                                                            gate.release))
    try:
        await gate.wait_held(GUARD)
        await asyncio.wait_for(buf.drop(), GUARD)
        warned = await controller_log.wait_for("a dropped RDMA buffer is released")
    finally:
        await gate.open()
    assert "1 transfers begun before the drop still reach its memory" in warned
    assert await asyncio.wait_for(moving, GUARD) == 0  # (the buffer's bytes: nothing changed them)


async def test_many_buffers_leave_no_fd_behind(procs: meshio.ProcMesh) -> None:
    """Hundreds of buffers of one owner, read and written from here, then
    dropped: neither process holds more file descriptors after."""
    owner = await procs.slice(procs=0).spawn("owner", Reusing)
    mine, theirs = len(open_fds()), await owner.fds.call_one()
    for _ in range(300):
        buf = await owner.register.call_one(4096)
        dst = bytearray(4096)
        await buf.read_into(dst)
        await buf.write_from(dst)
        await buf.drop()
    assert len(open_fds()) <= mine + 1  # (one: the owner's fence, kept while it lives)
    assert await owner.fds.call_one() <= theirs + 1  # (one: its fence)


async def test_the_fences_of_owners_gone_are_closed() -> None:
    """A reader keeps each owner's fence open (opened once per owner), and
    closes those of owners gone when it opens another: reading from one
    owner after another leaves one open, not one per owner."""
    for _ in range(3):
        async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
            owner = await procs.spawn("owner", Reusing)
            buf = await owner.register.call_one(4096)
            await buf.read_into(bytearray(4096))
    fences = [what for what in open_fds().values() if what.startswith("/memfd:")]
    assert len(fences) == 1, fences  # the last owner's (not closed until another opens)
