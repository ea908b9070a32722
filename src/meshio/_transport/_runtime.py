"""The per-event-loop runtime: a listening Unix socket, one connection per
peer process, length-prefixed frames (:mod:`._frames`) with out-of-band
buffers, and the dispatch table the layers above register handlers in.

The body of a frame is one control message (:mod:`._messages`).  Buffers (and a large
body) are received straight into freshly allocated ``bytearray``/``bytes``
objects (no copy out of a staging buffer for large payloads).

Nothing in a header is trusted before its data arrives: a message over the
size limit is skipped unread and its request failed (the connection stays);
the memory reserved for messages being received is bounded per process
(:class:`_ReceiveBudget`: a connection whose next message does not fit
pauses reading); a message that stops arriving drops its connection after
``frame_timeout`` seconds without data; see :func:`meshio.set_limits`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import struct
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar, Final, Protocol, TypeVar, cast

from .._constants import MSGPACK_NIL
from .._exceptions import (
    ActorError,
    AuthenticationError,
    DeadlockError,
    MeshioError,
    ProtocolError,
    RDMAError,
    RDMASizeError,
    SchemaError,
    SupervisionError,
    UnknownActorError,
    UnknownEndpointError,
)
from ._frames import (
    _DIRECT,
    _HDR,
    _LEN_MASK,
    _PEEK,
    _SCRATCH,
    MAX_BUFS,
    _allocate,
    _peek,
    frame_header,
)
from ._handshake import HANDSHAKE_TIMEOUT, HandshakeProtocol, new_secret
from ._messages import (
    Call,
    Cancel,
    ErrorInfo,
    Fail,
    Fault,
    Hello,
    Message,
    PeerDown,
    PeerUp,
    Ping,
    Pong,
    PortSend,
    RdmaOp,
    Reply,
    Restored,
    Shutdown,
    SpawnActor,
    StopActor,
    _Msg,
    decode_message,
    encode_message,
)
from ._serial import KIND_BYTES, MAX_BODY, Buffers, OutBuffers, limits

__all__ = ("Connection", "Pending", "Runtime", "close_runtime", "ignore_result", "runtime")

log = logging.getLogger("meshio")

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


class Pending:
    """A call waiting for its reply: the future, how to decode the result,
    and who was called (for error messages)."""

    __slots__ = ("decode", "endpoint", "fut", "mesh", "point")

    def __init__(
        self,
        fut: asyncio.Future[Any],
        decode: Callable[[Any, Buffers], Any],
        endpoint: str,
        mesh: str,
        point: Any,
    ) -> None:
        self.fut: asyncio.Future[Any] = fut
        self.decode: Callable[[Any, Buffers], Any] = decode
        self.endpoint: str = endpoint
        self.mesh: str = mesh
        self.point: Any = point

    @property
    def rank(self) -> int:
        """The callee's rank, when the call went to an actor (-1 otherwise)."""
        rank: int = getattr(self.point, "rank", -1)
        return rank


def ignore_result(raw: Any, bufs: Buffers) -> None:
    """The decoder of a call whose reply carries nothing (spawn, stop)."""
    return None


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
        self.peer_pid = -1
        self.worker = ""
        self.transport: asyncio.Transport | None = None
        self.closed: bool = False
        self.pending: dict[int, Pending] = {}
        self._req = 0
        self._backlog: list[bytes | Any] | None = [] if peer is not None else None
        self._buf = bytearray(_SCRATCH)
        self._mv = memoryview(self._buf)
        self._start: int = 0
        self._end: int = 0
        self._frame: _Frame | None = None
        self._cur: memoryview | None = None
        self._cur_pos: int = 0
        self._skip = 0  # bytes of a refused message still to come
        self._held = 0  # receive budget held by the frame being received
        self._waiting = False  # paused until the receive budget grants it
        self._rx = self._rx_seen = 0  # bytes received; as of the stall timer's start
        self._stall: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ sending

    def next_req(self, pending: Pending) -> int:
        self._req += 1
        self.pending[self._req] = pending
        return self._req

    def send(self, body: bytes, out: OutBuffers) -> None:
        header = frame_header(len(body), out)
        if self.transport is not None:
            if out:
                self.transport.writelines([header, body, *(b for b, _ in out)])
            else:
                self.transport.write(header + body)
        elif self._backlog is not None:
            self._backlog.append(header)
            self._backlog.append(body)
            self._backlog.extend(b for b, _ in out)
        # else: closed; pending calls were failed by connection_lost

    def send_message(self, msg: Message, out: OutBuffers | None = None) -> None:
        self.send(encode_message(msg), out or [])

    # ---------------------------------------------------------- lifecycle

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = stream = cast(asyncio.Transport, transport)  # a stream transport
        if self.peer is not None:  # we dialled: introduce ourselves first
            self.send_message(Hello(self.rt.addr, os.getpid(), self.rt.worker))
            backlog, self._backlog = self._backlog or [], None
            if backlog:
                stream.writelines(backlog)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        if self._frame is not None or self._cur is not None or self._start != self._end:
            log.warning("meshio: truncated frame from %s (connection closed mid-frame)",
                        self.peer or "unidentified peer")
        self._stop_receiving()
        self.rt._connection_lost(self, exc)

    def fail_all(self, make_error: Callable[[Pending], BaseException]) -> None:
        """Fail every call waiting on this connection; none may be left
        waiting, even if building its error goes wrong."""
        pending, self.pending = self.pending, {}
        for p in pending.values():
            if p.fut.done():
                continue
            try:
                error = make_error(p)
            except Exception as e:
                log.exception("meshio: building the error for %s failed", p.endpoint)
                error = SupervisionError(
                    f"{p.mesh} {p.point!r}: connection to process {self.peer_pid} at "
                    f"{self.peer} lost while {p.endpoint} was in flight ({e!r} describing it)",
                    actor=p.mesh, rank=p.rank, pid=self.peer_pid, cause="connection lost")
            p.fut.set_exception(error)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # ---------------------------------------------------------- receiving

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._cur is not None:
            return self._cur[self._cur_pos:]
        if self._end == len(self._buf):
            self._reserve(len(self._buf) - self._start + 1)
        return self._mv[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        self._rx += nbytes
        if self._cur is not None:
            self._cur_pos += nbytes
            if self._cur_pos < len(self._cur):
                return
            self._cur = None
        else:
            self._end += nbytes
        self._run_parse()

    def _run_parse(self) -> None:
        try:
            self._parse()
        except ProtocolError as e:
            log.warning("meshio: %s; dropping connection from %s", e,
                        self.peer or "unidentified peer")
            self.send_message(Fail(0, ErrorInfo("protocol", "ProtocolError", str(e))))
            self.abort()
            return
        if self._stall is None and self._incomplete() and not self.closed:
            self._rx_seen = self._rx
            self._stall = self.rt.loop.call_later(limits.frame_timeout, self._check_stall)

    def _incomplete(self) -> bool:
        return self._frame is not None or self._start != self._end or self._skip > 0

    def _check_stall(self) -> None:
        """Drop a connection whose message stopped arriving (no data for a
        whole ``frame_timeout``, while it was not paused by us)."""
        timer, self._stall = self._stall, None
        if self.closed or not self._incomplete():
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
                    self.peer or "unidentified peer", limits.frame_timeout)
        self.abort()

    def _resume(self) -> None:
        """The receive budget granted the message this connection waits for."""
        self._waiting = False
        if self.closed:
            return
        self._run_parse()
        transport = self.transport
        if not self._waiting and transport is not None and not transport.is_closing():
            transport.resume_reading()

    def _stop_receiving(self) -> None:
        """The connection is gone: give back what its message held."""
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        if self._waiting:
            _budget.forget(self)
            self._waiting = False
        if self._held:
            _budget.give(self._held)
            self._held = 0

    def _reserve(self, need: int) -> None:
        """Make room for ``need`` bytes from ``_start`` in the scratch buffer."""
        avail = self._end - self._start
        if need <= len(self._buf) - self._start:
            return
        if need <= len(self._buf) and self._start:
            self._buf[:avail] = self._buf[self._start:self._end]
        else:
            bigger = bytearray(max(need, 2 * len(self._buf)))
            bigger[:avail] = self._buf[self._start:self._end]
            self._buf = bigger
            self._mv = memoryview(bigger)
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
                if avail >= 8:  # fast path: a small frame without buffers, all here
                    body_len, nbufs = _HDR.unpack_from(self._buf, before)
                    if (not nbufs and body_len <= avail - 8
                            and body_len <= limits.max_message):
                        self._start = before + 8 + body_len
                        self._deliver(bytes(self._mv[before + 8:self._start]), [])
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
            self._deliver(f.got[0], f.got[1:])
        if self._start == self._end:
            self._start = self._end = 0
            if len(self._buf) > _SCRATCH:  # back to normal after a large header
                self._buf = bytearray(_SCRATCH)
                self._mv = memoryview(self._buf)

    def _header(self) -> _Frame | None:
        """The next frame, once its header is in and memory is reserved for
        it; None while waiting (or after refusing one over the limit)."""
        start = self._start
        avail = self._end - start
        if avail < 8:
            return None
        body_len, nbufs = _HDR.unpack_from(self._buf, start)
        if body_len > MAX_BODY or nbufs > MAX_BUFS:
            raise ProtocolError(
                f"malformed frame header (body {body_len} bytes, {nbufs} buffers)")
        need = 8 + 8 * nbufs
        if avail < need:
            self._reserve(need)
            return None
        descs = struct.unpack_from(f"<{nbufs}Q", self._buf, start + 8) if nbufs else ()
        if any(d >> 56 > KIND_BYTES for d in descs):
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
                self._waiting = True
                if self.transport is not None:
                    self.transport.pause_reading()
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
                got.append(bytes(part) if kind == KIND_BYTES else bytearray(part))
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
            return False
        return True

    def _malformed(self, body: bytes, e: Exception) -> None:
        """Answer a message that does not decode: fail the request or call it
        is recognisably about, else report it (``Fail`` with ``req`` 0)."""
        deep = isinstance(e, RecursionError)
        why = f"malformed message: {'nested too deeply: ' if deep else ''}{e}"
        log.warning("meshio: %s from %s", why, self.peer or "unidentified peer")
        tag, req = _peek(body[:_PEEK]) or (0, 0)
        if tag in _REQUESTS and req:
            self.send_message(Fail(req, ErrorInfo("schema", "SchemaError", why) if deep
                                   else ErrorInfo("protocol", "ProtocolError", why)))
        elif tag in _ANSWERS and req in self.pending:
            p = self.pending.pop(req)
            if not p.fut.done():
                p.fut.set_exception(ProtocolError(
                    f"the answer to {p.endpoint} [{p.mesh} {p.point}] is a {why}"))
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
                    self.peer or "unidentified peer", why)
        if tag in _REQUESTS:
            if req:
                self.send_message(Fail(req, ErrorInfo("schema", "SchemaError", why)))
        elif tag in _ANSWERS:
            p = self.pending.pop(req, None)
            if p is not None and not p.fut.done():
                p.fut.set_exception(SchemaError(
                    f"the answer to {p.endpoint} [{p.mesh} {p.point}] was skipped: {why}"))
        elif tag == _PORT_SEND:
            receiver = self.rt.ports.get(req)
            if receiver is not None:
                receiver._put_error(SchemaError(f"a value for port {req} was skipped: {why}"))

    def _deliver(self, body: bytes, bufs: Buffers) -> None:
        try:
            msg = decode_message(body)
        except Exception as e:
            self._malformed(body, e)
            return
        if type(msg) is Reply:
            p = self.pending.pop(msg.req, None)
            if p is not None and not p.fut.done():
                try:
                    p.fut.set_result(p.decode(msg.value, bufs))
                except MeshioError as e:
                    e.args = (f"{e} (from {p.mesh} {p.point})",)
                    p.fut.set_exception(e)
                except Exception as e:  # this call fails; the connection serves on
                    p.fut.set_exception(SchemaError(
                        f"the answer to {p.endpoint} from {p.mesh} {p.point} cannot be "
                        f"decoded: {type(e).__name__}: {e}"))
            return
        if type(msg) is Fail:
            if msg.req == 0:
                log.warning("meshio: peer %s reported: %s", self.peer, msg.error.message)
                return
            p = self.pending.pop(msg.req, None)
            if p is not None and not p.fut.done():
                p.fut.set_exception(error_from_info(msg.error, p))
            return
        try:
            self.rt.dispatch(self, msg, bufs)
        except Exception:  # one message's handler failed; the connection serves on
            log.exception("meshio: handling %s from %s failed", type(msg).__name__,
                          self.peer or "unidentified peer")


_REQUESTS: Final = frozenset(c.__struct_config__.tag for c in (Call, SpawnActor, RdmaOp))
_ANSWERS: Final = frozenset(c.__struct_config__.tag for c in (Reply, Fail))
_PORT_SEND: Final = PortSend.__struct_config__.tag


def error_from_info(info: ErrorInfo, p: Pending | None) -> MeshioError:
    where = f" [{p.mesh} {p.point}]" if p is not None else ""
    match info.kind:
        case "actor":
            return ActorError(
                f"{info.type_name}: {info.message}\n  in {info.actor} rank {info.rank}, "
                f"endpoint {p.endpoint if p else '?'}\n\nRemote traceback:\n{info.traceback}",
                remote_type=info.type_name, remote_message=info.message,
                remote_traceback=info.traceback, actor=info.actor, rank=info.rank,
                endpoint=p.endpoint if p else "")
        case "schema":
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
        case "supervision":
            return SupervisionError(info.message + where, actor=info.actor, rank=info.rank,
                                    cause=info.message)
        case "protocol":
            return ProtocolError(info.message + where)


def not_responding(down: PeerDown, now: Callable[[], float], *, in_flight: bool
                   ) -> Callable[[Pending], SupervisionError]:
    """What callers of the process ``down`` describes get while it does not
    answer heartbeats (``now``: a clock in seconds, for how long so far):
    calls in flight when that was found, or (``in_flight=False``) calls made
    afterwards, which are not sent."""
    since = now() - down.silent

    def error(p: Pending) -> SupervisionError:
        cause = f"not responding for {now() - since:.1f} s"
        what = (f"while {p.endpoint} was in flight" if in_flight
                else f"so {p.endpoint} was not sent")
        return SupervisionError(
            f"{p.mesh} {p.point!r} on proc mesh {down.mesh!r} rank {down.rank}: process "
            f"{down.pid} on {down.host} {cause} (no heartbeat answer; "
            f"heartbeat_timeout={down.timeout} s) {what}; it is not killed (no "
            f"supervisor): calls work again once it answers",
            actor=p.mesh, rank=p.rank, host=down.host, pid=down.pid, cause=cause)
    return error


# ---------------------------------------------------------------- runtime

_runtimes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Runtime] = (
    weakref.WeakKeyDictionary())


#: ``rt``: set in an actor's thread (where plain ``def`` endpoints run) to
#: the runtime of the actor's loop
actor_thread = threading.local()


def on_loop(fn: Callable[..., None], *args: Any) -> None:
    """Call ``fn(*args)`` on the runtime's loop: at once on a loop, or, from
    an actor's thread, scheduled there in order (before the reply of the
    ``def`` endpoint that called it)."""
    rt: Runtime | None = getattr(actor_thread, "rt", None)
    if rt is None:
        fn(*args)
    else:
        rt.loop.call_soon_threadsafe(fn, *args)


def runtime() -> Runtime:
    """The runtime of the running loop, created on first use (in an actor's
    thread: its loop's runtime, to read; send through :func:`on_loop`)."""
    rt_of_thread: Runtime | None = getattr(actor_thread, "rt", None)
    if rt_of_thread is not None:
        return rt_of_thread
    loop = asyncio.get_running_loop()
    rt = _runtimes.get(loop)
    if rt is None:
        rt = _runtimes[loop] = Runtime(loop)
        _quiet_when_abandoned(loop)
    return rt


def _quiet_when_abandoned(loop: asyncio.AbstractEventLoop) -> None:
    """Once ``loop`` is closed, asyncio's "exception was never retrieved"
    report of a call nobody awaited is dropped when the error is meshio's:
    the program ended (or was interrupted) and its meshes were stopped, which
    failed the call; other reports go to the loop's previous handler."""
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if (loop.is_closed() and isinstance(context.get("exception"), MeshioError)
                and "never retrieved" in context.get("message", "")):
            return
        if previous is None:
            loop.default_exception_handler(context)
        else:
            previous(loop, context)
    loop.set_exception_handler(handler)


#: listen backlog of every runtime (the kernel caps it at net.core.somaxconn)
LISTEN_BACKLOG: Final = 4096
#: seconds a dialler gives a peer to accept and complete the handshake
CONNECT_TIMEOUT = 60.0


def sockaddr(addr: str) -> str:
    """The socket address of a meshio address: ``@name`` is the Linux
    abstract socket ``\\0name`` (no file), anything else a path."""
    return "\0" + addr[1:] if addr.startswith("@") else addr


def _feed(conn: Connection, transport: asyncio.Transport, data: bytes) -> None:
    """Give ``conn`` bytes read before it was installed, as the transport would."""
    view = memoryview(data)
    while view and not transport.is_closing():
        buf = conn.get_buffer(len(view))
        n = min(len(buf), len(view))
        if not n:
            raise RuntimeError("get_buffer() returned an empty buffer")
        buf[:n] = view[:n]
        conn.buffer_updated(n)
        view = view[n:]


_M = TypeVar("_M", bound=_Msg)
#: what a layer above the transport registers to handle one kind of message
Handler = Callable[["Runtime", Connection, Any, Buffers], None]


class Mailbox(Protocol):
    """What the transport needs of an actor living in this process
    (:class:`meshio._cell.ActorCell` implements it)."""

    def post(self, conn: Connection, msg: Call, bufs: Buffers, /) -> None:
        """Queue ``msg`` (a call from ``conn``) for the actor."""
        ...

    def cancel(self, conn: Connection, req: int, /) -> None:
        """The caller of ``req`` on ``conn`` gave up."""
        ...

    def stop(self, exc: BaseException | None = None, /) -> asyncio.Task[None]:
        """Stop the actor; the task ends once it has cleaned up."""
        ...


class PortSink(Protocol):
    """What the transport needs of an open port (:class:`meshio.PortReceiver`)."""

    def _put(self, msg: PortSend, bufs: Buffers, /) -> None: ...

    def _put_error(self, error: MeshioError, /) -> None: ...


def register_handler(kind: type[_M], handler: Callable[[Runtime, Connection, _M, Buffers], None]
                     ) -> None:
    """Have every runtime hand messages of type ``kind`` to ``handler`` (run on
    the runtime's loop; an exception it raises is logged and the connection
    serves on).  The layers above the transport register theirs on import
    (actor cells: ``SpawnActor``; RDMA: ``RdmaOp``), so the transport imports
    nothing of them."""
    if kind in Runtime.handlers:
        raise ValueError(f"a handler for {kind.__name__} messages is already registered")
    Runtime.handlers[kind] = handler


class Runtime:
    """Everything one process needs to talk to its peers, for one loop.

    It listens on a Linux abstract Unix socket named by :attr:`addr`
    (``@meshio-<random>/controller`` in the controller, ``@meshio-<random>/<worker
    id>`` in its workers): no file exists, so nothing is left behind however
    the process dies.  Every connection, in or out, passes the job handshake
    (:mod:`._handshake`) over :attr:`secret` before a frame is read.
    """

    #: message type → its handler, for the messages of layers above the
    #: transport (see :func:`register_handler`)
    handlers: ClassVar[dict[type[_Msg], Handler]] = {}

    def __init__(self, loop: asyncio.AbstractEventLoop, addr: str | None = None,
                 worker: str = "", secret: bytes | None = None) -> None:
        self.loop = loop
        self.worker = worker
        self.host: str = socket.gethostname()
        #: the job secret every connection proves (made by the controller)
        self.secret: bytes = new_secret() if secret is None else secret
        if addr is None:
            addr = f"@meshio-{secrets.token_hex(8)}/controller"
        #: prefix of this job's socket names (``@meshio-<random>``)
        self.namespace: str = addr.rpartition("/")[0]
        self.addr = addr
        self._handshakes: set[HandshakeProtocol] = set()
        self._closed = False
        self.conns: dict[str, Connection] = {}
        self.all_conns: weakref.WeakSet[Connection] = weakref.WeakSet()
        #: the actors of this process by target (actor cells add themselves)
        self.actors: dict[str, Mailbox] = {}
        #: the open ports of this process by id (port receivers add themselves)
        self.ports: dict[int, PortSink] = {}
        #: addresses known dead → the error their callers get
        self.dead: dict[str, Callable[[Pending], SupervisionError]] = {}
        #: controller side: worker id → future of its Hello connection
        self.hello_waiters: dict[str, asyncio.Future[Connection]] = {}
        #: called with (connection, exc) when a peer connection is lost
        self.on_lost: dict[str, Callable[[Connection], None]] = {}
        self.on_fault: Callable[[Connection, ErrorInfo], None] = _log_fault
        #: controller side, by worker address: fault and heartbeat handlers
        self.on_fault_from: dict[str, Callable[[ErrorInfo], None]] = {}
        self.on_pong: dict[str, Callable[[], None]] = {}
        #: by worker address, the workers this runtime's heartbeats find not
        #: responding: their PeerDown as of now (told to each worker that connects)
        self.down: dict[str, Callable[[], PeerDown]] = {}
        #: worker side: a replacement process whose actors are being rebuilt
        self.restoring: bool = False
        #: worker side: temporary actors not rebuilt after a restart
        self.lost: set[str] = set()
        self.on_shutdown: Callable[[], None] | None = None
        #: worker side: the controller's address (faults are reported there)
        self.controller: str | None = None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(sockaddr(addr))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
        self._sock = sock
        self._serving = loop.create_task(self._serve(sock))

    async def _serve(self, sock: socket.socket) -> None:
        self.server: asyncio.Server = await self.loop.create_unix_server(
            self._handshake_in, sock=sock, backlog=LISTEN_BACKLOG)

    def _handshake_in(self) -> HandshakeProtocol:
        """A new incoming connection: the handshake first, then a Connection."""
        def done(transport: asyncio.Transport, leftover: bytes) -> None:
            self._handshakes.discard(hs)
            self._accept(transport, leftover, hs.creds)

        def fail(error: Exception) -> None:
            self._handshakes.discard(hs)
            if not self._closed:
                log.warning("meshio: refused a connection to %s from %s: %s", self.addr,
                            hs.describe(), error)

        hs = HandshakeProtocol(self.secret, dialler=False, timeout=HANDSHAKE_TIMEOUT,
                               on_done=done, on_fail=fail)
        self._handshakes.add(hs)
        return hs

    def _accept(self, transport: asyncio.Transport, leftover: bytes,
                creds: tuple[int, int, int] | None) -> None:
        conn = Connection(self, None)
        if creds is not None:
            conn.peer_pid = creds[0]
        self.all_conns.add(conn)
        transport.set_protocol(conn)
        conn.connection_made(transport)
        _feed(conn, transport, leftover)

    # ------------------------------------------------------------ peers

    def connect(self, addr: str) -> Connection:
        """The connection to ``addr``, dialling it if needed (sends made
        before it is up are queued in order)."""
        conn = self.conns.get(addr)
        if conn is not None:
            return conn
        conn = Connection(self, addr)
        self.conns[addr] = conn
        self.all_conns.add(conn)
        self.loop.create_task(self._dial(conn, addr))
        return conn

    async def _dial(self, conn: Connection, addr: str) -> None:
        """Connect to ``addr``, prove both sides, then hand over to ``conn``
        (which sends what was queued meanwhile); on failure its calls fail
        with what happened."""
        loop = self.loop
        deadline = loop.time() + CONNECT_TIMEOUT
        proven: asyncio.Future[None] = loop.create_future()

        def done(transport: asyncio.Transport, leftover: bytes) -> None:
            self._handshakes.discard(hs)
            proven.set_result(None)
            transport.set_protocol(conn)
            conn.connection_made(transport)
            _feed(conn, transport, leftover)

        def fail(error: Exception) -> None:
            self._handshakes.discard(hs)
            if not proven.done():
                proven.set_exception(error)

        try:
            sock = await self._connect(addr, deadline)
            hs = HandshakeProtocol(self.secret, dialler=True,
                                   timeout=max(deadline - loop.time(), 0.0),
                                   on_done=done, on_fail=fail)
            self._handshakes.add(hs)
            await loop.create_unix_connection(lambda: hs, sock=sock)
            await proven
        except (OSError, AuthenticationError) as e:
            if self.conns.get(addr) is conn:
                del self.conns[addr]
            conn.closed = True
            conn._backlog = None
            dead = self.dead.get(addr)
            conn.fail_all(dead or self._dial_error(addr, e))

    async def _connect(self, addr: str, deadline: float) -> socket.socket:
        """A socket connected to ``addr``; a full listen backlog (``EAGAIN``:
        the peer is busy) is retried with backoff until ``deadline``."""
        delay = 0.001
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:  # a Unix connect completes or fails at once, never "in progress"
                sock.connect(sockaddr(addr))
                return sock
            except BlockingIOError:
                sock.close()
                if self.loop.time() + delay > deadline:
                    raise TimeoutError(f"its listen backlog stayed full for "
                                       f"{CONNECT_TIMEOUT:g}s") from None
            except BaseException:
                sock.close()
                raise
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.1)

    def _dial_error(self, addr: str, e: Exception) -> Callable[[Pending], MeshioError]:
        """What callers get when dialling ``addr`` failed with ``e``."""
        def error(p: Pending) -> MeshioError:
            if isinstance(e, AuthenticationError):
                return AuthenticationError(
                    f"{p.mesh} {p.point}: the process at {addr} failed authentication ({e}); "
                    "it is not a process of this job")
            if isinstance(e, TimeoutError):
                why, cause = (f"timed out connecting to {p.mesh} {p.point} at {addr}: {e} "
                              "(process busy or stopped?)", "connect timed out")
            elif isinstance(e, (ConnectionRefusedError, FileNotFoundError)):
                why, cause = (f"cannot reach {p.mesh} {p.point} at {addr}: "
                              f"{e.strerror or e} (the process is gone or was never started)",
                              "connection refused")
            else:
                why, cause = (f"cannot connect to {p.mesh} {p.point} at {addr}: {e}",
                              "connect failed")
            return SupervisionError(why, actor=p.mesh, rank=p.rank, host=self.host,
                                    cause=cause)
        return error

    def _connection_lost(self, conn: Connection, exc: Exception | None) -> None:
        if conn.peer is not None and self.conns.get(conn.peer) is conn:
            del self.conns[conn.peer]
        hook = self.on_lost.get(conn.peer or "")
        if hook is not None:
            hook(conn)
            return
        cause = f"connection lost ({exc})" if exc else "connection closed"
        conn.fail_all(lambda p: SupervisionError(
            f"{p.mesh} {p.point}: {cause} to process {conn.peer_pid} at {conn.peer} while "
            f"{p.endpoint} was in flight", actor=p.mesh, rank=p.rank,
            pid=conn.peer_pid, cause=cause))

    # --------------------------------------------------------- dispatch

    def dispatch(self, conn: Connection, msg: Message, bufs: Buffers) -> None:
        match msg:
            case Call():
                cell = self.actors.get(msg.target)
                if cell is None:
                    if msg.req:
                        conn.send_message(Fail(msg.req, self._missing(msg.target)))
                    return
                cell.post(conn, msg, bufs)
            case Hello():
                conn.peer_pid = msg.pid
                conn.worker = msg.worker
                if conn.peer is None:
                    conn.peer = msg.addr
                    self.conns.setdefault(msg.addr, conn)
                waiter = self.hello_waiters.pop(msg.worker, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(conn)
            case PortSend():
                receiver = self.ports.get(msg.port)
                if receiver is not None:
                    receiver._put(msg, bufs)
            case StopActor():
                cell = self.actors.pop(msg.target, None)
                if cell is None:
                    conn.send_message(Reply(msg.req, MSGPACK_NIL))
                else:  # answered once its __cleanup__ has run
                    req = msg.req
                    cell.stop().add_done_callback(
                        lambda _: conn.send_message(Reply(req, MSGPACK_NIL)))
            case Cancel():
                cell = self.actors.get(msg.target)
                if cell is not None:
                    cell.cancel(conn, msg.req)
            case Fault():
                handler = self.on_fault_from.get(conn.peer or "")
                if handler is not None:
                    handler(msg.error)
                else:
                    self.on_fault(conn, msg.error)
            case Ping():
                conn.send_message(Pong(msg.seq))
            case Pong():
                on_pong = self.on_pong.get(conn.peer or "")
                if on_pong is not None:
                    on_pong()
            case PeerDown():  # calls to it fail (its connection stays) until PeerUp
                self.dead[msg.addr] = not_responding(msg, self.loop.time, in_flight=False)
                in_flight = not_responding(msg, self.loop.time, in_flight=True)
                for peer in list(self.all_conns):
                    if peer.peer == msg.addr:
                        peer.fail_all(in_flight)
            case PeerUp():
                self.dead.pop(msg.addr, None)
            case Restored():
                self.restoring = False
                self.lost.update(msg.lost)
            case Shutdown():
                if self.on_shutdown is not None:
                    self.on_shutdown()
            case _:
                registered = self.handlers.get(type(msg))
                if registered is None:
                    log.warning("meshio: unexpected %s from %s", type(msg).__name__, conn.peer)
                else:
                    registered(self, conn, msg, bufs)

    def _missing(self, target: str) -> ErrorInfo:
        if self.restoring or target in self.lost:
            why = ("is being rebuilt after a restart" if self.restoring
                   else "was temporary and not rebuilt after a restart")
            return ErrorInfo("supervision", "SupervisionError",
                             f"actor {target!r} in process {os.getpid()} {why}")
        return ErrorInfo(
            "unknown_actor", "UnknownActorError",
            f"no actor {target!r} in process {os.getpid()} "
            f"({self.worker or 'controller'}); it was never spawned here or has been stopped")

    def report_fault(self, info: ErrorInfo) -> None:
        """Tell the supervising controller that an actor failed with nobody waiting."""
        if self.controller is None:
            self.on_fault(Connection(self, None), info)
        else:
            self.connect(self.controller).send_message(Fault(info))

    def close(self) -> None:
        """Stop listening and drop every connection (the end of this loop's
        runtime; workers still attached exit when their connection drops)."""
        self._closed = True
        self._serving.cancel()
        server = getattr(self, "server", None)
        if server is not None:
            server.close()
        for hs in list(self._handshakes):
            hs.fail(ConnectionAbortedError(f"meshio runtime at {self.addr} closed"))
        for conn in list(self.all_conns):
            conn.abort()
        self._sock.close()
        if _runtimes.get(self.loop) is self:
            del _runtimes[self.loop]


def close_runtime() -> None:
    """Close the running loop's runtime, if it has one."""
    rt = _runtimes.get(asyncio.get_running_loop())
    if rt is not None:
        rt.close()


def _log_fault(conn: Connection, info: ErrorInfo) -> None:
    """A fault from an actor that no proc mesh of this process supervises
    (one in this process, or in a process no longer watched)."""
    pid = os.getpid() if conn.peer_pid == -1 else conn.peer_pid  # -1: from this process
    print(f"meshio: failure in {info.actor} rank {info.rank} (pid {pid}; no proc mesh of "
          f"this process watches it: nothing restarts it): {info.type_name}: "
          f"{info.message}\n{info.traceback}", file=sys.stderr, flush=True)
