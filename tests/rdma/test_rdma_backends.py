"""The RDMA suite, run on every backend this process has (same_host and tcp
here; ibverbs too inside the soft-RoCE VM)."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import threading
import time
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import meshio
import meshio._transport._runtime
from fifo_gate import Gate
from gone import killed
from meshio import RDMABuffer
from meshio.rdma import (
    Backend,
    RDMAError,
    RDMAFallbackWarning,
    RDMASizeError,
    _same_host,
    available_backends,
)
from rdma_actors import N, Owner, Peer
from test_docs import run_page

GUARD = 60


pytestmark = pytest.mark.filterwarnings("ignore::meshio.RDMAFallbackWarning")


async def test_read_and_write_with_offsets(pair: tuple[Owner, Peer], backend: str) -> None:
    owner, peer = pair
    buf = await owner.register.call_one(backend)
    assert await peer.backend.call_one(buf) == backend
    assert buf.size == N
    for offset, length in [(0, N), (1, 4095), (N - 7, 7), (12345, 65536)]:
        got = await asyncio.wait_for(peer.read.call_one(buf, offset, length), GUARD)
        assert got == await owner.content.call_one(offset, length)
    patch = os.urandom(70001)
    assert await peer.write.call_one(buf, patch, 333) == len(patch)
    assert await owner.content.call_one(333, len(patch)) == patch
    assert await owner.content.call_one(0, 333) != patch[:333]  # nothing else moved


async def test_size_errors(pair: tuple[Owner, Peer], backend: str) -> None:
    owner, _ = pair
    buf = await owner.register.call_one(backend)
    with pytest.raises(RDMASizeError, match="exceeds"):
        await buf.read_into(bytearray(16), offset=N - 8, length=16)
    with pytest.raises(RDMASizeError, match="destination holds 16 bytes"):
        await buf.read_into(bytearray(16), length=32)
    with pytest.raises(RDMASizeError, match="exceeds"):
        await buf.write_from(b"x" * 10, offset=N - 5)
    with pytest.raises(RDMAError, match="read-only"):
        await buf.read_into(b"immutable")
    # a bool is no offset or length (True was taken for 1: a shifted transfer)
    integer = "must be an integer (an int, a NumPy or torch integer, not a bool)"
    for call, message in (
            (buf.read_into(bytearray(8), offset=True), f"read_into: offset {integer}, got "
                                                       "True (bool)"),
            (buf.read_into(bytearray(8), length=True), f"read_into: length {integer} or "
                                                       "None, got True (bool)"),
            (buf.write_from(b"zz", offset=False), f"write_from: offset {integer}, got "
                                                  "False (bool)"),
            (buf.read_into(bytearray(8), offset=1.0), f"read_into: offset {integer}, got "  # type: ignore[arg-type]
                                                      "1.0 (float)")):
        with pytest.raises(TypeError) as info:
            await call
        assert str(info.value) == message


async def test_drop_then_use_is_a_clear_error(pair: tuple[Owner, Peer], backend: str) -> None:
    owner, peer = pair
    buf = await owner.register.call_one(backend)
    assert len(await peer.read.call_one(buf, 0, 10)) == 10
    await peer.drop.call_one(buf)  # dropped from a holder: released in the owner
    with pytest.raises(meshio.ActorError) as err:
        await peer.read.call_one(buf, 0, 10)
    assert err.value.remote_type.endswith("RDMAError")
    assert "dropped" in err.value.remote_message
    with pytest.raises(RDMAError, match="dropped"):
        await buf.read_into(bytearray(10), length=10)
    # nothing to copy, still a transfer on a dropped buffer (it returned 0)
    for edge in ({"length": 0}, {"offset": N}, {"offset": N, "length": 0}):
        with pytest.raises(RDMAError, match="dropped"):
            await buf.read_into(bytearray(1), **edge)
    await buf.drop()  # idempotent
    # its token cell, reused by a new registration, still says "dropped" to it
    newer = await owner.register.call_one(backend)
    assert newer.handle.token_addr == buf.handle.token_addr
    with pytest.raises(RDMAError, match="dropped"):
        await buf.read_into(bytearray(10), length=10)
    assert await peer.read.call_one(newer, 0, 10) == await owner.content.call_one(0, 10)


def token_cells() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is ctypes.c_uint64)


async def test_dropped_registrations_leave_a_bounded_number_of_token_cells() -> None:
    """Each registration left its token cell behind forever (a weight store
    publishing at 10 Hz grew by ~200 MB a day); released cells are reused."""
    data = bytearray(4096)
    for _ in range(20):
        await RDMABuffer(data).drop()
    before = token_cells()
    for _ in range(500):
        await RDMABuffer(data).drop()
    assert token_cells() - before <= 2


async def test_dead_owner_fails_promptly(pair: tuple[Owner, Peer], backend: str) -> None:
    owner, peer = pair
    buf = await owner.register.call_one(backend)
    pid = await owner.pid.call_one()
    await killed(pid, GUARD)
    with pytest.raises(meshio.ActorError) as err:
        await asyncio.wait_for(peer.read.call_one(buf, 0, 10), GUARD)
    assert err.value.remote_type.endswith("RDMAError")
    with pytest.raises(RDMAError):  # 0 bytes to copy from it, all the same (it returned 0)
        await asyncio.wait_for(buf.read_into(bytearray(1), length=0), GUARD)


async def test_one_sided_owner_loop_blocked(pair: tuple[Owner, Peer], backend: str,
                                            tmp_path: os.PathLike[str]) -> None:
    if backend == "tcp":
        pytest.skip("the tcp fallback is served by the owner's loop: not one-sided")
    owner, peer = pair
    buf = await owner.register.call_one(backend)
    assert len(await peer.read.call_one(buf, 0, 8)) == 8  # connection set up once
    blocked, release = await _block(owner, tmp_path)
    # The owner is stuck in a blocking open(): its loop cannot run.
    got = await asyncio.wait_for(peer.read.call_one(buf, 100, 4096), GUARD)
    assert not blocked.done()
    await release()
    await asyncio.wait_for(blocked, GUARD)
    assert got == await owner.content.call_one(100, 4096)


async def test_bad_objects_are_refused() -> None:
    with pytest.raises(RDMASizeError, match="empty"):
        RDMABuffer(bytearray())
    with pytest.raises(RDMAError, match="read-only"):
        RDMABuffer(b"bytes are immutable")
    with pytest.raises(TypeError, match=r"expected a CPU torch\.Tensor"):
        RDMABuffer(object())
    with pytest.raises(ValueError, match="backend must be one of"):
        RDMABuffer(bytearray(8), backend="carrier-pigeon")


async def test_backend_names_and_local_buffer() -> None:
    have = available_backends()
    assert have[-1] == "tcp" and "same_host" in have
    data = bytearray(range(256)) * 4
    buf = RDMABuffer(data)
    assert buf.backend == "same_host"
    assert meshio.rdma.backend_for(buf.handle) == "same_host"
    dst = bytearray(10)
    await buf.read_into(dst, offset=256, length=10)
    assert dst == data[256:266]
    await buf.drop()
    with pytest.raises(RDMAError, match="dropped"):
        await buf.read_into(dst, length=10)


async def test_tcp_fallback_warns_once(pair: tuple[Owner, Peer]) -> None:
    owner, _ = pair
    buf = await owner.register.call_one("tcp")
    import meshio.rdma._tcp as tcp

    tcp._warned = False
    with pytest.warns(RDMAFallbackWarning):
        await buf.read_into(bytearray(8), length=8)
    with _no_warning():
        await buf.read_into(bytearray(8), length=8)


async def test_tcp_fallback_warning_names_the_line_that_transferred(
        pair: tuple[Owner, Peer]) -> None:
    """The warning is attributed to the user's line (here), not to meshio's
    (it named ``_buffer.py``): ``filterwarnings(module=...)`` matches it."""
    owner, _ = pair
    buf = await owner.register.call_one("tcp")
    import meshio.rdma._tcp as tcp

    for transfer in (lambda: buf.read_into(bytearray(8), length=8),
                     lambda: buf.options(timeout=GUARD).read_into(bytearray(8), length=0),
                     lambda: buf.write_from(b"x", offset=3)):
        tcp._warned = False
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            await transfer()
        [warning] = [w for w in caught if issubclass(w.category, RDMAFallbackWarning)]
        assert warning.filename == __file__, warning


class _no_warning:
    def __enter__(self) -> None:
        self._cm = warnings.catch_warnings(record=True)
        self.caught = self._cm.__enter__()
        warnings.simplefilter("always")

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(*exc)
        assert not [w for w in self.caught if issubclass(w.category, RDMAFallbackWarning)]


async def test_timeout_option(pair: tuple[Owner, Peer], tmp_path: os.PathLike[str]) -> None:
    owner, _ = pair
    buf = (await owner.register.call_one("tcp")).options(timeout=0.5)
    blocked, release = await _block(owner, tmp_path)  # tcp needs the owner's loop
    t0 = time.monotonic()
    with pytest.raises(meshio.CallTimeout, match=r"longer than 0\.5s"):
        await buf.read_into(bytearray(8), length=8)
    assert time.monotonic() - t0 < GUARD
    await release()
    await asyncio.wait_for(blocked, GUARD)


async def _block(owner: Owner, tmp: os.PathLike[str]) -> tuple[
        asyncio.Future[None], Callable[[], Awaitable[None]]]:
    """Block the owner's event loop; returns its pending call and a release."""
    gate = Gate(tmp)
    blocked = owner.block.call_one(gate.ready, gate.release)
    await gate.wait_held(GUARD)  # the owner is inside its blocking endpoint now
    return blocked, gate.open


async def test_owner_killed_during_tcp_transfer_fails_promptly(
        pair: tuple[Owner, Peer], tmp_path: os.PathLike[str]) -> None:
    """The tcp backend needs the owner's loop: block it, start a read, kill the
    owner while the read is in flight; the read fails with RDMAError."""
    owner, _ = pair
    buf = await owner.register.call_one("tcp")
    pid = await owner.pid.call_one()
    blocked, _release = await _block(owner, tmp_path)
    transfer = asyncio.ensure_future(buf.read_into(bytearray(N)))
    conn = meshio._transport._runtime.runtime().conns[buf.handle.owner]

    async def in_flight() -> None:  # yield to the loop until the read's requests are out
        while not any(p.endpoint == "RDMA read" for p in conn.pending.values()):
            await asyncio.sleep(0)

    await asyncio.wait_for(in_flight(), GUARD)
    await killed(pid, GUARD)
    with pytest.raises(RDMAError, match="unreachable"):
        await asyncio.wait_for(transfer, GUARD)
    with pytest.raises(meshio.SupervisionError):
        await blocked


async def test_numpy_array_registers_and_receives() -> None:
    np = pytest.importorskip("numpy")
    src = np.arange(1000, dtype=np.int64)
    buf = RDMABuffer(src)
    assert buf.size == src.nbytes
    dst = np.zeros(500, dtype=np.int64)
    await buf.read_into(dst, offset=500 * 8)
    assert (dst == np.arange(500, 1000)).all()
    await buf.write_from(np.full(10, -1, dtype=np.int64), offset=0)
    assert (src[:10] == -1).all() and src[10] == 10
    await buf.drop()


async def test_numpy_integers_are_offsets_and_lengths() -> None:
    """An offset or a length computed with NumPy is taken, as by slicing
    (``operator.index``); a NumPy bool is not."""
    np = pytest.importorskip("numpy")
    data = bytearray(range(64))
    buf = RDMABuffer(data)
    dst = bytearray(8)
    assert await buf.read_into(dst, offset=np.int64(8), length=np.uint8(4)) == 4
    assert dst[:4] == data[8:12]
    assert await buf.write_from(b"ab", offset=np.int32(62)) == 2
    assert data[62:] == b"ab"
    with pytest.raises(TypeError, match=r"offset must be an integer .*got np\.True_"):
        await buf.read_into(dst, offset=np.True_)
    await buf.drop()


async def test_the_opening_example_of_the_rdma_page_runs(tmp_path: Path) -> None:
    """``docs/rdma.md`` opens with a block meant to run as copied (it used an
    attribute never set, and names it never imported); it runs, printing
    what the page shows.  (That page's blocks are not among the pages
    ``test_docs.py`` runs, only compiles.)"""
    page = Path(__file__).resolve().parents[2] / "docs" / "rdma.md"
    [block], [printed] = await asyncio.to_thread(run_page, page, tmp_path)
    assert block.output is not None and printed == block.output


async def test_stopping_the_owning_actor_releases_its_buffers(
        pair: tuple[Owner, Peer], backend: str) -> None:
    owner, peer = pair
    buf = await owner.register.call_one(backend)
    assert len(await peer.read.call_one(buf, 0, 16)) == 16
    await owner.stop()  # the actor goes; its process stays up
    with pytest.raises(meshio.ActorError) as err:
        await asyncio.wait_for(peer.read.call_one(buf, 0, 16), GUARD)
    assert err.value.remote_type.endswith("RDMAError")
    assert "dropped" in err.value.remote_message


async def test_closing_the_runtime_releases_the_buffers_registered_in_it(
        backend: Backend) -> None:
    """Closing the runtime (as the end of ``meshio.run`` does) releases the
    buffers registered in it (ibverbs: their memory regions, the runtime's
    queue pairs and the device, which the leak check sees closed): the token
    word that same-host readers check says "dropped"."""
    buf = RDMABuffer(bytearray(os.urandom(64)), backend=backend)
    await asyncio.wait_for(buf.read_into(bytearray(8), length=8), GUARD)  # to itself
    token = ctypes.c_uint64.from_address(buf.handle.token_addr)
    assert token.value == buf.handle.token
    meshio._transport._runtime.close_runtime()
    assert token.value == 0


@pytest.mark.skipif("same_host" not in available_backends(), reason="no same_host backend here")
@pytest.mark.parametrize("op", ["read", "write"])
async def test_a_cancelled_transfer_returns_once_its_copy_threads_are_done(
        pair: tuple[Owner, Peer], monkeypatch: pytest.MonkeyPatch, op: str) -> None:
    """A large ``same_host`` transfer copies in threads, which a
    cancellation cannot stop: ``read_into`` or ``write_from`` cancelled
    meanwhile raises only once they are done, so that memory the caller
    frees or reuses after it is never written (a read's destination; before,
    a read raised at once while the threads wrote on) nor read (a write's
    source: bytes put there since never reach the owner).  The copy is held
    by a gate around the real one, in this process."""
    owner, _ = pair
    buf = await asyncio.wait_for(owner.register.call_one("same_host"), GUARD)
    entered, release = threading.Event(), threading.Event()
    copies: list[int] = []
    real = _same_host._cma

    def held(op: Any, h: Any, local: int, remote: int, n: int) -> None:
        if n < 4096:  # (the buffer token's check, on the loop)
            real(op, h, local, remote, n)
            return
        entered.set()  # a data copy, in a copy thread
        release.wait(GUARD)
        real(op, h, local, remote, n)
        copies.append(n)

    monkeypatch.setattr(_same_host, "_cma", held)
    local = bytearray(N) if op == "read" else bytearray(os.urandom(N))
    source = bytes(local)
    moving = asyncio.ensure_future(buf.read_into(local) if op == "read"
                                   else buf.write_from(local))
    assert await asyncio.to_thread(entered.wait, GUARD)  # a copy thread is in it
    moving.cancel()
    for _ in range(3):  # (turns of the loop: the cancellation is delivered)
        await asyncio.sleep(0)
    assert not moving.done()  # it waits for the copy
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(moving, GUARD)
    assert sum(copies) == N  # every byte copied before it gave up
    content = await asyncio.wait_for(owner.content.call_one(0, N), GUARD)
    if op == "read":
        assert bytes(local) == content
    else:
        local[:] = bytes(N)  # the source reused: nothing reads it any more
        assert await asyncio.wait_for(owner.content.call_one(0, N), GUARD) == content == source
