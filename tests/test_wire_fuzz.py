"""Property-based tests (hypothesis) of the frame parser and the value decoders.

Any byte string, and any mutation of a stream of valid frames, fed to a
:class:`~meshio._transport._connection.Connection` in arbitrary chunks (as the event loop's
``get_buffer``/``buffer_updated`` would) yields delivered messages, typed
errors to the callers, or a dropped connection: never an exception out of the
protocol, never memory reserved beyond the configured limits, never a
connection left waiting forever.  The value decoders give a value or a
``SchemaError``, whatever the bytes.

No processes here: the connection runs on a fake transport and a fake event
loop whose clock the test advances.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import struct
import subprocess
from collections.abc import Callable, Generator
from typing import Any

import msgspec
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fuzz import FUZZ
from meshio import SchemaError
from meshio._port import PortReceiver
from meshio._transport import _bulk, _pool
from meshio._transport import _connection as R
from meshio._transport import _frames as F
from meshio._transport import _messages as M
from meshio._transport._connection import Connection, Pending
from meshio._transport._frames import frame_header
from meshio._transport._serial import (
    KIND_BUFFER,
    KIND_BYTEARRAY,
    KIND_BYTES,
    OOB_THRESHOLD,
    Packer,
    limits,
)
from meshio.endpoints._schema import Schema

MAX_MESSAGE = 1 << 20  # small limits, so that the fuzzer reaches them
BUDGET = 3 << 19
TIMEOUT = 5.0


@contextlib.contextmanager
def small_limits() -> Generator[None]:
    """Small limits and a receive budget of this example's own; every
    receive allocation of a connection is checked against them."""
    saved = (limits.max_message, limits.receive_budget, limits.frame_timeout, R._budget)

    def checked(kind: int, n: int) -> tuple[Any, memoryview]:
        assert n <= limits.max_message, f"allocated {n} bytes, over the message size limit"
        return F._allocate(kind, n)

    limits.max_message, limits.receive_budget, limits.frame_timeout = (
        MAX_MESSAGE, BUDGET, TIMEOUT)
    R._budget = R._ReceiveBudget()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(R, "_allocate", checked)  # (the name the connection calls)
            yield
    finally:
        limits.max_message, limits.receive_budget, limits.frame_timeout, R._budget = saved


# ------------------------------------------------------- fake loop/runtime


class Handle:
    def __init__(self, due: float, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.due, self.fn, self.args = due, fn, args
        self.cancelled = False

    def when(self) -> float:
        return self.due

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """The few loop methods a connection uses, with a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.handles: list[Handle] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, fn: Callable[..., None], *args: Any) -> Handle:
        h = Handle(self.now + delay, fn, args)
        self.handles.append(h)
        return h

    def call_soon(self, fn: Callable[..., None], *args: Any) -> Handle:
        return self.call_later(0, fn, *args)

    def get_debug(self) -> bool:  # (asyncio.Future asks its loop)
        return False

    def create_future(self) -> asyncio.Future[None]:
        return asyncio.Future(loop=self)  # type: ignore[arg-type]

    def run_due(self) -> None:
        while True:
            due = [h for h in self.handles if h.due <= self.now and not h.cancelled]
            if not due:
                return
            h = min(due, key=lambda h: h.due)
            self.handles.remove(h)
            self.now, now = h.due, self.now  # each timer fires on time
            h.fn(*h.args)
            self.now = now

    def advance(self, dt: float) -> None:
        self.now += dt
        self.run_due()


class FakeRuntime:
    def __init__(self) -> None:
        self.loop = FakeLoop()
        self.ports: dict[int, PortReceiver[Any]] = {}
        self.got: list[tuple[M.Message, list[Any]]] = []
        self.reading = False  # (set by a read; batching() below ignores it)
        self.batched: list[Connection] = []  # (always empty: nothing for a read to write)
        self.admitted: list[Callable[[], None]] = []  # (no actor here: no call to serve)

    def dispatch(self, conn: Connection, msg: M.Message, bufs: list[Any]) -> None:
        self.got.append((msg, bufs))

    def batching(self, conn: Connection) -> None:  # (the end of the turn: flushed then)
        self.loop.call_soon(conn.flush)

    def _connection_lost(self, conn: Connection, exc: Exception | None) -> None:
        pass


class FakeTransport:
    def __init__(self, conn: Connection, loop: FakeLoop) -> None:
        self.conn, self.loop = conn, loop
        self.written: list[bytes] = []
        self.paused = self.closing = False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def writelines(self, parts: list[Any]) -> None:
        self.written.append(b"".join(bytes(p) for p in parts))

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:
        if not self.closing:
            self.closing = True
            self.loop.call_soon(self.conn.connection_lost, None)


def connect(rt: FakeRuntime) -> tuple[Connection, FakeTransport]:
    conn = Connection(rt, None)  # type: ignore[arg-type]  # (accepted: nothing queued)
    conn.peer = "peer"
    transport = FakeTransport(conn, rt.loop)
    conn.transport = transport  # type: ignore[assignment]
    return conn, transport


# ------------------------------------------------------------ invariants

SCRATCH_BOUND = 2 * (8 + 8 * F.MAX_BUFS + F._PEEK)


def check_bounds(conns: list[Connection]) -> None:
    """What the process has reserved for incomplete frames stays bounded."""
    assert R._budget.used <= max(BUDGET, limits.max_message)
    for c in conns:
        scratch, held, _ = c.receiving
        assert held <= limits.max_message
        assert scratch <= SCRATCH_BOUND


def feed(conn: Connection, transport: FakeTransport, data: bytes, cuts: list[int]) -> int:
    """Feed ``data`` as the loop would, cut at ``cuts``; stops when paused or
    closed.  Returns how much was consumed."""
    mv = memoryview(data)
    pos = 0
    cut_iter = iter(sorted(set(cuts)))
    while pos < len(data) and not transport.paused and not transport.closing:
        target = conn.get_buffer(-1)
        assert len(target) > 0
        limit = next(cut_iter, len(data))
        while limit <= pos:
            limit = next(cut_iter, len(data))
        limit = min(limit, len(data))
        n = min(len(target), limit - pos)
        target[:n] = mv[pos:pos + n]
        conn.buffer_updated(n)
        pos += n
        check_bounds([conn])
    return pos


def finish(rt: FakeRuntime, conns: list[Connection]) -> None:
    """With no more data, every connection is complete, or dropped after the
    frame timeout; then every reservation is given back."""
    rt.loop.run_due()
    # each is dropped within twice the timeout of its last data (or of the
    # budget granting it what it waited for, once another was dropped)
    for _ in range(2 * len(conns) + 2):
        rt.loop.advance(TIMEOUT)
    for c in conns:
        assert c.closed or not c.incomplete(), "an incomplete frame never timed out"
        if not c.closed:
            c.connection_lost(None)
    rt.loop.run_due()
    assert R._budget.used == 0 and not R._budget.waiting


# -------------------------------------------------------------- valid data


class Target:
    def method(self, x: int, data: bytes, note: str, blob: Any = None) -> list[int]:
        raise NotImplementedError

    def variadic(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


SCHEMA = Schema(Target.method, "Target.method")
VARIADIC = Schema(Target.variadic, "Target.variadic")


def valid_frames() -> list[bytes]:
    """A stream of real messages: calls with out-of-band values and pickles,
    a reply, small calls and replies framed together, a port value."""
    frames: list[bytes] = []
    for i, (data, note, blob) in enumerate([
            (b"x" * 10, "short", None),
            (b"y" * 70_000, "z" * 40_000, {1: 2}),  # bytes, str and pickle out of band
            (b"", "é" * 20, {frozenset([1]): b"q" * 40_000}),
    ]):
        packer = Packer()
        body = SCHEMA.pack_call((i, data, note, blob), {}, packer)
        msg = M.encode_message(M.Call(i + 1, "t", "method", msgspec.Raw(body)))
        frames.append(frame_header(len(msg), packer) + msg
                      + b"".join(bytes(memoryview(b)) for b, _ in packer))
    packer = Packer()
    value = packer.pack([1, 2, 3], True)
    reply = M.encode_message(M.Reply(1, msgspec.Raw(value)))
    frames.append(frame_header(len(reply), packer) + reply)
    calls = M.encode_message(M.Calls([M.Call(10 + k, "t", "method", msgspec.Raw(
        SCHEMA.pack_call((k, b"c", "n", [k]), {}, Packer()))) for k in range(3)]))
    frames.append(frame_header(len(calls), []) + calls)
    answers = M.encode_message(M.Answers([(1, msgspec.Raw(value)), (2, msgspec.Raw(value))], []))
    frames.append(frame_header(len(answers), []) + answers)
    port = M.encode_message(M.PortSend(7, msgspec.Raw(Packer().pack({"k": 1.5}, False))))
    frames.append(frame_header(len(port), []) + port)
    return frames


VALID = valid_frames()
STREAM = b"".join(VALID)


def big_frame(size: int, req: int) -> bytes:
    """A call whose one buffer is ``size`` bytes (its content: zeros)."""
    msg = M.encode_message(M.Call(req, "t", "method", msgspec.Raw(b"\x80")))
    return frame_header(len(msg), [(b"", KIND_BYTEARRAY)])[:8] + struct.pack(
        "<Q", (KIND_BYTEARRAY << 56) | size) + msg + bytes(size)


@st.composite
def mutated(draw: st.DrawFn, stream: bytes) -> bytes:
    data = bytearray(stream)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "set", "cut", "insert", "delete"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[pos] = draw(st.sampled_from([0, 0x7F, 0x80, 0xC1, 0xFF]))
        elif op == "cut":
            del data[pos:]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(max_size=16))
        else:
            del data[pos:pos + draw(st.integers(1, 64))]
    return bytes(data)


cuts = st.lists(st.integers(0, len(STREAM) + 64), max_size=12)


def run_one(data: bytes, cut_at: list[int]) -> FakeRuntime:
    with small_limits():
        rt = FakeRuntime()
        conn, transport = connect(rt)
        fut = _Future()
        conn.pending[1] = Pending(fut, SCHEMA.unpack_result, "Target.method", "m", 0)  # type: ignore[arg-type]
        receiver: PortReceiver[Any] = PortReceiver(7)
        rt.ports[7] = receiver
        feed(conn, transport, data, cut_at)
        finish(rt, [conn])
        if fut.done():  # a reply, mutated or not, gives a value or a typed error
            assert fut.error is None or isinstance(fut.error, SchemaError), fut.error
        for msg, bufs in rt.got:  # every call's arguments decode or fail typed
            for call in [msg] if isinstance(msg, M.Call) else (
                    msg.calls if isinstance(msg, M.Calls) else []):
                try:
                    SCHEMA.unpack_args(call.args, bufs)
                except SchemaError:
                    pass
        for item in receiver._items:  # a port value, or an error for recv()
            assert not isinstance(item, BaseException)
        return rt


class _Future:
    """Stands in for the pending call's future."""

    def __init__(self) -> None:
        self.finished = False
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self.finished

    def set_result(self, value: Any) -> None:
        self.finished = True

    def set_exception(self, error: BaseException) -> None:
        self.finished, self.error = True, error

    def cancelled(self) -> bool:
        return False


# ---------------------------------------------------------------- parser


def test_valid_stream_is_delivered_whole() -> None:
    """issue 7 item 4: (evidence) the unmutated stream, cut anywhere, delivers every
    message (sanity for the properties below)."""
    for cut in range(0, len(STREAM), 997):
        rt = run_one(STREAM, [cut])
        assert [type(m) for m, _ in rt.got] == [M.Call] * 3 + [M.Calls, M.PortSend]
    rt = run_one(STREAM, list(range(0, len(STREAM), 7)))
    assert len(rt.got) == 5


@FUZZ
@given(data=st.binary(max_size=2048), cut_at=cuts)
def test_parser_arbitrary_bytes(data: bytes, cut_at: list[int]) -> None:
    """issue 7 item 4: (evidence) arbitrary bytes in arbitrary chunks never raise out
    of the protocol, never reserve beyond the limits, never hang."""
    run_one(data, cut_at)


@FUZZ
@given(data=st.binary(min_size=8, max_size=64), cut_at=cuts)
def test_parser_arbitrary_headers(data: bytes, cut_at: list[int]) -> None:
    """issue 7 item 4: (evidence) headers that claim anything (a well-formed start
    followed by random descriptors and body) behave the same."""
    nbufs = len(data) // 16
    run_one(struct.pack("<II", len(data) % 40, nbufs) + data, cut_at)


@FUZZ
@given(data=mutated(STREAM), cut_at=cuts)
def test_parser_mutated_frames(data: bytes, cut_at: list[int]) -> None:
    """issue 7 item 4: (evidence) mutations of a stream of valid frames."""
    run_one(data, cut_at)


@FUZZ
@given(sizes=st.lists(st.integers(F._SCRATCH + 1, MAX_MESSAGE + 4096), min_size=2,
                      max_size=4),
       stop_at=st.lists(st.integers(0, MAX_MESSAGE), min_size=4, max_size=4))
def test_budget_across_connections(sizes: list[int], stop_at: list[int]) -> None:
    """issue 7 item 4: big frames on several connections at once never hold
    more than the process budget (waiting ones pause reading), a frame over
    the size limit is skipped without dropping its connection, a frame that
    stops arriving times out, and every reservation comes back."""
    with small_limits():
        rt = FakeRuntime()
        links = [connect(rt) for _ in sizes]
        streams = [big_frame(n, 100 + k) + VALID[0] for k, n in enumerate(sizes)]
        ends = [min(len(s), stop + 8) if k % 2 else len(s)
                for k, (s, stop) in enumerate(zip(streams, stop_at))]
        pos = [0] * len(links)
        for _ in range(1000):
            progressed = False
            for k, (conn, tr) in enumerate(links):
                if pos[k] < ends[k] and not tr.paused and not tr.closing:
                    n = feed(conn, tr, streams[k][pos[k]:min(pos[k] + 300_000, ends[k])], [])
                    pos[k] += n
                    progressed = progressed or n > 0
                check_bounds([c for c, _ in links])
            rt.loop.run_due()
            if not progressed:
                rt.loop.advance(TIMEOUT)  # only stalled connections are left
            if all(p >= e or tr.closing for p, e, (_, tr) in zip(pos, ends, links)):
                break
        else:
            pytest.fail("connections waiting on each other forever")
        finish(rt, [c for c, _ in links])
        delivered = {m.req for m, _ in rt.got if isinstance(m, M.Call)}
        for k, (_, tr) in enumerate(links):
            if ends[k] < len(streams[k]):
                continue  # stopped mid-way: timed out (checked by finish)
            refused = any(b"over the message size limit" in b for b in tr.written)
            assert refused == (len(streams[k]) - len(VALID[0]) - 8 - 8 > MAX_MESSAGE)
            assert (100 + k in delivered) != refused  # delivered, or refused and skipped


def test_scratch_buffer_shrinks_after_large_header() -> None:
    """issue 7 item 4, issue 15 item 8: a connection has no scratch buffer
    until data arrives; a header with many buffer descriptors grows it; it
    is given back once that frame is done."""
    with small_limits():
        rt = FakeRuntime()
        conn, tr = connect(rt)
        assert conn.receiving[0] == 0
        feed(conn, tr, VALID[0], [])
        # (a transport with no socket, as an in-memory one: its first scratch is small)
        assert len(rt.got) == 1 and conn.receiving[0] == F._MEMORY_SCRATCH
        n = 40_000
        msg = M.encode_message(M.Call(1, "t", "method", msgspec.Raw(b"\x80")))
        frame = frame_header(len(msg), [(b"a", KIND_BYTES)] * n) + msg + b"a" * n
        header = 8 + 8 * n  # all of it but its last byte: it waits in the buffer
        feed(conn, tr, frame[:header - 1], list(range(0, header, 4096)))
        assert conn.receiving[0] >= header > F._SCRATCH
        header -= 1
        feed(conn, tr, frame[header:], list(range(0, len(frame) - header, 4096)))
        assert len(rt.got) == 2 and len(rt.got[1][1]) == n
        assert conn.receiving[0] <= F._SCRATCH
        finish(rt, [conn])


# ------------------------------------------------- large parts by descriptor


def control(msg: M.Message) -> bytes:
    body = M.encode_message(msg)
    return frame_header(len(body), []) + body


def call_body(req: int) -> bytes:
    return M.encode_message(M.Call(req, "t", "method", msgspec.Raw(b"\x80")))


def described_call(req: int, eid: int, n: int = _pool.THRESHOLD, start: int = 0) -> bytes:
    """A call whose one buffer travels by descriptor: export ``eid``, ``n``
    bytes from byte ``start`` of a cache line, written by the sender."""
    msg = call_body(req)
    kind = (KIND_BUFFER | _bulk.REMOTE) << 56
    return (frame_header(len(msg), [(b"", KIND_BYTEARRAY)])[:8]
            + struct.pack("<Q", kind | _bulk._DESC.size) + msg + _bulk._DESC.pack(eid, n, start))


def sent_messages(transport: FakeTransport) -> list[M.Message]:
    """The messages the connection wrote (small frames, one each)."""
    return [M.decode_message(w[8:]) for w in transport.written]


def fills(transport: FakeTransport) -> list[M.Message]:
    """The ``Fill`` messages the connection wrote."""
    return [m for m in sent_messages(transport) if isinstance(m, M.Fill)]


@functools.cache
def gone_pid() -> int:
    """A process of this host that has exited and been reaped: the peer of
    :func:`by_descriptor`'s connections (no one writes their parts, so
    one that ends mid-frame keeps nothing: ``_bulk.quarantine``)."""
    with subprocess.Popen(["true"]) as p:
        p.wait()
    return p.pid


@contextlib.contextmanager
def by_descriptor() -> Generator[tuple[FakeRuntime, Connection, FakeTransport]]:
    """A connection to a process of this host (its peer writes large parts
    into memory this one lends it), with a message limit above
    :data:`_pool.THRESHOLD`."""
    with small_limits():
        limits.max_message = 8 * _pool.THRESHOLD
        rt = FakeRuntime()
        conn, transport = connect(rt)
        conn.bulk = _bulk.Exports(gone_pid())
        yield rt, conn, transport


def test_a_described_frame_waits_for_its_parts() -> None:
    """A frame whose large part the peer writes is delivered on the peer's
    ``Filled``, not before, with the memory it asked the peer to fill;
    ``Ping`` and ``Pong`` pass it meanwhile, the frames after it follow it."""
    with by_descriptor() as (rt, conn, transport):
        start = 16
        feed(conn, transport, described_call(1, 5, start=start) + control(M.Ping(3)), [])
        [fill] = fills(transport)
        assert isinstance(fill, M.Fill) and fill.export == 5 and len(fill.to) == 1
        assert fill.to[0] % 64 == start  # where the sender's part starts in a line
        assert [type(m) for m, _ in rt.got] == [M.Ping]  # the call waits
        feed(conn, transport, control(M.Filled(5)) + VALID[0], [])
        assert [type(m) for m, _ in rt.got] == [M.Ping, M.Call, M.Call]
        call, bufs = rt.got[1]
        assert isinstance(call, M.Call) and call.req == 1
        assert _bulk.address_of(bufs[0]) == fill.to[0] and bufs[0].nbytes == _pool.THRESHOLD
        assert not conn.incomplete() and not conn.closed
        finish(rt, [conn])


def test_a_frame_before_filled_drops_the_connection() -> None:
    """A data frame where only ``Filled`` (or ``Fill``, ``Ping``, ``Pong``)
    may come is a broken stream: the connection is dropped, with a typed
    error to the peer, and the waiting frame is never delivered."""
    with by_descriptor() as (rt, conn, transport):
        feed(conn, transport, described_call(1, 5) + VALID[0] + control(M.Filled(5)), [])
        rt.loop.run_due()
        assert conn.closed and rt.got == []
        assert any(isinstance(m, M.Fail) and "export 5" in m.error.message
                   for m in sent_messages(transport))


@pytest.mark.parametrize("export, parts", [(2, 1), (1, 2), (9, 1)],
                         ids=["the export behind the first", "too many parts", "unknown"])
def test_a_fill_the_sender_cannot_serve_drops_the_connection(export: int, parts: int) -> None:
    """A ``Fill`` naming an export whose frame is still queued behind the
    first (the peer cannot have its frame yet), or one the sender never
    made, or with too many addresses, drops the connection before anything
    is written into the peer, and the frames behind the gates never go."""
    with by_descriptor() as (rt, conn, transport):
        lent = [bytearray(b"a") * _pool.THRESHOLD, bytearray(b"b") * _pool.THRESHOLD]
        done = [conn.send(call_body(1), [(buf, KIND_BYTEARRAY)]) for buf in lent]
        assert conn.waiting_export() == 1 and all(d is not None for d in done)
        sent = len(transport.written)  # the first frame, its descriptor: the second waits
        target = bytearray(_pool.THRESHOLD)
        hostile = M.Fill(export, [_bulk.address_of(memoryview(target))] * parts)
        bulk = conn.bulk
        assert bulk is not None
        bulk.fill(conn, hostile)  # (FakeLoop has no run_in_executor: a write would raise)
        rt.loop.run_due()
        assert conn.closed and transport.closing
        assert len(transport.written) == sent
        assert not any(target)
        assert all(d is not None and d.done() for d in done)  # nothing waits on them


_STEPS = st.sampled_from(["filled", "wrong", "ping", "pong", "fill", "call", "described"])


@FUZZ
@given(first=st.sampled_from(["filled", "filled", "ping", "call", "wrong"]),
       steps=st.lists(_STEPS, max_size=5),
       n=st.sampled_from([_pool.THRESHOLD, 3 * _pool.THRESHOLD, 0, 100, 9 * _pool.THRESHOLD]),
       start=st.sampled_from([0, 16, 63, 64, 4096]),
       cut_at=st.lists(st.integers(0, 400), max_size=6), mutate=st.booleans(), data=st.data())
def test_descriptor_streams(first: str, steps: list[str], n: int, start: int,
                            cut_at: list[int], mutate: bool, data: st.DataObject) -> None:
    """Any sequence of frames after a described one, whole or mutated and cut
    anywhere: no exception out of the parser, memory within its bounds, and
    nothing left waiting; whole, the described call is delivered exactly
    when ``Filled`` for its export came before any data frame, and in order."""
    frames = {"filled": control(M.Filled(1)), "wrong": control(M.Filled(2)),
              "ping": control(M.Ping(1)), "pong": control(M.Pong(1)),
              "fill": control(M.Fill(9, [])), "call": VALID[0],
              "described": described_call(3, 4)}
    steps = [first, *steps]
    stream = described_call(100, 1, n, start) + b"".join(frames[s] for s in steps)
    if mutate:
        stream = data.draw(mutated(stream))
    with by_descriptor() as (rt, conn, transport):
        feed(conn, transport, stream, cut_at)
        finish(rt, [conn])
    if mutate:
        return
    data_steps = [s for s in steps if s not in ("ping", "pong", "fill")]
    good = (_pool.THRESHOLD <= n < 8 * _pool.THRESHOLD and start < 64
            and data_steps[:1] == ["filled"])
    delivered = [m.req for m, _ in rt.got if isinstance(m, M.Call)]
    assert (100 in delivered) == good, (steps, n, start, delivered)
    assert delivered == sorted(delivered, key=lambda req: req != 100)  # it came first


# ---------------------------------------------------------- value decoders


def _attributed(p: torch.nn.Parameter) -> torch.nn.Parameter:
    p.shard = 1  # type: ignore[attr-defined]
    return p


def _encodings() -> list[tuple[bytes, list[Any]]]:
    out: list[tuple[bytes, list[Any]]] = []
    for args in [(1, b"d", "n", None), (2, b"e" * 50_000, "é" * 30_000, [{1, 2}, "x"]),
                 (3, b"", "", {"nested": [[1.5, None]]}),
                 (4, b"", "", [torch.arange(6.0).reshape(2, 3).t()]),
                 # tensors kept by identity: one held twice, and views of one storage
                 (5, b"", "", [_t := torch.arange(8.0), _t, _t[2:], _t.view(2, 4).t()]),
                 # a NumPy array held twice, kept by identity
                 (6, b"", "", [_a := np.arange(8.0), _a, {"x": _a}, np.ones(2)]),
                 # Parameters (one held twice), one with an attribute (its class pickled)
                 (7, b"", "", [_p := torch.nn.Parameter(torch.ones(4)), _p, _p.data[1:],
                               _attributed(torch.nn.Parameter(torch.ones(2)))])]:
        packer = Packer()
        body = SCHEMA.pack_call(args, {}, packer)
        out.append((body, [bytes(memoryview(b)) if k == KIND_BYTES else bytearray(b)
                           for b, k in packer]))
    return out


ENCODINGS = _encodings()


def decode_all(body: bytes, bufs: list[Any]) -> None:
    for decode in (SCHEMA.unpack_args, SCHEMA.unpack_result, VARIADIC.unpack_args,
                   VARIADIC.unpack_result):
        try:
            decode(body, bufs)
        except SchemaError:
            pass
    receiver: PortReceiver[Any] = PortReceiver(1)
    receiver._put(M.PortSend(1, msgspec.Raw(body)), bufs)
    assert len(receiver._items) == 1


@FUZZ
@given(body=st.binary(max_size=512), bufs=st.lists(st.binary(max_size=64), max_size=3))
def test_decoders_arbitrary_bytes(body: bytes, bufs: list[bytes]) -> None:
    """issue 7 item 1: (evidence) any bytes decode to a value or a SchemaError (port
    values to a value or an error for recv)."""
    decode_all(body, list(bufs))


@FUZZ
@given(which=st.integers(0, len(ENCODINGS) - 1), data=st.data())
def test_decoders_mutated_encodings(which: int, data: st.DataObject) -> None:
    """issue 7 item 1: (evidence) mutated valid argument encodings (bad extension codes,
    buffer indices, pickles, tensors' descriptions) decode to a value or a SchemaError."""
    body, bufs = ENCODINGS[which]
    decode_all(data.draw(mutated(body)), [data.draw(st.sampled_from([b, b[:1], b""]))
                                          for b in bufs])


def test_decoders_deep_nesting() -> None:
    """issue 7 item 20: deep nesting is a SchemaError when decoding, typed or
    not, and when encoding."""
    deep = b"\x91" * 100_000 + b"\x01"
    for body in (msgspec.msgpack.encode({"x": 1, "data": b"", "note": ""})[:-1] + deep,
                 b"\x84" + msgspec.msgpack.encode("blob") + deep):
        with pytest.raises(SchemaError):
            SCHEMA.unpack_args(body, [])
    with pytest.raises(SchemaError, match="nested too deeply"):
        VARIADIC.unpack_result(deep, [])
    with pytest.raises(SchemaError, match=r"Target\.variadic.*nested too deeply"):
        VARIADIC.unpack_args(b"\x82\xa6kwargs\x80\xa4args" + deep, [])
    nested: list[Any] = []
    for _ in range(5000):
        nested = [nested]
    with pytest.raises(SchemaError, match=r"Target\.method.*nested too deeply"):
        SCHEMA.pack_call((1, b"", "", nested), {}, Packer())


# ------------------------------------------------- validation before pickles

#: what the reconstruction of a :class:`Tripwire` recorded: proof that it ran
TRIPPED: list[str] = []


def _trip(tag: str) -> str:
    TRIPPED.append(tag)
    return tag


class Tripwire:
    """Pickled wherever it is sent; unpickling it leaves a record behind."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __reduce__(self) -> tuple[Any, ...]:
        return (_trip, (self.tag,))


_SIZES = st.sampled_from([0, 10, OOB_THRESHOLD, 70_000])


def received(kwargs: dict[str, Any], cut_at: list[int]) -> tuple[M.Call, list[Any]]:
    """The call of ``Target.method`` with ``kwargs`` as its receiver gets it:
    encoded by the sender's code, its frame parsed by a connection."""
    packer = Packer()
    body = SCHEMA.pack_call((), kwargs, packer)  # the sender pickles what it cannot encode
    msg = M.encode_message(M.Call(1, "t", "method", msgspec.Raw(body)))
    frame = frame_header(len(msg), packer) + msg + b"".join(
        bytes(memoryview(b)) for b, _ in packer)
    with small_limits():
        rt = FakeRuntime()
        conn, transport = connect(rt)
        feed(conn, transport, frame, cut_at)
        finish(rt, [conn])
    [(call, bufs)] = rt.got
    assert isinstance(call, M.Call) and len(bufs) == len(packer)
    return call, bufs


@FUZZ
@given(data_size=_SIZES, note_size=_SIZES, ascii_note=st.booleans(),
       blob=st.sampled_from(["none", "tripwire", "bytes"]), x_first=st.booleans(),
       cut_at=st.lists(st.integers(0, 200_000), max_size=6))
def test_typed_argument_is_validated_before_any_pickle(
        data_size: int, note_size: int, ascii_note: bool, blob: str, x_first: bool,
        cut_at: list[int]) -> None:
    """issue 15 item 4: a pickle in the natively typed argument ``x: int``
    fails the call with a SchemaError naming ``$.x`` before anything in the
    message is unpickled, whether or not the frame carries out-of-band
    buffers (big ``bytes``, ASCII or other ``str``, pickles), wherever the
    pickle is among the arguments and however the frame arrives."""
    extra = {"none": None, "tripwire": Tripwire("blob"), "bytes": b"b" * 40_000}[blob]
    kwargs = {"x": Tripwire("x"), "data": b"d" * data_size,
              "note": ("n" if ascii_note else "é") * note_size, "blob": extra}
    if not x_first:
        kwargs = {k: kwargs[k] for k in ("data", "note", "blob", "x")}
    call, bufs = received(kwargs, cut_at)
    TRIPPED.clear()
    with pytest.raises(SchemaError, match=r"Expected `int`, got `(pickle|ext)` - at `\$\.x`"):
        SCHEMA.unpack_args(call.args, bufs)
    assert TRIPPED == []
    # the same arguments with a good x decode, the pickled blob included
    call, bufs = received({**kwargs, "x": 7}, cut_at)
    assert SCHEMA.unpack_args(call.args, bufs) == ((), {**kwargs, "x": 7, "blob": (
        "blob" if blob == "tripwire" else extra)})
    assert TRIPPED == (["blob"] if blob == "tripwire" else [])


class Checked(msgspec.Struct):
    """Its own check looks at a field that may hold a pickle."""

    extra: Any

    def __post_init__(self) -> None:
        if not isinstance(self.extra, Tripwire | str):
            raise ValueError(f"extra must be a Tripwire, got {type(self.extra).__name__}")


class Takes:
    def method(self, checked: Checked, data: bytes, y: int) -> None:
        raise NotImplementedError


def test_user_checks_see_unpickled_values() -> None:
    """issue 15 item 4: validating before unpickling never shows a stand-in
    for a pickle to user code: a Struct's ``__post_init__`` sees the value
    once unpickled (with a big buffer in the frame or without), and a bad
    typed argument beside it still fails before the pickle is unpickled."""
    schema = Schema(Takes.method, "Takes.method")
    for data in (b"", b"d" * 70_000):
        for y, error in ((1, None), ("one", r"got `str` - at `\$\.y`")):
            packer = Packer()
            body = schema.pack_call((Checked(Tripwire("c")), data, y), {}, packer)
            bufs = [bytes(memoryview(b)) for b, _ in packer]
            TRIPPED.clear()
            if error is None:
                assert schema.unpack_args(body, bufs)[1]["checked"] == Checked("c")
                assert TRIPPED == ["c"]
            else:
                with pytest.raises(SchemaError, match=error):
                    schema.unpack_args(body, bufs)
                assert TRIPPED == []
