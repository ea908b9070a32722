"""Memory a peer of this host was asked to write a large value into
(``Fill``) is never reused while that peer may still be writing: its copy
threads go on after the connection ends, so the receiver keeps the memory
until the peer exits (:func:`meshio._transport._bulk.quarantine`)."""

from __future__ import annotations

import asyncio
import gc
import struct
import subprocess
import sys
import weakref
from collections.abc import Callable, Generator
from typing import Any

import msgspec
import pytest

from meshio._transport import _bulk
from meshio._transport import _messages as M
from meshio._transport._bulk import THRESHOLD, Exports, address_of, pool_view, quarantine
from meshio._transport._connection import Connection
from meshio._transport._frames import frame_header
from meshio._transport._serial import KIND_BUFFER, KIND_BYTEARRAY

#: generous bound on any single wait: a regression fails instead of hanging
DEADLINE = 30.0


class Landing(bytearray):
    """Landing memory a test can watch (a weak reference)."""


@pytest.fixture
def peer() -> Generator[subprocess.Popen[bytes]]:
    """A live process of this host, which exits once killed."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    yield proc
    proc.kill()
    proc.wait()
    assert proc.stdin is not None
    proc.stdin.close()


def watch(memory: object) -> asyncio.Event:
    """An event set once ``memory`` is freed."""
    freed = asyncio.Event()
    weakref.finalize(memory, freed.set)
    return freed


async def test_memory_is_kept_until_the_peer_exits(peer: subprocess.Popen[bytes]) -> None:
    """Quarantined memory, a block of the pool or an object of its own,
    outlives every other reference while the peer lives (a pool block is
    not lent again), and is freed once the peer exits."""
    loop = asyncio.get_running_loop()
    block, own = pool_view(THRESHOLD), Landing(THRESHOLD)
    at = address_of(block)
    freed = [watch(block), watch(own)]
    quarantine(loop, peer.pid, [b"body", block, own])
    del block, own
    gc.collect()
    assert not any(f.is_set() for f in freed)
    assert address_of(pool_view(THRESHOLD)) != at  # its block is not lent again
    peer.kill()
    await asyncio.wait_for(asyncio.gather(*(f.wait() for f in freed)), DEADLINE)


async def test_memory_of_a_peer_gone_is_freed_at_once(peer: subprocess.Popen[bytes]) -> None:
    """A peer that has exited writes nothing: its memory goes at once."""
    peer.kill()
    peer.wait()
    own = Landing(THRESHOLD)
    freed = watch(own)
    quarantine(asyncio.get_running_loop(), peer.pid, [own])
    del own
    assert freed.is_set()


# ------------------------------------------------ through a connection


class Runtime:
    """What a connection's receiving side uses of its runtime."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.reading = False
        self.batched: list[Connection] = []
        self.admitted: list[Callable[[], None]] = []
        self.got: list[M.Message] = []

    def dispatch(self, conn: Connection, msg: M.Message, bufs: list[Any]) -> None:
        self.got.append(msg)

    def batching(self, conn: Connection) -> None:
        pass

    def _connection_lost(self, conn: Connection, exc: Exception | None) -> None:
        pass


class Transport:
    """Where a connection writes: what it wrote."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:  # (the test ends the connection: connection_lost)
        self.closing = True


def described_call(eid: int) -> bytes:
    """A call whose one buffer (``THRESHOLD`` bytes) its sender writes."""
    body = M.encode_message(M.Call(1, "t", "method", msgspec.Raw(b"\x80")))
    kind = (KIND_BUFFER | _bulk.REMOTE) << 56
    return (frame_header(len(body), [(b"", KIND_BYTEARRAY)])[:8]
            + struct.pack("<Q", kind | 24) + body + struct.pack("<QQQ", eid, THRESHOLD, 0))


@pytest.mark.parametrize("end", ["connection lost", "a frame before Filled"])
async def test_a_connection_ended_mid_fill_keeps_its_landing_memory(
        peer: subprocess.Popen[bytes], end: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame waits for its large part, which the peer (a live process)
    was asked to write: the connection ends (it closed, or broke the
    stream), the frame is never delivered, and the memory lent for the part
    stays out of the pool until the peer exits."""
    landed: list[asyncio.Event] = []

    def lent(n: int, start: int = 0) -> memoryview:
        view = pool_view(n, start)
        landed.append(watch(view))
        return view

    monkeypatch.setattr(_bulk, "pool_view", lent)
    rt = Runtime(asyncio.get_running_loop())
    conn = Connection(rt, None)  # type: ignore[arg-type]
    transport = Transport()
    conn.transport = transport  # type: ignore[assignment]
    conn.bulk = Exports(peer.pid)
    data = described_call(7)
    if end != "connection lost":
        data += described_call(8)  # (large parts before export 7's: dropped)
    conn.get_buffer(-1)[:len(data)] = data
    conn.buffer_updated(len(data))
    assert transport.closing == (end != "connection lost")
    fills = [m for w in transport.written if isinstance(m := M.decode_message(w[8:]), M.Fill)]
    assert [f.export for f in fills] == [7] and len(landed) == 1
    conn.connection_lost(None)
    gc.collect()
    assert rt.got == [] and not landed[0].is_set()
    peer.kill()
    await asyncio.wait_for(landed[0].wait(), DEADLINE)
