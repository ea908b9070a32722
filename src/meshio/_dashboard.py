"""``meshio.serve_dashboard``: a live page of the running job, served by its controller.

One static page (``meshio/dashboard.html``, shipped in the package) and
what it reads, all from the controller's loop (:class:`~._http.HTTPServer`):

==================  ===========================================================
``/``               the page
``/events``         server-sent events: ``state`` (the :func:`state` JSON,
                    every :data:`INTERVAL` seconds) and ``supervision`` (each
                    :class:`~meshio.SupervisionEvent` of the supervisors of the
                    controller's proc meshes, the past ones first, then live)
``/api/state``      the :func:`state` JSON, once
``/api/stacks``     every actor's stacks (``await proc_mesh.stacks()`` over all
                    proc meshes): ``{"text": ..., "stacks": ...}``
``/metrics``        the Prometheus text of ``meshio.serve_metrics``
==================  ===========================================================

On loopback (the default) a client of this process's user is answered
without the token, as the inspection socket answers only it: the owner of
the client's socket is read from ``/proc/net/tcp`` and ``/proc/net/tcp6``
(:func:`tcp_peer_uid`); another user's client, or one whose owner is not
found, needs the token, except for ``/metrics`` (numbers and names, for a
Prometheus of any user).  A request naming another host, a web page's
DNS-rebinding trick, needs the token too; one that names no host, as
HTTP/1.0 allows, comes from no browser: it is answered.  On any other
address every request must carry the job's dashboard token
(:func:`token`: an HMAC of the job's secret), as ``?token=`` or
``Authorization: Bearer``: without it the answer is 401, with a wrong one
403.  ``meshio dashboard`` asks a running controller, through its
inspection listener (:mod:`meshio._inspect`), to serve it
(:class:`~._transport._messages.ServeDashboard`), and prints its URL.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import os
import socket
import sys
import time
from importlib.resources import files
from typing import cast

import msgspec

from ._http import HTTPServer, Request, response_head, start
from ._inspect import ASK_TIMEOUT, Controller, Inspection, ask, from_inspection
from ._metrics import stats
from ._prometheus import SCRAPE_TIMEOUT, write_metrics
from ._stacks import STACKS_TIMEOUT, Stacks
from ._transport._connection import Connection
from ._transport._messages import ErrorInfo, Fail, Reply, ServeDashboard
from ._transport._runtime import Runtime, register_handler, runtime
from ._transport._serial import Buffers
from ._transport._sockets import is_loopback
from ._transport._tasks import TaskOwner
from ._util import utf8
from .supervision._supervisor import Supervisor

__all__ = ("INTERVAL", "DashboardServer", "ask_dashboard", "serve_dashboard", "state",
           "tcp_peer_uid", "token")

#: seconds between two ``state`` events of the live stream
INTERVAL = 1.0
#: supervision events kept for a page that opens later
FEED = 1000
#: events a live stream's client may leave unread before it is dropped
BACKLOG = 1000

_encode = msgspec.json.Encoder().encode
_encode_msgpack = msgspec.msgpack.Encoder().encode
_url_decoder = msgspec.msgpack.Decoder(str)
_PAGE = "dashboard.html"
_NEEDS_TOKEN = ("pass the job's token: ?token=... or Authorization: Bearer ... (the URL "
                "serve_dashboard and meshio dashboard print)\n")


def token(secret: bytes) -> str:
    """The dashboard token of the job whose secret is ``secret``: it
    proves a request comes from someone the job's owner told."""
    return hmac.new(secret, b"meshio dashboard", hashlib.sha256).hexdigest()[:32]


_IP = ipaddress.IPv4Address | ipaddress.IPv6Address


def _proc_net_address(ip: _IP, port: int) -> str:
    """``ip``:``port`` as ``/proc/net/tcp`` (IPv4) or ``tcp6`` writes it:
    each 32-bit word of the address in hex, in this machine's byte order."""
    packed = ip.packed
    words = (int.from_bytes(packed[i:i + 4], sys.byteorder) for i in range(0, len(packed), 4))
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def tcp_peer_uid(peer: tuple[str, int], ours: tuple[str, int]) -> int | None:
    """The uid owning the socket at ``peer`` (an address and port of this
    machine) connected to ``ours``: the ``uid`` column of the line of
    ``/proc/net/tcp`` or ``/proc/net/tcp6`` whose local address is
    ``peer`` and remote address ``ours``.  None if there is no such line
    with a process still holding the socket (the peer closed it), or no
    such files (not Linux)."""
    ips: list[_IP] = [ipaddress.ip_address(peer[0]), ipaddress.ip_address(ours[0])]
    ports = (peer[1], ours[1])
    as_v6: list[_IP] = [ip if ip.version == 6 else ipaddress.IPv6Address(f"::ffff:{ip}")
                        for ip in ips]
    tables = [("/proc/net/tcp6", as_v6)]  # (an IPv6 socket may dial an IPv4 one)
    if as_v6 != ips:
        tables.insert(0, ("/proc/net/tcp", ips))
    for table, (local, remote) in tables:
        want = (_proc_net_address(local, ports[0]), _proc_net_address(remote, ports[1]))
        try:
            with open(table, encoding="ascii") as lines:
                next(lines)  # (the column names)
                for line in lines:
                    # sl local rem st queues tr retrnsmt uid timeout inode ...
                    fields = line.split()
                    if (fields[1], fields[2]) == want and fields[9] != "0":  # (0: closed)
                        return int(fields[7])
        except OSError:
            continue
    return None


def _host_name(header: str) -> str:
    """The host of a ``Host`` header (``127.0.0.1:8265``, ``[::1]:8265``);
    a header that is none (``[::1]evil``, ``localhost:x``) whole, which
    names no host."""
    if header.startswith("["):
        host, bracket, rest = header[1:].partition("]")
        port = rest.removeprefix(":") if bracket and rest[:1] in ("", ":") else "x"
    elif header.count(":") == 1:
        host, _, port = header.partition(":")
    else:
        return header
    return host if port == "" or (port.isascii() and port.isdigit()) else header


def _utf8_all(value: object) -> object:
    """``value`` (of ``msgspec.to_builtins``) with every string, keys
    too, made UTF-8 by :func:`~._util.utf8`."""
    if isinstance(value, str):
        return utf8(value)
    if isinstance(value, dict):
        return {_utf8_all(k): _utf8_all(v) for k, v in cast("dict[object, object]", value).items()}
    if isinstance(value, list):
        return [_utf8_all(v) for v in cast("list[object]", value)]
    return value


def _to_json(value: object) -> bytes:
    """``value`` as JSON; its strings that UTF-8 cannot encode (from
    ``sys.argv``, a name, an error message) with those characters
    replaced (:func:`~._util.utf8`), not a failure."""
    try:
        return _encode(value)
    except UnicodeEncodeError:
        return _encode(_utf8_all(msgspec.to_builtins(value)))


async def state(rt: Runtime) -> bytes:
    """What the page shows, as JSON: ``job`` (the controller: pid, host,
    argv), ``time``, ``proc_meshes`` (:func:`meshio.stats`, each with its
    ``id`` too) and ``meshes`` (per proc mesh id, unique where names may
    repeat: its name, supervisor, strategy, extent and actor meshes).
    Text that UTF-8 cannot encode has those characters replaced."""
    snapshot = await stats(timeout=SCRAPE_TIMEOUT)
    procs = rt.state(Inspection).procs if rt.has_state(Inspection) else []
    meshes = {s.id: {"name": s.name,
                     "supervisor": None if s.supervisor is None else s.supervisor.name,
                     "strategy": None if s.supervisor is None else s.supervisor.strategy,
                     "extent": dict(s.region.extent),
                     "actor_meshes": [a.name for a in s.actors]}
              for s in procs}
    return _to_json({"job": {"pid": os.getpid(), "host": socket.gethostname(),
                             "argv": sys.argv},
                     "time": time.time(),
                     "proc_meshes": snapshot.proc_meshes,
                     "meshes": meshes})


def _sse(kind: str, data: bytes) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


class DashboardServer(HTTPServer):
    """The HTTP server of :func:`serve_dashboard`, listening from its start.
    Stop it with :meth:`aclose`, or use it as ``async with``.

    Attributes:
        host: the address it listens on.
        port: the port it listens on (the one picked, if asked for 0).
        token: the job's dashboard token (:attr:`url` includes it); every
            request needs it unless ``host`` is a loopback address, the
            request names a loopback host, or none, and it comes from this
            process's user (any user, for ``/metrics``).
    """

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self._rt = runtime()
        self.token: str = token(self._rt.secret)
        self._open = is_loopback(self.host)
        self._page = files("meshio").joinpath(_PAGE).read_bytes()
        #: the supervision events seen (JSON), the last FEED
        self._feed: list[bytes] = []
        #: per live stream, its queue of what to send and the task sending it
        self._listeners: dict[asyncio.Queue[bytes], asyncio.Task[None]] = {}
        #: what sends the live streams their states, while there are any
        self._ticking: asyncio.Task[None] | None = None
        #: one task per supervisor, reading its events (cancelled by aclose)
        self._watching: dict[Supervisor, asyncio.Task[None]] = {}

    @property
    def url(self) -> str:
        """The page's address, token included: ``http://HOST:PORT/?token=...``."""
        host = socket.gethostname() if self.host in ("0.0.0.0", "::") else None
        base = self._base() if host is None else f"http://{host}:{self.port}"
        return f"{base}/?token={self.token}"

    def __repr__(self) -> str:
        return f"<DashboardServer {self._base()}/{' closed' if self._closed else ''}>"

    async def aclose(self) -> None:
        """Stop listening, end the requests being answered and stop reading
        supervision events.  Idempotent."""
        try:
            await super().aclose()  # (no request runs after it: nothing starts a task)
        finally:
            if self._ticking is not None:  # (it may find a supervisor: first)
                self._ticking.cancel()
                await asyncio.wait([self._ticking])
            for task in self._watching.values():
                task.cancel()
            if self._watching:
                await asyncio.wait(self._watching.values())

    # ------------------------------------------------------------ events

    def _discover(self) -> None:
        """Read the events of every supervisor of the proc meshes (and its
        parents) not read yet."""
        procs = self._rt.state(Inspection).procs if self._rt.has_state(Inspection) else []
        for proc in procs:
            sup = proc.supervisor
            while sup is not None and sup not in self._watching and not self._closed:
                self._watching[sup] = self._rt.tasks.start(self._watch(sup))
                sup = sup.parent

    async def _watch(self, sup: Supervisor) -> None:
        async for event in sup.events():
            data = _to_json(event)
            self._feed.append(data)
            del self._feed[:-FEED]
            self._offer(_sse("supervision", data))

    # ------------------------------------------------------------ requests

    async def _refused(self, request: Request,
                       writer: asyncio.StreamWriter) -> tuple[str, str] | None:
        """Why ``request`` is refused (a status, and why), or None.  A
        request with the token is answered.  On loopback so is one from a
        client of this process's user (the owner of its socket,
        :func:`tcp_peer_uid`), and ``/metrics`` to any local client, if it
        names a loopback host (one naming another host is a web page's
        trick, DNS rebinding: it needs the token) or none (no ``Host``, as
        HTTP/1.0 allows: a browser always names one, so it is no web
        page's, and it reached this loopback address, the host it would
        name)."""
        given = request.query.get("token")
        auth = request.headers.get("authorization", "")
        if given is None and auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        if given is not None and hmac.compare_digest(given.encode(), self.token.encode()):
            return None
        host = request.headers.get("host", "")
        why = _NEEDS_TOKEN
        if self._open and (not host or is_loopback(_host_name(host))):
            if request.path == "/metrics":
                return None
            peer, ours = writer.get_extra_info("peername"), writer.get_extra_info("sockname")
            owner = None if peer is None or ours is None else await asyncio.to_thread(
                tcp_peer_uid, peer[:2], ours[:2])  # (None: closed already)
            if owner == os.getuid():
                return None
            whose = ("of no process any more (or /proc/net/tcp is not there)" if owner is None
                     else f"another user's (uid {owner})")
            why = (f"this connection is {whose}: only the dashboard's user (uid "
                   f"{os.getuid()}) is answered without the token; ") + why
        return ("401 Unauthorized" if given is None else "403 Forbidden"), why

    async def _respond(self, request: Request, writer: asyncio.StreamWriter) -> None:
        refused = await self._refused(request, writer)
        if refused is not None:
            status, why = refused
            body = why.encode()
            writer.write(response_head(status, "text/plain", len(body),
                                       'WWW-Authenticate: Bearer realm="meshio"\r\n') + body)
            return
        self._discover()
        match request.path:
            case "/":
                writer.write(response_head("200 OK", "text/html; charset=utf-8",
                                           len(self._page)) + self._page)
            case "/events":
                await self._stream(writer)
            case "/api/state":
                self._json(writer, await state(self._rt))
            case "/api/stacks":
                stacks = (await self._rt.state(Inspection).stacks(STACKS_TIMEOUT)
                          if self._rt.has_state(Inspection) else Stacks(()))
                self._json(writer, _to_json({"text": stacks.text(), "stacks": stacks}))
            case "/metrics":
                await write_metrics(writer)
            case _:
                body = b"see /\n"
                writer.write(response_head("404 Not Found", "text/plain", len(body)) + body)

    @staticmethod
    def _json(writer: asyncio.StreamWriter, body: bytes) -> None:
        writer.write(response_head("200 OK", "application/json", len(body)) + body)

    async def _stream(self, writer: asyncio.StreamWriter) -> None:
        """The live stream: the events so far and the state now, then what
        :meth:`_offer` queues (a ``state`` every :data:`INTERVAL` seconds,
        each supervision event as it comes), until the client goes away (a
        write fails), reads too slowly, or the server closes."""
        task = asyncio.current_task()
        assert task is not None
        queue: asyncio.Queue[bytes] = asyncio.Queue(BACKLOG)
        self._listeners[queue] = task
        if self._ticking is None:
            self._ticking = self._rt.tasks.start(self._tick())
        try:
            writer.write(response_head("200 OK", "text/event-stream")
                         + b"".join(_sse("supervision", e) for e in self._feed)
                         + _sse("state", await state(self._rt)))
            while True:
                await writer.drain()
                writer.write(await queue.get())
        finally:
            del self._listeners[queue]

    def _offer(self, data: bytes) -> None:
        """Queue ``data`` for every live stream; a stream whose client has
        not read :data:`BACKLOG` of them is ended."""
        for queue, task in self._listeners.items():
            try:
                queue.put_nowait(data)
            except asyncio.QueueFull:
                task.cancel()

    async def _tick(self) -> None:
        """A ``state`` for the live streams every :data:`INTERVAL` seconds
        (one :func:`meshio.stats` for them all), while there are any."""
        try:
            while self._listeners:
                await asyncio.sleep(INTERVAL)  # a period, not a wait for an event
                data = _sse("state", await state(self._rt))
                self._discover()
                self._offer(data)
        finally:
            self._ticking = None


def serve_dashboard(port: int = 0, host: str = "127.0.0.1") -> DashboardServer:
    """Serve the job's live dashboard from this controller's event loop
    (call it there): its hosts, proc meshes and actor meshes as a tree,
    per-endpoint rates and latency, per-process CPU and memory, the
    supervision events as they happen, a button that fetches every actor's
    stacks, and ``/metrics`` (as :func:`meshio.serve_metrics`).  Its URL
    (:attr:`DashboardServer.url`, with the job's token) is printed once,
    on stderr.

    On loopback (the default) a local client of this process's user is
    answered without the token, and any local client at ``/metrics``; one
    of another user needs it, and so does one whose ``Host`` names another
    host, as a web page's DNS-rebinding trick does.  On any other address
    (``host="0.0.0.0"``) every request without the job's token
    (``?token=`` or ``Authorization: Bearer``) gets 401, with a wrong one 403.

    Args:
        port: the TCP port; 0 picks a free one (:attr:`DashboardServer.port`).
        host: the address to listen on (on a loopback one, this user's
            clients need no token).

    Raises:
        TypeError: ``port`` is not an int, or ``host`` not a str.
        ValueError: ``port`` is outside 0..65535.
        OSError: nothing can listen at that address (in use, or not this host's).
        RuntimeError: called outside the controller's event loop.
    """
    server = start(DashboardServer, port, host, "serve_dashboard")
    print(f"meshio: dashboard at {server.url}", file=sys.stderr, flush=True)
    return server


# ------------------------------------------------------- meshio dashboard

class _Served:
    """The dashboards a controller serves for ``meshio dashboard`` clients
    (``rt.state(_Served)``), each kept by a task that closes it when
    cancelled (when the runtime closes)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.servers: dict[tuple[str, int], DashboardServer] = {}
        self.tasks = TaskOwner("the dashboards served for `meshio dashboard`", rt.loop)

    def serve(self, port: int, host: str) -> DashboardServer:
        """The dashboard served on ``host``:``port`` for such a client
        (port 0: any one served on ``host``), started if there is none."""
        for (h, p), server in self.servers.items():
            if h == host and port in (0, p):
                return server
        server = serve_dashboard(port, host)
        self.servers[host, server.port] = server
        self.tasks.start(self._keep(server))
        return server

    async def _keep(self, server: DashboardServer) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await server.aclose()

    def close(self) -> None:
        self.tasks.cancel()


def _on_serve_dashboard(rt: Runtime, conn: Connection, msg: ServeDashboard,
                        bufs: Buffers) -> None:
    if not from_inspection(rt, conn, msg):
        return
    try:
        server = rt.state(_Served).serve(msg.port, msg.host)
    except (OSError, ValueError) as e:
        conn.send_message(Fail(msg.req, ErrorInfo(
            "schema", type(e).__name__, f"cannot serve the dashboard on {msg.host}:{msg.port}: "
                                        f"{e}")))
        return
    conn.send_message(Reply(msg.req, msgspec.Raw(_encode_msgpack(server.url))))


register_handler(ServeDashboard, _on_serve_dashboard, inspection=True)


async def ask_dashboard(controller: Controller, port: int, host: str) -> str:
    """Have ``controller`` serve its dashboard on ``host``:``port``; its URL.

    Raises:
        MeshioError: the controller could not be reached, refused us, or
            could not listen there (the message says why).
        TimeoutError: it did not answer in :data:`ASK_TIMEOUT` seconds.
    """
    return await ask(controller, lambda req: ServeDashboard(req, port, host),
                     lambda raw, bufs: _url_decoder.decode(raw), "dashboard", ASK_TIMEOUT)
