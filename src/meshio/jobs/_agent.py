"""The host agent, ``meshio agent``: one per host, started by the scheduler
(Slurm, Kubernetes) or by hand; it starts and watches that host's workers
for a controller on another host.

An agent is a meshio runtime listening on TCP (``tcp://ADDR:PORT``): every
connection proves the job secret, under TLS when configured, before a
frame is read.  It serves two requests (:class:`LaunchWorker`,
:class:`SignalWorker`) and sends back its workers' output and exit status;
the workers connect to the controller themselves.  Its workers are its
children and die with it (``PR_SET_PDEATHSIG``).  With ``--idle-timeout``
it exits once no controller has been connected for that long, so an
allocation nobody uses ends instead of leaking.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import ipaddress
import logging
import signal
import socket
import struct
import sys
from typing import Any

import msgspec

from .._launcher import LocalLauncher, LocalProc, WorkerSpec
from .._transport._connection import Connection
from .._transport._messages import (
    ErrorInfo,
    Fail,
    LaunchWorker,
    Reply,
    SignalWorker,
    Stream,
    WatchWorker,
    WorkerExited,
    WorkerOutput,
)
from .._transport._runtime import Runtime, register_handler, tcp_address, tcp_endpoint
from .._transport._serial import Buffers
from .._transport._tls import TLSConfig
from ._remote import read_secret_file

__all__ = ("Agent", "host_address", "main", "serve_agent")

log = logging.getLogger("meshio")

#: ``SIOCGIFADDR``: an interface's IPv4 address
_SIOCGIFADDR = 0x8915


def host_address() -> str:
    """The first IPv4 address of this host that is not loopback (loopback
    if there is none): what an agent listening on ``0.0.0.0`` advertises."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR,
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            addr = socket.inet_ntoa(packed[20:24])
            if not ipaddress.ip_address(addr).is_loopback:
                return addr
    return "127.0.0.1"


class Agent:
    """An agent's state on its runtime: the workers it started, by id."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        endpoint = tcp_endpoint(rt.addr)
        assert endpoint is not None, "an agent listens on TCP"
        self.advertise = endpoint[0]
        self.procs: dict[str, LocalProc] = {}
        self.launcher = LocalLauncher(output=self._relay)
        self._conns: dict[str, Connection] = {}

    def close(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGKILL)

    def _relay(self, worker: str, stream: Stream, data: bytes) -> None:
        conn = self._conns.get(worker)
        if conn is not None and not conn.closed:
            conn.send_message(WorkerOutput(worker, stream, data))

    async def launch(self, conn: Connection, msg: LaunchWorker) -> None:
        spec = WorkerSpec(msg.worker, tcp_address(self.advertise, 0), msg.controller, msg.env,
                          msg.restart, msg.label, secret=self.rt.tcp.secret,
                          bootstrap=msg.bootstrap, tls=self.rt.tcp.tls, addr=msg.addr,
                          keep_alive=msg.keep_alive)
        self._conns[msg.worker] = conn
        try:
            proc = await self.launcher.launch(spec)
        except Exception as e:  # the host could not start it (fork failed, bad python)
            del self._conns[msg.worker]
            self._answer(conn, msg.req, None, f"could not start worker {msg.worker}: {e!r}")
            return
        self.procs[msg.worker] = proc
        self._answer(conn, msg.req, proc, "")
        code = await proc.wait()
        del self.procs[msg.worker]
        conn = self._conns.pop(msg.worker, conn)  # (a controller re-attached meanwhile)
        if not conn.closed:
            conn.send_message(WorkerExited(msg.worker, code, proc.start_failure or ""))

    def watch(self, conn: Connection, msg: WatchWorker) -> None:
        """A controller re-attached to a kept-alive worker of this host: its
        output and exit go to that controller (on ``conn``) from now on."""
        proc = self.procs.get(msg.worker)
        if proc is not None:
            self._conns[msg.worker] = conn
        self._answer(conn, msg.req, proc, f"has no worker {msg.worker} (it has exited)")

    def _answer(self, conn: Connection, req: int, proc: LocalProc | None, why: str) -> None:
        """Answer request ``req`` with the pid of ``proc``, or fail it: ``why``."""
        if proc is not None:
            conn.send_message(Reply(req, msgspec.Raw(msgspec.msgpack.encode(proc.pid))))
        else:
            conn.send_message(Fail(req, ErrorInfo(
                "supervision", "SupervisionError", f"host agent at {self.rt.addr} {why}")))


def _not_an_agent(rt: Runtime, conn: Connection, req: int) -> None:
    conn.send_message(Fail(req, ErrorInfo(
        "protocol", "ProtocolError", f"the process at {rt.addr} is not a host agent")))


def _on_launch(rt: Runtime, conn: Connection, msg: LaunchWorker, bufs: Buffers) -> None:
    if not rt.has_state(Agent):
        _not_an_agent(rt, conn, msg.req)
        return
    rt.loop.create_task(rt.state(Agent).launch(conn, msg))


def _on_signal(rt: Runtime, conn: Connection, msg: SignalWorker, bufs: Buffers) -> None:
    proc = rt.state(Agent).procs.get(msg.worker) if rt.has_state(Agent) else None
    if proc is not None:
        proc.send_signal(msg.sig)


register_handler(LaunchWorker, _on_launch)
register_handler(SignalWorker, _on_signal)


def _on_watch(rt: Runtime, conn: Connection, msg: WatchWorker, bufs: Buffers) -> None:
    if not rt.has_state(Agent):
        _not_an_agent(rt, conn, msg.req)
        return
    rt.state(Agent).watch(conn, msg)


register_handler(WatchWorker, _on_watch)


async def serve_agent(listen: str, secret: bytes, *, advertise: str | None = None,
                      tls: TLSConfig | None = None, idle_timeout: float | None = None,
                      ready: Any = None) -> None:
    """Be a host agent on ``listen`` (``HOST:PORT``; port 0 picks one) until
    SIGTERM/SIGINT, or until no controller has been connected for
    ``idle_timeout`` seconds.  ``ready(address)`` is called once it listens
    (its ``tcp://`` address, naming ``advertise``, by default the host
    listened on, or this host's address when that is ``0.0.0.0``)."""
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT, got {listen!r}")
    bind = host.strip("[]")
    name = advertise or (host_address() if bind in ("0.0.0.0", "::") else bind)
    loop = asyncio.get_running_loop()
    rt = Runtime(loop, tcp_address(bind, int(port)), worker="agent", secret=secret, tls=tls,
                 advertise=name)
    rt.state(Agent)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready(rt.addr)
    try:
        if idle_timeout is None:
            await stop.wait()
        else:
            await _until_idle(rt, stop, idle_timeout)
    finally:
        rt.close()


async def _until_idle(rt: Runtime, stop: asyncio.Event, idle_timeout: float) -> None:
    """Return on ``stop``, or once no connection has been open for ``idle_timeout`` s."""
    idle_since = rt.loop.time()
    step = min(idle_timeout / 4, 5.0)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), step)
        except TimeoutError:
            pass
        if any(not c.closed for c in rt.all_conns) or rt.state(Agent).procs:
            idle_since = rt.loop.time()
        elif rt.loop.time() - idle_since >= idle_timeout:
            log.warning("meshio agent at %s: no controller for %g s; exiting", rt.addr,
                        idle_timeout)
            return


def tls_flags(cert: str, key: str, ca: str, mutual: bool) -> list[str]:
    """The ``meshio agent`` options of a TLS setting (``cert``, ``key``,
    ``ca``: the paths as the agent's host sees them)."""
    return ["--tls-cert", cert, "--tls-key", key, "--tls-ca", ca,
            *([] if mutual else ["--tls-no-mutual"])]


def main(argv: list[str] | None = None) -> None:
    """``meshio agent``: see ``meshio agent --help``."""
    ap = argparse.ArgumentParser(prog="meshio agent",
                                 description="serve this host's workers to a meshio controller")
    ap.add_argument("--listen", required=True, help="HOST:PORT to listen on (port 0: any)")
    ap.add_argument("--secret-file", required=True,
                    help="file holding the job secret (at least 16 bytes)")
    ap.add_argument("--advertise", help="address controllers and workers reach this host at "
                                        "(default: the listen host, or this host's address)")
    ap.add_argument("--tls-cert", help="PEM certificate chain of this host")
    ap.add_argument("--tls-key", help="PEM private key")
    ap.add_argument("--tls-ca", help="PEM CA bundle peers must chain to")
    ap.add_argument("--tls-no-mutual", action="store_true",
                    help="do not demand client certificates (the secret still does)")
    ap.add_argument("--idle-timeout", type=float,
                    help="exit after this many seconds without a controller")
    args = ap.parse_args(argv)
    tls_args = (args.tls_cert, args.tls_key, args.tls_ca)
    if any(tls_args) and not all(tls_args):
        ap.error("--tls-cert, --tls-key and --tls-ca go together")
    tls = (TLSConfig(args.tls_cert, args.tls_key, args.tls_ca, mutual=not args.tls_no_mutual)
           if all(tls_args) else None)
    secret = read_secret_file(args.secret_file)
    logging.basicConfig(format="%(message)s", level=logging.WARNING)

    def ready(addr: str) -> None:
        print(f"meshio agent listening on {addr}", flush=True)

    # asyncio's own loop: an agent only starts and watches processes
    asyncio.run(serve_agent(args.listen, secret, advertise=args.advertise, tls=tls,
                            idle_timeout=args.idle_timeout, ready=ready))
    sys.exit(0)
