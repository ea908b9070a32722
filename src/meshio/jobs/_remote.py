"""Hosts reached through their host agent (``meshio agent``): the
controller's side.

:class:`RemoteLauncher` is the :class:`~meshio._launcher.ProcLauncher` of
one remote host: it asks the host's agent to start each worker and watches
it through the agent (:class:`RemoteProc`); the worker itself connects to
the controller directly, over TCP, proving the job secret (and TLS when
configured), and so do workers of different hosts to each other.
:func:`attach` makes a :class:`~meshio.HostMesh` of such hosts.  A
controller drives the hosts of any number of jobs, each proving its own
secret and TLS settings (:class:`~meshio._transport._credentials.Credentials`).

Partitions (:class:`_AgentWatch`): while a host runs workers started (or
re-attached to: :meth:`RemoteLauncher.adopt`) with a ``partition_timeout``,
the controller beats its agent
(:class:`~meshio._transport._messages.AgentBeat`); a host whose agent has
not answered for a worker's ``partition_timeout`` is *downed* for it: the
worker counts as exited (:attr:`RemoteProc.downed` says why) and its
connections are dropped, so its proc mesh fails it as any dead process.
The agent, which has not been heard for as long, has killed it by then
(self-fencing, :mod:`._agent`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import re
import signal
import socket
import stat
import sys
from collections.abc import Sequence

import msgspec

from .._exceptions import SupervisionError
from .._extent import Region
from .._launcher import EXIT_UNKNOWN, ExitWatch, Forward, WorkerSpec
from .._proc_mesh import HostMesh
from .._transport._connection import Connection, Pending
from .._transport._credentials import Credentials
from .._transport._messages import (
    AgentBeat,
    AgentBeatAck,
    LaunchWorker,
    SignalWorker,
    WatchWorker,
    WorkerExited,
    WorkerOutput,
)
from .._transport._runtime import Runtime, RuntimeState, register_handler, runtime
from .._transport._serial import Buffers
from .._transport._sockets import tcp_endpoint
from .._transport._tls import TLSConfig

__all__ = ("RemoteLauncher", "RemoteProc", "attach", "checked_secret", "not_a_host",
           "not_private", "read_secret_file", "route_to")

log = logging.getLogger("meshio")

#: most seconds between two beats to a host agent (a quarter of the
#: shortest ``partition_timeout`` of its workers when that is shorter)
AGENT_BEAT = 1.0
#: a host name once IDNA-encoded: dot-separated labels (their lengths checked
#: by the encoding), an optional final dot
_HOST_NAME = re.compile(rb"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?")


def read_secret_file(path: str | os.PathLike[str], *, private: bool = False) -> bytes:
    """The job secret in the file ``path`` (``meshio agent --secret-file``;
    trailing whitespace dropped).  With ``private``, the file opened must
    be one that others may neither read nor write (:func:`not_private`,
    a file of root's shared with its group allowed).

    Raises:
        OSError: the file cannot be read.
        ValueError: the secret is shorter than 16 bytes; with ``private``,
            the file is not private (a FIFO or a device too: opened without
            waiting for a writer, then refused).
    """
    # (O_NONBLOCK: opening a FIFO would wait for a writer, forever)
    with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK)) as f:
        if private and (why := not_private(os.fstat(f.fileno()), root_group=True)):
            raise ValueError(f"the file {why}; a job secret must be a regular file, yours "
                             "alone (chmod 600)")
        return checked_secret(f.read().strip())


def not_private(st: os.stat_result, *, root_group: bool = False) -> str | None:
    """Why the file of ``st`` may not hold a job's secret, or None: it is no
    regular file, it is another user's, or others may read or write it.
    With ``root_group``, a file of root's that its group may read or write
    passes too, not one that every user may: a Kubernetes Secret is
    mounted so (root's, mode 0440, its group the pod's ``fsGroup``)."""
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISREG(st.st_mode):
        return "is no regular file (a FIFO, a device, a directory, a socket)"
    if root_group and st.st_uid == 0:
        return None if not mode & stat.S_IRWXO else (
            f"is readable or writable by every user (mode {mode:o})")
    if st.st_uid != os.getuid():
        return f"belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"is readable or writable by others (mode {mode:o})"
    return None


def checked_secret(secret: bytes) -> bytes:
    """``secret``, at least 16 bytes.

    Raises:
        ValueError: it is shorter.
    """
    if len(secret) < 16:
        raise ValueError(f"the job secret must be at least 16 bytes, got {len(secret)}")
    return secret


def not_a_host(host: str) -> str | None:
    """Why ``host`` is neither a host name nor an IP address (a port,
    brackets, spaces, an empty or over-long DNS label), or None."""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    try:
        name = host.encode("idna")
    except UnicodeError as e:  # a label empty or over 63 characters
        return f"is not a host name ({e.__cause__ or e})"
    if not _HOST_NAME.fullmatch(name):
        return "is neither a host name nor an IP address"
    if len(name.rstrip(b".")) > 253:
        return "is not a host name (longer than 253 characters)"
    return None


def route_to(host: str) -> str:
    """This host's address on the route to ``host`` (what to advertise to it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))  # UDP: picks the route, sends nothing
        return str(probe.getsockname()[0])


class RemoteProc(ExitWatch):
    """A worker on a remote host, watched through that host's agent."""

    def __init__(self, launcher: RemoteLauncher, conn: Connection, worker: str, pid: int,
                 label: str, loop: asyncio.AbstractEventLoop,
                 partition_timeout: float | None = None) -> None:
        self.pid = pid
        self.host = launcher.host
        self.agent = launcher.agent
        self.start_failure: str | None = None
        self.downed: str | None = None
        self.partition_timeout = partition_timeout
        #: when the controller learned it runs (its host's silence counts from then at most)
        self.since = loop.time()
        self._conn = conn
        self._worker = worker
        self._exit = loop.create_future()
        self._out = {stream: Forward(label, stream) for stream in ("stdout", "stderr")}

    def send_signal(self, sig: int) -> None:
        if not self._exit.done() and not self._conn.closed:
            self._conn.send_message(SignalWorker(self._worker, sig))

    def _output(self, stream: str, data: bytes) -> None:
        self._out[stream].data_received(data)

    def _exited(self, code: int, start_failure: str = "", downed: str | None = None) -> None:
        if not self._exit.done():
            for out in self._out.values():
                out.eof_received()
            self.start_failure = start_failure or None
            self.downed = downed
            self._exit.set_result(code)


class _Remote(RuntimeState):
    """The controller runtime's remote workers, by worker id, and its watch
    over their agents, by agent connection."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.procs: dict[str, RemoteProc] = {}
        self.watches: dict[Connection, _AgentWatch] = {}

    def watch(self, proc: RemoteProc) -> None:
        """Beat ``proc``'s agent while it runs; down it if its host goes silent."""
        watch = self.watches.get(proc._conn)
        if watch is None:
            watch = self.watches[proc._conn] = _AgentWatch(self, proc._conn)
        watch.add(proc)

    def close(self) -> None:
        for watch in self.watches.values():
            watch.close()
        self.watches.clear()
        for proc in self.procs.values():
            proc._exited(-signal.SIGKILL)  # their agents end them with their controller
        self.procs.clear()


class _AgentWatch:
    """The controller's beats to one host agent, while it runs workers with a
    ``partition_timeout``; each worker whose host has not answered for its
    ``partition_timeout`` is downed.  Owns its beating task (cancelled by
    :meth:`close`)."""

    def __init__(self, remote: _Remote, conn: Connection) -> None:
        self.remote = remote
        self.conn = conn
        self.procs: dict[str, RemoteProc] = {}
        self.seq = 0
        #: the last answer heard, and when (loop time)
        self.heard = 0
        self.last = remote.rt.loop.time()
        self._task: asyncio.Task[None] | None = None

    def add(self, proc: RemoteProc) -> None:
        self.procs[proc._worker] = proc
        if self._task is None or self._task.done():
            self._task = self.remote.rt.tasks.start(self._beat())

    def acked(self, seq: int) -> None:
        if seq > self.heard:
            self.heard, self.last = seq, self.remote.rt.loop.time()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _beat(self) -> None:
        loop = self.remote.rt.loop
        while not self.conn.closed:
            for worker, proc in list(self.procs.items()):
                if proc.returncode is not None:
                    del self.procs[worker]
            if not self.procs:
                return
            shortest = min(p.partition_timeout or AGENT_BEAT for p in self.procs.values())
            await asyncio.sleep(min(AGENT_BEAT, shortest / 4))
            now = loop.time()
            for proc in list(self.procs.values()):
                silent = now - max(self.last, proc.since)
                if proc.partition_timeout is not None and silent > proc.partition_timeout:
                    self._down(proc, silent)
            self.seq += 1
            self.conn.send_message(AgentBeat(self.seq, self.heard))

    def _down(self, proc: RemoteProc, silent: float) -> None:
        """``proc``'s host has been silent past its ``partition_timeout``: it
        counts as dead (its agent has killed it), and its connections go, so
        its proc mesh fails it, and a supervisor may start a replacement."""
        del self.procs[proc._worker]
        self.remote.procs.pop(proc._worker, None)
        why = (f"partitioned: its host {proc.host} was unreachable for {silent:.1f} s "
               f"(partition_timeout={proc.partition_timeout:g} s), so it counts as dead; its "
               f"agent {proc.agent} kills its workers itself once cut off that long")
        log.warning("meshio: host %s unreachable for %.1f s (partition_timeout=%g s): "
                    "downed; its process %d counts as failed", proc.host, silent,
                    proc.partition_timeout, proc.pid)
        proc._exited(-signal.SIGKILL, downed=why)
        for conn in list(self.remote.rt.all_conns):
            if conn.worker == proc._worker and not conn.closed:
                conn.abort()


def _on_output(rt: Runtime, conn: Connection, msg: WorkerOutput, bufs: Buffers) -> None:
    proc = rt.state(_Remote).procs.get(msg.worker) if rt.has_state(_Remote) else None
    if proc is not None:
        proc._output(msg.stream, msg.data)


def _on_ack(rt: Runtime, conn: Connection, msg: AgentBeatAck, bufs: Buffers) -> None:
    watch = rt.state(_Remote).watches.get(conn) if rt.has_state(_Remote) else None
    if watch is not None:
        watch.acked(msg.seq)


def _on_exit(rt: Runtime, conn: Connection, msg: WorkerExited, bufs: Buffers) -> None:
    proc = rt.state(_Remote).procs.pop(msg.worker, None) if rt.has_state(_Remote) else None
    if proc is not None:
        proc._exited(msg.code, msg.start_failure)


register_handler(WorkerOutput, _on_output)
register_handler(WorkerExited, _on_exit)
register_handler(AgentBeatAck, _on_ack)


def _pid(raw: msgspec.Raw, bufs: Buffers) -> int:
    return msgspec.msgpack.decode(raw, type=int)


def _pid_or_none(raw: msgspec.Raw, bufs: Buffers) -> int | None:
    """A watch's answer: the worker's pid, or None (the agent has it no more)."""
    return msgspec.msgpack.decode(raw, type=int | None)


class RemoteLauncher:
    """Starts workers on one remote host through its agent at ``agent``
    (``tcp://HOST:PORT``)."""

    in_process = False

    def __init__(self, agent: str, job: Credentials) -> None:
        endpoint = tcp_endpoint(agent)
        if endpoint is None:
            raise ValueError(f"a host agent's address is tcp://HOST:PORT, got {agent!r}")
        self.agent = agent
        self.host: str = endpoint[0]
        self._job = job

    async def launch(self, spec: WorkerSpec) -> RemoteProc:
        rt = runtime()
        conn = rt.connect(self.agent, self._job)
        fut: asyncio.Future[int] = rt.loop.create_future()
        req = conn.next_req(Pending(fut, _pid, "start worker", f"host agent {self.agent}",
                                    spec.label or spec.worker))
        sent = False
        try:
            await rt.sockets.dialled(conn)
            if not fut.done():  # the agent proved the job's credentials: serve its workers
                rt.on_lost.setdefault(self.agent, self._agent_lost)
                controller = rt.sockets.listen_tcp(advertise=route_to(self.host), job=self._job)
                # the controller's import path goes first (a shared filesystem has it)
                env = {**spec.env, "MESHIO_SYS_PATH": json.dumps([p for p in sys.path if p])}
                conn.send_message(LaunchWorker(req, spec.worker, spec.addr, controller, env,
                                               spec.restart, spec.label, spec.bootstrap,
                                               spec.partition_timeout, spec.keep_alive))
                sent = True
            # (a failed dial failed it, before anything listened for the job)
            pid = await asyncio.shield(fut)
        except BaseException:  # given up (cancelled): nobody will own what it starts
            if not sent:
                conn.pending.pop(req, None)
                fut.cancel()
            elif not fut.done():
                fut.add_done_callback(lambda f: self._started_for_nobody(conn, spec.worker, f))
            raise
        return self._watch(conn, spec, pid)

    @staticmethod
    def _started_for_nobody(conn: Connection, worker: str, fut: asyncio.Future[int]) -> None:
        """The agent answered a launch given up meanwhile: a worker it started
        is killed (nobody would ever stop it); a failure is nobody's."""
        if not fut.cancelled() and fut.exception() is None:
            conn.send_message(SignalWorker(worker, signal.SIGKILL))

    def _watch(self, conn: Connection, spec: WorkerSpec, pid: int) -> RemoteProc:
        """The handle of the worker of ``spec``, running as ``pid``, told of
        by the agent on ``conn`` (its output, its exit); with a
        ``partition_timeout``, its host is downed once its agent has been
        silent that long (:class:`_AgentWatch`), as its agent fences it."""
        proc = RemoteProc(self, conn, spec.worker, pid, spec.label or spec.worker,
                          conn.rt.loop, spec.partition_timeout)
        remote = conn.rt.state(_Remote)
        remote.procs[spec.worker] = proc
        if spec.partition_timeout is not None:
            remote.watch(proc)
        return proc

    def reach(self, secret: bytes) -> tuple[Credentials, str]:
        # (its workers prove the job's credentials, whoever spawned them:
        # a mesh of another job fails the handshake)
        addr = runtime().sockets.listen_tcp(advertise=route_to(self.host), job=self._job)
        return self._job, addr

    async def adopt(self, spec: WorkerSpec, pid: int) -> RemoteProc:
        rt = runtime()
        conn = rt.connect(self.agent, self._job)
        fut: asyncio.Future[int | None] = rt.loop.create_future()
        label = spec.label or spec.worker
        req = conn.next_req(Pending(fut, _pid_or_none, "watch worker",
                                    f"host agent {self.agent}", label))
        # (its agent fences it for this controller from now on)
        conn.send_message(WatchWorker(req, spec.worker, spec.partition_timeout))
        rt.on_lost.setdefault(self.agent, self._agent_lost)
        running = await fut
        if running is None:  # it exited while no controller watched it: it fails now
            proc = RemoteProc(self, conn, spec.worker, pid, label, rt.loop)
            proc._exited(EXIT_UNKNOWN)
            return proc
        return self._watch(conn, spec, running)

    def _agent_lost(self, conn: Connection) -> None:
        """The agent's connection dropped: its workers died with it (they are
        its children, killed with it) or can no longer be watched."""
        rt = conn.rt
        conn.fail_all(lambda p: SupervisionError(
            f"host agent {self.agent} ({self.host}): connection lost while {p.endpoint} for "
            f"{p.point} was in flight", host=self.host, cause="host agent lost"))
        if rt.has_state(_Remote):
            watch = rt.state(_Remote).watches.pop(conn, None)
            if watch is not None:
                watch.close()
            procs = rt.state(_Remote).procs
            for worker, proc in list(procs.items()):
                if proc._conn is conn:
                    del procs[worker]
                    proc._exited(-signal.SIGKILL)


def attach(addresses: Sequence[str], *, secret: bytes | None = None,
           secret_file: str | os.PathLike[str] | None = None,
           tls: TLSConfig | None = None) -> HostMesh:
    """Hosts whose agents were started some other way
    (``meshio agent --listen HOST:PORT --secret-file F``), as a host mesh
    with one dim, ``hosts``, in the order given.

    Nothing is contacted until ``spawn_procs``: a host that cannot be
    reached (or fails authentication) fails that with
    :class:`~meshio.SupervisionError` or :class:`~meshio.AuthenticationError`,
    and leaves nothing behind (attach again with the right secret).  One
    controller drives the hosts of any number of jobs, each with its own
    secret and TLS settings; an actor calls the actors of its own job only.

    Args:
        addresses: the agents, ``"tcp://HOST:PORT"`` or ``"HOST:PORT"``.
        secret: the job secret the agents hold (bytes).
        secret_file: or the path of the file holding it (the agents'
            ``--secret-file``), which others may neither read nor write
            (as the agents'; a file of root's shared with its group, as
            Kubernetes mounts a Secret, passes).
        tls: certificates, when the agents were started with ``--tls-*``.

    Raises:
        ValueError: no address, a malformed one (its host no host name or
            IP address: :func:`not_a_host`), or one given twice (as
            written, ``tcp://`` added: two names of one host are not
            compared); a secret shorter than 16 bytes; a ``secret_file``
            that is not private (another user's, or others may read or
            write it: the error names its mode; ``chmod 600`` it), or no
            regular file.
        TypeError: an address not a ``str``; ``tls`` not a
            :class:`~meshio.TLSConfig` or None; ``secret`` not bytes (a
            ``str`` too: pass a file as ``secret_file``), or both or
            neither of ``secret`` and ``secret_file``.
        OSError: ``secret_file`` cannot be read.
    """
    if isinstance(addresses, str) or not addresses:
        raise ValueError("attach: addresses must be a non-empty sequence of "
                         "'tcp://HOST:PORT' strings")
    for i, address in enumerate(addresses):
        if not isinstance(address, str):
            raise TypeError(f"attach: addresses[{i}] must be a 'tcp://HOST:PORT' string, "
                            f"got {type(address).__name__}")
    if tls is not None and not isinstance(tls, TLSConfig):
        raise TypeError(f"attach: tls= takes a meshio.TLSConfig or None, got "
                        f"{type(tls).__name__}")
    if (secret is None) == (secret_file is None):
        raise TypeError("attach: pass the job secret as secret=<bytes> or the path of its "
                        "file as secret_file=<path>, one of the two")
    if secret_file is not None:
        if not isinstance(secret_file, (str, os.PathLike)):
            raise TypeError("attach: secret_file= is the path of the job secret's file, got "
                            f"{type(secret_file).__name__}")
        try:
            key = read_secret_file(secret_file, private=True)
        except ValueError as e:
            raise ValueError(f"attach: secret_file {os.fspath(secret_file)!r}: {e}") from None
    elif isinstance(secret, bytes):
        key = checked_secret(secret)
    else:  # never read as a file name, and never shown
        raise TypeError(f"attach: secret= takes the job secret itself as bytes, got "
                        f"{type(secret).__name__}; to read it from a file, pass "
                        "secret_file=<path>")
    job = Credentials(key, tls)
    agents = [a if a.startswith("tcp://") else f"tcp://{a}" for a in addresses]
    for i, agent in enumerate(agents):
        if agent in agents[:i]:
            raise ValueError(f"attach: agent {agent} is given twice (addresses "
                             f"{agents.index(agent)} and {i}): each address is one host")
    launchers = [RemoteLauncher(a, job) for a in agents]
    for launcher in launchers:  # (resolved at spawn_procs: a name that cannot be is refused now)
        if (why := not_a_host(launcher.host)) is not None:
            raise ValueError(f"attach: agent {launcher.agent}: {launcher.host!r} {why}")
    return HostMesh(launchers, Region.full(("hosts",), (len(launchers),)))
