"""Wire robustness against real worker processes: malformed, garbage and
truncated frames on a worker's socket, calls to unknown actors and endpoints.

A raw client dials a worker's listening Unix socket and speaks the frame
format by hand (``meshio._transport._frames.frame_header`` + ``meshio._transport._messages``).
After each abuse the worker must still serve the controller's calls.
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import pytest_asyncio

import meshio
from log_watch import LogWatch
from meshio import Actor, ActorMesh, endpoint
from meshio._transport import _messages as M
from meshio._transport._connection import Connection
from meshio._transport._frames import MAX_BUFS, frame_header
from meshio._transport._runtime import Runtime, runtime
from meshio._transport._serial import KIND_BYTEARRAY, KIND_BYTES, MAX_BODY
from meshio.testing import actor_target, forged_mesh, process_address
from raw_peer import close, dial, expect_eof, read_frame

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: generous bound on any single wait: a regression fails instead of hanging
DEADLINE = 30.0


class Echo(Actor):
    @endpoint
    async def echo(self, x: int) -> int:
        return x

    @endpoint
    async def total(self, data: bytes) -> int:
        return len(data)


class EchoPlus(Actor):
    """Same wire name space as Echo plus an endpoint Echo does not have."""

    @endpoint
    async def echo(self, x: int) -> int:
        return x

    @endpoint
    async def missing(self) -> int:
        return 0


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def echo() -> AsyncIterator[ActorMesh[Echo]]:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, name="wire") as pm:
        mesh = await pm.spawn("echo", Echo)
        yield mesh  # type: ignore[misc]


# ----------------------------------------------------------------- helpers


def frame(msg: M.Message | bytes, out: list[tuple[Any, int]] | None = None) -> bytes:
    body = msg if isinstance(msg, bytes) else M.encode_message(msg)
    out = out or []
    return frame_header(len(body), out) + body + b"".join(bytes(b) for b, _ in out)


def raw_args(**kwargs: Any) -> msgspec.Raw:
    return msgspec.Raw(msgspec.msgpack.encode(kwargs))


async def assert_serving(mesh: ActorMesh[Echo], x: int) -> None:
    values = await asyncio.wait_for(mesh.echo.call(x=x), DEADLINE)
    assert values.values() == [x] * len(mesh)


# ------------------------------------------------------------------- tests


async def test_raw_client_speaks_the_protocol(echo: ActorMesh[Echo]) -> None:
    """Sanity for the helpers: hand-made Calls get their answers, in order:
    the first of a turn of the worker's loop as a Reply, the small ones made
    after it in that turn together, as one Answers."""
    r, w = await dial(process_address(echo, 0))
    try:
        w.write(b"".join(frame(M.Call(req, actor_target(echo), "echo", raw_args(x=req * 10)))
                         for req in range(1, 21)))
        msg, bufs = await asyncio.wait_for(read_frame(r), DEADLINE)
        assert msg == M.Reply(1, msgspec.Raw(msgspec.msgpack.encode(10))) and bufs == []
        answers: list[tuple[int, bytes]] = []
        frames = 0
        while len(answers) < 19:
            msg, bufs = await asyncio.wait_for(read_frame(r), DEADLINE)
            frames += 1
            assert bufs == []
            if isinstance(msg, M.Reply):
                answers.append((msg.req, bytes(msg.value)))
            else:
                assert isinstance(msg, M.Answers) and msg.fails == []
                answers.extend((req, bytes(value)) for req, value in msg.replies)
        assert answers == [(req, msgspec.msgpack.encode(req * 10)) for req in range(2, 21)]
        assert frames < 19  # framed together (one Answers, unless the calls came apart)
        # out-of-band buffers made by hand are accepted too
        data = b"z" * 100_000
        w.write(frame(M.Call(3, actor_target(echo), "total", msgspec.Raw(
            msgspec.msgpack.encode({"data": msgspec.msgpack.Ext(2, msgspec.msgpack.encode(
                (0, 0)))}))), [(data, KIND_BYTES)]))
        msg, _ = await asyncio.wait_for(read_frame(r), DEADLINE)
        assert msg == M.Reply(3, msgspec.Raw(msgspec.msgpack.encode(len(data))))
    finally:
        await close(w)


@pytest.mark.parametrize("header", [
    pytest.param(struct.pack("<II", 0xFFFF_FFFF, 0), id="body-4GiB"),
    pytest.param(struct.pack("<II", MAX_BODY + 1, 0), id="body-over-max"),
    pytest.param(struct.pack("<II", 4, MAX_BUFS + 1), id="too-many-buffers"),
    pytest.param(struct.pack("<II", 0xFFFF_FFFF, 0xFFFF_FFFF), id="all-ones"),
    pytest.param(struct.pack("<IIQ", 4, 1, (KIND_BYTEARRAY << 56) | (1 << 55)) + b"abcd",
                 id="buffer-2**55-bytes"),
    pytest.param(struct.pack("<IIQ", 4, 1, (KIND_BYTES << 56) | (1 << 45)) + b"abcd",
                 id="buffer-32TiB"),
    pytest.param(struct.pack("<IIQ", 4, 1, (0xFF << 56) | 4) + b"abcd", id="unknown-buffer-kind"),
])
async def test_absurd_header_gets_protocol_error_and_drop(
        echo: ActorMesh[Echo], header: bytes) -> None:
    r, w = await dial(process_address(echo, 0))
    try:
        w.write(header)
        msg, _ = await asyncio.wait_for(read_frame(r), DEADLINE)
        assert isinstance(msg, M.Fail), msg
        assert msg.req == 0
        assert msg.error.kind == "protocol"
        assert msg.error.type_name == "ProtocolError"
        await expect_eof(r)  # that connection is dropped
    finally:
        await close(w)
    await assert_serving(echo, 11)


@pytest.mark.parametrize("body", [
    pytest.param(b"\xff\xfe\xfd garbage \x00\x01", id="garbage"),
    pytest.param(b"\xc1", id="never-used-msgpack-byte"),
    pytest.param(msgspec.msgpack.encode([99, "x", 1]), id="unknown-tag"),
    pytest.param(msgspec.msgpack.encode([2, "not-an-int", "t", "m", 1]), id="wrong-field-type"),
    pytest.param(msgspec.msgpack.encode({"req": 1}), id="map-not-array"),
    pytest.param(b"", id="empty-body"),
])
async def test_garbage_body_gets_protocol_fail(echo: ActorMesh[Echo], body: bytes) -> None:
    r, w = await dial(process_address(echo, 1))
    try:
        w.write(frame_header(len(body), []) + body)
        msg, _ = await asyncio.wait_for(read_frame(r), DEADLINE)
        assert isinstance(msg, M.Fail), msg
        assert msg.req == 0
        assert msg.error.kind == "protocol"
        assert "malformed" in msg.error.message
    finally:
        await close(w)
    await assert_serving(echo, 12)


@pytest.mark.parametrize("chunk", [
    pytest.param(b"\x05", id="partial-header"),
    pytest.param(struct.pack("<II", 100, 0) + b"abc", id="partial-body"),
    pytest.param(struct.pack("<II", 4, 2) + struct.pack("<Q", 8), id="partial-descs"),
    pytest.param(frame(M.Call(7, "t", "m", raw_args()), [(b"q" * 1000, KIND_BYTES)])[:-10],
                 id="partial-buffer"),
])
async def test_truncated_frame_then_close(echo: ActorMesh[Echo], chunk: bytes) -> None:
    r, w = await dial(process_address(echo, 0))
    w.write(chunk)
    await w.drain()
    await assert_serving(echo, 19)  # a stalled half frame blocks nobody else
    w.write_eof()
    await expect_eof(r)  # the worker closes its side too, sending nothing
    await close(w)
    await assert_serving(echo, 13)


async def test_unknown_actor_raw(echo: ActorMesh[Echo]) -> None:
    r, w = await dial(process_address(echo, 0))
    try:
        w.write(frame(M.Call(41, "nobody/here", "echo", raw_args(x=1))))
        msg, _ = await asyncio.wait_for(read_frame(r), DEADLINE)
        assert isinstance(msg, M.Fail) and msg.req == 41, msg
        assert msg.error.kind == "unknown_actor"
        assert "nobody/here" in msg.error.message
        # the connection stays usable after a well-formed but unroutable call
        w.write(frame(M.Call(42, actor_target(echo), "echo", raw_args(x=3))))
        msg, _ = await asyncio.wait_for(read_frame(r), DEADLINE)
        assert msg == M.Reply(42, msgspec.Raw(msgspec.msgpack.encode(3)))
    finally:
        await close(w)


async def test_unknown_endpoint_raw(echo: ActorMesh[Echo]) -> None:
    r, w = await dial(process_address(echo, 1))
    try:
        w.write(frame(M.Call(9, actor_target(echo), "nope", raw_args())))
        msg, _ = await asyncio.wait_for(read_frame(r), DEADLINE)
        assert isinstance(msg, M.Fail) and msg.req == 9, msg
        assert msg.error.kind == "unknown_endpoint"
        assert "nope" in msg.error.message and "echo" in msg.error.message
        assert msg.error.rank == 1
    finally:
        await close(w)
    await assert_serving(echo, 14)


async def test_bad_arguments_raw_are_schema_errors(echo: ActorMesh[Echo]) -> None:
    r, w = await dial(process_address(echo, 0))
    try:
        not_a_map = msgspec.Raw(msgspec.msgpack.encode([1, 2]))
        for req, args in ((1, not_a_map), (2, raw_args(x="seven")), (3, raw_args(y=1)),
                          (4, raw_args())):
            w.write(frame(M.Call(req, actor_target(echo), "echo", args)))
            msg, _ = await asyncio.wait_for(read_frame(r), DEADLINE)
            assert isinstance(msg, M.Fail) and msg.req == req, msg
            assert msg.error.kind == "schema", msg
    finally:
        await close(w)
    await assert_serving(echo, 15)


async def test_unknown_actor_via_controller(echo: ActorMesh[Echo]) -> None:
    bogus = forged_mesh(echo, Echo, target="nobody/bogus")
    with pytest.raises(meshio.UnknownActorError) as info:
        await asyncio.wait_for(bogus.echo.call(x=1), DEADLINE)
    assert "nobody/bogus" in str(info.value)
    assert len(info.value.failures) == 2
    assert all(isinstance(e, meshio.UnknownActorError) for _, e in info.value.failures)
    with pytest.raises(meshio.UnknownActorError):
        await asyncio.wait_for(bogus.slice(procs=1).echo.call_one(x=1), DEADLINE)
    await assert_serving(echo, 16)


async def test_unknown_endpoint_via_controller(echo: ActorMesh[Echo]) -> None:
    wrong = forged_mesh(echo, EchoPlus)
    with pytest.raises(meshio.UnknownEndpointError) as info:
        await asyncio.wait_for(wrong.slice(procs=0).missing.call_one(), DEADLINE)
    assert "missing" in str(info.value)
    # the endpoints both classes share still work through the wrong view
    assert (await asyncio.wait_for(wrong.echo.call(x=2), DEADLINE)).values() == [2, 2]
    await assert_serving(echo, 17)


async def test_controller_socket_survives_garbage(echo: ActorMesh[Echo],
                                                  controller_log: LogWatch) -> None:
    """The controller's own listening socket is as robust as a worker's; what
    it logs names the peer as its handshake showed it (a peer that sent no
    Hello was an "unidentified peer")."""
    addr = runtime().addr
    r, w = await dial(addr)
    try:
        w.write(frame_header(3, []) + b"\xc1\xc1\xc1")
        msg, _ = await asyncio.wait_for(read_frame(r), DEADLINE)
        assert isinstance(msg, M.Fail) and msg.error.kind == "protocol", msg
        w.write(struct.pack("<II", 0xFFFF_FFFF, 0))
        msg, _ = await asyncio.wait_for(read_frame(r), DEADLINE)
        assert isinstance(msg, M.Fail) and msg.error.kind == "protocol", msg
        await expect_eof(r)
    finally:
        await close(w)
    line = await controller_log.wait_for("malformed frame header")
    assert line.endswith(f"dropping connection from pid {os.getpid()} (uid {os.getuid()})"), line
    await assert_serving(echo, 18)


async def test_runtime_state_is_made_once_and_closed_with_the_runtime() -> None:
    """issue 9: Runtime.state is the one per-runtime state mechanism: made on
    first use, the same object after, closed with the runtime (last made
    first), and refused once the runtime has closed."""
    closed: list[object] = []

    class First:
        def __init__(self, rt: Runtime) -> None:
            self.rt = rt

        def close(self) -> None:
            closed.append(self)

    class Second(First):
        pass

    rt = Runtime(asyncio.get_running_loop(), in_process=True)
    first = rt.state(First)
    assert rt.state(First) is first and first.rt is rt and rt.has_state(First)
    assert not rt.has_state(Second)
    second = rt.state(Second)
    rt.close()
    assert closed == [second, first]
    with pytest.raises(meshio.ClosedResourceError, match="is closed"):
        rt.state(First)


class _Recorded:
    """A transport that keeps what a connection writes, one entry a write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False


async def _messages(data: bytes) -> list[M.Message]:
    """The messages of the frames in ``data`` (none with buffers)."""
    r = asyncio.StreamReader()
    r.feed_data(data)
    r.feed_eof()
    out: list[M.Message] = []
    while not r.at_eof():
        msg, bufs = await read_frame(r)
        assert bufs == []
        out.append(msg)
    return out


async def test_what_a_read_answers_is_written_when_the_read_returns() -> None:
    """Frames sent while a connection's read runs (here the runtime's Pongs
    to three Pings read at once) are written by the time the read returns:
    the first at once, the others together, and no end-of-turn callback is
    left for them (so a call served as it came in is answered without
    waiting for a turn of the loop).  Frames sent outside a read still
    batch until the end of the turn."""
    rt = Runtime(asyncio.get_running_loop(), in_process=True)
    try:
        conn = Connection(rt, "peer")
        transport = _Recorded()
        conn.transport = transport  # type: ignore[assignment]  # (what sending uses)
        data = b"".join(frame(M.Ping(seq)) for seq in (1, 2, 3))
        conn.get_buffer(len(data))[:len(data)] = data
        conn.buffer_updated(len(data))
        assert [await _messages(w) for w in transport.writes] == [
            [M.Pong(1)], [M.Pong(2), M.Pong(3)]]
        assert rt.batched == [] and not rt.reading

        conn.send_message(M.Ping(4))
        conn.send_message(M.Ping(5))
        assert await _messages(transport.writes[-1]) == [M.Ping(4)] and rt.batched == [conn]
        await asyncio.sleep(0)  # (the end of this turn)
        assert await _messages(transport.writes[-1]) == [M.Ping(5)] and rt.batched == []
    finally:
        rt.close()
