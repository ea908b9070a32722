"""Large frames on real TCP connections, plain and under TLS, on both loops
(issue 16, across hosts): a frame with a buffer over the write slice goes
out a slice at a time as the transport drains, so under TLS each slice is
encrypted while the one before is on the wire, and no transport holds a
copy of the whole frame.  Two :class:`Connection` ends on one loop, one
sending replies with buffers, the other receiving them: every byte arrives,
in order, whatever the sizes around the slice boundary and whatever small
frames are sent while large ones still wait.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncGenerator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trustme
import uvloop

from meshio._transport._connection import _SLICE, Connection, Pending
from meshio._transport._messages import Answers, Reply, decode_message
from meshio._transport._runtime import close_runtime, runtime
from meshio._transport._serial import KIND_BYTEARRAY, KIND_BYTES, OutBuffers
from meshio.jobs import TLSConfig

DEADLINE = 30.0
LOOPS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {
    "asyncio": asyncio.run, "uvloop": uvloop.run}


pytestmark = pytest.mark.usefixtures("uvloop_started")


def _tls(tmp_path: Path) -> TLSConfig:
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(tmp_path / "h.pem")
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    return TLSConfig(tmp_path / "h.pem", tmp_path / "h.pem", tmp_path / "ca.pem")


@asynccontextmanager
async def _pair(tls: TLSConfig | None) -> AsyncGenerator[tuple[Connection, Connection]]:
    """``(sender, receiver)``: connections at both ends of one TCP connection
    on loopback (under ``tls`` when given)."""
    loop = asyncio.get_running_loop()
    rt = runtime()
    receiver, sender = Connection(rt, None), Connection(rt, None)
    accepted: asyncio.Future[None] = loop.create_future()

    def accept() -> Connection:
        accepted.set_result(None)
        return receiver

    server = await loop.create_server(accept, "127.0.0.1", 0,
                                      ssl=tls.server_context() if tls else None)
    try:
        port = server.sockets[0].getsockname()[1]
        await asyncio.wait_for(loop.create_connection(
            lambda: sender, "127.0.0.1", port, ssl=tls.client_context() if tls else None,
            server_hostname="127.0.0.1" if tls else None), DEADLINE)
        await asyncio.wait_for(accepted, DEADLINE)
        yield sender, receiver
    finally:
        sender.abort()
        receiver.abort()
        server.close()
        await server.wait_closed()
        close_runtime()


def _expect(receiver: Connection, req: int, arrived: list[int]) -> asyncio.Future[Any]:
    """The buffers of the reply ``req`` that ``receiver`` will get; ``arrived``
    records the order replies come in."""
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    fut.add_done_callback(lambda _: arrived.append(req))
    receiver.pending[req] = Pending(fut, lambda raw, bufs: bufs, "e", "m", None)
    return fut


def _reply(sender: Connection, req: int, out: OutBuffers) -> None:
    sender.send_message(Reply(req, msgspec.Raw(msgspec.msgpack.encode(None))), out)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("secure", [False, True], ids=["tcp", "tls"])
def test_large_frames_arrive_whole_and_in_order(loop: str, secure: bool,
                                                tmp_path: Path) -> None:
    """Buffers of every size around the slice boundary, in one frame and
    across frames, with small frames sent while large ones wait: each
    arrives intact, in the order sent, and the sender's queue empties."""
    sizes = [_SLICE - 1, _SLICE, _SLICE + 1, 3 * _SLICE + 7, 1]
    big = [os.urandom(n) for n in sizes]
    tls = _tls(tmp_path) if secure else None

    async def main() -> None:
        async with _pair(tls) as (sender, receiver):
            arrived: list[int] = []
            futs = [_expect(receiver, req, arrived) for req in range(1, 6)]
            _reply(sender, 1, [(b, KIND_BYTES) for b in big])  # one frame, all sizes
            _reply(sender, 2, [])  # small, behind the queued slices
            _reply(sender, 3, [(bytearray(big[3]), KIND_BYTEARRAY)])
            _reply(sender, 4, [(memoryview(big[0])[7:], KIND_BYTES)])  # a view, offset
            _reply(sender, 5, [(b"x", KIND_BYTES)])
            got = await asyncio.wait_for(asyncio.gather(*futs), DEADLINE)
            assert [bytes(b) for b in got[0]] == big
            assert got[1] == []
            assert bytes(got[2][0]) == big[3] and type(got[2][0]) is bytearray
            assert got[3] == [big[0][7:]] and got[4] == [b"x"]
            assert arrived == [1, 2, 3, 4, 5]
            assert not sender.sending
            assert sender.transport is not None
            ssl_object = sender.transport.get_extra_info("ssl_object")
            assert isinstance(ssl_object, ssl.SSLObject) if secure else ssl_object is None

    LOOPS[loop](main())


@pytest.mark.parametrize("loop", LOOPS)
def test_replies_made_in_one_turn_arrive_in_order_merged(
        loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """100 replies made in one turn of the loop (as an actor answering a
    burst of calls): the small ones after the first travel merged, as
    Answers frames; two with a 16 MiB buffer, written in slices, sit among
    them. Every reply arrives, in the order made: small replies made while
    the large ones are still being written wait behind them."""
    big = os.urandom(16 << 20)
    merged: list[int] = []
    deliver = Connection.deliver

    def spy(conn: Connection, body: bytes, bufs: Any) -> None:
        msg = decode_message(body)
        if isinstance(msg, Answers):
            merged.append(len(msg.replies))
        deliver(conn, body, bufs)

    monkeypatch.setattr(Connection, "deliver", spy)

    async def main() -> None:
        async with _pair(None) as (sender, receiver):
            arrived: list[int] = []
            futs = [_expect(receiver, req, arrived) for req in range(1, 101)]
            for req in range(1, 101):
                sender.reply(req, msgspec.msgpack.encode(None),
                             [(big, KIND_BYTES)] if req in (40, 41) else [])
            got = await asyncio.wait_for(asyncio.gather(*futs), DEADLINE)
            assert arrived == list(range(1, 101))
            assert [bytes(b) for b in got[39] + got[40]] == [big, big]
            assert sum(merged) >= 38  # (2-39 at least: made before any large frame)

    LOOPS[loop](main())


@pytest.mark.parametrize("loop", LOOPS)
def test_large_frame_is_not_copied_into_the_transport(loop: str) -> None:
    """Right after a 32 MiB frame is sent, the transport holds at most a
    slice of it beyond its high-water mark (it used to take the whole frame, and the standard loop
    joined its parts into one copy first); the rest follows as it drains."""
    value = os.urandom(32 << 20)

    async def main() -> None:
        async with _pair(None) as (sender, receiver):
            arrived: list[int] = []
            fut = _expect(receiver, 1, arrived)
            _reply(sender, 1, [(value, KIND_BYTES)])
            transport = sender.transport
            assert transport is not None
            # slices go in until the transport passes its high-water mark
            # (part of the slice before may still be there): one slice more
            high = transport.get_write_buffer_limits()[1]
            assert transport.get_write_buffer_size() <= high + _SLICE
            assert await asyncio.wait_for(fut, DEADLINE) == [value]

    LOOPS[loop](main())



class _ViewsTransport(asyncio.Transport):
    """A transport that keeps views of what it is given, not copies, until
    the test sends them (:meth:`send`), as uvloop, TLS and the standard loop
    from Python 3.12 do while the socket is full; it pauses and resumes its
    protocol at its water marks as they do."""

    def __init__(self, protocol: Connection) -> None:
        super().__init__()
        self.protocol = protocol
        self.held: list[memoryview] = []
        self.wire = bytearray()
        self.low, self.high = 16 << 10, 64 << 10
        self.paused = False

    def write(self, data: Any) -> None:
        self.held.append(memoryview(data).cast("B"))
        self._maybe_pause()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def get_write_buffer_size(self) -> int:
        return sum(v.nbytes for v in self.held)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.low, self.high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        assert high is not None and low is not None
        self.low, self.high = low, high
        self._maybe_pause()

    def send(self, n: int) -> None:
        """The socket takes ``n`` bytes of what is held."""
        while n and self.held:
            v = self.held[0]
            k = min(n, v.nbytes)
            self.wire += v[:k]
            n -= k
            if k == v.nbytes:
                self.held.pop(0)
            else:
                self.held[0] = v[k:]
        if self.paused and self.get_write_buffer_size() <= self.low:
            self.paused = False
            self.protocol.resume_writing()

    def _maybe_pause(self) -> None:
        if not self.paused and self.get_write_buffer_size() > self.high:
            self.paused = True
            self.protocol.pause_writing()

    def is_closing(self) -> bool:
        return False


@pytest.mark.parametrize("size", [64 << 10, 3 * _SLICE + 5], ids=["one-write", "sliced"])
def test_a_frame_s_memory_is_lent_until_the_transport_sent_all_of_it(size: int) -> None:
    """The future :meth:`Connection.send` returns for a frame with buffers
    (an actor's result waits on it before the actor runs anything else) is
    done only once the transport holds none of them: changing the buffer then
    changes nothing on the wire.  It used to be done once the last slice was
    handed to the transport, which may still hold a view of it."""

    async def main() -> None:
        conn = Connection(runtime(), None)
        transport = _ViewsTransport(conn)
        conn.connection_made(transport)
        try:
            value = bytearray(os.urandom(size))
            original = bytes(value)
            lent = conn.send_message(Reply(1, msgspec.Raw(msgspec.msgpack.encode(None))),
                                     [(value, KIND_BYTEARRAY)])
            assert lent is not None  # the transport holds part of it
            while not lent.done():  # the socket takes a little at a time
                transport.send(8 << 10)
            value[:] = bytes(size)  # the actor's next call changes it in place
            transport.send(1 << 40)
            assert transport.wire.endswith(original)
        finally:
            conn.connection_lost(None)
            close_runtime()

    asyncio.run(main())
