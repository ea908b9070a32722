"""The host agent, ``meshio agent``: one per host, started by the scheduler
(Slurm, Kubernetes) or by hand; it starts and watches that host's workers
for a controller on another host.

An agent is a meshio runtime listening on TCP (``tcp://ADDR:PORT``): every
connection proves the job secret, under TLS when configured, before a
frame is read.  It serves two requests (:class:`LaunchWorker`,
:class:`SignalWorker`) and sends back its workers' output and exit status;
the workers connect to the controller themselves.  Its workers are its
children and die with it (``PR_SET_PDEATHSIG``); each leads a process group
of its own, killed with it and once it has exited, so what its actors
started goes too (:mod:`meshio._launcher`).  With ``--idle-timeout``
it exits once no controller has been connected for that long, so an
allocation nobody uses ends instead of leaking.

Self-fencing: a worker launched with a ``partition_timeout`` is killed
(SIGKILL) by its agent once the agent has had no contact with the
controller that launched it (or re-attached to it since:
:class:`WatchWorker`) for that long while their connection stays open (a
partition, not a controller that exited).  Contact is counted from
the last :class:`AgentBeatAck` the controller says it heard, so the agent
kills before the controller downs the host, and a healed partition never
finds a second incarnation of a rank beside the first.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import ipaddress
import logging
import signal
import socket
import ssl
import struct
import sys
from typing import Any

import msgspec

from .._checks import check_seconds
from .._launcher import LocalLauncher, LocalProc, WorkerSpec, default_sigchld
from .._transport._connection import Connection
from .._transport._messages import (
    AgentBeat,
    AgentBeatAck,
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
from .._transport._runtime import Runtime, register_handler, tcp_address
from .._transport._serial import Buffers
from .._transport._sockets import tcp_endpoint
from .._transport._tasks import within
from .._transport._tls import TLSConfig
from ._remote import not_a_host, read_secret_file

__all__ = ("Agent", "host_address", "main", "serve_agent")

log = logging.getLogger("meshio")

#: ``SIOCGIFADDR``: an interface's IPv4 address
_SIOCGIFADDR = 0x8915
#: answers to beats kept per controller until it says it heard them (an
#: older one dropped only shortens the time to fencing: the safe side)
_UNHEARD_KEPT = 4096


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
        #: by controller connection: when the controller last heard this agent
        #: (the time this agent sent the last answer the controller says it heard)
        self._contact: dict[Connection, float] = {}
        #: by controller connection: when each answer not heard of yet was sent, by seq
        self._answered: dict[Connection, dict[int, float]] = {}
        #: workers to kill after their partition_timeout without contact with
        #: their controller: worker → (its controller's connection, the
        #: timeout, when it was launched)
        self._fenced: dict[str, tuple[Connection, float, float]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for proc in self.procs.values():
            proc.send_signal(signal.SIGKILL)

    def beat(self, conn: Connection, msg: AgentBeat) -> None:
        """A controller's beat: answer it, and count contact from the sending
        of the answer it says it heard."""
        for gone in [c for c in self._answered if c.closed]:  # controllers that left
            del self._answered[gone]
            self._contact.pop(gone, None)
        answered = self._answered.setdefault(conn, {})
        answered[msg.seq] = self.rt.loop.time()
        sent = answered.get(msg.heard)
        if sent is not None:
            self._contact[conn] = max(self._contact.get(conn, sent), sent)
            for seq in [seq for seq in answered if seq <= msg.heard]:
                del answered[seq]
        elif len(answered) > _UNHEARD_KEPT:
            del answered[next(iter(answered))]
        conn.send_message(AgentBeatAck(msg.seq))

    def _deadline(self, conn: Connection, timeout: float, launched: float) -> float:
        return max(self._contact.get(conn, launched), launched) + timeout

    def _arm(self) -> None:
        """Wake at the first moment a fenced worker may be past its deadline."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._fenced:
            self._timer = self.rt.loop.call_at(
                min(self._deadline(*f) for f in self._fenced.values()), self._fence)

    def _fence(self) -> None:
        """Kill the workers whose controller has not heard this agent for their
        ``partition_timeout`` (it downs them then: their calls fail, a
        supervisor starts replacements), so no two incarnations ever run."""
        self._timer = None
        now = self.rt.loop.time()
        killed: dict[Connection, list[str]] = {}
        for worker, (conn, timeout, launched) in list(self._fenced.items()):
            if conn.closed:  # the controller is gone, not cut off: the usual rules apply
                del self._fenced[worker]
            elif self._deadline(conn, timeout, launched) <= now:
                del self._fenced[worker]
                proc = self.procs.get(worker)
                if proc is not None:
                    proc.send_signal(signal.SIGKILL)
                    silent = now - max(self._contact.get(conn, launched), launched)
                    killed.setdefault(conn, []).append(
                        f"{worker} (pid {proc.pid}; silent {silent:.1f} s, "
                        f"partition_timeout={timeout:g} s)")
        for conn, workers in killed.items():
            log.warning("meshio agent at %s: no contact with the controller at %s for its "
                        "workers' partition_timeout: killed %s, so that none of them runs "
                        "beside a replacement (self-fencing)", self.rt.addr,
                        conn.who, ", ".join(workers))
        self._arm()

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
        if msg.partition_timeout is not None:  # fenced from now, even before it runs
            self._fenced[msg.worker] = (conn, msg.partition_timeout, self.rt.loop.time())
            self._arm()
        try:
            proc = await self.launcher.launch(spec)
        except Exception as e:  # the host could not start it (fork failed, bad python)
            del self._conns[msg.worker]
            self._fenced.pop(msg.worker, None)
            self._answer(conn, msg.req, None, f"could not start worker {msg.worker}: {e!r}")
            return
        self.procs[msg.worker] = proc
        if msg.partition_timeout is not None and msg.worker not in self._fenced:
            proc.send_signal(signal.SIGKILL)  # fenced while it started
        self._answer(conn, msg.req, proc, "")
        code = await proc.wait()
        del self.procs[msg.worker]
        conn = self._conns.pop(msg.worker, conn)  # (a controller re-attached meanwhile)
        self._fenced.pop(msg.worker, None)
        if not conn.closed:
            conn.send_message(WorkerExited(msg.worker, code, proc.start_failure or ""))

    def watch(self, conn: Connection, msg: WatchWorker) -> None:
        """A controller re-attaches to a kept-alive worker of this host: its
        output and exit go to that controller (on ``conn``) from now on, and
        with a ``partition_timeout`` it is fenced for that controller, as if
        launched by it now.  Answered with its pid, or None if it has exited
        (while no controller watched it, or with an earlier incarnation of
        this agent): the controller fails it as if it died after the
        re-attach.  Refused (``ProcMeshTakenError``, nothing changed) while
        another controller that watches it is connected: a re-attach that
        the worker refuses too, as it serves that one."""
        proc = self.procs.get(msg.worker)
        watcher = self._conns.get(msg.worker)
        if proc is not None and watcher is not None and watcher is not conn \
                and not watcher.closed:
            conn.send_message(Fail(msg.req, ErrorInfo(
                "supervision", "ProcMeshTakenError",
                f"host agent at {self.rt.addr}: worker {msg.worker} (pid {proc.pid}) cannot "
                f"be re-attached: the controller at {watcher.who} "
                f"watches it, still connected")))
            return
        if proc is not None and proc.returncode is None:  # (reaped now if it has exited)
            self._conns[msg.worker] = conn
            if msg.partition_timeout is not None:
                self._fenced[msg.worker] = (conn, msg.partition_timeout, self.rt.loop.time())
                self._arm()
            pid: int | None = proc.pid
        else:
            pid = None
        conn.send_message(Reply(msg.req, msgspec.Raw(msgspec.msgpack.encode(pid))))

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
    rt.tasks.start(rt.state(Agent).launch(conn, msg))


def _on_signal(rt: Runtime, conn: Connection, msg: SignalWorker, bufs: Buffers) -> None:
    proc = rt.state(Agent).procs.get(msg.worker) if rt.has_state(Agent) else None
    if proc is not None:
        proc.send_signal(msg.sig)


def _on_beat(rt: Runtime, conn: Connection, msg: AgentBeat, bufs: Buffers) -> None:
    if rt.has_state(Agent):  # (beats go to agents only)
        rt.state(Agent).beat(conn, msg)


register_handler(LaunchWorker, _on_launch)
register_handler(AgentBeat, _on_beat)
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
    bind, port = _host_port(listen)
    if idle_timeout is not None:
        idle_timeout = check_seconds(idle_timeout, "serve_agent", "idle_timeout", also=" or None")
    name = advertise or (host_address() if bind in ("0.0.0.0", "::") else bind)
    loop = asyncio.get_running_loop()
    rt = Runtime(loop, tcp_address(bind, port), worker="agent", secret=secret, tls=tls,
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
            await within(stop.wait(), step)
        except TimeoutError:
            pass
        if any(not c.closed for c in rt.all_conns) or rt.state(Agent).procs:
            idle_since = rt.loop.time()
        elif rt.loop.time() - idle_since >= idle_timeout:
            log.warning("meshio agent at %s: no controller for %g s; exiting", rt.addr,
                        idle_timeout)
            return


def _host_port(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT``) split, the port checked (0: any).

    Raises:
        ValueError: not ``HOST:PORT``, or a port beyond 65535.
    """
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT, got {listen!r}")
    if int(port) > 65535:
        raise ValueError(f"--listen {listen!r}: the port must be 0..65535 (0: any free one)")
    return host.strip("[]"), int(port)


def tls_flags(cert: str, key: str, ca: str, *, mutual: bool,
              check_hostname: bool) -> list[str]:
    """The ``meshio agent`` options of a TLS setting (``cert``, ``key``,
    ``ca``: the paths as the agent's host sees them)."""
    return ["--tls-cert", cert, "--tls-key", key, "--tls-ca", ca,
            *([] if mutual else ["--tls-no-mutual"]),
            *([] if check_hostname else ["--tls-no-check-hostname"])]


def _idle_timeout_arg(text: str) -> float:
    """``--idle-timeout``, as argparse's ``type``."""
    try:
        return check_seconds(float(text), "meshio agent", "--idle-timeout")
    except ValueError:  # (not a number, or not > 0)
        raise argparse.ArgumentTypeError(
            f"must be seconds > 0 (inf: never), got {text!r}") from None


def _unloadable(cert: str, key: str, ca: str) -> str | None:
    """Why the agent's TLS files cannot be loaded (naming the options), or
    None: a bad file is a usage error now, not a failure at the first
    connection."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ValueError) as e:
        return (f"--tls-cert {cert!r} / --tls-key {key!r}: not a PEM certificate chain and "
                f"its private key ({e})")
    try:
        ctx.load_verify_locations(ca)
    except (OSError, ValueError) as e:
        return f"--tls-ca {ca!r}: not a PEM CA bundle ({e})"
    return None


def main(argv: list[str] | None = None) -> None:
    """``meshio agent``: see ``meshio agent --help``."""
    ap = argparse.ArgumentParser(prog="meshio agent",
                                 description="serve this host's workers to a meshio controller")
    ap.add_argument("--listen", required=True, help="HOST:PORT to listen on (port 0: any)")
    ap.add_argument("--secret-file", required=True,
                    help="file holding the job secret (at least 16 bytes), that others may "
                         "neither read nor write (mode 0600)")
    ap.add_argument("--advertise", help="host name or IP address (no port) controllers and "
                                        "workers reach this host at (default: the listen host, "
                                        "or this host's address)")
    ap.add_argument("--tls-cert", help="PEM certificate chain of this host")
    ap.add_argument("--tls-key", help="PEM private key")
    ap.add_argument("--tls-ca", help="PEM CA bundle peers must chain to")
    ap.add_argument("--tls-no-mutual", action="store_true",
                    help="do not demand client certificates (the secret still does)")
    ap.add_argument("--tls-no-check-hostname", action="store_true",
                    help="this host's workers do not check that the certificates of the hosts "
                         "they dial name them (for certificates without their IP addresses; "
                         "the CA and the secret still authenticate every peer)")
    ap.add_argument("--idle-timeout", type=_idle_timeout_arg,
                    help="exit after this many seconds (> 0) without a controller")
    args = ap.parse_args(argv)
    try:
        bind, port = _host_port(args.listen)
    except ValueError as e:
        ap.error(str(e))
    if (why := not_a_host(bind)) is not None:  # (getaddrinfo: a UnicodeError)
        ap.error(f"--listen {args.listen!r}: {bind!r} {why}")
    try:
        socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM)
    except OSError as e:  # (socket.gaierror)
        ap.error(f"--listen {args.listen!r}: cannot resolve {bind!r}: {e.strerror or e}")
    if args.advertise is not None and (why := not_a_host(args.advertise)) is not None:
        ap.error(f"--advertise {args.advertise!r} {why} (give no port, no brackets)")
    tls_args = (args.tls_cert, args.tls_key, args.tls_ca)
    for flag, path in zip(("--tls-cert", "--tls-key", "--tls-ca"), tls_args):
        if path == "":  # (an unset variable, say: never taken for "no TLS")
            ap.error(f"{flag} '': names no file")
    if any(tls_args) and not all(tls_args):
        ap.error("--tls-cert, --tls-key and --tls-ca go together")
    tls = None
    if all(tls_args):
        try:
            tls = TLSConfig(*tls_args, mutual=not args.tls_no_mutual,
                            check_hostname=not args.tls_no_check_hostname)
        except OSError as e:  # (a file that does not exist)
            ap.error(str(e))
        if (why := _unloadable(*tls_args)) is not None:
            ap.error(why)
    try:
        secret = read_secret_file(args.secret_file, private=True)
    except OSError as e:
        ap.error(f"--secret-file {args.secret_file!r}: cannot read it: {e.strerror or e}")
    except ValueError as e:
        ap.error(f"--secret-file {args.secret_file!r}: {e}")
    logging.basicConfig(format="%(message)s", level=logging.WARNING)
    # Started with SIGCHLD ignored (by a parent that ignored it): the kernel
    # would reap our workers at once and every exit status be lost.
    default_sigchld()
    listening = False

    def ready(addr: str) -> None:
        nonlocal listening
        listening = True
        print(f"meshio agent listening on {addr}", flush=True)

    # asyncio's own loop: an agent only starts and watches processes
    try:
        asyncio.run(serve_agent(args.listen, secret, advertise=args.advertise, tls=tls,
                                idle_timeout=args.idle_timeout, ready=ready))
    except OSError as e:
        if listening:
            raise
        sys.exit(f"meshio agent: cannot listen on {args.listen}: {e.strerror or e}")
    sys.exit(0)
