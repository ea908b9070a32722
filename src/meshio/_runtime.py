"""The per-event-loop runtime: a listening Unix socket, one connection per
peer process, length-prefixed frames with out-of-band buffers.

Frame layout (little endian)::

    u32 body_len | u32 nbufs | nbufs x u64 (kind << 56 | length) | body | buffers

The body is one control message (:mod:`._messages`).  Buffers are received
straight into freshly allocated ``bytearray``/``bytes`` objects (no copy out
of a staging buffer for large payloads).
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import logging
import os
import shutil
import socket
import struct
import sys
import tempfile
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, cast

import msgspec

from ._exceptions import MeshioError, ProtocolError, SupervisionError
from ._messages import (
    Call,
    ErrorInfo,
    Fail,
    Fault,
    Hello,
    Message,
    Ping,
    Pong,
    PortSend,
    RdmaOp,
    Reply,
    Restored,
    Shutdown,
    SpawnActor,
    StopActor,
    decode_message,
    encode_message,
)
from ._serial import KIND_BYTES, Buffers, OutBuffers

if TYPE_CHECKING:
    from ._cell import ActorCell
    from ._port import PortReceiver

__all__ = ("Connection", "Pending", "Runtime", "close_runtime", "ignore_result", "runtime")

log = logging.getLogger("meshio")

_HDR: Final = struct.Struct("<II")
_LEN_MASK: Final = (1 << 56) - 1
MAX_BODY: Final = 1 << 30
MAX_BUFS: Final = 1 << 16
_SCRATCH: Final = 1 << 18

_bytes_alloc = ctypes.pythonapi.PyBytes_FromStringAndSize
_bytes_alloc.restype = ctypes.py_object
_bytes_alloc.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_BYTES_DATA_OFFSET: Final = bytes.__basicsize__ - 1


def _allocate(kind: int, n: int) -> tuple[Any, memoryview]:
    """A receive target of ``n`` bytes and a writable view of it."""
    if kind == KIND_BYTES and n:
        # A bytes object filled in place: zero-copy receive of ``bytes``.
        b = _bytes_alloc(None, n)
        array = (ctypes.c_char * n).from_address(id(b) + _BYTES_DATA_OFFSET)
        return b, memoryview(array).cast("B")
    target = bytearray(n)
    return (target if kind != KIND_BYTES else b""), memoryview(target)


def frame_header(body_len: int, out: OutBuffers) -> bytes:
    if not out:
        return _HDR.pack(body_len, 0)
    lens = [(kind << 56) | memoryview(buf).nbytes for buf, kind in out]
    return _HDR.pack(body_len, len(out)) + struct.pack(f"<{len(out)}Q", *lens)


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
        self.fut = fut
        self.decode = decode
        self.endpoint = endpoint
        self.mesh = mesh
        self.point = point

    @property
    def rank(self) -> int:
        """The callee's rank, when the call went to an actor (-1 otherwise)."""
        rank: int = getattr(self.point, "rank", -1)
        return rank


def ignore_result(raw: Any, bufs: Buffers) -> None:
    """The decoder of a call whose reply carries nothing (spawn, stop)."""
    return None


class _Frame:
    __slots__ = ("body", "body_len", "bufs", "descs")

    def __init__(self, body_len: int, descs: tuple[int, ...]) -> None:
        self.body_len = body_len
        self.descs = descs
        self.body: bytes | None = None
        self.bufs: Buffers = []


class Connection(asyncio.BufferedProtocol):
    """One connection to a peer process; both sides may send requests."""

    def __init__(self, rt: Runtime, peer: str | None) -> None:
        self.rt = rt
        self.peer = peer
        self.peer_pid = -1
        self.worker = ""
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.pending: dict[int, Pending] = {}
        self._req = 0
        self._backlog: list[bytes | Any] | None = [] if peer is not None else None
        self._buf = bytearray(_SCRATCH)
        self._mv = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._frame: _Frame | None = None
        self._cur: memoryview | None = None
        self._cur_pos = 0

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

    def forget_cancelled(self) -> None:
        """Drop calls whose caller gave up (timed out): a reply that never
        comes must not keep them forever."""
        for req in [r for r, p in self.pending.items() if p.fut.cancelled()]:
            del self.pending[req]

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
        if self._cur is not None:
            self._cur_pos += nbytes
            if self._cur_pos < len(self._cur):
                return
            self._cur = None
        else:
            self._end += nbytes
        try:
            self._parse()
        except ProtocolError as e:
            log.warning("meshio: %s; dropping connection from %s", e,
                        self.peer or "unidentified peer")
            self.send_message(Fail(0, ErrorInfo("protocol", "ProtocolError", str(e))))
            self.abort()

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
            self._mv.release()
            self._buf = bigger
            self._mv = memoryview(bigger)
        self._start, self._end = 0, avail

    def _parse(self) -> None:
        buf, mv = self._buf, self._mv
        while True:
            f = self._frame
            if f is None:
                avail = self._end - self._start
                if avail < 8:
                    break
                body_len, nbufs = _HDR.unpack_from(buf, self._start)
                if body_len > MAX_BODY or nbufs > MAX_BUFS:
                    raise ProtocolError(
                        f"malformed frame header (body {body_len} bytes, {nbufs} buffers)")
                need = 8 + 8 * nbufs
                if avail < need:
                    self._reserve(need)
                    break
                descs = struct.unpack_from(f"<{nbufs}Q", buf, self._start + 8) if nbufs else ()
                if any(d >> 56 > KIND_BYTES for d in descs):
                    raise ProtocolError("malformed frame header (unknown buffer kind)")
                self._start += need
                f = self._frame = _Frame(body_len, descs)
            if f.body is None:
                if self._end - self._start < f.body_len:
                    self._reserve(f.body_len)
                    break
                f.body = bytes(mv[self._start:self._start + f.body_len])
                self._start += f.body_len
            while len(f.bufs) < len(f.descs):
                d = f.descs[len(f.bufs)]
                n = d & _LEN_MASK
                try:
                    target, tmv = _allocate(d >> 56, n)
                except (MemoryError, OverflowError) as e:
                    raise ProtocolError(f"malformed frame header (cannot allocate a {n}-byte "
                                        f"buffer: {type(e).__name__})") from None
                k = min(self._end - self._start, n)
                tmv[:k] = mv[self._start:self._start + k]
                self._start += k
                f.bufs.append(target)
                if k < n:
                    self._cur, self._cur_pos = tmv, k
                    return
            self._frame = None
            self._deliver(f.body, f.bufs)
            if self._buf is not buf:  # a handler never resizes, but be safe
                buf, mv = self._buf, self._mv
        if self._start == self._end:
            self._start = self._end = 0

    def _deliver(self, body: bytes, bufs: Buffers) -> None:
        try:
            msg = decode_message(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            log.warning("meshio: malformed message from %s: %s",
                        self.peer or "unidentified peer", e)
            self.send_message(Fail(0, ErrorInfo("protocol", "ProtocolError",
                                                f"malformed message: {e}")))
            return
        if type(msg) is Reply:
            p = self.pending.pop(msg.req, None)
            if p is not None and not p.fut.done():
                try:
                    p.fut.set_result(p.decode(msg.value, bufs))
                except MeshioError as e:
                    e.args = (f"{e} (from {p.mesh} {p.point})",)
                    p.fut.set_exception(e)
            return
        if type(msg) is Fail:
            if msg.req == 0:
                log.warning("meshio: peer %s reported: %s", self.peer, msg.error.message)
                return
            p = self.pending.pop(msg.req, None)
            if p is not None and not p.fut.done():
                p.fut.set_exception(error_from_info(msg.error, p))
            return
        self.rt.dispatch(self, msg, bufs)


def error_from_info(info: ErrorInfo, p: Pending | None) -> MeshioError:
    from ._exceptions import (
        ActorError,
        SchemaError,
        UnknownActorError,
        UnknownEndpointError,
    )

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
        case "rdma":
            from ._exceptions import RDMAError, RDMASizeError

            cls = RDMASizeError if info.type_name == "RDMASizeError" else RDMAError
            return cls(info.message + where)
        case "supervision":
            return SupervisionError(info.message + where, actor=info.actor, rank=info.rank,
                                    cause=info.message)
        case _:
            return ProtocolError(info.message + where)


# ---------------------------------------------------------------- runtime

_runtimes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Runtime] = (
    weakref.WeakKeyDictionary())


def runtime() -> Runtime:
    """The runtime of the running loop, created on first use."""
    loop = asyncio.get_running_loop()
    rt = _runtimes.get(loop)
    if rt is None:
        rt = _runtimes[loop] = Runtime(loop)
    return rt


class Runtime:
    """Everything one process needs to talk to its peers, for one loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, addr: str | None = None,
                 worker: str = "") -> None:
        self.loop = loop
        self.worker = worker
        self.host = socket.gethostname()
        if addr is None:
            self.sockdir = tempfile.mkdtemp(prefix="meshio-")
            atexit.register(shutil.rmtree, self.sockdir, True)
            addr = os.path.join(self.sockdir, "controller.sock")
        else:
            self.sockdir = os.path.dirname(addr)
        self.addr = addr
        self.conns: dict[str, Connection] = {}
        self.all_conns: weakref.WeakSet[Connection] = weakref.WeakSet()
        self.actors: dict[str, ActorCell] = {}
        self.ports: dict[int, PortReceiver[Any]] = {}
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
        #: worker side: a replacement process whose actors are being rebuilt
        self.restoring = False
        #: worker side: temporary actors not rebuilt after a restart
        self.lost: set[str] = set()
        self.on_shutdown: Callable[[], None] | None = None
        #: worker side: the controller's address (faults are reported there)
        self.controller: str | None = None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(addr):
            os.unlink(addr)
        sock.bind(addr)
        sock.listen(128)
        sock.setblocking(False)
        self._sock = sock
        self._serving = loop.create_task(self._serve(sock))

    async def _serve(self, sock: socket.socket) -> None:
        self.server = await self.loop.create_unix_server(lambda: self._accept(), sock=sock)

    def _accept(self) -> Connection:
        conn = Connection(self, None)
        self.all_conns.add(conn)
        return conn

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
        try:
            await self.loop.create_unix_connection(lambda: conn, addr)
        except OSError as e:
            why = e.strerror or e
            if self.conns.get(addr) is conn:
                del self.conns[addr]
            conn.closed = True
            conn._backlog = None
            dead = self.dead.get(addr)
            conn.fail_all(dead or (lambda p: SupervisionError(
                f"cannot reach {p.mesh} {p.point} at {addr}: {why} "
                "(the process is gone or was never started)",
                actor=p.mesh, rank=p.rank, host=self.host,
                cause="connection refused")))

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
            case SpawnActor():
                from ._cell import spawn_cell

                self.loop.create_task(spawn_cell(self, conn, msg, bufs))
            case StopActor():
                cell = self.actors.pop(msg.target, None)
                if cell is not None:
                    cell.stop()
                conn.send_message(Reply(msg.req, msgspec.Raw(b"\xc0")))
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
            case RdmaOp():
                from ._rdma import serve_op

                serve_op(self, conn, msg, bufs)
            case Restored():
                self.restoring = False
                self.lost.update(msg.lost)
            case Shutdown():
                if self.on_shutdown is not None:
                    self.on_shutdown()
            case _:
                log.warning("meshio: unexpected %s from %s", type(msg).__name__, conn.peer)

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
        self._serving.cancel()
        server = getattr(self, "server", None)
        if server is not None:
            server.close()
        for conn in list(self.all_conns):
            conn.abort()
        self._sock.close()
        if os.path.exists(self.addr):
            os.unlink(self.addr)
        if _runtimes.get(self.loop) is self:
            del _runtimes[self.loop]


def close_runtime() -> None:
    """Close the running loop's runtime, if it has one."""
    rt = _runtimes.get(asyncio.get_running_loop())
    if rt is not None:
        rt.close()


def _log_fault(conn: Connection, info: ErrorInfo) -> None:
    print(f"meshio: unhandled failure in {info.actor} rank {info.rank} "
          f"(pid {conn.peer_pid}): {info.type_name}: {info.message}\n{info.traceback}",
          file=sys.stderr, flush=True)
