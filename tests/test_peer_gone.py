"""What a peer wrote before it died reaches its callers, even when this
side's next write finds it gone before the loop has read it.

A write to a socket whose peer is gone (a broken pipe, a reset) makes the
event loop close the transport at once, without reading what the socket
still holds.  A worker that sends ``Started`` and then kills itself (a
poison message) while its caller writes to it lost that ``Started``: the
crash did not count as the call's, and a supervisor allowing one restart
gave up (found by CI, one run in ~15 on one loaded core).  Real sockets
(Unix, and TCP on loopback, where the peer's close is a reset) on both
event loops users run: the standard one and uvloop (``meshio.run``).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import msgspec
import pytest
import uvloop

from meshio._transport import _messages as M
from meshio._transport._connection import Connection, Pending
from meshio._transport._frames import frame_header
from meshio._transport._runtime import Runtime

#: generous bound on any single wait: a regression fails instead of hanging
DEADLINE = 30.0

pytestmark = pytest.mark.usefixtures("uvloop_started")

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def frame(msg: M.Message) -> bytes:
    body = M.encode_message(msg)
    return frame_header(len(body), []) + body


def _sockets(family: str) -> tuple[socket.socket, socket.socket]:
    """Both ends of a connection: ``(ours, theirs)``."""
    if family == "unix":
        return socket.socketpair()
    with socket.create_server(("127.0.0.1", 0)) as server:
        ours = socket.create_connection(server.getsockname())
        theirs, _ = server.accept()
    return ours, theirs


async def _answer_of_a_peer_gone_before_it_was_read(family: str) -> object:
    """A call's reply is in this side's socket and the peer is gone (it
    left this side's Hello unread: a reset on TCP); this side writes
    before reading."""
    loop = asyncio.get_running_loop()
    rt = Runtime(loop, in_process=True)
    ours, theirs = _sockets(family)
    try:
        conn = Connection(rt, "peer")
        if family == "unix":
            await loop.create_unix_connection(lambda: conn, sock=ours)
        else:
            await loop.create_connection(lambda: conn, sock=ours)
        theirs.recv(1, socket.MSG_PEEK)  # (the Hello is there, unread)
        answered: asyncio.Future[object] = loop.create_future()
        req = conn.next_req(Pending(answered, lambda value, bufs: msgspec.msgpack.decode(value),
                                    "Peer.work", "peer", 0))
        theirs.sendall(frame(M.Reply(req, msgspec.Raw(msgspec.msgpack.encode(42)))))
        theirs.close()
        conn.send_message(M.Ping(1))
        conn.write_batched()  # (out now, before the loop gets to read)
        return await asyncio.wait_for(answered, DEADLINE)
    finally:
        theirs.close()
        rt.close()


@pytest.mark.parametrize("family", ["unix", "tcp"])
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_reply_written_before_the_peer_died_is_read_when_a_write_finds_it_gone(
        loop: str, family: str) -> None:
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        assert runner.run(_answer_of_a_peer_gone_before_it_was_read(family)) == 42
