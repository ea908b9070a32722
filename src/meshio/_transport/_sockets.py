"""The socket backend of a runtime: its listeners (a Unix name; TCP, with
TLS, per job it drives; the inspection listener) and its dialler, each
connection past the job handshake (:mod:`._handshake`) before it is handed
to the runtime.  The in-process transport's :class:`~._memory.MemoryBackend`
implements the same :class:`Backend` interface for the runtimes of one
process and loop."""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import secrets
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar, cast

from .._exceptions import AuthenticationError, ClosedResourceError, MeshioError, SupervisionError
from ._connection import Connection, Pending
from ._credentials import Credentials
from ._handshake import HANDSHAKE_TIMEOUT, HandshakeProtocol, peer_creds, tcp_address
from ._tasks import within

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ("CONNECT_TIMEOUT", "LISTEN_BACKLOG", "Backend", "Crowd", "SocketBackend", "feed",
           "is_loopback", "sockaddr", "tcp_endpoint", "tcp_listener", "unix_listener")

log = logging.getLogger("meshio")

_K = TypeVar("_K")

#: seconds a TLS listener waits before accepting again after an accept
#: failed (out of descriptors or memory; asyncio's servers wait as long)
ACCEPT_RETRY_DELAY: Final = 1.0
#: listen backlog of every runtime (the kernel caps it at net.core.somaxconn)
LISTEN_BACKLOG: Final = 4096
#: seconds a dialler gives a peer to accept and complete the handshake
CONNECT_TIMEOUT = 60.0
#: incoming connections a runtime lets handshake at once, on all its
#: listeners: past it, the oldest of the source holding the most is dropped
#: for the newest.  Peers that connect and never prove anything (thousands
#: of them, each allowed the handshake timeout) hold at most this many
#: descriptors, and a flood from one address crowds out only itself: the
#: job's peers at other addresses still get through.
MAX_HANDSHAKING: Final = 256
#: refusals logged at once, then one more a second: a flood of refused
#: connections writes a line a second (each naming how many went unlogged),
#: not one per connection
REFUSALS_LOGGED: Final = 20


def sockaddr(addr: str) -> str:
    """The socket address of a meshio Unix address: ``@name`` is the Linux
    abstract socket ``\\0name`` (no file), anything else a path."""
    return "\0" + addr[1:] if addr.startswith("@") else addr


def is_loopback(host: str) -> bool:
    """``host`` (an address, ``[::1]`` too, or ``localhost`` in any case, a
    final dot or not) is this machine's loopback."""
    host = host.lower().removesuffix(".")
    if host == "localhost":
        return True
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # (another name)
        return False


def _source(peer: object) -> str:
    """Whom an incoming connection from ``peer`` (its address) counts
    against: its IPv4 address (also as an IPv6 listener sees it,
    ``::ffff:10.0.0.9``); the /64 network of its IPv6 address (one host may
    hold all of one); ``""``, a Unix socket's peer (on this host, its uid
    checked at once)."""
    if not isinstance(peer, tuple) or not peer:
        return ""
    host = str(cast(tuple[object, ...], peer)[0])
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv4Address):
        return host
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.ip_network(f"{ip}/64", strict=False))


class Crowd(Generic[_K]):
    """Incoming connections that proved nothing yet, oldest first, each
    counted against its source (:func:`_source`): past ``most`` of them,
    the oldest of the source that holds the most is dropped for the newest,
    so that a flood from one address crowds out only itself."""

    def __init__(self, most: int) -> None:
        self.most = most
        #: each connection → (the source it counts against, how to drop it)
        self._held: dict[_K, tuple[str, Callable[[], None]]] = {}

    def admit(self, key: _K, peer: object, drop: Callable[[], None]) -> None:
        """Count ``key``, a connection from ``peer`` (its address), which
        ``drop`` drops."""
        held = self._held
        if len(held) >= self.most:
            crowd, _ = Counter(source for source, _ in held.values()).most_common(1)[0]
            oldest = next(k for k, (source, _) in held.items() if source == crowd)
            held.pop(oldest)[1]()
        held[key] = (_source(peer), drop)

    def leave(self, key: _K) -> bool:
        """Count ``key`` no longer (it proved itself, or ended); whether it
        was counted (not dropped)."""
        return self._held.pop(key, None) is not None


def tcp_endpoint(addr: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``tcp://HOST:PORT`` address (``[v6]`` for IPv6
    hosts); None for a Unix address.

    Raises:
        ValueError: a ``tcp://`` address without a valid port.
    """
    if not addr.startswith("tcp://"):
        return None
    host, sep, port = addr[len("tcp://"):].rpartition(":")
    if not sep or not port.isdigit() or not host or int(port) > 65535:
        raise ValueError(f"bad meshio TCP address {addr!r}: expected tcp://HOST:PORT")
    return host.strip("[]"), int(port)


def unix_listener(addr: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(sockaddr(addr))
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def tcp_listener(host: str, port: int) -> socket.socket:
    sock = socket.create_server((host, port), backlog=LISTEN_BACKLOG,
                                family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setblocking(False)
    return sock


def feed(conn: Connection, transport: asyncio.Transport, data: bytes) -> None:
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


class Backend(Protocol):
    """How a runtime connects to a peer: the sockets, or memory (the
    in-process transport)."""

    def dial(self, conn: Connection, addr: str) -> None:
        """Connect ``conn`` (made by :meth:`Runtime.connect`) to ``addr``;
        what it sends meanwhile is queued, and a failure fails its calls."""
        ...

    async def dialled(self, conn: Connection) -> None:
        """Return once dialling ``conn`` has ended (up, or failed)."""
        ...

    def close(self) -> None:
        """Stop listening and dialling."""
        ...


class SocketBackend:
    """A runtime's listeners and dialler on Unix and TCP sockets."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        #: controller side: the ``tcp://`` address it listens at for each job
        #: it drives (:meth:`listen_tcp`)
        self._tcp_listeners: dict[Credentials, str] = {}
        #: controller side: the Unix name it listens at for each kept-alive
        #: proc mesh of another job it re-attached to (:meth:`listen_job`)
        self._job_listeners: dict[Credentials, str] = {}
        self._socks: list[socket.socket] = []
        self._servers: list[asyncio.Server] = []
        self._handshakes: set[HandshakeProtocol] = set()
        #: the incoming ones, under way (:meth:`_admit`)
        self._incoming: Crowd[HandshakeProtocol] = Crowd(MAX_HANDSHAKING)
        #: refusals that may be logged now (:data:`REFUSALS_LOGGED`), when
        #: that was counted, and those not logged since the last line
        self._may_log = float(REFUSALS_LOGGED)
        self._counted = time.monotonic()
        self._unlogged = 0
        #: connections being dialled → done once dialling ended (:meth:`dialled`)
        self._dialling: dict[Connection, asyncio.Task[None]] = {}

    def dial(self, conn: Connection, addr: str) -> None:
        task = self._dialling[conn] = self.rt.tasks.start(self._dial(conn, addr))
        task.add_done_callback(lambda _: self._dialling.pop(conn, None))

    def close(self) -> None:
        for server in self._servers:
            server.close()
        for hs in list(self._handshakes):
            hs.fail(ConnectionAbortedError(f"meshio runtime at {self.rt.addr} closed"))
        for sock in self._socks:
            sock.close()

    def listen_inspection(self, secret: bytes) -> str:
        """Listen for inspection clients (``meshio stacks``) too, at a Unix
        name of their own, returned: a connection there proves ``secret``
        (not the job's, which it never learns) and may send only the
        messages registered with ``inspection=True``; any other drops it,
        and its ``Hello`` is ignored (it is nobody's address).  Once per
        runtime: a second call returns the same address.

        Raises:
            ClosedResourceError: the runtime is closed.
        """
        if self.rt.inspection_addr is not None:
            return self.rt.inspection_addr
        if self.rt.closed:
            raise ClosedResourceError(f"meshio runtime at {self.rt.addr} is closed")
        addr = f"{self.rt.namespace}/inspect"
        sock = unix_listener(addr)
        self._socks.append(sock)
        self.rt.inspection = creds = Credentials(secret)
        self.rt.tasks.start(self._serve(sock, functools.partial(self._handshake_in, addr, creds)))
        self.rt.inspection_addr = addr
        return addr

    @property
    def tcp_addrs(self) -> list[str]:
        """Where this runtime listens on TCP, one address per job it drives."""
        return list(self._tcp_listeners.values())

    def listen_tcp(self, bind: str | None = None, port: int = 0, *, advertise: str,
                   job: Credentials) -> str:
        """Listen on TCP too, for the processes of ``job`` (a connection there
        proves its secret, under its TLS): a controller whose workers run on
        other hosts.  Its ``tcp://`` address names the host ``advertise`` (how
        those hosts reach this one), on every address of its family unless
        ``bind`` names one, or ``advertise`` is a loopback address (a job on
        this host only: nothing elsewhere may even connect).  One listener
        per job: a second call for the same job returns the same address."""
        addr = self._tcp_listeners.get(job)
        if addr is not None:
            return addr
        if self.rt.closed:
            raise ClosedResourceError(f"meshio runtime at {self.rt.addr} is closed")
        if bind is None:
            bind = advertise if is_loopback(advertise) else "::" if ":" in advertise else "0.0.0.0"
        addr = self._tcp_listeners[job] = self.listen(tcp_listener(bind, port), advertise, job)
        return addr

    def listen_job(self, job: Credentials) -> str:
        """Listen on a Unix name of its own for the processes of ``job`` (a
        connection there proves its secret): a controller that re-attached
        to a kept-alive proc mesh started by another controller, whose
        workers hold that controller's secret.  One listener per job: a
        second call returns the same address.

        Raises:
            ClosedResourceError: the runtime is closed.
        """
        addr = self._job_listeners.get(job)
        if addr is not None:
            return addr
        if self.rt.closed:
            raise ClosedResourceError(f"meshio runtime at {self.rt.addr} is closed")
        addr = f"{self.rt.namespace}/job-{secrets.token_hex(4)}"
        sock = unix_listener(addr)
        self._socks.append(sock)
        self.rt.tasks.start(self._serve(sock, functools.partial(self._handshake_in, addr, job)))
        self._job_listeners[job] = addr
        return addr

    def listen(self, sock: socket.socket, advertise: str, job: Credentials | None) -> str:
        """Serve connections on the listening ``sock``: Unix (``job`` None),
        or TCP for the processes of ``job``, its address as ``advertise``
        names the host."""
        self._socks.append(sock)
        if job is None:
            self.rt.tasks.start(self._serve(
                sock, functools.partial(self._handshake_in, self.rt.addr, None)))
            return self.rt.addr
        addr = tcp_address(advertise, sock.getsockname()[1])
        self.rt.tasks.start(self._serve(sock, functools.partial(self._handshake_in, addr, job))
                         if job.server_context is None else self._serve_tls(sock, addr, job))
        return addr

    async def _serve(self, sock: socket.socket,
                     factory: Callable[[], asyncio.BaseProtocol]) -> None:
        if sock.family == socket.AF_UNIX:
            server = await self.rt.loop.create_unix_server(factory, sock=sock,
                                                        backlog=LISTEN_BACKLOG)
        else:
            server = await self.rt.loop.create_server(factory, sock=sock, backlog=LISTEN_BACKLOG)
        self._servers.append(server)

    async def _serve_tls(self, sock: socket.socket, addr: str, job: Credentials) -> None:
        """Accept TCP connections on ``sock`` and run TLS on each from its
        first byte (``connect_accepted_socket``; uvloop's ``start_tls`` after
        an accept sometimes lost the first bytes and stalled the handshake)."""
        sock.setblocking(False)
        while True:
            try:
                conn, peer = await self.rt.loop.sock_accept(sock)
            except ConnectionAbortedError:  # (gone before it was accepted)
                continue
            except OSError as e:  # out of descriptors or memory: as asyncio's servers do
                log.warning("meshio: cannot accept connections at %s: %s; trying again in "
                            "%g s", addr, e, ACCEPT_RETRY_DELAY)
                await asyncio.sleep(ACCEPT_RETRY_DELAY)
                continue
            self.rt.tasks.start(self._accept_tls(conn, peer, addr, job))

    async def _accept_tls(self, conn: socket.socket, peer: Any, addr: str,
                          job: Credentials) -> None:
        """The server side of TLS on an accepted connection, then the job
        handshake.  A peer that fails TLS (plain text, no or a foreign
        certificate, silence) is logged with its address and dropped;
        nothing of it is read."""
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        accepting = asyncio.current_task()

        def drop() -> None:  # (TLS under way: given up; else as any handshake)
            if accepting is not None and not accepting.done():
                accepting.cancel()
            else:
                hs.fail(self._dropped())
        hs = self._handshake_in(addr, job, tls=True)
        hs.peername = peer
        self._admit(hs, drop)  # (as accepted: TLS holds it for the handshake timeout too)
        try:
            await self.rt.loop.connect_accepted_socket(
                lambda: hs, conn, ssl=job.server_context,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
        except (TimeoutError, OSError) as e:
            conn.close()
            hs.fail(AuthenticationError(f"TLS failed: {str(e) or type(e).__name__}"))  # logged
        except BaseException as e:
            conn.close()
            self._handshakes.discard(hs)
            admitted = self._incoming.leave(hs)
            if isinstance(e, asyncio.CancelledError) and not admitted and not self.rt.closed:
                self._log_refused(addr, hs, self._dropped())  # (dropped by _admit)
            raise

    def _handshake_in(self, addr: str, job: Credentials | None, *,
                      tls: bool = False) -> HandshakeProtocol:
        """A new incoming connection at this runtime's address ``addr`` (on
        TCP, for the processes of ``job``): the handshake first, then a
        Connection.  It is admitted (:meth:`_admit`) once its peer is known,
        as its transport is made; under ``tls``, by the caller, as TLS
        begins."""
        def done(transport: asyncio.Transport, leftover: bytes) -> None:
            self._handshakes.discard(hs)
            self._incoming.leave(hs)
            self.rt.accept(transport, leftover, hs.creds, job, addr, hs.describe())

        def fail(error: Exception) -> None:
            self._handshakes.discard(hs)
            self._incoming.leave(hs)
            if not self.rt.closed:
                self._log_refused(addr, hs, error)

        hs = HandshakeProtocol(
            self.rt.secret if job is None else job.secret, dialler=False,
            timeout=HANDSHAKE_TIMEOUT, on_done=done, on_fail=fail,
            on_made=None if tls else lambda: self._admit(hs, lambda: hs.fail(self._dropped())))
        self._handshakes.add(hs)
        return hs

    def _admit(self, hs: HandshakeProtocol, drop: Callable[[], None]) -> None:
        """Count ``hs`` among the incoming handshakes under way
        (:class:`Crowd`: if :data:`MAX_HANDSHAKING` are, the oldest of the
        source that holds the most is dropped first, by its ``drop``)."""
        self._incoming.admit(hs, hs.peername, drop)

    @staticmethod
    def _dropped() -> ConnectionAbortedError:
        return ConnectionAbortedError(
            f"dropped unproven: {MAX_HANDSHAKING} connections were in the handshake at once "
            "(the oldest of the address holding the most goes for the newest)")

    def _log_refused(self, addr: str, hs: HandshakeProtocol, error: Exception) -> None:
        """Log a refused connection: :data:`REFUSALS_LOGGED` at once, then
        one a second, each line naming the refusals not logged before it.
        A process of this host and user that only went away during the
        handshake (it died, or gave up: a start cancelled, a ``meshio
        stacks`` past its timeout) proved nothing wrong: said at INFO level,
        not as a warning.  A TCP peer that did is warned of: one with
        another job's secret hangs up so (it checks the listener's proof
        first), and so does a probe that only connects."""
        if isinstance(error, ConnectionResetError) and hs.creds is not None:
            log.info("meshio: a connection to %s from %s ended: %s", addr, hs.describe(), error)
            return
        now = time.monotonic()
        self._may_log = min(float(REFUSALS_LOGGED), self._may_log + now - self._counted)
        self._counted = now
        if self._may_log < 1:
            self._unlogged += 1
            return
        self._may_log -= 1
        more, self._unlogged = self._unlogged, 0
        log.warning("meshio: refused a connection to %s from %s: %s%s", addr, hs.describe(),
                    error, f" ({more} more refused, not logged, since the line before)"
                    if more else "")

    async def dialled(self, conn: Connection) -> None:
        """Return once dialling ``conn`` (:meth:`Runtime.connect`) has ended: it is
        up, or it failed, and its calls with it."""
        task = self._dialling.get(conn)
        if task is not None:
            await asyncio.shield(task)

    async def _dial(self, conn: Connection, addr: str) -> None:
        """Connect to ``addr``, prove both sides, then hand over to ``conn``
        (which sends what was queued meanwhile); on failure its calls fail
        with what happened."""
        loop = self.rt.loop
        deadline = loop.time() + CONNECT_TIMEOUT
        proven: asyncio.Future[None] = loop.create_future()

        def done(transport: asyncio.Transport, leftover: bytes) -> None:
            self._handshakes.discard(hs)
            proven.set_result(None)
            creds = peer_creds(transport)  # (named in the errors of calls to it)
            if creds is not None:
                conn.peer_pid = creds[0]
            transport.set_protocol(conn)
            conn.connection_made(transport)
            feed(conn, transport, leftover)

        def fail(error: Exception) -> None:
            self._handshakes.discard(hs)
            if not proven.done():
                proven.set_exception(error)

        try:
            target = self.rt.routes.get(addr, addr)
            endpoint = tcp_endpoint(target)
            sock = await (self._connect(target, deadline) if endpoint is None
                          else self._connect_tcp(endpoint, deadline))
            job = conn.job or self.rt.tcp
            hs = HandshakeProtocol(job.secret,
                                   dialler=True, timeout=max(deadline - loop.time(), 0.0),
                                   on_done=done, on_fail=fail, pid=self.rt.pids.get(target))
            self._handshakes.add(hs)
            tls = None if endpoint is None else job.client_context
            try:
                if endpoint is None:
                    await loop.create_unix_connection(lambda: hs, sock=sock)
                else:
                    await loop.create_connection(
                        lambda: hs, sock=sock, ssl=tls,
                        server_hostname=endpoint[0] if tls is not None else None,
                        ssl_handshake_timeout=(max(deadline - loop.time(), 0.001)
                                               if tls is not None else None))
            except BaseException as e:  # before the handshake began: it never ends
                self._handshakes.discard(hs)
                if tls is not None and isinstance(e, OSError) and not isinstance(e, TimeoutError):
                    raise ConnectionError(  # connected: only TLS could fail
                        f"TLS failed: {str(e) or type(e).__name__} (is the peer a process of a job "
                        "with other TLS settings, or none?)") from e
                raise
            await proven
        except (OSError, AuthenticationError) as e:
            if self.rt.conns.get(addr) is conn:
                del self.rt.conns[addr]
            conn.closed = True
            conn._backlog = None
            dead = self.rt.dead.get(addr)
            conn.fail_all(dead or self._dial_error(addr, e))
            if addr == self.rt.controller:  # a worker that cannot reach its controller lost it
                try:  # (its stderr is a pipe a dead controller read: then nobody hears it)
                    print(f"meshio: worker {self.rt.worker} cannot connect to its controller "
                          f"at {addr}: {str(e) or type(e).__name__}", file=sys.stderr, flush=True)
                except OSError:
                    pass
                hook = self.rt.on_lost.get(addr)
                if hook is not None:
                    hook(conn)

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
                if self.rt.loop.time() + delay > deadline:
                    raise TimeoutError(f"its listen backlog stayed full for "
                                       f"{CONNECT_TIMEOUT:g}s") from None
            except BaseException:
                sock.close()
                raise
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.1)

    async def _connect_tcp(self, endpoint: tuple[str, int], deadline: float) -> socket.socket:
        """A TCP socket connected to ``endpoint`` (no delay: small frames go at once)."""
        host, port = endpoint
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                             socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await within(self.rt.loop.sock_connect(sock, (host, port)),
                                   max(deadline - self.rt.loop.time(), 0.001))
        except BaseException:
            sock.close()
            raise
        return sock

    def _dial_error(self, addr: str, e: Exception) -> Callable[[Pending], MeshioError]:
        """What callers get when dialling ``addr`` failed with ``e``."""
        def error(p: Pending) -> MeshioError:
            if isinstance(e, AuthenticationError):
                return AuthenticationError(
                    f"{p.who}: the process at {addr} failed authentication ({e}); "
                    "it is not a process of this job")
            if isinstance(e, TimeoutError):
                why, cause = (f"timed out connecting to {p.who} at {addr}: "
                              f"{str(e) or f'no connection within {CONNECT_TIMEOUT:g}s'} "
                              "(process busy or stopped, or its host unreachable?)",
                              "connect timed out")
            elif isinstance(e, (ConnectionRefusedError, FileNotFoundError)):
                why, cause = (f"cannot reach {p.who} at {addr}: "
                              f"{e.strerror or e} (the process is gone or was never started)",
                              "connection refused")
            else:
                why, cause = (f"cannot connect to {p.who} at {addr}: {e}",
                              "connect failed")
            return SupervisionError(why, actor=p.mesh, rank=p.rank, host=self.rt.host,
                                    cause=cause)
        return error

