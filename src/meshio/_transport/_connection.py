"""One connection to a peer process: reading frames (:mod:`._frames`) into
messages under the size limits and the per-process receive budget, sending
them, and the calls waiting for their answers (:class:`Pending`).

Nothing in a header is trusted before its data arrives: a message over the
size limit is skipped unread and its request failed (the connection stays);
the memory reserved for messages being received is bounded per process
(:class:`_ReceiveBudget`: a connection whose next message does not fit
pauses reading); a message that stops arriving drops its connection after
``frame_timeout`` seconds without data; see :func:`meshio.set_limits`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import struct
import sys
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar, cast

import msgspec

from .._exceptions import (
    CallTimeout,
    DeadlockError,
    MeshioError,
    ProcMeshTakenError,
    ProtocolError,
    RDMAError,
    RDMASizeError,
    SchemaError,
    SupervisionError,
    UnknownActorError,
    UnknownEndpointError,
    cell_names,
    new_actor_error,
    readable,
)
from ._bulk import Exports, exports_for, quarantine
from ._frames import (
    _DIRECT,
    _HDR,
    _LEN_MASK,
    _MEMORY_SCRATCH,
    _PEEK,
    _SCRATCH,
    MAX_BUFS,
    _allocate,
    _peek,
    frame_header,
    is_ascii,
    read_header,
    text_part,
)
from ._messages import (
    Answers,
    Call,
    Calls,
    Cancel,
    ErrorInfo,
    Fail,
    Fill,
    Filled,
    Hello,
    Message,
    PeerDown,
    Ping,
    Pong,
    PortSend,
    RdmaOp,
    Reply,
    SpawnActor,
    decode_message,
    encode_message,
)
from ._serial import (
    KIND_ASCII,
    KIND_BUFFER,
    KIND_BYTEARRAY,
    KIND_BYTES,
    MAX_BODY,
    Buffers,
    Handing,
    OutBuffers,
    limits,
)
from ._tasks import when_done

if TYPE_CHECKING:
    from ._credentials import Credentials
    from ._credit import Window
    from ._runtime import Runtime

__all__ = ("Connection", "Gathering", "Pending", "ReplyFuture", "Settle", "Slot",
           "blocked_loop", "call_repr", "error_from_info", "ignore_result", "lost_with_relay",
           "not_responding")

log = logging.getLogger("meshio")
T = TypeVar("T")
#: small frames written at once at most (header and body count one each):
#: a burst reaches the peer in pieces, which it starts on while the rest
#: are being made
_BATCH: Final = 32
#: consecutive small replies (or calls) framed together at most, written
#: then as a piece the peer starts on while the rest are made; and the
#: largest result (or arguments) that is (see :meth:`Connection.reply`)
_MERGED: Final = 32
_MERGED_MAX: Final = 1024

#: a frame with a buffer larger than this is written a slice at a time, as
#: the transport drains (``pause_writing``/``resume_writing``): under TLS
#: each slice is encrypted while the previous one is on the wire (not the
#: whole frame first), and no transport copies the whole frame
_SLICE: Final = 1 << 18

#: seconds between the beats of a connection that reads nothing for a while
#: (it waits for its receive budget): each beat is an unasked ``Pong``, since
#: the peer's heartbeats wait unread meanwhile
_BEAT: Final = 0.1
#: bytes read at most from a socket whose connection a failed write ended
#: (:meth:`Connection.connection_lost`): more than its receive buffer holds
_REST_MAX: Final = 16 << 20


class _ReceiveBudget:
    """The bytes this process has reserved for messages being received, over
    all its connections, bounded by ``limits.receive_budget``.  A message
    reserves its whole size when its header is read (so none waits holding
    part of the budget) and gives it back when it is delivered or its
    connection is lost.  One that does not fit waits, its connection paused,
    and is granted in arrival order; a message alone is always granted."""

    def __init__(self) -> None:
        self.used = 0
        self.waiting: deque[tuple[Connection, int]] = deque()

    def take(self, conn: Connection, size: int) -> bool:
        """Reserve ``size`` bytes now, or queue ``conn`` and return False."""
        if not self.waiting and (self.used == 0 or self.used + size <= limits.receive_budget):
            self.used += size
            return True
        self.waiting.append((conn, size))
        return False

    def give(self, size: int) -> None:
        """Return ``size`` bytes; grant waiting connections what now fits."""
        self.used -= size
        while self.waiting:
            conn, need = self.waiting[0]
            if self.used and self.used + need > limits.receive_budget:
                break
            self.waiting.popleft()
            self.used += need
            conn._held = need
            conn.rt.loop.call_soon(conn._resume)

    def forget(self, conn: Connection) -> None:
        """``conn`` is gone: drop it from the queue."""
        self.waiting = deque(w for w in self.waiting if w[0] is not conn)


_budget = _ReceiveBudget()


class Settle(Protocol):
    """Where an answer goes: an :class:`asyncio.Future`, or one actor's slot
    of a :class:`Gathering`."""

    def done(self) -> bool: ...
    def set_result(self, result: Any, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...
    def cancel(self, msg: Any | None = None) -> bool: ...


class Pending:
    """A call waiting for its reply: where the answer goes (settled through
    :meth:`set_result` and the other methods of a future), how to decode the
    result, and who was called (for error messages)."""

    __slots__ = ("_fut", "_point", "decode", "endpoint", "mesh")

    def __init__(
        self,
        fut: Settle,
        decode: Callable[[Any, Buffers], Any],
        endpoint: str,
        mesh: str,
        point: Any,
    ) -> None:
        self._fut: Settle = fut
        self.decode: Callable[[Any, Buffers], Any] = decode
        self.endpoint: str = endpoint
        self.mesh: str = mesh
        self._point = point

    @property
    def point(self) -> Any:
        """Who was called, for error messages."""
        return self._point

    @property
    def rank(self) -> int:
        """The callee's rank, when the call went to an actor (-1 otherwise)."""
        rank: int = getattr(self.point, "rank", -1)
        return rank

    @property
    def who(self) -> str:
        """Who was called, for error messages: an actor as ``<mesh> rank <r>``,
        its rank in its mesh as spawned (as :class:`~meshio.ActorError` and
        :attr:`rank` say; :attr:`point` is its point in the view called,
        a slice's own); anything else by its name and :attr:`point`."""
        rank = self.rank
        return f"{self.mesh} rank {rank}" if rank >= 0 else f"{self.mesh} {self.point}"

    @property
    def callee(self) -> str:
        """The address of the process called, where known ("": not known):
        another than the peer of the connection the call is on when a relay
        of the fan-out tree carries it (see :func:`lost_with_relay`)."""
        addr: str = getattr(self.point, "addr", "")
        return addr

    @property
    def proc(self) -> str:
        """The process called as its proc mesh names it, ``proc mesh 'wp'
        rank 1``, where known ("" otherwise)."""
        proc: str = getattr(self.point, "proc", "")
        return proc

    @property
    def target(self) -> str:
        """The actor mesh whose actor the call runs on, as a :class:`Cancel`
        of it names it ("": the call is not an actor's, nothing cancels it
        there)."""
        return ""

    def done(self) -> bool:
        return self._fut.done()

    def set_result(self, result: Any, /) -> None:
        self._fut.set_result(result)

    def set_exception(self, exception: BaseException, /) -> None:
        self._fut.set_exception(exception)

    def cancel(self, msg: Any | None = None) -> bool:
        return self._fut.cancel(msg)

    def fail(self, info: ErrorInfo) -> None:
        """The callee answered with an error."""
        self.set_exception(error_from_info(info, self))

    def begun(self) -> None:
        """The callee says the call has started running (:class:`Started`)."""

    def lent(self, read: asyncio.Future[None]) -> None:
        """The call's large arguments are read from this process's memory
        until ``read`` is done (:meth:`Connection.send`): its future, if
        cancelled meanwhile, is cancelled only then (:func:`~._tasks.when_done`), so
        that its caller may change them once the ``await`` ended.  (A future
        of the caller's own is left as is.)"""


#: the message a call's future is cancelled with when its deadline passed
#: (its callee is told so: :attr:`Cancel.expired`)
DEADLINE: Final = "meshio: the call's deadline passed"


class Gathering:
    """The answers of one ``call`` to every actor of a view, gathered without
    a future (and its callbacks) per actor: each actor's request is its
    :class:`Slot` (a :class:`Pending` of its own); :attr:`fut` completes when
    every slot is settled.  The values are in :attr:`values`, the failures
    in :attr:`errors`, both by index in the view."""

    __slots__ = ("_inflight", "abandoned", "errors", "finish", "fut", "left", "reads", "slots",
                 "target", "values")

    def __init__(self, loop: asyncio.AbstractEventLoop, target: str, inflight: list[int],
                 decode: Callable[[Any, Buffers], Any], endpoint: str, mesh: str,
                 points: Sequence[Any]) -> None:
        n = len(points)
        self.fut: asyncio.Future[Any] = _Gathered(loop, self)
        #: what :attr:`fut` is done with once every slot is settled (None: None)
        self.finish: Callable[[], Any] | None = None
        self.values: list[Any] = [None] * n
        self.errors: dict[int, BaseException] = {}
        self.left: int = n
        self.target: str = target
        self.slots: list[Slot] = [Slot(self, i, decode, endpoint, mesh, point)
                                  for i, point in enumerate(points)]
        self._inflight = inflight
        #: the caller gave up (its future is cancelled once ``reads`` are done)
        self.abandoned = False
        #: the calls' lent arguments still read (:meth:`Pending.lent`)
        self.reads: list[asyncio.Future[None]] | None = None
        if not n:
            self.fut.set_result(None)

    def outcome(self, finish: Callable[[], T]) -> asyncio.Future[T]:
        """A future done with ``finish()`` (or what it raises) once every
        slot is settled: no task in between.  Cancelling it abandons the
        gathering."""
        self.finish = finish
        if not self.left:  # (settled already: nothing called, or every call failed at once)
            self.fut = _Gathered(self.fut.get_loop(), self)
            self.settled()
        return self.fut

    def settled(self) -> None:
        """Every slot is settled."""
        fut = self.fut
        if fut.done() or self.abandoned:
            return
        if self.finish is None:
            fut.set_result(None)
        elif self.errors:  # judged a turn later: what a failure means (a hole?)
            fut.get_loop().call_soon(self._finished)  # is known by then (ProcState.hole)
        else:
            self._finished()

    def _finished(self) -> None:
        fut, finish = self.fut, self.finish
        if fut.done() or finish is None or self.abandoned:  # (cancelled meanwhile)
            return
        try:
            value = finish()
        except Exception as e:  # (the failures, combined)
            fut.set_exception(e)
        else:
            fut.set_result(value)

    def unsettled(self) -> list[int]:
        """The indices still waiting for an answer."""
        return [s.index for s in self.slots if not s.settled]

    def sent(self, conn: Connection, slots: Sequence[Slot]) -> None:
        """The requests of ``slots`` are in flight on ``conn``."""
        for req, s in enumerate(slots, conn.next_reqs(slots)):
            s.sent(conn, req)

    def abandon(self, msg: str | None = None) -> None:
        """The caller gave up (cancelled, timed out: ``msg`` is
        :data:`DEADLINE`): the callees still running the call drop or cancel
        it; later answers are ignored."""
        self.abandoned = True
        if self.left:
            for s in self.slots:
                s.cancel(msg)


class Slot(Pending):
    """One actor's request in a :class:`Gathering`: settling it fills its
    place in the gathering (no future)."""

    __slots__ = ("conn", "gathering", "index", "req", "settled")

    def __init__(self, gathering: Gathering, index: int, decode: Callable[[Any, Buffers], Any],
                 endpoint: str, mesh: str, point: Any) -> None:
        self.decode = decode
        self.endpoint = endpoint
        self.mesh = mesh
        self._point = point
        self.gathering = gathering
        self.index = index
        self.settled = False
        self.conn: Connection | None = None  # where its request is in flight
        self.req = 0

    @property
    def target(self) -> str:
        return self.gathering.target

    def sent(self, conn: Connection, req: int) -> None:
        """Its request is ``req`` on ``conn``."""
        self.conn, self.req = conn, req
        self.gathering._inflight[self.index] += 1

    def lent(self, read: asyncio.Future[None]) -> None:
        g = self.gathering
        if g.reads is None:
            g.reads = []
        g.reads.append(read)

    def done(self) -> bool:
        return self.settled

    def set_result(self, result: Any, /) -> None:
        self._settle(self.gathering.values, result)

    def set_exception(self, exception: BaseException, /) -> None:
        self._settle(self.gathering.errors, exception)

    def _settle(self, into: list[Any] | dict[int, BaseException], value: Any) -> None:
        if self.settled:
            raise asyncio.InvalidStateError(f"slot {self.index} is already settled")
        self.settled = True
        into[self.index] = value
        g = self.gathering
        g.left -= 1
        if self.conn is not None:
            g._inflight[self.index] -= 1
        if not g.left:
            g.settled()

    def cancel(self, msg: Any | None = None) -> bool:
        if self.settled:
            return False
        self.set_exception(asyncio.CancelledError(msg))
        conn = self.conn
        if conn is not None and conn.pending.pop(self.req, None) is not None:
            conn.send_cancel(Cancel(self.req, self.gathering.target, msg == DEADLINE))
        return True


class ReplyFuture(asyncio.Future[Any]):
    """What the adverbs return (``call``, ``call_one``, ``choose``): an
    ``asyncio.Future``, which Monarch's ``.get()`` reads for its value:
    asked for that, it says to ``await`` it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return call_repr(self, self.call_name())

    def call_name(self) -> str:
        """Which call this is the future of, for its repr."""
        return "meshio call"

    if not TYPE_CHECKING:
        # (Hidden from type checkers, which see an asyncio.Future; read only
        # for a name the future lacks, never on the way of a call.)
        def __getattr__(self, name):
            if name == "get":
                raise AttributeError(
                    "the future of a meshio call has no .get() (Monarch's blocking "
                    "spelling): it is an asyncio.Future: `await` it for its value, in an "
                    "`async def` (value = await mesh.endpoint.call_one(...))", name=name,
                    obj=self)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}",
                                 name=name, obj=self)


class _Gathered(ReplyFuture):
    """A :class:`Gathering`'s future: cancelling it (its caller gave up)
    abandons the gathering."""

    __slots__ = ("gathering",)

    def __init__(self, loop: asyncio.AbstractEventLoop, gathering: Gathering) -> None:
        super().__init__(loop=loop)
        self.gathering = gathering

    def call_name(self) -> str:
        slots = self.gathering.slots
        if not slots:
            return "meshio call of no actors"
        n = len(slots)
        return f"call of {slots[0].endpoint} on {slots[0].mesh!r} ({n} actor{'s' * (n != 1)})"

    def cancel(self, msg: Any | None = None) -> bool:
        if self.done():
            return False
        g = self.gathering
        g.abandon(msg)
        if not when_done(g.reads, functools.partial(super().cancel, msg)):
            super().cancel(msg)
        return True


def call_repr(fut: asyncio.Future[Any], call: str) -> str:
    """The repr of ``fut``, the future of ``call`` (``"call of G.greet on
    'g' (8 actors)"``): what it is, and that it is awaited (a call made
    without ``await`` shows it as a notebook cell's value).  Worked out
    when asked, not when the future is made (one per call)."""
    if fut.cancelled():
        return f"<{call}: cancelled>"
    if not fut.done():
        return f"<{call}: pending; await it for its value>"
    # (not exception(): it would count the error as seen, and silence
    # asyncio's report of a failed call nobody awaited)
    error: BaseException | None = getattr(fut, "_exception", None)
    if error is None:
        return f"<{call}: done; await it for its value>"
    return f"<{call}: failed ({type(error).__name__}); await it for the error>"


def ignore_result(raw: Any, bufs: Buffers) -> None:
    """The decoder of a call whose reply carries nothing (spawn, stop)."""
    return None


#: what a receiver takes between a frame whose large parts it waits for and
#: the sender's ``Filled`` (:mod:`._bulk`): they keep no order with frames
_AHEAD: Final = frozenset((Fill, Ping, Pong))


class _Gate:
    """In a connection's write queue, behind a frame whose large parts are
    written into the peer (:mod:`._bulk`): what follows waits until they
    are (``open``); ``done`` then (or once the connection ended)."""

    __slots__ = ("done", "eid", "open")

    def __init__(self, eid: int, done: asyncio.Future[None]) -> None:
        self.eid = eid
        self.done = done
        self.open = False


class _Frame:
    """A frame being received: its parts (``kind << 56 | length``, the body
    first) and those received so far."""

    __slots__ = ("got", "parts")

    def __init__(self, parts: tuple[int, ...]) -> None:
        self.parts = parts
        self.got: Buffers = []


class Connection(asyncio.BufferedProtocol):
    """One connection to a peer process; both sides may send requests."""

    def __init__(self, rt: Runtime, peer: str | None) -> None:
        self.rt = rt
        self.peer = peer
        #: the peer as its handshake showed it (pid and uid, or host and
        #: port), for log lines until its Hello names its address
        self.origin = "unidentified peer"
        self.peer_pid = -1
        self.worker = ""
        #: where the peer listens, as its Hello says (a replacement worker:
        #: not at :attr:`peer`, the address it answers to)
        self.listen = ""
        self.transport: asyncio.Transport | None = None
        self.closed: bool = False
        #: a TCP connection's job: what it proved (None: Unix or in memory);
        #: an inspection client's credentials (``Runtime.listen_inspection``)
        self.job: Credentials | None = None
        self.pending: dict[int, Pending] = {}
        #: flow control (:mod:`._credit`), by actor: our calls to it over this
        #: connection; the peer's calls that left its mailbox, not given back yet
        self.windows: dict[str, Window] = {}
        self.taken: dict[tuple[str, str], int] = {}
        self._req = 0
        #: what is sent while it is dialled (None: up, accepted, or given up)
        self._backlog: list[bytes | Any] | None = [] if peer is not None else None
        #: aborted while it was dialled: it closes as it comes up (:meth:`abort`)
        self._aborted = False
        #: what waits for the transport to drain, in order (see _SLICE)
        self._queue: deque[bytes | memoryview | asyncio.Future[None] | _Gate] | None = None
        self._paused = False  # the transport asked us to stop writing
        #: the transport's ``(low, high)`` water marks while both are 0, so
        #: that it resumes us once it has sent everything (see :meth:`_drain`)
        self._marks: tuple[int, int] | None = None
        #: small frames sent in this turn of the loop and not written yet
        #: (None: none sent this turn; see :meth:`send`)
        self._batch: list[bytes] | None = None
        #: small replies (or calls: ``_merging`` says which) made after this
        #: turn's first frame, not framed yet (see :meth:`reply`)
        self._merged: list[Any] = []
        self._merging: type[Answers] | type[Calls] = Answers
        # the scratch buffer: none until data arrives (see _reserve)
        self._buf = bytearray()
        self._mv = memoryview(self._buf)
        self._start: int = 0
        self._end: int = 0
        #: where the last bytes that may start a Cancel frame are in the
        #: read being parsed (:meth:`cancel_follows`): -1 none, or not
        #: looked for yet (``_UNSCANNED``, after any position).  Below
        #: ``_start``: no Cancel follows (``ActorCell.post`` reads it so)
        self.cancel_at: int = _UNSCANNED
        self._frame: _Frame | None = None
        self._cur: memoryview | None = None
        self._cur_pos: int = 0
        self._text = False  # _cur is ASCII text, checked as it arrives ...
        self._text_ok = True  # ... and every byte so far was ASCII
        self._skip = 0  # bytes of a refused message still to come
        self._held = 0  # receive budget held by the frame being received
        self._waiting = False  # paused until the receive budget grants it
        self._beat: asyncio.TimerHandle | None = None  # while _waiting: see _BEAT
        self._rx = self._rx_seen = 0  # bytes received; as of the stall timer's start
        #: times the transport resumed our writing: it sent what it held, the peer reads
        self._resumed = 0
        self._socket = False  # a socket's (another process's), not in memory
        self._stall: asyncio.TimerHandle | None = None
        #: large values to and from a process of this host (:mod:`._bulk`)
        self.bulk: Exports | None = None
        #: a frame whose large parts the peer writes: ``(export id, parts)``,
        #: delivered on the peer's ``Filled``
        self._filling: tuple[int, Buffers] | None = None

    @property
    def who(self) -> str:
        """The peer, for log lines: its address, or as its handshake showed it."""
        return self.peer or self.origin

    # ------------------------------------------------------------ sending

    def next_req(self, pending: Pending) -> int:
        req = self._req = self._req + 1
        self.pending[req] = pending
        return req

    def next_reqs(self, pending: Sequence[Pending]) -> int:
        """Requests for all of ``pending``, numbered in order; the first."""
        first = self._req + 1
        self._req += len(pending)
        self.pending.update(zip(range(first, self._req + 1), pending))
        return first

    def send(self, body: bytes, out: OutBuffers) -> asyncio.Future[None] | None:
        """Send a frame.  Its large parts are read from this process's memory
        after this returns (written into a peer of this host, :mod:`._bulk`,
        or queued in slices): the future is done once they no longer are
        (the peer has them, or the connection ended); None when nothing is
        read later."""
        if self._merged:  # the replies or calls made before it go first
            self._frame_merged()
        lent = 0
        if out and self.bulk is not None:
            out, lent = self.bulk.export(out)
        header = frame_header(len(body), out)
        queued = None
        transport = self.transport
        if transport is not None:
            batch = self._batch
            if out or self._queue is not None:
                if batch:  # the small frames before it go first
                    self._write_batch(batch)
                queued = self._write([header, body, *(b for b, _ in out)],
                                     bool(out) and not lent)
            elif batch is None:
                # The first small frame of this turn of the loop goes out at
                # once (a lone call waits for nothing); those that follow it
                # in the same turn are written together, up to _BATCH at a
                # time: one system call and one wake-up of the peer for a
                # burst of calls or replies, instead of one each.
                transport.write(header + body)
                self._batch = []
                self.rt.batching(self)
            else:
                batch.append(header)
                batch.append(body)
                if len(batch) >= _BATCH:
                    self._write_batch(batch)
        elif self._backlog is not None:
            self._backlog.append(header)
            self._backlog.append(body)
            self._backlog.extend(b for b, _ in out)
        # else: closed; pending calls were failed by connection_lost
        if lent and transport is not None:
            return self._gate(lent)
        return queued

    def _gate(self, eid: int) -> asyncio.Future[None]:
        """Queue what is sent from now on behind the frame of export
        ``eid``, until its large parts are written into the peer
        (:meth:`filled`); a future done then."""
        gate = _Gate(eid, self.rt.loop.create_future())
        if self._queue is None:
            self._queue = deque()
        self._queue.append(gate)
        return gate.done

    def _first_gate(self) -> tuple[int, _Gate] | None:
        """Where in the write queue the first gate is, and the gate: that of
        the export whose frame the peer can have."""
        return next(((i, g) for i, g in enumerate(self._queue or ()) if isinstance(g, _Gate)),
                    None)

    def waiting_export(self) -> int:
        """The export whose parts the peer is to ask for next (0: none)."""
        first = self._first_gate()
        return 0 if first is None else first[1].eid

    def filled(self, written: bool) -> None:
        """The parts of :meth:`waiting_export` are in the peer
        (``written``), or it refused them: the frames behind them go, after
        a ``Filled`` if written."""
        _, gate = cast(tuple[int, _Gate], self._first_gate())  # (Exports.fill checked it)
        if written:
            self.send_control(Filled(gate.eid))
        gate.open = True
        self._drain()

    def send_control(self, msg: Fill | Filled | Ping | Pong) -> None:
        """Send ``msg`` ahead of the frames waiting behind this side's
        exports (:meth:`_gate`), right before the first gate: ``Fill``,
        ``Ping`` and ``Pong`` keep no order with other frames, and the peer
        may wait on a ``Fill`` to let its own frames go; ``Filled`` belongs
        there, between its export's frame and what follows it."""
        first = self._first_gate()
        if first is None:
            self.send_message(msg)
            return
        body = encode_message(msg)
        cast(deque[Any], self._queue).insert(first[0], frame_header(len(body), []) + body)
        self._drain()

    def send_message(self, msg: Message,
                     out: OutBuffers | None = None) -> asyncio.Future[None] | None:
        """:meth:`send` of ``msg``."""
        if type(out) is Handing:
            self.hands(out)
        return self.send(encode_message(msg), out or [])

    def hands(self, out: Handing) -> None:
        """The frame of ``out`` goes to this connection's peer: of the ports
        its value holds, those opened in this process count the peer among
        their holders now (its death before it decodes them ends their
        receivers as after; its own notice once it has, changes nothing).
        A closed connection sends nothing: nobody is counted."""
        rt = self.rt
        if self.closed or self.peer == rt.addr:  # (this process never counts itself)
            return
        for addr, port_id in out.ports:
            sink = rt.ports.get(port_id) if addr == rt.addr else None
            if sink is not None:
                sink._held(self)

    def hands_down(self, out: Handing, relay: str, callees: list[str]) -> tuple[int, ...]:
        """The tree message of ``out`` goes to this connection's peer, the
        relay at ``relay`` of the fan-out tree, for the processes at
        ``callees``: of the ports its value holds, those opened in this
        process count the relay among their holders now, as a process called
        (:meth:`hands`) if it is one of them, and for the others it relays
        to until it hands over those that hold them from then on
        (``PortSend.holders``: the processes that answered or were
        cancelled, or all a broadcast reached).  Returns their ids
        (``Fanout.ports``), none when it relays to no other."""
        rt = self.rt
        if self.closed or relay == rt.addr:  # (this process never counts itself)
            return ()
        if relay in callees:
            self.hands(out)
        if all(callee == relay for callee in callees):
            return ()
        ids: list[int] = []
        for addr, port_id in out.ports:
            sink = rt.ports.get(port_id) if addr == rt.addr else None
            if sink is not None:
                sink._relaying(self)
                ids.append(port_id)
        return tuple(ids)

    def send_cancel(self, msg: Cancel) -> None:
        """Send ``msg`` with the small frames written as this turn of the
        loop ends, never alone at once (as a turn's first frame goes): the
        Cancels of calls given up together (``cancel()`` on each, a gather
        cancelled) reach the actor in one write, so that a call queued
        behind the first does not start before its own Cancel is read."""
        if self._batch is None and self.transport is not None:
            self._batch = []
            self.rt.batching(self)
        self.send_message(msg)

    def reply(self, req: int, body: bytes, out: OutBuffers) -> asyncio.Future[None] | None:
        """Answer request ``req`` with the encoded value ``body`` (and its
        out-of-band buffers): :meth:`send` of a :class:`Reply`.  The first
        frame of a turn of the loop goes out at once, as any; small replies
        made after it in the same turn (a burst of calls served) are framed
        together, as one :class:`Answers` in order with the frames around
        them: the caller decodes one frame for them, not one each."""
        if type(out) is Handing:
            self.hands(out)
        if self._merge(Answers, (req, msgspec.Raw(body)), out, len(body)):
            return None
        return self.send(encode_message(Reply(req, msgspec.Raw(body))), out)

    def call(self, msg: Call, out: OutBuffers) -> asyncio.Future[None] | None:
        """:meth:`send` of ``msg`` (and its out-of-band buffers); small calls
        made after the first frame of a turn of the loop (a burst) are framed
        together, as one :class:`Calls`, as :meth:`reply` does."""
        if type(out) is Handing:
            self.hands(out)
        if self._merge(Calls, msg, out, len(msg.args)):
            return None
        read = self.send(encode_message(msg), out)
        if read is not None and msg.req:
            p = self.pending.get(msg.req)
            if p is not None:
                p.lent(read)
        return read

    def _merge(self, kind: type[Answers] | type[Calls], item: Any, out: OutBuffers,
               size: int) -> bool:
        """Merge a reply or call (``item``, of ``size`` bytes, with ``out``)
        with those before it in this turn, if it may be: small, without
        buffers, after this turn's first frame, and with no large frame still
        being written (it would overtake it); False if not (it goes alone)."""
        if out or self._batch is None or self._queue is not None or size > _MERGED_MAX:
            return False
        if self._merging is not kind:
            if self._merged:
                self._frame_merged()
            self._merging = kind
        merged = self._merged
        merged.append(item)
        if len(merged) >= _MERGED:  # a piece the peer starts on while the rest are made
            self._frame_merged()
            if self._batch:
                self._write_batch(self._batch)
        return True

    def _frame_merged(self) -> None:
        """Add the replies or calls merged (:meth:`reply`, :meth:`call`) to
        this turn's batch, as one frame."""
        merged, self._merged = self._merged, []
        batch = self._batch
        if batch is None or self.transport is None:
            return  # (closed meanwhile: its callers were failed)
        body = encode_message(Answers(merged, []) if self._merging is Answers else Calls(merged))
        batch.append(frame_header(len(body), []))
        batch.append(body)
        if len(batch) >= _BATCH:
            self._write_batch(batch)

    def _write(self, parts: list[Any], lent: bool) -> asyncio.Future[None] | None:
        """Write a frame's parts: at once, or queued in slices of ``_SLICE``
        bytes behind what already waits (:meth:`resume_writing`).  When some
        of them are ``lent`` (read from memory the sender owns), a future done
        once no part is read any more, or None if none is already."""
        queue = self._queue
        transport = cast(asyncio.Transport, self.transport)
        if queue is None:
            if all(memoryview(p).nbytes <= _SLICE for p in parts):
                transport.writelines(parts)
                if not lent or not transport.get_write_buffer_size():
                    return None
                parts = []  # the transport still holds some: wait until it has sent them
            queue = self._queue = deque()
        for p in parts:
            view = memoryview(p)
            if view.nbytes <= _SLICE:
                queue.append(p)
            else:
                queue.extend(view[i:i + _SLICE] for i in range(0, view.nbytes, _SLICE))
        if not lent:
            self._drain()
            return None
        written: asyncio.Future[None] = self.rt.loop.create_future()
        queue.append(written)
        self._drain()
        return None if written.done() else written

    def _drain(self) -> None:
        """Write queued slices until the transport asks us to pause.  A
        frame's future is done once the transport is empty: uvloop, TLS and
        the standard loop from Python 3.12 keep views of what they could not
        send yet, not copies, so until then they read the sender's memory.
        A gate (:meth:`_gate`) holds what follows it until it opens."""
        queue, transport = self._queue, self.transport
        while queue and not self._paused and transport is not None:
            item = queue[0]
            if isinstance(item, _Gate):
                if not item.open:  # its export is being written
                    return
                queue.popleft()
                item.done.set_result(None)
            elif not isinstance(item, asyncio.Future):
                queue.popleft()
                transport.write(item)
            elif transport.get_write_buffer_size():
                # water marks of 0: the transport pauses us now and resumes
                # us once it has sent everything (restored in resume_writing)
                self._marks = transport.get_write_buffer_limits()
                transport.set_write_buffer_limits(high=0, low=0)
                return
            else:
                queue.popleft()
                item.set_result(None)  # (only this connection settles it)
        if not queue:
            self._queue = None

    @property
    def writing_paused(self) -> bool:
        """The transport asked us to stop writing (the peer reads slower
        than we send): what is sent now waits in this process's memory."""
        return self._paused

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._resumed += 1
        if self._marks is not None and self.transport is not None:
            low, high = self._marks
            self._marks = None
            self.transport.set_write_buffer_limits(high=high, low=low)
        self._drain()

    def _write_batch(self, batch: list[bytes]) -> None:
        """Write the small frames of ``batch`` (this turn's so far) and empty it."""
        if self.transport is not None:
            self.transport.write(b"".join(batch))
        batch.clear()

    def write_batched(self) -> None:
        """Write what this turn has batched now: before the loop is held
        (code paused in a debugger on it), which would keep it unwritten."""
        if self._merged:
            self._frame_merged()
        if self._batch:
            self._write_batch(self._batch)

    async def flushed(self, timeout: float) -> None:
        """Write what this turn has batched now and wait (up to ``timeout``
        seconds) until everything written is in the kernel: before code that
        may end the process runs, so that the peer gets it anyway."""
        self.write_batched()
        loop = self.rt.loop
        deadline = loop.time() + timeout
        while (t := self.transport) is not None and (t.get_write_buffer_size()
                                                     or self._queue is not None):
            if loop.time() >= deadline:
                return
            await asyncio.sleep(0.001)  # (the loop writes as the socket drains)

    def flush(self) -> None:
        """The end of the turn (:meth:`Runtime.batching`): write what is
        batched; the next small frame goes out at once."""
        if self._merged:
            self._frame_merged()
        batch, self._batch = self._batch, None
        if batch:
            self._write_batch(batch)

    # ---------------------------------------------------------- lifecycle

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = stream = cast(asyncio.Transport, transport)  # a stream transport
        self.bulk = exports_for(stream)
        self._socket = stream.get_extra_info("socket") is not None  # (not in memory)
        if self._aborted:
            stream.abort()  # (its loss is reported as any connection's)
            return
        if self.peer is not None:  # we dialled: introduce ourselves first
            rt = self.rt
            self.send_message(Hello(rt.addr, os.getpid(), rt.worker,
                                    "" if rt.listening == rt.addr else rt.listening))
            backlog, self._backlog = self._backlog or [], None
            if backlog:
                stream.writelines(backlog)

    def connection_lost(self, exc: Exception | None) -> None:
        transport = self.transport
        self.closed = True
        self.transport = None
        if isinstance(exc, OSError) and transport is not None and self._socket:
            self._read_the_rest(transport)  # (the socket said the peer is gone)
        for item in self._queue or ():
            if isinstance(item, asyncio.Future):
                item.set_result(None)  # nothing of it is read any more
            elif isinstance(item, _Gate):
                item.done.set_result(None)
        self._queue = None
        self._batch = None
        self._merged = []
        if self._frame is not None or self._cur is not None or self._start != self._end:
            log.warning("meshio: truncated frame from %s (connection closed mid-frame)",
                        self.who)
        self._stop_receiving()
        self.rt._connection_lost(self, exc)

    def _read_the_rest(self, transport: asyncio.BaseTransport) -> None:
        """Read what the peer sent before it went.  A write that finds the
        peer gone (a broken pipe, a reset) makes the loop close the
        transport at once, without reading what the socket still holds: a
        reply, a ``Started`` (a call that killed its process would not count
        as running when it did), all written before the peer died.  The
        socket is still open here (both loops close it after this)."""
        if transport.get_extra_info("ssl_object") is not None:
            return  # (bytes under TLS: the record layer is gone with the transport)
        fd = transport.get_extra_info("socket").fileno()  # (a socket: self._socket)
        got = 0
        while got < _REST_MAX:
            try:
                n = os.readv(fd, [self.get_buffer(-1)])
            except OSError:  # nothing more (EAGAIN), or the reset after the data
                return
            if n == 0:
                return
            got += n
            self.buffer_updated(n)

    def fail_all(self, make_error: Callable[[Pending], BaseException], *,
                 cancel: bool = False) -> None:
        """Fail every call waiting on this connection; none may be left
        waiting, even if building its error goes wrong.  ``cancel``: the
        peer is still there but does not answer (stopped, hung): it is told
        to drop or cancel each call to an actor (:class:`Cancel`), as a
        caller that gave up does.  It reads that once it runs again, so a
        call failed here does not keep its actor busy, nor hold the calls
        queued behind it; the Cancels wait in the socket until then (one
        small frame per call), and go with the connection if it dies."""
        pending, self.pending = self.pending, {}
        cancels: list[Cancel] = []
        for req, p in pending.items():
            if p.done():
                continue
            try:
                error = make_error(p)
                callee = p.callee
                if callee and self.peer is not None and callee != self.peer:
                    # a relay of the fan-out tree carried it: the relay's
                    # failure, not that of the process called
                    error = lost_with_relay(p, error, self.peer, callee in self.rt.dead)
            except Exception as e:
                log.exception("meshio: building the error for %s failed", p.endpoint)
                error = SupervisionError(
                    f"{p.who}: connection to process {self.peer_pid} at "
                    f"{self.peer} lost while {p.endpoint} was in flight ({e!r} describing it)",
                    actor=p.mesh, rank=p.rank, pid=self.peer_pid, cause="connection lost")
            p.set_exception(error)
            if cancel and p.target:
                cancels.append(Cancel(req, p.target))
        # The last call first: an actor's calls queue in the order sent, so
        # the one it runs is cancelled once those behind it are dropped, and
        # none of them starts (more Cancels than one read takes, the rest
        # not read yet).
        for msg in reversed(cancels):
            self.send_cancel(msg)

    def abort(self) -> None:
        """Close at once.  One still being dialled sends nothing of what
        was queued for it (a re-attach given up: its ``Adopt`` never
        reaches the worker), and closes as it comes up; its calls fail
        then, or as its dial fails, as for any connection lost."""
        if self.transport is not None:
            self.write_batched()  # a last word (a Fail saying why) goes before the abort
            self.transport.abort()
        elif self._backlog is not None:
            self._backlog = None
            self._aborted = True

    # ---------------------------------------------------------- receiving

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._cur is not None:
            return self._cur[self._cur_pos:]
        if self._end == len(self._buf):
            self._reserve(len(self._buf) - self._start + 1)
        return self._mv[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        self._rx += nbytes
        rt = self.rt
        if self._socket:
            rt.heard()
        if self._cur is not None:
            pos = self._cur_pos
            self._cur_pos = pos + nbytes
            if self._text and self._text_ok:
                self._text_ok = is_ascii(self._cur[pos:self._cur_pos])
            if self._cur_pos < len(self._cur):
                return
            if not self._text_ok and self._frame is not None:  # not text after all
                self._frame.got[-1] = self._cur.tobytes()
            self._cur, self._text, self._text_ok = None, False, True
        else:
            self._end += nbytes
        rt.reading = True
        try:
            self._run_parse()
        finally:
            # The calls it brought for idle actors run now, once every
            # message it brought is in (a Cancel behind a call drops it, as
            # for a call queued behind a busy actor: ActorCell.post), and
            # what they answered goes out now, not after a callback at the
            # end of the turn (Runtime.batching).
            while rt.admitted:  # (again for calls those posted here meanwhile)
                admitted, rt.admitted = rt.admitted, []
                for serve in admitted:
                    try:
                        serve()
                    except Exception:  # (a bug: the other actors' calls are served all the same)
                        log.exception("meshio: serving the calls a read brought failed")
            rt.reading = False
            if rt.batched:
                rt.end_turn()

    def _run_parse(self) -> None:
        try:
            self._parse()
        except ProtocolError as e:
            log.warning("meshio: %s; dropping connection from %s", e,
                        self.who)
            self.send_message(Fail(0, ErrorInfo("protocol", "ProtocolError", str(e))))
            self.abort()
            return
        finally:
            self.cancel_at = _UNSCANNED  # (the next read's bytes are looked at anew)
        if self._stall is None and self.incomplete() and not self.closed:
            self._rx_seen = self._rx
            self._stall = self.rt.loop.call_later(limits.frame_timeout, self._check_stall)

    def cancel_follows(self) -> bool:
        """Whether a :class:`Cancel` may follow in the read being parsed,
        after the message just delivered: a call it brought for an idle
        actor then waits for the read's end (``ActorCell.post``), else it
        runs at once.  The read's bytes are searched once, in C, for those
        a Cancel frame starts with (:attr:`cancel_at`); bytes that only
        look like them make a call wait, no Cancel is missed.  (Waiting
        for each read's end cost a call of 1,000 in flight ~3% more
        instructions than this: ``benchmarks/README.md``.)"""
        at = self.cancel_at
        if at == _UNSCANNED:
            at = self.cancel_at = self._buf.rfind(_CANCEL_START, self._start, self._end)
        return at >= self._start

    @property
    def sending(self) -> bool:
        """Something is queued to be written (large frames go out in slices)."""
        return self._queue is not None

    def incomplete(self) -> bool:
        """A frame is partly received, or waits for its large parts (its
        stall timer runs)."""
        return (self._frame is not None or self._start != self._end or self._skip > 0
                or self._filling is not None)

    @property
    def receiving(self) -> tuple[int, int, bool]:
        """What receiving holds now: the scratch buffer's size, the receive
        budget held for the frame under way, and whether anything of a
        frame is held at all (a part, text being checked); the decoder
        tests check these stay bounded and come back to nothing."""
        busy = (self._end != 0 or self._frame is not None or self._cur is not None
                or self._text or not self._text_ok)
        return len(self._buf), self._held, busy

    def _check_stall(self) -> None:
        """Drop a connection whose message stopped arriving (no data for a
        whole ``frame_timeout``, while it was not paused by us)."""
        timer, self._stall = self._stall, None
        if self.closed or not self.incomplete():
            return
        # a timer that fires late found this loop blocked, not the peer idle
        late = timer is not None and (
            self.rt.loop.time() - timer.when() > limits.frame_timeout / 2)
        if self._waiting or late or self._rx != self._rx_seen:
            self._rx_seen = self._rx
            self._stall = self.rt.loop.call_later(limits.frame_timeout, self._check_stall)
            return
        log.warning("meshio: a message from %s stopped arriving (no data for %g s, "
                    "meshio.set_limits(frame_timeout=...)); dropping the connection",
                    self.who, limits.frame_timeout)
        self.abort()

    @property
    def reading_paused(self) -> bool:
        """Whether this side reads nothing from the peer for now (it waits
        for its receive budget): the peer's answers to heartbeats wait
        unread meanwhile."""
        return self._waiting

    def _pause(self) -> None:
        """Read nothing until :meth:`_resume`, beating meanwhile."""
        self._waiting = True
        if self.transport is not None:
            self.transport.pause_reading()
        if self._beat is None:
            self._beat = self.rt.loop.call_later(_BEAT, self._alive)

    def _alive(self) -> None:
        """A beat while paused: this loop runs, though it reads no ``Ping``."""
        self._beat = None
        if self._waiting and not self.closed:
            self.send_message(Pong(0))
            self._beat = self.rt.loop.call_later(_BEAT, self._alive)

    def _resume(self) -> None:
        """The receive budget granted the message this connection waits for."""
        self._waiting = False
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None
        if self.closed:
            return
        self._run_parse()
        transport = self.transport
        if not self._waiting and transport is not None and not transport.is_closing():
            transport.resume_reading()

    def _land(self, f: _Frame) -> int | None:
        """:meth:`_bulk.Exports.land` of a complete frame; only one at a
        time waits for its parts (the peer sends nothing else until then)."""
        if self._filling is not None and any(d >> 56 > KIND_BUFFER for d in f.parts):
            raise ProtocolError(f"malformed frame (large parts before those of export "
                                f"{self._filling[0]} were written)")
        return cast(Exports, self.bulk).land(self, f.parts, f.got)

    def _stop_receiving(self) -> None:
        """The connection is gone: give back what its message held."""
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        if self._waiting:
            _budget.forget(self)
            self._waiting = False
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None
        if self._held:
            _budget.give(self._held)
            self._held = 0
        filling, self._filling = self._filling, None
        if self.bulk is not None:
            if filling is not None:  # the peer may still write into its parts
                quarantine(self.rt.loop, self.bulk.pid, filling[1])
            self.bulk.close()

    def _reserve(self, need: int) -> None:
        """Make room for ``need`` bytes from ``_start`` in the scratch buffer.
        A new one is not zeroed: its memory is committed only as data
        arrives, so an idle connection holds little (and none before its
        first message).  An in-memory connection's starts small."""
        avail = self._end - self._start
        if need <= len(self._buf) - self._start:
            return
        if need <= len(self._buf) and self._start:
            self._buf[:avail] = self._buf[self._start:self._end]
        else:
            first = _SCRATCH if self._socket else _MEMORY_SCRATCH
            bigger, view = _allocate(KIND_BYTEARRAY, max(need, 2 * len(self._buf), first))
            view[:avail] = self._mv[self._start:self._end]
            self._buf, self._mv = bigger, view
        self._start, self._end = 0, avail

    def _parse(self) -> None:
        while True:
            if self._skip:  # the rest of a refused message
                k = min(self._end - self._start, self._skip)
                self._start += k
                self._skip -= k
                if self._skip:
                    break
            f = self._frame
            if f is None:
                before = self._start
                avail = self._end - before
                if avail < 8:  # no header yet
                    break
                # fast path: a small frame without buffers, all here
                body_len, nbufs = read_header(self._buf, before)
                if not nbufs and body_len <= avail - 8 and body_len <= limits.max_message:
                    self._start = before + 8 + body_len
                    self.deliver(bytes(self._mv[before + 8:self._start]), [])
                    continue
                f = self._header()
                if f is None:
                    if self._start != before:  # refused: skip it
                        continue
                    break
                self._frame = f
            if not self._receive(f):
                break
            self._frame = None
            if self._held:
                held, self._held = self._held, 0
                _budget.give(held)
            landing = None if self.bulk is None else self._land(f)
            if landing is None:
                self.deliver(f.got[0], f.got[1:])
            elif landing:  # the peer writes its large parts: delivered on its Filled
                self._filling = (landing, f.got)
        if self._start == self._end:
            self._start = self._end = 0
            if len(self._buf) > _SCRATCH:  # given back after a large header
                self._buf = bytearray()
                self._mv = memoryview(self._buf)

    def _header(self) -> _Frame | None:
        """The next frame (its 8-byte start is in), once the rest of its
        header is in and memory is reserved for it; None while waiting (or
        after refusing one over the limit)."""
        start = self._start
        avail = self._end - start
        body_len, nbufs = read_header(self._buf, start)
        if body_len > MAX_BODY or nbufs > MAX_BUFS:
            raise ProtocolError(
                f"malformed frame header (body {body_len} bytes, {nbufs} buffers)")
        need = 8 + 8 * nbufs
        if avail < need:
            self._reserve(need)
            return None
        descs = struct.unpack_from(f"<{nbufs}Q", self._buf, start + 8) if nbufs else ()
        if any(d >> 56 > KIND_BUFFER for d in descs) and (
                self.bulk is None or not self.bulk.described(descs)):
            raise ProtocolError("malformed frame header (unknown buffer kind)")
        size = body_len + sum(d & _LEN_MASK for d in descs)
        if size > limits.max_message:
            peek = min(body_len, _PEEK)
            if avail < need + peek:
                self._reserve(need + peek)
                return None
            self._start = start + need + peek
            self._skip = size - peek
            self._refuse(bytes(self._mv[start + need:start + need + peek]), size)
            return None
        if size > _SCRATCH and not self._held:
            if self._waiting or not _budget.take(self, size):
                self._pause()
                return None
            self._held = size
        self._start = start + need
        return _Frame(((KIND_BYTES << 56) | body_len, *descs))

    def _receive(self, f: _Frame) -> bool:
        """Take the frame's parts from the scratch buffer; a large part not
        all there is received straight into its own object.  True once the
        frame is complete."""
        got, parts = f.got, f.parts
        while len(got) < len(parts):
            d = parts[len(got)]
            kind, n = d >> 56, d & _LEN_MASK
            start = self._start
            avail = self._end - start
            if n <= avail:
                part = self._mv[start:start + n]
                got.append(text_part(part) if kind == KIND_ASCII else bytearray(part)
                           if kind in (KIND_BYTEARRAY, KIND_BUFFER) else bytes(part))
                self._start = start + n
                continue
            if n < _DIRECT:
                self._reserve(n)
                return False
            try:
                target, tmv = _allocate(kind, n)
            except (MemoryError, OverflowError) as e:
                raise ProtocolError(f"cannot allocate a {n}-byte buffer for a message "
                                    f"({type(e).__name__})") from None
            tmv[:avail] = self._mv[start:self._end]
            self._start = self._end
            got.append(target)
            self._cur, self._cur_pos = tmv, avail
            self._text = kind == KIND_ASCII
            self._text_ok = not self._text or is_ascii(tmv[:avail])
            return False
        return True

    def _malformed(self, body: bytes, e: Exception) -> None:
        """Answer a message that does not decode: fail the request or call it
        is recognisably about, else report it (``Fail`` with ``req`` 0)."""
        deep = isinstance(e, RecursionError)
        why = f"malformed message: {'nested too deeply: ' if deep else ''}{e}"
        log.warning("meshio: %s from %s", why, self.who)
        tag, req = _peek(body[:_PEEK]) or (0, 0)
        if tag in _REQUESTS and req:
            self.send_message(Fail(req, ErrorInfo("schema", "SchemaError", why) if deep
                                   else ErrorInfo("protocol", "ProtocolError", why)))
        elif tag in _ANSWERS and req in self.pending:
            p = self.pending.pop(req)
            if not p.done():
                p.set_exception(ProtocolError(
                    f"the answer to {p.endpoint} [{p.who}] is a {why}"))
        else:
            self.send_message(Fail(0, ErrorInfo("protocol", "ProtocolError", why)))

    def _refuse(self, prefix: bytes, size: int) -> None:
        """Answer a message over the size limit, which is skipped unread: fail
        the request it carries, or the call or port it answers."""
        head = _peek(prefix)
        if head is None:
            raise ProtocolError(f"malformed frame (a {size}-byte message, over the limit, "
                                "whose body is not a message)")
        tag, req = head
        why = (f"a message of {size} bytes is over the message size limit of "
               f"{limits.max_message} bytes of process {os.getpid()}; raise it with "
               "meshio.set_limits(max_message=...) or MESHIO_MAX_MESSAGE, or send less at a time")
        log.warning("meshio: skipped a message from %s unread: %s",
                    self.who, why)
        if tag in _REQUESTS:
            if req:
                self.send_message(Fail(req, ErrorInfo("schema", "SchemaError", why)))
        elif tag in _ANSWERS:
            p = self.pending.pop(req, None)
            if p is not None and not p.done():
                p.set_exception(SchemaError(
                    f"the answer to {p.endpoint} [{p.who}] was skipped: {why}"))
        elif tag == _PORT_SEND:
            receiver = self.rt.ports.get(req)
            if receiver is not None:
                receiver._put_error(SchemaError(f"a value for port {req} was skipped: {why}"))

    def deliver(self, body: bytes, bufs: Buffers) -> None:
        try:
            msg = decode_message(body)
        except Exception as e:
            self._malformed(body, e)
            return
        if self._filling is not None and type(msg) not in _AHEAD:
            self._filled(msg)
            return
        if type(msg) is Reply:
            self._reply(msg.req, msg.value, bufs)
            return
        if type(msg) is Fail:
            if msg.req == 0:
                log.warning("meshio: peer %s reported: %s", self.peer, msg.error.message)
                return
            self._fail(msg.req, msg.error)
            return
        if type(msg) is Answers:
            for req, value in msg.replies:
                self._reply(req, value, [])
            for req, error in msg.fails:
                self._fail(req, error)
            return
        try:
            self.rt.dispatch(self, msg, bufs)
        except Exception:  # one message's handler failed; the connection serves on
            log.exception("meshio: handling %s from %s failed", type(msg).__name__,
                          self.who)

    def _filled(self, msg: Message) -> None:
        """``msg`` came while a frame waits for its large parts: the
        sender's ``Filled``, which delivers that frame, or a breach."""
        eid, got = cast(tuple[int, Buffers], self._filling)
        if type(msg) is not Filled or msg.export != eid:
            raise ProtocolError(f"malformed stream (a {type(msg).__name__} before the large "
                                f"parts of export {eid} were written)")
        self._filling = None
        self.deliver(got[0], got[1:])

    def _reply(self, req: int, value: Any, bufs: Buffers) -> None:
        p = self.pending.pop(req, None)
        if p is not None and not p.done():
            try:
                p.set_result(p.decode(value, bufs))
            except MeshioError as e:
                e.args = (f"{e} (from {p.who})",)
                p.set_exception(e)
            except Exception as e:  # this call fails; the connection serves on
                p.set_exception(SchemaError(
                    f"the answer to {p.endpoint} from {p.who} cannot be "
                    f"decoded: {type(e).__name__}: {e}"))

    def _fail(self, req: int, error: ErrorInfo) -> None:
        p = self.pending.pop(req, None)
        if p is not None and not p.done():
            p.fail(error)


_REQUESTS: Final = frozenset(c.__struct_config__.tag for c in (Call, SpawnActor, RdmaOp))
_ANSWERS: Final = frozenset(c.__struct_config__.tag for c in (Reply, Fail))
_PORT_SEND: Final = PortSend.__struct_config__.tag
#: the bytes every Cancel frame has from its header's count of buffers
#: (none) on: its body's array header and tag (array_like, every field
#: encoded: the same for every Cancel)
_CANCEL_START: Final = _HDR.pack(0, 0)[4:] + encode_message(Cancel(0, ""))[:2]
_UNSCANNED: Final[int] = sys.maxsize


def error_from_info(info: ErrorInfo, p: Pending | None) -> MeshioError:
    where = f" [{p.who}]" if p is not None else ""
    match info.kind:
        case "actor":  # (its texts cut where raised; a peer that did not, cut here)
            message, tb = readable(info.message), cell_names(readable(info.traceback))
            endpoint = p.endpoint if p else "?"
            what = "constructor" if endpoint.endswith(".__init__") else "endpoint"
            return new_actor_error(
                f"{info.type_name}: {message}\n  in {info.actor} rank {info.rank}, "
                f"{what} {endpoint}\n\nRemote traceback:\n{tb}",
                remote_type=info.type_name, remote_bases=info.bases, remote_message=message,
                remote_traceback=tb, actor=info.actor, rank=info.rank,
                endpoint=p.endpoint if p else "")
        case "schema":  # (a receiver skipping a message over its limit has not read
            # which endpoint it was for: the caller names it)
            if p is not None and p.endpoint and p.endpoint not in info.message:
                return SchemaError(f"{p.endpoint}: {info.message}{where}")
            return SchemaError(info.message + where)
        case "unknown_actor":
            return UnknownActorError(info.message + where)
        case "unknown_endpoint":
            return UnknownEndpointError(info.message + where)
        case "deadlock":
            return DeadlockError(info.message + where)
        case "rdma":
            cls = RDMASizeError if info.type_name == "RDMASizeError" else RDMAError
            return cls(info.message + where)
        case "supervision":  # (the callee's actor and rank, else the caller's: it may have none)
            # (a kept-alive worker refusing a re-attach: it serves another controller)
            sup = ProcMeshTakenError if info.type_name == "ProcMeshTakenError" \
                else SupervisionError
            return sup(
                info.message + where, actor=info.actor or (p.mesh if p else ""),
                rank=info.rank if info.rank >= 0 or p is None else p.rank, cause=info.message)
        case "protocol":
            return ProtocolError(info.message + where)
        case "timeout":
            return CallTimeout(info.message + where, endpoint=p.endpoint if p else "",
                               ranks=[p.rank] if p else [])


def lost_with_relay(p: Pending, relay: BaseException, addr: str, down: bool
                    ) -> SupervisionError:
    """The error of the call ``p`` that a relay of the fan-out tree (the
    process at ``addr``) carried, or was to carry, when the relay failed
    with ``relay`` (what a call to the relay itself gets): it names the
    relay as such, and the process called (``down``: known down too, else
    not seen to fail) as its own."""
    if not isinstance(relay, SupervisionError):
        what = f"the process at {addr}: {type(relay).__name__}: {relay}"
    elif relay.pid > 0:  # (a relay's peer may not know it)
        what = f"process {relay.pid} on {relay.host or addr}: {relay.cause or relay}"
    else:
        what = f"the process at {addr}: {relay.cause or relay}"
    own = f"rank {p.rank}'s own process" if p.rank >= 0 else f"its own process ({p.callee})"
    own += (" is down too" if down else " was not seen to fail (call again: the next call "
            "goes round the relay)")
    return SupervisionError(
        f"{p.who}: {p.endpoint} was lost with the fan-out relay that carried "
        f"it ({what}); {own}", actor=p.mesh, rank=p.rank, cause="lost with its fan-out relay")


def disconnected(peer: str, pid: int, host: str, cause: str
                 ) -> Callable[[Pending], SupervisionError]:
    """What the calls in flight to the process at ``peer`` (``pid`` on
    ``host``) get when its connection is lost (``cause``: "connection
    lost", with the exception that ended it if one did) where nothing
    watching the process says why: a worker's actors calling those of
    another proc mesh, whose exit status only the process that spawned it
    knows (the controller, which says so; its supervisor acts on it).  It
    names who was called, its process by its proc mesh and rank where known
    (else by its address), and guesses no cause."""
    said = "connection closed" if cause == "connection lost" else cause

    def error(p: Pending) -> SupervisionError:
        proc = p.proc
        if proc:
            where = f" on {proc}: process {pid} on {host}"
            why = ("; the owner of the proc mesh reports why, and its supervisor, if any, "
                   "restarts it")
        else:
            where, why = f": process {pid} at {peer} on {host}", ""
        return SupervisionError(
            f"{p.who}{where}: {said} while {p.endpoint} was in flight (the process exited "
            f"or was killed{why})", actor=p.mesh, rank=p.rank, host=host, pid=pid, cause=cause)
    return error


def blocked_loop(endpoint: str = "") -> str:
    """The likely cause of a process that runs but answers no heartbeat,
    and its fix (the end of every "not responding" message); ``endpoint``:
    the call in flight there, the first suspect."""
    suspect = f" ({endpoint}, in flight there, if it is one)" if endpoint else ""
    return (f"its event loop is likely blocked by an `async def` endpoint that does not "
            f"await{suspect}: time.sleep, CPU-bound work or a torch.distributed collective "
            f"(DDP's constructor too) in one holds the loop that answers heartbeats; make "
            f"such an endpoint a plain `def` (it runs in the actor's thread) or "
            f"`await asyncio.to_thread(...)` its blocking part")


def not_responding(down: PeerDown, now: Callable[[], float], *, in_flight: bool
                   ) -> Callable[[Pending], SupervisionError]:
    """What callers of the process ``down`` describes get while it does not
    answer heartbeats (``now``: a clock in seconds, for how long so far):
    calls in flight when that was found, or (``in_flight=False``) calls made
    afterwards, which are not sent; for a process ``down.gone`` (its host
    downed), that it is down and why."""
    since = now() - down.silent

    def error(p: Pending) -> SupervisionError:
        if down.gone:
            return SupervisionError(
                f"{p.who} on proc mesh {down.mesh!r} rank {down.rank}: process "
                f"{down.pid} on {down.host} is down ({down.gone}); {p.endpoint} "
                f"{'was in flight' if in_flight else 'was not sent'}", actor=p.mesh,
                rank=p.rank, host=down.host, pid=down.pid, cause="partitioned")
        cause = f"not responding for {now() - since:.1f} s"
        what = (f"while {p.endpoint} was in flight" if in_flight
                else f"so {p.endpoint} was not sent")
        return SupervisionError(
            f"{p.who} on proc mesh {down.mesh!r} rank {down.rank}: process "
            f"{down.pid} on {down.host} {cause} (no heartbeat answer; "
            f"heartbeat_timeout={round(down.timeout, 6)} s) {what}; it is not killed (no "
            f"supervisor): calls work again once it answers. If it runs, "
            f"{blocked_loop(p.endpoint if in_flight else '')}",
            actor=p.mesh, rank=p.rank, host=down.host, pid=down.pid, cause=cause)
    return error
