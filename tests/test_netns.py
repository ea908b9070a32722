"""issue 10: many hosts as Linux network namespaces (tests/netns_hosts.py),
one ``meshio agent`` per namespace, each with its own address behind a
bridge: calls, actor-to-actor calls and RDMA handles across hosts, a killed
agent, a stopped worker, a partition (veth down) and its heal, refused
peers, mutual TLS, torch.distributed's rendezvous and forwarded output.

Needs root (CI runs as root); skipped without it.  Nothing sleeps to wait
for an event: tests wait on supervision events, pidfds, replies and the
forwarded output itself, each under a guard so a regression fails instead
of hanging.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import ssl
import sys
import time
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trustme

import meshio
from log_watch import LogWatch
from meshio import (
    Actor,
    RDMABuffer,
    SupervisionError,
    _launcher,
    _proc_state,
    context,
    endpoint,
)
from meshio.jobs import TLSConfig
from meshio.supervision import SupervisionEvent
from meshio.testing import wait_exited
from netns_hosts import Host, netns_hosts, requires_netns
from raw_peer import refused_by
from rdma_actors import N, Owner, Peer

pytestmark = [requires_netns, pytest.mark.filterwarnings("ignore::meshio.RDMAFallbackWarning")]

#: guard on any single wait (a regression fails instead of hanging)
DEADLINE = 30.0
#: heartbeats of the failure tests: a silent process is found within ~TIMEOUT + INTERVAL
INTERVAL, TIMEOUT = 0.25, 1.5
#: what "promptly" allows beyond the heartbeat timeout on a loaded 2-core machine:
#: one interval, the wait for an exit status, and slack; TCP alone would take minutes
PROMPT = TIMEOUT + INTERVAL + _proc_state.EXIT_STATUS_WAIT + 5.0


class Where(Actor):
    @endpoint
    async def where(self) -> tuple[int, str]:
        return os.getpid(), context().proc.addr

    @endpoint
    async def echo(self, x: int) -> int:
        return x

    @endpoint
    async def ask(self, other: Where, x: int) -> list[tuple[int, str]]:
        """Call ``other`` (another proc mesh, on another host) from here."""
        return [(await other.echo.call_one(x), addr) for _, addr in
                (await other.where.call()).values()]

    @endpoint
    async def hang(self) -> None:
        await asyncio.Event().wait()

    @endpoint
    async def ask_hang(self, other: Where) -> None:
        """Call ``other``'s :meth:`hang` from here."""
        await other.hang.call_one()

    @endpoint
    def say(self, marker: str) -> None:
        print(marker, flush=True)

    @endpoint
    def env(self, names: list[str]) -> dict[str, str]:
        return {k: os.environ[k] for k in names}

    @endpoint
    async def all_reduce(self, value: float) -> float:
        """gloo over the namespace's own interface (the host name resolves
        to no address of the namespace): setup_torch_distributed named it."""
        import torch
        import torch.distributed as dist

        await asyncio.to_thread(dist.init_process_group, "gloo")
        t = torch.tensor([value])
        await asyncio.to_thread(dist.all_reduce, t)  # pyright: ignore[reportUnknownArgumentType,reportUnknownMemberType]
        dist.destroy_process_group()
        return float(t.item())


# ------------------------------------------------------------------ fixtures

def attach(hosts: list[Host], secret_file: Path, tls: TLSConfig | None = None
           ) -> meshio.HostMesh:
    return meshio.attach([h.agent_addr for h in hosts], secret_file=secret_file, tls=tls)


def bridge_of(host: Host) -> str:
    """The controller's address as the host sees it (the bridge's)."""
    return host.addr.rsplit(".", 1)[0] + ".1"


class Watch:
    """A supervisor's events, in order, with a wait for the next matching one."""

    def __init__(self, sup: meshio.Supervisor) -> None:
        self.seen: list[SupervisionEvent] = []
        self._it = sup.events()

    async def next(self, kind: str) -> SupervisionEvent:
        async def scan() -> SupervisionEvent:
            while True:
                ev = await self._it.__anext__()
                self.seen.append(ev)
                if ev.kind == kind:
                    return ev
        return await asyncio.wait_for(scan(), DEADLINE)

    async def aclose(self) -> None:
        await self._it.aclose()


@asynccontextmanager
async def supervised(hm: meshio.HostMesh, **kw: object) -> AsyncGenerator[
        tuple[meshio.ProcMesh, Watch]]:
    sup = meshio.Supervisor(heartbeat_interval=INTERVAL, heartbeat_timeout=TIMEOUT,
                            **kw)  # type: ignore[arg-type]
    watch = Watch(sup)
    try:
        async with hm.spawn_procs(supervisor=sup, shutdown="brutal_kill") as procs:
            yield procs, watch
    finally:
        await watch.aclose()


async def fails_promptly(call: asyncio.Future[object] | object) -> tuple[SupervisionError, float]:
    """The SupervisionError ``call`` ends with, and how long that took."""
    t0 = time.monotonic()
    with pytest.raises(SupervisionError) as ei:
        await asyncio.wait_for(call, DEADLINE)  # type: ignore[arg-type]
    return ei.value, time.monotonic() - t0


async def wait_pid_gone(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await wait_exited(fd, DEADLINE)
    finally:
        os.close(fd)


# ------------------------------------------------------------------ calls

async def test_calls_and_actor_to_actor_calls_across_hosts(hosts: list[Host],
                                                           secret_file: Path) -> None:
    """Every process runs in its host's namespace and serves calls at that
    host's address; an actor on one host calls a mesh (a reference passed
    as an argument) on another host."""
    hm = attach(hosts, secret_file)
    async with hm.spawn_procs(per_host={"procs": 2}) as procs, \
            attach(hosts[1:], secret_file).spawn_procs() as others:
        w = await procs.spawn("w", Where)
        found = (await asyncio.wait_for(w.where.call(), DEADLINE)).values()
        hosts_of = [addr.removeprefix("tcp://").rsplit(":", 1)[0] for _, addr in found]
        assert hosts_of == [hosts[0].addr] * 2 + [hosts[1].addr] * 2
        assert len({pid for pid, _ in found}) == 4
        o = await others.spawn("o", Where)
        (_, o_addr), = (await o.where.call()).values()
        assert o_addr.startswith(f"tcp://{hosts[1].addr}:")
        asked = await asyncio.wait_for(w.slice(hosts=0).ask.call(o, 7), DEADLINE)
        assert asked.values() == [[(7, o_addr)]] * 2


async def test_rdma_tcp_handle_across_hosts(hosts: list[Host], secret_file: Path) -> None:
    """A buffer owned on one host, read and written through the ``tcp``
    backend by an actor on another host and by the controller."""
    owners = await attach(hosts[:1], secret_file).spawn_procs()
    peers = await attach(hosts[1:], secret_file).spawn_procs()
    try:
        owner = await owners.spawn("owner", Owner)
        peer = await peers.spawn("peer", Peer)
        buf = await owner.register.call_one("tcp")
        assert buf.backend == "tcp" and buf.size == N
        for offset, length in [(0, N), (12345, 65536), (N - 7, 7)]:
            got = await asyncio.wait_for(peer.read.call_one(buf, offset, length), DEADLINE)
            assert got == await owner.content.call_one(offset, length)
        patch = os.urandom(70001)
        assert await peer.write.call_one(buf, patch, 333) == len(patch)
        assert await owner.content.call_one(333, len(patch)) == patch
        here = bytearray(4096)
        assert await asyncio.wait_for(buf.read_into(here, offset=333, length=4096),
                                      DEADLINE) == 4096
        assert bytes(here) == patch[:4096]
    finally:
        await peers.stop()
        await owners.stop()


async def test_a_buffer_the_controller_owns_is_read_and_written_on_another_host(
        hosts: list[Host], secret_file: Path) -> None:
    """The controller's handles name its Unix address; an actor on another
    host reaches it over the connection it dialled to the controller's TCP
    listener (the controller names itself there on connecting)."""
    data = bytearray(os.urandom(N))
    buf = RDMABuffer(data, backend="tcp")
    async with attach(hosts[1:], secret_file).spawn_procs() as peers:
        peer = await peers.spawn("peer", Peer)
        got = await asyncio.wait_for(peer.read.call_one(buf, 4321, 65536), DEADLINE)
        assert got == bytes(data[4321:4321 + 65536])
        assert await peer.write.call_one(buf, b"x" * 1000, 7) == 1000
        assert data[7:1007] == b"x" * 1000


# ------------------------------------------------------------------ failures

async def test_killed_agent_fails_in_flight_calls_promptly(hosts: list[Host],
                                                           secret_file: Path) -> None:
    """SIGKILL of one host's agent takes its workers down: a call in flight
    there fails with SupervisionError at once; the other host still serves."""
    async with attach(hosts, secret_file).spawn_procs() as procs:
        w = await procs.spawn("w", Where)
        (_, _), (pid1, _) = (await w.where.call()).values()
        stuck = asyncio.ensure_future(w.slice(hosts=1).hang.call_one())
        assert hosts[1].agent is not None
        hosts[1].agent.kill()  # ``ip netns exec`` execs the agent: this is its pid
        error, took = await fails_promptly(stuck)
        assert error.host == hosts[1].addr and took < PROMPT
        await wait_pid_gone(pid1)  # its worker died with it
        assert await asyncio.wait_for(w.slice(hosts=0).echo.call_one(3), DEADLINE) == 3


async def test_a_restart_waits_for_its_host_agent_started_again(
        hosts: list[Host], secret_file: Path, controller_log: LogWatch) -> None:
    """SIGKILL of one host's agent takes its worker down, and the restart
    finds no agent there (connection refused): it waits for one, dialling
    again, instead of failing at once (each refusal was a failed restart:
    max_restarts=3 was used up in milliseconds and the supervisor stopped
    the whole mesh).  An agent started again at the same address, as systemd
    or a pod's restartPolicy does, gets the rank back on that one restart;
    the other host's process is untouched."""
    async with supervised(attach(hosts, secret_file), max_restarts=1) as (procs, watch):
        w = await procs.spawn("w", Where)
        (pid0, addr0), (pid1, addr1) = (await w.where.call()).values()
        assert hosts[1].agent is not None
        hosts[1].agent.kill()
        failure = await watch.next("failure")
        assert (failure.rank, failure.pid, failure.host) == (1, pid1, hosts[1].addr)
        refused = await controller_log.wait_for("its restart waits for the agent")
        assert f"rank 1: cannot reach host agent {hosts[1].agent_addr}" in refused
        hosts[1].start_agent(secret_file)
        await asyncio.to_thread(hosts[1].agent_listening)
        restart = await watch.next("restart")
        assert (restart.rank, restart.host) == (1, hosts[1].addr) and restart.pid != pid1
        found = (await asyncio.wait_for(w.where.call(), DEADLINE)).values()
        assert found == [(pid0, addr0), (restart.pid, addr1)]
        assert [(e.kind, e.rank) for e in watch.seen] == [("failure", 1), ("restart", 1)]


async def test_stopped_remote_worker_is_killed_and_restarted(hosts: list[Host],
                                                             secret_file: Path) -> None:
    """SIGSTOP of a worker on another host: its call in flight fails within
    the heartbeat timeout; its supervisor has it killed by its agent and
    started again on the same host, at the same address."""
    async with supervised(attach(hosts, secret_file), max_restarts=1) as (procs, watch):
        w = await procs.spawn("w", Where)
        h = await procs.spawn("h", Where)
        (_, _), (pid1, addr1) = (await w.where.call()).values()
        stuck = asyncio.ensure_future(h.slice(hosts=1).hang.call_one())
        os.kill(pid1, signal.SIGSTOP)
        error, took = await fails_promptly(stuck)
        assert "hung" in error.cause and error.pid == pid1 and took < PROMPT
        failure = await watch.next("failure")
        assert failure.pid == pid1 and failure.host == hosts[1].addr
        restart = await watch.next("restart")
        assert restart.host == hosts[1].addr and restart.pid != pid1
        await wait_pid_gone(pid1)
        assert (await asyncio.wait_for(w.slice(hosts=1).where.call_one(), DEADLINE)) \
            == (restart.pid, addr1)


async def test_partition_fails_calls_and_the_heal_restores_them(
        hosts: list[Host], secret_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No supervisor: a host cut off (its veth down) leaves heartbeats
    unanswered, so its calls fail within the heartbeat timeout, in flight
    and new ones alike, and nothing is killed; once the link is back the
    same process answers again (policy: recover)."""
    loop = asyncio.get_running_loop()
    answers = asyncio.Event()
    responds = _proc_state.ProcState.responds

    def watched(self: _proc_state.ProcState, w: object) -> None:
        loop.call_soon(answers.set)
        responds(self, w)  # type: ignore[arg-type]

    monkeypatch.setattr(_proc_state.ProcState, "responds", watched)
    async with attach(hosts, secret_file).spawn_procs(
            heartbeat_interval=INTERVAL, heartbeat_timeout=TIMEOUT) as procs:
        w = await procs.spawn("w", Where)
        h = await procs.spawn("h", Where)
        (_, _), (pid1, addr1) = (await w.where.call()).values()
        stuck = asyncio.ensure_future(h.slice(hosts=1).hang.call_one())
        await asyncio.wait_for(w.slice(hosts=1).echo.call_one(0), DEADLINE)  # hang is in
        hosts[1].partition()
        try:
            error, took = await fails_promptly(stuck)
            assert "not responding" in error.cause and took < PROMPT
            assert error.host == hosts[1].addr and error.pid == pid1
            later, _ = await fails_promptly(w.slice(hosts=1).echo.call_one(1))
            assert "was not sent" in str(later)
            assert await w.slice(hosts=0).echo.call_one(2) == 2  # the other host serves
        finally:
            hosts[1].heal()
        await asyncio.wait_for(answers.wait(), DEADLINE)
        assert await asyncio.wait_for(w.slice(hosts=1).where.call_one(), DEADLINE) \
            == (pid1, addr1)


async def test_partition_with_a_supervisor_restarts_after_the_heal(
        hosts: list[Host], secret_file: Path) -> None:
    """A supervisor: the cut-off process is declared hung, its calls fail
    within the heartbeat timeout (not when TCP gives up), and once the
    link is back its agent kills it and the supervisor's replacement
    serves on the same host (policy: restart)."""
    async with supervised(attach(hosts, secret_file), max_restarts=1) as (procs, watch):
        w = await procs.spawn("w", Where)
        h = await procs.spawn("h", Where)
        (_, _), (pid1, addr1) = (await w.where.call()).values()
        stuck = asyncio.ensure_future(h.slice(hosts=1).hang.call_one())
        await asyncio.wait_for(w.slice(hosts=1).echo.call_one(0), DEADLINE)
        hosts[1].partition()
        try:
            error, took = await fails_promptly(stuck)
            assert "hung" in error.cause and error.pid == pid1 and took < PROMPT
            failure = await watch.next("failure")
            assert failure.host == hosts[1].addr
        finally:
            hosts[1].heal()
        restart = await watch.next("restart")
        assert restart.host == hosts[1].addr and restart.pid != pid1
        await wait_pid_gone(pid1)
        assert await asyncio.wait_for(w.slice(hosts=1).where.call_one(), DEADLINE) \
            == (restart.pid, addr1)
        assert [e.kind for e in watch.seen] == ["failure", "restart"]


async def test_partition_escalates_when_no_restart_is_allowed(
        hosts: list[Host], secret_file: Path) -> None:
    """max_restarts=0: the supervisor gives up while the host is still cut
    off (stopping the mesh does not wait for an exit nobody can report);
    after the heal the cut-off process is gone too."""
    escalated: list[SupervisionError] = []

    def on_escalate(e: SupervisionError) -> bool:
        escalated.append(e)
        return True

    async with supervised(attach(hosts, secret_file), max_restarts=0,
                          on_escalate=on_escalate) as (procs, watch):
        w = await procs.spawn("w", Where)
        (pid0, _), (pid1, _) = (await w.where.call()).values()
        hosts[1].partition()
        try:
            ev = await watch.next("escalation")
            assert "max_restarts=0" in ev.cause and "hung" in ev.cause
            assert len(escalated) == 1 and "rank 1 failed (hung" in str(escalated[0])
            assert escalated[0].host == hosts[1].addr  # where the failure happened
            error, _ = await fails_promptly(w.slice(hosts=0).echo.call_one(1))
            assert "supervisor gave up" in error.cause
        finally:
            hosts[1].heal()
        await wait_pid_gone(pid0)
        await wait_pid_gone(pid1)  # killed by its agent once it heard


# ------------------------------------------------------------------ security

async def test_wrong_secret_is_refused_and_the_agent_keeps_serving(
        secret_file: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A peer with another secret fails the handshake across the bridge,
    garbage is dropped and logged with the peer's address; the agent
    still serves.  (Hosts made in the test: its captured stderr is theirs.)"""
    with netns_hosts(1, secret_file) as hosts:
        host, port = hosts[0].agent_addr.removeprefix("tcp://").rsplit(":", 1)
        await refused_by(host, int(port))
        # garbage where the handshake belongs: dropped
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        assert await asyncio.wait_for(reader.read(), DEADLINE) == b""
        writer.close()
        await writer.wait_closed()
        async with attach(hosts, secret_file).spawn_procs() as procs:
            w = await procs.spawn("w", Where)
            assert await asyncio.wait_for(w.echo.call_one(2), DEADLINE) == 2
    err = capfd.readouterr().err  # the agent has exited: its log is complete
    assert "refused a connection" in err and f"from {bridge_of(hosts[0])} port" in err
    assert "not a meshio handshake" in err


def _tls(tmp_path: Path, name: str, ca: trustme.CA) -> TLSConfig:
    """A certificate of ``ca`` valid for every address a netns host or the
    bridge can have (netns_hosts picks a subnet in 10.100-249.0.0/24)."""
    ips = [f"10.{net}.0.{i}" for net in range(100, 250) for i in (1, 10, 11)]
    cert = ca.issue_cert(*ips)
    cert.private_key_and_cert_chain_pem.write_to_path(tmp_path / f"{name}.pem")
    ca.cert_pem.write_to_path(tmp_path / f"{name}-ca.pem")
    return TLSConfig(tmp_path / f"{name}.pem", tmp_path / f"{name}.pem",
                     tmp_path / f"{name}-ca.pem")


async def test_mutual_tls_across_hosts(tmp_path: Path, secret_file: Path,
                                       capfd: pytest.CaptureFixture[str]) -> None:
    """Agents, workers and the controller under mutual TLS: calls and
    actor-to-actor calls across hosts; a client without a certificate, and
    a plain-text one, are refused before the job handshake; the agent keeps
    serving."""
    tls = _tls(tmp_path, "job", trustme.CA())
    args = ("--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--tls-ca", str(tls.ca))
    with netns_hosts(2, secret_file, agent_args=args) as hosts:
        async with attach(hosts, secret_file, tls).spawn_procs() as procs:
            w = await procs.spawn("w", Where)
            found = (await asyncio.wait_for(w.where.call(), DEADLINE)).values()
            assert [a.removeprefix("tcp://").rsplit(":", 1)[0] for _, a in found] \
                == [h.addr for h in hosts]
            asked = await asyncio.wait_for(w.slice(hosts=0).ask.call(w.slice(hosts=1), 4),
                                           DEADLINE)
            assert asked.values() == [[(4, found[1][1])]]
            host, port = hosts[0].agent_addr.removeprefix("tcp://").rsplit(":", 1)
            # no client certificate: the agent demands one
            anonymous = ssl.create_default_context(cafile=str(tls.ca))
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, int(port), ssl=anonymous), DEADLINE)
                # TLS 1.3: the refusal arrives with the first read
                await asyncio.wait_for(reader.readexactly(1), DEADLINE)
            # plain text: dropped during TLS
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"\x00" * 64)
            assert await asyncio.wait_for(reader.read(), DEADLINE) == b""
            writer.close()
            await writer.wait_closed()
            assert (await asyncio.wait_for(w.echo.call(5), DEADLINE)).values() == [5, 5]
        async with attach(hosts, secret_file, tls).spawn_procs() as procs:  # still serving
            w = await procs.spawn("w", Where)
            assert (await asyncio.wait_for(w.echo.call(6), DEADLINE)).values() == [6, 6]
    err = capfd.readouterr().err
    assert err.count("refused a connection") >= 2 and "TLS failed" in err


# ------------------------------------------------------------------ torch, output

async def test_setup_torch_distributed_master_addr_is_the_first_hosts_address(
        hosts: list[Host], secret_file: Path) -> None:
    """MASTER_ADDR is rank 0's namespace address (reachable from the other
    host), GLOO_SOCKET_IFNAME each host's interface holding its address, and
    gloo's all_reduce runs across the two hosts."""
    pytest.importorskip("torch")
    # c10d looks up its peers' names (no DNS answers in a namespace) holding
    # the GIL: generous heartbeats, so that stall is not taken for a hang
    async with attach(hosts, secret_file).spawn_procs(heartbeat_timeout=DEADLINE) as procs:
        await meshio.setup_torch_distributed(procs)
        w = await procs.spawn("w", Where)
        envs = (await w.env.call(["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                  "GLOO_SOCKET_IFNAME"])).values()
        assert [e["RANK"] for e in envs] == ["0", "1"]
        assert {e["WORLD_SIZE"] for e in envs} == {"2"}
        assert {e["MASTER_ADDR"] for e in envs} == {hosts[0].addr}
        assert len({e["MASTER_PORT"] for e in envs}) == 1
        # gloo's interface: each namespace's own veth end (mp<tag><i>), set
        # by setup_torch_distributed; all_reduce relies on it
        assert all(e["GLOO_SOCKET_IFNAME"].startswith("mp") for e in envs)
        assert len({e["GLOO_SOCKET_IFNAME"] for e in envs}) == 2
        assert (await asyncio.wait_for(w.all_reduce.call(1.5), DEADLINE)).values() == [3.0, 3.0]


async def test_remote_print_reaches_the_controller(
        hosts: list[Host], secret_file: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A worker's print on another host comes out of the controller's
    stdout, prefixed with the worker's label (through its agent)."""
    loop = asyncio.get_running_loop()
    arrived = asyncio.Event()
    marker = f"hello from a namespace {secrets.token_hex(4)}"
    forward = _launcher.Forward.data_received

    def watched(self: _launcher.Forward, data: bytes) -> None:
        forward(self, data)
        if marker.encode() in data:
            loop.call_soon(arrived.set)

    monkeypatch.setattr(_launcher.Forward, "data_received", watched)
    async with attach(hosts[1:], secret_file).spawn_procs() as procs:
        w = await procs.spawn("w", Where)
        await w.say.call_one(marker)
        await asyncio.wait_for(arrived.wait(), DEADLINE)
    sys.stdout.flush()  # (the forwarded lines that arrived, written)
    out = capsys.readouterr().out
    assert f"[procs hosts=0 procs=0] {marker}\n" in out, out
