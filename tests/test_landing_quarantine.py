"""Memory a peer of this host was asked to write a large value into
(``Fill``) is never reused while that peer may still be writing: its copy
threads go on after the connection ends, so the receiver keeps the memory
until the peer exits (:func:`meshio._transport._bulk.quarantine`)."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import weakref
from collections.abc import Generator

import pytest

from meshio._transport import _bulk
from meshio._transport._bulk import Exports, address_of, quarantine
from meshio._transport._pool import THRESHOLD, pool_view
from test_wire_fuzz import FakeRuntime, connect, described_call, fills

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
    rt = FakeRuntime()
    rt.loop = asyncio.get_running_loop()  # type: ignore[assignment]  # (the pidfd is watched)
    conn, transport = connect(rt)
    conn.bulk = Exports(peer.pid)
    data = described_call(1, 7)
    if end != "connection lost":
        data += described_call(2, 8)  # (large parts before export 7's: dropped)
    conn.get_buffer(-1)[:len(data)] = data
    conn.buffer_updated(len(data))
    assert transport.closing == (end != "connection lost")
    assert [f.export for f in fills(transport)] == [7] and len(landed) == 1
    if transport.closing:  # aborted: its connection_lost is queued, then this turn's end
        turn = rt.loop.create_future()
        rt.loop.call_soon(turn.set_result, None)
        await turn
    else:
        conn.connection_lost(None)
    gc.collect()
    assert rt.got == [] and not landed[0].is_set()
    peer.kill()
    await asyncio.wait_for(landed[0].wait(), DEADLINE)

