"""The per-event-loop runtime: a listening Unix socket, one connection
(:mod:`._connection`) per peer process, dialled or accepted through the job
handshake, and the dispatch table the layers above register handlers in
(:func:`register_handler`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import math
import os
import secrets
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol, TypeVar, cast

from .._checks import check_seconds
from .._exceptions import (
    AuthenticationError,
    ClosedResourceError,
    MeshioError,
    SupervisionError,
    WrongLoopError,
)
from ._bulk import fill
from ._connection import Connection, Pending, disconnected, ignore_result, not_responding
from ._credentials import Credentials
from ._credit import credit, took, windows_lost
from ._fanout import FanoutState, Order, refuse, relay
from ._handshake import new_secret, tcp_address
from ._memory import MemoryBackend
from ._messages import (
    Call,
    Calls,
    Cancel,
    Credit,
    ErrorInfo,
    Fail,
    Fanout,
    Fault,
    Fill,
    Hello,
    LoopHeld,
    Message,
    Moved,
    PeerDown,
    PeerUp,
    Ping,
    Pong,
    PortSend,
    Started,
    _Msg,
)
from ._pool import trimming
from ._roles import DeadTable, Incarnation, Watch
from ._serial import Buffers, limits
from ._sockets import SocketBackend, feed, tcp_endpoint, tcp_listener, unix_listener
from ._tasks import TaskOwner
from ._tls import TLSConfig

__all__ = ("Connection", "Pending", "Runtime", "RuntimeState", "ask_each", "check_loop",
           "close_runtime", "existing_runtime", "ignore_result", "no_running_loop", "not_its_loop",
           "fault_report", "runtime", "tcp_address", "tell_held")

log = logging.getLogger("meshio")

_T = TypeVar("_T")


# ---------------------------------------------------------------- runtime

_runtimes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Runtime] = (
    weakref.WeakKeyDictionary())


#: every open runtime of this process by address: a runtime reaches the
#: in-process ones among them in memory (:mod:`._memory`)
_local: weakref.WeakValueDictionary[str, Runtime] = weakref.WeakValueDictionary()

#: the runtime of the code running now where it is not its loop's
#: (:attr:`Runtime.context`: in-process workers' actors)
_current: contextvars.ContextVar[Runtime | None] = contextvars.ContextVar(
    "meshio_runtime", default=None)

#: ``rt``: set in an actor's thread (where plain ``def`` endpoints run) to
#: the runtime of the actor's loop
actor_thread = threading.local()


def on_loop(fn: Callable[..., object], *args: Any) -> None:
    """Call ``fn(*args)`` on the runtime's loop: at once on a loop, or, from
    an actor's thread, scheduled there in order (before the reply of the
    ``def`` endpoint that called it)."""
    rt: Runtime | None = getattr(actor_thread, "rt", None)
    if rt is None:
        fn(*args)
    else:
        rt.loop.call_soon_threadsafe(fn, *args)


def on_loop_wait(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` on the runtime's loop, and its result: at once on a loop,
    or, from an actor's thread (its ``__init__``, a ``def`` endpoint), run
    there in the thread's context while the thread waits."""
    rt: Runtime | None = getattr(actor_thread, "rt", None)
    if rt is None:
        return fn(*args)
    done: concurrent.futures.Future[_T] = concurrent.futures.Future()

    def run() -> None:
        try:
            done.set_result(fn(*args))
        except BaseException as e:  # raised in the waiting thread
            done.set_exception(e)
    rt.loop.call_soon_threadsafe(run, context=contextvars.copy_context())
    return done.result()


def runtime() -> Runtime:
    """The runtime of the running loop, created on first use (in an actor's
    thread: its loop's runtime, to read; send through :func:`on_loop`; in an
    in-process worker's actor: that worker's)."""
    rt_of_thread: Runtime | None = getattr(actor_thread, "rt", None)
    if rt_of_thread is not None:
        return rt_of_thread
    current = _current.get()
    if current is not None:
        return current
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise no_running_loop("meshio") from None
    rt = _runtimes.get(loop)
    if rt is None:
        rt = _runtimes[loop] = Runtime(loop)
        _quiet_when_abandoned(loop)
        rt.tasks.start(_close_with_loop(rt), name="meshio: close with its loop")
    return rt


def existing_runtime() -> Runtime | None:
    """What :func:`runtime` is here if there is one already, else None (no
    running loop, or one meshio has not used yet): it never makes one."""
    rt: Runtime | None = getattr(actor_thread, "rt", None) or _current.get()
    if rt is not None:
        return rt
    try:
        return _runtimes.get(asyncio.get_running_loop())
    except RuntimeError:
        return None


#: how to run a use of a loop's mesh from another thread (the obvious
#: run_coroutine_threadsafe(mesh.endpoint.call_one(...), loop) calls the
#: adverb in that thread, and it raises there)
_RUN_IT_THERE = ("put the use in a coroutine function, e.g. `async def call(): return await "
                 "mesh.endpoint.call_one(...)`, and run that there with "
                 "asyncio.run_coroutine_threadsafe(call(), loop).result() (not with "
                 "mesh.endpoint.call_one(...) as the coroutine: an adverb sends at once, in the "
                 "thread that calls it, and raises this)")
#: how to use something of a loop from elsewhere (the end of every WrongLoopError)
_USE_IT_THERE = (f"use it from that loop: from another thread, {_RUN_IT_THERE}; "
                 "loop.call_soon_threadsafe(fn, *args) runs a plain function such as "
                 "port.send there")


def no_running_loop(what: str, *, runs_elsewhere: bool = False) -> WrongLoopError:
    """The error of using ``what`` (``"meshio"``, ``"actor mesh 'c'"``)
    from a thread that runs no event loop: the one wording of it.  In the
    main thread that is a script's top level (Monarch's synchronous
    ``this_host().spawn_procs(...)``), whose fix is a loop, not a thread,
    unless the loop ``what`` belongs to ``runs_elsewhere`` (in a thread)."""
    if threading.current_thread() is threading.main_thread() and not runs_elsewhere:
        return WrongLoopError(
            f"{what} cannot be used outside a running event loop (here: the main thread, "
            f"with no loop running): meshio's API is async, with no blocking form of "
            f"spawn_procs, spawn or a call; write the program as an `async def main()` that "
            f"awaits them and run it with meshio.run(main()) (in a notebook, `await` them "
            f"in a cell); if your event loop runs in another thread, {_RUN_IT_THERE}")
    return WrongLoopError(
        f"{what} cannot be used from a thread that runs no event loop (e.g. one of "
        f"asyncio.to_thread): meshes, services, ports and supervisors belong to the meshio "
        f"runtime of the event loop they were created on; {_USE_IT_THERE}")


def not_its_loop(rt: Runtime, what: str) -> MeshioError:
    """The error of using ``what`` (``"actor mesh 'c'"``), which belongs to
    ``rt``, where the running loop is not ``rt``'s: another loop (its
    runtime has another job secret: it could not even reach the processes)
    or a thread that runs none (:class:`WrongLoopError`), or ``rt``'s loop
    has ended (:class:`ClosedResourceError`)."""
    if rt.closed or rt.loop.is_closed():
        return ClosedResourceError(
            f"{what} belongs to the meshio runtime of an event loop that has ended (the loop "
            f"it was created on is closed, or its meshio.run returned): it cannot be used any "
            f"more; create the proc meshes and actors a loop uses on that loop (e.g. within "
            f"the one asyncio.run or meshio.run)")
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return no_running_loop(what, runs_elsewhere=rt.loop.is_running())
    return WrongLoopError(
        f"{what} belongs to the meshio runtime of another event loop (the one it was "
        f"created on), not the running one (each loop has a runtime of its own, and no "
        f"mesh moves between them); {_USE_IT_THERE}")


def check_loop(rt: Runtime, what: str) -> None:
    """Raise :func:`not_its_loop`'s error unless the running loop is ``rt``'s."""
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not rt.loop:
        raise not_its_loop(rt, what)


async def _close_with_loop(rt: Runtime) -> None:
    """Close ``rt`` if its loop ends with it open: ``asyncio.run`` (or
    pytest-asyncio) cancels the tasks left once its main returns, this one
    among them, where ``meshio.run`` closes the runtime itself.  So the
    workers of a proc mesh never stopped exit (their connections drop)
    and the controller's inspection file goes, on every loop alike."""
    try:
        await rt.loop.create_future()
    finally:
        if not rt.closed:
            rt.close()


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


_M = TypeVar("_M", bound=_Msg)
#: what a layer above the transport registers to handle one kind of message
Handler = Callable[["Runtime", Connection, Any, Buffers], None]


class Mailbox(Protocol):
    """What the transport needs of an actor living in this process
    (:class:`meshio._cell.ActorCell` implements it)."""

    def post(self, conn: Connection, msg: Call, bufs: Buffers, /) -> None:
        """Queue ``msg`` (a call from ``conn``) for the actor."""
        ...

    def post_run(self, conn: Connection, calls: Sequence[Call], i: int, /) -> int:
        """:meth:`post` of ``calls[i]`` (a call of a :class:`Calls` frame to
        the actor, unnumbered) and perhaps of calls after it to the actor;
        the index of the first call not taken (> ``i``)."""
        ...

    def cancel(self, conn: Connection, req: int, expired: bool = False, /) -> None:
        """The caller of ``req`` on ``conn`` gave up (``expired``: its deadline passed)."""
        ...

    def lost(self, conn: Connection, /) -> None:
        """``conn`` is gone: its calls have nobody to answer."""
        ...

    def stop(self, exc: BaseException | None = None, /) -> asyncio.Task[None]:
        """Stop the actor; the task ends once it has cleaned up."""
        ...

    def held_for(self, chain: tuple[str, ...], sent: str, /) -> str | None:
        """Why awaiting room in the actor's mailbox for ``sent`` (a
        broadcast of that endpoint, made by a call that carries ``chain``)
        would wait forever, if it would: the call under way in the mailbox
        is one of ``chain``, so it waits for the caller, and nothing leaves
        the mailbox before it returns.  None if not."""
        ...


class RuntimeState(Protocol):
    """A layer's state kept per runtime (see :meth:`Runtime.state`)."""

    def close(self) -> None:
        """The runtime is closing: release what this state holds."""
        ...


_S = TypeVar("_S", bound=RuntimeState)


class PortSink(Protocol):
    """What the transport needs of an open port (:class:`meshio.PortReceiver`)."""

    def _put(self, msg: PortSend, bufs: Buffers, /) -> None: ...

    def _put_error(self, error: MeshioError, /) -> None: ...

    def _held(self, conn: Connection, /) -> None: ...

    def _relaying(self, conn: Connection, /) -> None: ...

    def _released(self, conn: Connection, holders: tuple[str, ...], /) -> None: ...

    def _lost(self, conn: Connection, /) -> None: ...


def register_handler(kind: type[_M], handler: Callable[[Runtime, Connection, _M, Buffers], None],
                     *, inspection: bool = False) -> None:
    """Have every runtime hand messages of type ``kind`` to ``handler`` (run on
    the runtime's loop; an exception it raises is logged and the connection
    serves on).  The layers above the transport register theirs on import
    (actor cells: ``SpawnActor``; RDMA: ``RdmaOp``), so the transport imports
    nothing of them.  ``inspection``: an inspection client may send it too
    (:meth:`Runtime.listen_inspection`)."""
    if kind in Runtime.handlers:
        raise ValueError(f"a handler for {kind.__name__} messages is already registered")
    Runtime.handlers[kind] = handler
    if inspection:
        Runtime.for_inspection.add(kind)


def _internal(rt: Runtime, what: str, e: Exception) -> str:
    """The message callers get when serving their ``what`` failed here."""
    return (f"meshio failed serving this {what} in pid {os.getpid()} on {rt.host} "
            f"({type(e).__name__}: {e}); the process serves on (please report this)")


class Runtime:
    """Everything one process needs to talk to its peers, for one loop.

    It listens on a Linux abstract Unix socket named by :attr:`addr`
    (``@meshio-<random>/controller`` in the controller, ``@meshio-<random>/<worker
    id>`` in its workers): no file exists, so nothing is left behind however
    the process dies.  Every connection, in or out, passes the job handshake
    (:mod:`._handshake`) over :attr:`secret` before a frame is read.

    A ``tcp://HOST:PORT`` address listens on TCP instead (port 0: any),
    named by ``advertise`` (how other hosts reach it) when ``HOST`` is
    ``0.0.0.0``; ``tls`` then applies to every connection.  A controller
    listens on TCP once per job it drives (:meth:`SocketBackend.listen_tcp`), and a TCP
    connection proves the :class:`~._credentials.Credentials` of the job of
    the process at its other end (:attr:`peer_jobs`).

    With ``name``, the runtime answers to that address while it listens at
    ``addr`` (:attr:`listening`): a replacement worker keeps its
    predecessor's address, which its peers know, but listens on a fresh
    name (another user may hold the old one); the controller tells the
    peers where (:class:`~._messages.Moved`, :attr:`routes`).

    An ``in_process`` runtime (a worker of the in-process transport,
    :mod:`meshio.testing`) listens on no socket: the runtimes of this process
    on the same loop reach it, and it them, through in-memory connections
    (:mod:`._memory`), with no handshake, since nothing leaves the process.

    Its dispatch handles the transport's own messages; the layers above
    register handlers for theirs (:func:`register_handler`).  What it knows
    by role is an object of its own (:mod:`._roles`): :attr:`watch`, the
    workers it started; :attr:`incarnation`, its own restart as a worker.
    """

    #: message type → its handler, for the messages of layers above the
    #: transport (see :func:`register_handler`)
    handlers: ClassVar[dict[type[_Msg], Handler]] = {}
    #: the messages an inspection client may send (the others drop its connection)
    for_inspection: ClassVar[set[type[_Msg]]] = set()

    def __init__(self, loop: asyncio.AbstractEventLoop, addr: str | None = None,
                 worker: str = "", secret: bytes | None = None, *,
                 in_process: bool = False, tls: TLSConfig | None = None,
                 advertise: str | None = None, name: str | None = None) -> None:
        self.loop = loop
        self.in_process = in_process
        #: where what this runtime receives in memory runs: a context of its
        #: own in which :func:`runtime` is this runtime
        self.context: contextvars.Context = contextvars.Context()
        self.context.run(_current.set, self)
        self.worker = worker
        self.host: str = socket.gethostname()
        #: the job secret every connection proves (made by the controller)
        self.secret: bytes = new_secret() if secret is None else secret
        if addr is None:
            addr = f"@meshio-{secrets.token_hex(8)}/controller"
        #: what this runtime's TCP connections prove, but for those to the
        #: processes of another job (:attr:`peer_jobs`): its own secret, and ``tls``
        self.tcp: Credentials = Credentials(self.secret, tls)
        #: by address, the job of the process there when it is not this
        #: runtime's own (learned from its ``Hello``, or told by a controller
        #: re-attaching to a kept-alive proc mesh; what dialling it proves)
        self.peer_jobs: dict[str, Credentials] = {}
        #: its tasks: serving each listener, TLS handshakes, dialling, and
        #: what the layers start on its behalf (cancelled by :meth:`close`)
        self.tasks: TaskOwner = TaskOwner(f"the runtime at {addr}", self.loop)
        if not in_process:  # (memory idle in the receive pool goes back to the system)
            self.tasks.start(trimming(), name="meshio: trim the receive pool")
        #: how it reaches peers and is reached: its sockets (listeners and
        #: dialler), and memory for the in-process runtimes on its loop
        self.sockets: SocketBackend = SocketBackend(self)
        self.memory: MemoryBackend = MemoryBackend(self)
        #: whether the loop is being kept polling (:meth:`heard`); when the
        #: last data from another process came in, when it last polled
        #: (``perf_counter``)
        self.polling: bool = False
        self._heard_at = self._polled_at = -math.inf
        #: the connections batching small frames until the end of this turn
        #: of the loop (:meth:`batching`)
        self.batched: list[Connection] = []
        #: a connection's read (``buffer_updated``) is running: it writes
        #: what was batched meanwhile when it returns
        self.reading = False
        #: what serves the calls that read brought for idle actors (each
        #: actor's, once), run as it returns: the read's Cancels are in by then
        self.admitted: list[Callable[[], None]] = []
        endpoint = None if in_process else tcp_endpoint(addr)
        if endpoint is not None:  # a TCP address of its own: port 0 picks one
            addr = self.sockets.listen(tcp_listener(*endpoint), advertise or endpoint[0],
                                       self.tcp)
        #: prefix of this job's socket names (``@meshio-<random>``)
        self.namespace: str = (addr.rpartition("/")[0] if endpoint is None
                               else f"@meshio-{secrets.token_hex(8)}")
        #: where this runtime listens (its Unix name, or its ``tcp://`` address)
        self.listening: str = addr
        #: the address this runtime answers to: where it listens, or ``name``
        self.addr: str = name or addr
        #: address → where the process answering to it listens, when not
        #: there (replacement workers; told by the controller, :class:`Moved`)
        self.routes: dict[str, str] = {} if name is None else {name: addr}
        #: a runtime's own address → the other one this runtime dialled it
        #: at, over whose connection it is reached (a controller's Unix name
        #: → its TCP listener, told on connecting: see :meth:`accept`)
        self.aliases: dict[str, str] = {}
        #: Unix address → the pid of the process listening there, where known
        #: (the controller's own workers): a dial finding another one is refused
        self.pids: dict[str, int] = {}
        self.closed: bool = False
        self.conns: dict[str, Connection] = {}
        self.all_conns: weakref.WeakSet[Connection] = weakref.WeakSet()
        #: the actors of this process by target (actor cells add themselves)
        self.actors: dict[str, Mailbox] = {}
        #: by target, the credit this process's actor gave back for this
        #: process's own calls to it and this process has not received yet
        #: (:func:`._credit.took`, :func:`._credit.credit`): none on the way,
        #: its calls waiting for room there wait for the actor's next call
        self.own_credit: dict[str, int] = {}
        #: the open ports of this process by id (port receivers add themselves)
        self.ports: dict[int, PortSink] = {}
        #: the actors a message wanting no answer (a ``broadcast``) found
        #: gone here, said once each (:meth:`post`)
        self.unheard: set[str] = set()
        #: the ports (of this runtime) a value arrived for after they were
        #: closed, said once each
        self.dropped: set[int] = set()
        #: addresses known dead → the error their callers get
        self.dead: DeadTable = DeadTable()
        #: by peer address: called with the connection when it is lost
        self.on_lost: dict[str, Callable[[Connection], None]] = {}
        #: called with every connection lost, after its actors' and ports'
        #: calls (layers' states drop what a peer held: weight stores' waits)
        self.on_any_lost: list[Callable[[Connection], None]] = []
        self.on_fault: Callable[[Connection, ErrorInfo], None] = _log_fault
        #: the workers this runtime started (a controller's role)
        self.watch: Watch = Watch()
        #: this process as an incarnation of a worker's slot (a worker's role)
        self.incarnation: Incarnation = Incarnation()
        #: the fan-out tree: this runtime as a caller and as a relay; the
        #: direct calls it holds back for the tree calls they follow
        self.fanout: FanoutState = FanoutState()
        self.order: Order = Order(self)
        #: the layers' per-runtime state, by the factory that made it (:meth:`state`)
        self._states: dict[Callable[[Runtime], RuntimeState], RuntimeState] = {}
        #: worker side: the controller's address (faults are reported there)
        self.controller: str | None = None
        #: what an inspection client proves (:meth:`SocketBackend.listen_inspection`), and
        #: where it reaches this runtime; None: nowhere
        self.inspection: Credentials | None = None
        self.inspection_addr: str | None = None
        if not in_process and endpoint is None:
            self.sockets.listen(unix_listener(addr), "", None)
        _local[self.addr] = self

    def accept(self, transport: asyncio.Transport, leftover: bytes,
                creds: tuple[int, int, int] | None, job: Credentials | None,
                addr: str, origin: str) -> None:
        """A connection at this runtime's address ``addr`` passed the
        handshake (on TCP, for the processes of ``job``) with the peer
        ``origin`` (for log lines): a Connection takes over its transport
        (``leftover``: bytes read already)."""
        conn = Connection(self, None)
        conn.job = job
        conn.origin = origin
        if creds is not None:
            conn.peer_pid = creds[0]
        self.all_conns.add(conn)
        transport.set_protocol(conn)
        conn.connection_made(transport)
        if addr != self.addr and job is not self.inspection:
            # the peer dialled another name of this runtime (a controller's
            # TCP or job listener): tell it the one this runtime's handles
            # carry (a weight store's, an RDMA buffer's), which it then
            # reaches through ``addr`` (:attr:`aliases`)
            conn.send_message(Hello(self.addr, os.getpid(), self.worker))
        feed(conn, transport, leftover)


    # ------------------------------------------------------------ peers

    def connect(self, addr: str, job: Credentials | None = None) -> Connection:
        """The connection to ``addr``, dialling it if needed (sends made
        before it is up are queued in order).  It is dialled proving
        ``job``: by default the job of the process there (:attr:`peer_jobs`),
        else this runtime's own (:attr:`tcp`).

        Raises:
            AuthenticationError: ``addr`` is connected already, as a process
                of another job than ``job``.
            WrongLoopError: ``addr`` is the runtime of another loop of this
                process, which this loop's runtime cannot reach (its own
                job secret): a port opened there, used here.
        """
        conn = self.conns.get(addr)
        if conn is None and addr in self.aliases:
            return self.connect(self.aliases[addr], job)
        if conn is not None:
            if job is not None and conn.job != job:
                raise AuthenticationError(
                    f"{addr} is connected already, as a process of a job with another secret "
                    "or TLS setting; a process belongs to one job")
            return conn
        peer = _local.get(addr)
        if peer is not None and peer.loop is not self.loop and _runtimes.get(self.loop) is self:
            raise not_its_loop(peer, f"the port (or handle) at {addr}")
        conn = Connection(self, addr)
        conn.job = job or self.peer_jobs.get(addr, self.tcp if addr.startswith("tcp://")
                                             else None)
        self.conns[addr] = conn
        self.all_conns.add(conn)
        (self.sockets if self.in_memory(addr) is None else self.memory).dial(conn, addr)
        return conn

    def in_memory(self, addr: str) -> Runtime | None:
        """The runtime at ``addr`` when this one reaches it in memory (one
        of them in-process, both on this loop), else None."""
        peer = _local.get(addr)
        if peer is not None and (peer.in_process or self.in_process) and peer.loop is self.loop:
            return peer
        return None

    def _connection_lost(self, conn: Connection, exc: Exception | None) -> None:
        if conn.peer is not None and self.conns.get(conn.peer) is conn:
            del self.conns[conn.peer]
        # what it asked of this process (a relay's calls too) has nobody to answer
        for cell in list(self.actors.values()):
            cell.lost(conn)
        for receiver in list(self.ports.values()):
            receiver._lost(conn)
        self.fanout.lost(conn)
        for lost in self.on_any_lost:
            lost(conn)
        cause = f"connection lost ({exc})" if exc else "connection lost"
        tcp = tcp_endpoint(conn.peer or "")
        host = self.host if tcp is None else tcp[0]
        windows_lost(conn, lambda: SupervisionError(
            f"{cause} to process {conn.peer_pid} at {conn.peer} while a broadcast waited for "
            "room in its actors' mailboxes", host=host, pid=conn.peer_pid, cause=cause))
        hook = self.on_lost.get(conn.peer or "")
        if hook is not None:
            hook(conn)
        else:
            conn.fail_all(disconnected(conn.peer or "", conn.peer_pid, host, cause))
        if conn.peer is not None:  # (once its owner knows it is dead: see the hook)
            self.fanout.gone(conn.peer)

    # --------------------------------------------------- end of the turn

    def batching(self, conn: Connection) -> None:
        """``conn`` sent the first frame of this turn of the loop and batches
        the small frames that follow until the turn ends: one callback per
        turn writes every connection's batch (a call to 4 actors goes on
        4 connections: one callback, not 4).  Within a read
        (:attr:`reading`), the read writes them when it returns, without a
        callback: a call served as it came in is answered then."""
        if not self.batched and not self.reading:
            self.loop.call_soon(self.end_turn)
        self.batched.append(conn)

    def end_turn(self) -> None:
        """Write every connection's batch (:meth:`batching`)."""
        conns, self.batched = self.batched, []
        for conn in conns:
            conn.flush()

    # ---------------------------------------------------------- polling

    def heard(self) -> None:
        """Data came in from another process (a socket connection's read).
        If it came within ``busy_poll`` seconds (:func:`~meshio.set_limits`)
        of the data before, calls are going back and forth: the loop keeps
        polling (never sleeps) until that long after the last data, so the
        next message is read as soon as it lands, not after the kernel wakes
        this process up (a third of a small call's round trip: about 25 of
        70 µs here, at each end).  A process that hears something now and
        then never polls."""
        now = time.perf_counter()
        recent = now - self._heard_at < limits.busy_poll
        self._heard_at = now
        if recent and not self.polling:
            self.polling = True
            self.loop.call_soon(self._poll)

    def _poll(self) -> None:
        """One turn of polling: a callback ready at each turn of the loop
        keeps it from sleeping.  A turn that heard nothing new yields the
        core, so that another process runnable on it goes first (without
        that, 4 polling workers and their caller on 2 cores took a call to
        all 4 from 114 to 390 µs); a turn busy with new data does not (the
        yield would only slow it down)."""
        now = time.perf_counter()
        if self.closed or now - self._heard_at >= limits.busy_poll:
            self.polling = False
            return
        if self._heard_at < self._polled_at:
            os.sched_yield()
        self._polled_at = now
        self.loop.call_soon(self._poll)

    # --------------------------------------------------------- dispatch

    def dispatch(self, conn: Connection, msg: Message, bufs: Buffers) -> None:
        if conn.job is not None and conn.job is self.inspection:
            self._inspected(conn, msg, bufs)
            return
        match msg:
            case Call():
                self.admit(conn, msg, bufs)
            case Calls():
                self.admit_calls(conn, msg.calls)
            case Fanout():
                try:
                    relay(self, conn, msg, bufs, self.admit)
                except Exception as e:  # a bug here: its callers hear of it, not a hang
                    log.exception("meshio: relaying a tree call of %s.%s from %s failed",
                                  msg.target, msg.method, conn.who)
                    refuse(conn, msg, _internal(self, "tree call", e))
            case Hello() if conn.peer is not None:  # a runtime this one dialled names itself
                if msg.addr != conn.peer:
                    self.aliases[msg.addr] = conn.peer
                if conn.peer_pid == -1:  # (named in the errors of calls to it)
                    conn.peer_pid = msg.pid
            case Hello():
                if conn.peer_pid not in (-1, msg.pid):  # SO_PEERCRED knows better
                    log.warning("meshio: refused a connection to %s from pid %d: its Hello "
                                "claims pid %d (a relayed connection?)", self.addr,
                                conn.peer_pid, msg.pid)
                    conn.abort()
                    return
                conn.peer_pid = msg.pid
                conn.worker = msg.worker
                conn.listen = msg.listen or msg.addr
                if conn.peer is None:
                    conn.peer = msg.addr
                    self.conns.setdefault(msg.addr, conn)
                    if conn.job is not None and conn.job is not self.tcp:
                        self.peer_jobs[msg.addr] = conn.job  # redialled as a process of its job
                waiter = self.watch.hello_waiters.pop(msg.worker, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(conn)
            case Started():
                p = conn.pending.get(msg.req)
                if p is not None:
                    p.begun()
            case PortSend():
                receiver = self.ports.get(msg.port)
                if receiver is None:
                    if not (msg.held or msg.released or msg.close) \
                            and msg.port not in self.dropped:
                        self.dropped.add(msg.port)  # (a value lost: said, once per port)
                        log.warning("meshio: a value sent to port %d by process %s was dropped: "
                                    "the port is closed (one close() ends it for every sender), "
                                    "or its receiver was closed or is gone (said once per port)",
                                    msg.port, conn.peer_pid)
                elif msg.held:
                    receiver._held(conn)
                elif msg.released:
                    receiver._released(conn, msg.holders)
                else:
                    receiver._put(msg, bufs)
            case Credit():
                up = (self.fanout.ups.get((msg.target, msg.origin))
                      if msg.origin and msg.origin != self.addr else None)
                if up is not None:  # a relay: to where the origin's tree calls came from
                    up.send_message(msg)
                else:
                    credit(conn, msg, self.fanout.gates)
            case Cancel():
                cell = self.actors.get(msg.target)
                if not self.fanout.cancel(conn, msg.req, msg.expired) and cell is not None:
                    cell.cancel(conn, msg.req, msg.expired)
            case Fault():
                handler = self.watch.on_fault_from.get(conn.peer or "")
                if handler is not None:
                    handler(msg.error, msg.stopped)
                else:
                    self.on_fault(conn, msg.error)
            case Ping():
                conn.send_control(Pong(msg.seq))
            case Pong():
                on_pong = self.watch.on_pong.get(conn.peer or "")
                if on_pong is not None:
                    on_pong()
            case PeerDown():  # calls to it fail (its connection stays) until PeerUp
                self.dead[msg.addr] = not_responding(msg, self.loop.time, in_flight=False)
                in_flight = not_responding(msg, self.loop.time, in_flight=True)
                for peer in list(self.all_conns):
                    if peer.peer == msg.addr:  # (silent, not gone: its calls cancelled there)
                        peer.fail_all(in_flight, cancel=not msg.gone)
                        if msg.gone:  # nothing else would ever close it
                            peer.abort()
            case PeerUp():
                self.dead.pop(msg.addr, None)
            case Moved():
                if self.controller is not None and conn.peer == self.controller:
                    self.routes[msg.addr] = msg.listen
                    if msg.pid:
                        self.pids[msg.listen] = msg.pid
                    for worker in self.watch.on_pong:  # our own workers (nested proc meshes)
                        own = self.conns.get(worker)
                        if own is not None:
                            own.send_message(msg)
            case _:
                registered = self.handlers.get(type(msg))
                if registered is None:
                    log.warning("meshio: unexpected %s from %s", type(msg).__name__, conn.peer)
                else:
                    registered(self, conn, msg, bufs)

    def _inspected(self, conn: Connection, msg: Message, bufs: Buffers) -> None:
        """A message from an inspection client (:meth:`SocketBackend.listen_inspection`)."""
        if type(msg) is Hello:
            return
        if type(msg) not in self.for_inspection:
            log.warning("meshio: dropped an inspection client of %s (pid %d): it sent %s, "
                        "which inspection clients may not", self.addr, conn.peer_pid,
                        type(msg).__name__)
            conn.abort()
            return
        self.handlers[type(msg)](self, conn, msg, bufs)

    def admit(self, conn: Connection, msg: Call, bufs: Buffers) -> None:
        """Hand a call that arrived on ``conn`` (or, a tree call's, was
        relayed by its peer) to the actor it is for; a numbered one
        (``Call.seq``) in its order."""
        try:
            if msg.seq:
                self.order.admit(conn, msg, bufs, self.post)
            elif (cell := self.actors.get(msg.target)) is not None:
                cell.post(conn, msg, bufs)  # (post's common case, inline: this runs per call)
            else:
                self.post(conn, msg, bufs)
        except Exception as e:  # a bug here: the caller hears of it, not a hang
            self.refuse(conn, msg, e)

    def admit_calls(self, conn: Connection, calls: Sequence[Call]) -> None:
        """:meth:`admit` of each call of a :class:`Calls` frame, in order; a
        run of calls to one actor in one go (``Mailbox.post_run``: one that
        finds it idle is served with those after it, as they come)."""
        i, n = 0, len(calls)
        while i < n:
            msg = calls[i]
            cell = self.actors.get(msg.target) if not msg.seq else None
            if cell is None:
                self.admit(conn, msg, [])
                i += 1
                continue
            try:
                i = cell.post_run(conn, calls, i)
            except Exception as e:  # a bug here, before calls[i] was taken (see refuse)
                self.refuse(conn, msg, e)
                i += 1

    def refuse(self, conn: Connection, msg: Call, e: Exception) -> None:
        """Admitting or starting ``msg`` failed with ``e``, a bug: it is
        logged and the caller hears of it (not a hang); the connection and
        the actor serve on."""
        log.exception("meshio: admitting a call of %s.%s from %s failed", msg.target,
                      msg.method, conn.who, exc_info=e)
        conn.send_message(Fail(msg.req, ErrorInfo(  # (req 0, a broadcast: the peer logs it)
            "protocol", "ProtocolError", _internal(self, "call", e))))

    def post(self, conn: Connection, msg: Call, bufs: Buffers) -> None:
        """Hand a call to the actor it is for (in :meth:`admit`, which
        answers for a failure here)."""
        cell = self.actors.get(msg.target)
        if cell is None:
            if not msg.origin and self.incarnation.stopped(msg.target) \
                    and self.incarnation.missing(msg.target) is None:
                # stopped: the caller's window for it goes (:func:`._credit.credit`),
                # before the caller hears of the call's failure
                conn.send_message(Credit(msg.target, -1))
            elif msg.bounded:  # no mailbox holds it
                took(conn, msg.target, 1, msg.origin)
            if msg.req:
                conn.send_message(Fail(msg.req, self._missing(msg.target)))
            elif msg.target not in self.unheard:  # (a broadcast: nobody to tell but the logs)
                self.unheard.add(msg.target)
                log.warning("meshio: a broadcast of %s was dropped: %s (said once per actor "
                            "and process)", msg.method, self._missing(msg.target).message)
            return
        cell.post(conn, msg, bufs)

    def _missing(self, target: str) -> ErrorInfo:
        why = self.incarnation.missing(target)
        if why is not None:
            return ErrorInfo("supervision", "SupervisionError",
                             f"actor {target!r} in process {os.getpid()} {why}")
        if self.incarnation.stopped(target):
            name = target.rpartition("/")[2]
            return ErrorInfo(
                "supervision", "SupervisionError",
                f"actor mesh {name!r} was stopped in process {os.getpid()} (its actor "
                f"{target!r} is gone: stop() on the mesh, or on a slice holding this actor); "
                f"a stopped actor stays stopped, and a mesh spawned again under its name is "
                f"another one, reached through the reference its spawn returned", actor=name)
        return ErrorInfo(
            "unknown_actor", "UnknownActorError",
            f"no actor {target!r} in process {os.getpid()} "
            f"({self.worker or 'controller'}); it was never spawned here or has been stopped")

    def report_fault(self, info: ErrorInfo, stopped: bool = False) -> None:
        """Tell the supervising controller that an actor failed with nobody
        waiting (``stopped``: the failure ended the actor)."""
        if self.controller is None:
            self.on_fault(Connection(self, None), info)
        else:
            self.connect(self.controller).send_message(Fault(info, stopped))

    def state(self, make: Callable[[Runtime], _S]) -> _S:
        """This runtime's instance of a layer's state: ``make(self)`` on first
        use, the same object after; closed with the runtime, the last made
        first (the one way a layer above keeps state per runtime).

        Raises:
            ClosedResourceError: the runtime has closed (nothing would close
                a state made now).
        """
        st = self._states.get(make)
        if st is None:
            if self.closed:
                raise ClosedResourceError(
                    f"meshio runtime at {self.addr} is closed (its loop's meshio.run "
                    f"returned); {getattr(make, '__qualname__', make)} cannot start on it")
            st = self._states[make] = make(self)
        return cast(_S, st)

    def has_state(self, make: Callable[[Runtime], RuntimeState]) -> bool:
        """Whether :meth:`state` has made ``make``'s state in this runtime."""
        return make in self._states

    def close(self) -> None:
        """Stop listening, drop every connection and close the layers' state
        (the end of this loop's runtime; workers still attached exit when
        their connection drops)."""
        self.closed = True
        if _local.get(self.addr) is self:
            del _local[self.addr]
        self.tasks.cancel()
        self.sockets.close()
        self.memory.close()
        # Nothing watches the processes at the other end any more: their
        # connections' losses (reported a loop turn later) fail what is in
        # flight and report no process failure (a worker exits when its
        # controller's connection drops: the end of the program, not a crash).
        self.on_lost.clear()
        for conn in list(self.all_conns):
            conn.abort()
        for st in reversed(list(self._states.values())):
            try:
                st.close()
            except Exception:  # one layer's failure does not keep the others open
                log.exception("meshio: closing the runtime at %s", self.addr)
        self._states.clear()
        if _runtimes.get(self.loop) is self:
            del _runtimes[self.loop]


def close_runtime() -> None:
    """Close the running loop's runtime, if it has one."""
    rt = _runtimes.get(asyncio.get_running_loop())
    if rt is not None:
        rt.close()


def tell_held(rt: Runtime, what: str, held: bool) -> None:
    """In a worker: tell the controller that started it that ``what`` is
    about to hold its loop (``held``: an actor being built, the first
    ``import torch``) or no longer does (:class:`LoopHeld`), written at
    once; nothing in a controller, or with its connection gone."""
    conn = rt.conns.get(rt.controller or "")
    if conn is not None and not conn.closed:
        conn.send_message(LoopHeld(held, what))
        conn.write_batched()


async def ask_each(rt: Runtime, asks: Sequence[tuple[str, Callable[[int], Message], str, Any]],
                   decode: Callable[[Any, Buffers], _T], what: str,
                   timeout: float) -> list[_T | str]:
    """Ask several processes at once, each on its runtime (not an actor):
    ``asks`` holds, per process, its address, the request to send it
    (made from its request number), and how to name it in an error: a mesh
    (``proc mesh 'p'``) and a point in it (as for a call: :class:`Pending`).
    Per ask, in order: its answer (``decode``), or a line saying why there
    is none (the process is gone, failed, or has not answered within
    ``timeout`` seconds).  ``what`` names the request (``"stacks()"``).

    Raises:
        TypeError: ``timeout`` is not a number (a str, a bool).
        ValueError: ``timeout`` is not seconds > 0 (NaN, or an int no float
            holds; ``math.inf``: no bound).
    """
    check_seconds(timeout, what.removesuffix("()"), "timeout")
    futs: list[asyncio.Future[_T]] = []
    asked: list[Pending] = []
    sent: list[tuple[str, Connection, int]] = []
    for addr, request, mesh, point in asks:
        fut: asyncio.Future[_T] = rt.loop.create_future()
        futs.append(fut)
        pending = Pending(fut, decode, what, mesh, point)
        asked.append(pending)
        dead = rt.dead.get(addr)
        if dead is not None:
            fut.set_exception(dead(pending))
            continue
        conn = rt.connect(addr)
        req = conn.next_req(pending)
        sent.append((addr, conn, req))
        conn.send_message(request(req))
    try:
        if futs:
            await asyncio.wait(futs, timeout=timeout)
    finally:  # (also when cancelled) an answer still to come is not waited for
        for _, conn, req in sent:
            conn.pending.pop(req, None)
        for fut in futs:
            if not fut.cancel() and not fut.cancelled():  # done: its error counts as seen
                fut.exception()
    # Each named as the other errors name a process: "proc mesh 'p' rank 1
    # (pid 42): ..." (not an address, nor the repr of its point).
    pids = {addr: conn.peer_pid for addr, conn, _ in sent}
    answers: list[_T | str] = []
    for (addr, _, _, _), pending, fut in zip(asks, asked, futs):
        error = None if fut.cancelled() else fut.exception()
        pid = error.pid if isinstance(error, SupervisionError) else pids.get(addr, -1)
        who = pending.who if pid < 0 else f"{pending.who} (pid {pid})"
        if fut.cancelled():
            answers.append(f"{who} did not answer within {timeout:g} s: its process is "
                           "stopped or hung, or an async endpoint blocks its event loop")
        elif isinstance(error, SupervisionError) and error.cause:
            answers.append(f"{who}: {error.cause}")  # (its text names it as a callee's)
        elif isinstance(error, MeshioError):
            answers.append(str(error))
        elif isinstance(error, ValueError):  # a malformed answer
            answers.append(f"{who}: bad answer: {error}")
        else:
            answers.append(fut.result())
    return answers


def fault_report(info: ErrorInfo, pids: Sequence[int], what_now: str, ranks: str = "") -> str:
    """One report (for stderr, after ``meshio: ``) of actors that failed
    alike with nobody to tell: where (``info.rank``, or ``ranks`` of
    several, written as runs), what happens now, and the error with the
    traceback of ``info``."""
    where = (f"rank {info.rank} (pid {pids[0]}" if len(pids) == 1
             else f"ranks {ranks} (pids {', '.join(map(str, pids))}")
    return (f"failure in {info.actor} {where}; {what_now}): {info.type_name}: "
            f"{info.message}\n{info.traceback}")


def _log_fault(conn: Connection, info: ErrorInfo) -> None:
    """A fault from an actor that no proc mesh of this process supervises
    (one in this process, or in a process no longer watched)."""
    pid = os.getpid() if conn.peer_pid == -1 else conn.peer_pid  # -1: from this process
    print("meshio: " + fault_report(info, (pid,), "no proc mesh of this process watches it: "
                                     "nothing restarts it"), file=sys.stderr, flush=True)


register_handler(Fill, fill)  # the transport's own: large values (._bulk)
