"""issue 10: many hosts, simulated on this machine: host agents as separate
processes on loopback (ProcessJob), reached over authenticated TCP (and
TLS); jobs cached in .meshio/ and re-attached."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme

import meshio
import meshio._proc_state
import meshio._transport._sockets as sockets_module
from gone import wait_gone
from hop_actors import Hop
from layout_actors import Layout
from meshio import (
    AuthenticationError,
    MeshioError,
    ProcessStartError,
    SupervisionError,
    context,
    endpoint,
)
from meshio._transport._sockets import MAX_HANDSHAKING
from meshio.jobs import JobCacheError, ProcessJob, TLSConfig
from meshio.testing import job_record
from raw_peer import refused_by

DEADLINE = 60.0


class Where(Hop):
    @endpoint
    async def where(self) -> tuple[int, str, str]:
        ctx = context()
        return os.getpid(), ctx.proc.addr, os.environ.get("MESHIO_WORKER", "")


@pytest.fixture
async def job(tmp_path: Path) -> AsyncIterator[ProcessJob]:
    """Two host meshes of agents on loopback, killed after the test."""
    j = ProcessJob(meshes={"trainers": 2, "generators": 1}, cache_dir=tmp_path / ".meshio")
    try:
        yield j
    finally:
        await j.kill()


def agent_pids(j: ProcessJob) -> list[int]:
    entry = job_record(j)
    assert entry is not None
    return [a["pid"] for agents in entry["hosts"].values() for a in agents]


async def test_process_job_spawns_on_each_host_and_calls_across_hosts(job: ProcessJob) -> None:
    """state() gives one host mesh per name; spawn_procs adds dims on every
    host; calls reach every process; an actor calls a mesh on another host
    directly; kill() ends the agents and their workers."""
    state = await job.state()
    assert sorted(state) == ["generators", "trainers"]
    assert state.trainers.sizes == {"hosts": 2} and state.generators.sizes == {"hosts": 1}
    async with state.trainers.spawn_procs(per_host={"gpus": 2}) as trainers_procs, \
            state.generators.spawn_procs(per_host={"gpus": 1}) as gen_procs:
        assert trainers_procs.sizes == {"hosts": 2, "gpus": 2}
        trainers = await trainers_procs.spawn("trainers", Where)
        generators = await gen_procs.spawn("generators", Where)
        found = (await asyncio.wait_for(trainers.where.call(), DEADLINE)).values()
        addrs = [addr for _, addr, _ in found]
        assert all(a.startswith("tcp://127.0.0.1:") for a in addrs) and len(set(addrs)) == 4
        assert len({pid for pid, _, _ in found}) == 4
        assert (await asyncio.wait_for(trainers.ask.call(generators, 7), DEADLINE)).values() \
            == [[7]] * 4
    pids = agent_pids(job)
    await job.kill()
    await wait_gone(pids)


async def test_workers_with_a_tcp_port_keep_a_random_layout(job: ProcessJob) -> None:
    """issue 16: workers on this host share one address layout
    (tests/test_worker_layout.py); those a host agent starts listen on TCP,
    so each keeps a random one."""
    state = await job.state()
    async with state.trainers.spawn_procs(per_host={"gpus": 2}) as procs:
        found = (await asyncio.wait_for(
            (await procs.spawn("layout", Layout)).layout.call(), DEADLINE)).values()
    assert len({at for _, at in found}) == 4, found  # (28 bits of randomness each)


async def test_second_run_reattaches_from_the_cache(job: ProcessJob, tmp_path: Path) -> None:
    """A new ProcessJob of the same name and shape (the script run again)
    uses the cached live agents instead of starting new ones."""
    await job.apply()
    again = ProcessJob(meshes={"trainers": 2, "generators": 1}, cache_dir=tmp_path / ".meshio")
    await again.apply()
    assert agent_pids(again) == agent_pids(job)
    state = await again.state()
    async with state.generators.spawn_procs() as procs:
        w = await procs.spawn("w", Where)
        assert await asyncio.wait_for(w.echo.call_one(3), DEADLINE) == 3


async def test_stale_cache_is_reported_and_replaced(job: ProcessJob, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """An agent of the cached job died: the cache is reported stale and
    new agents start (the old survivors are stopped)."""
    await job.apply()
    old = agent_pids(job)
    os.kill(old[0], signal.SIGKILL)
    await wait_gone(old[:1])
    again = ProcessJob(meshes={"trainers": 2, "generators": 1}, cache_dir=tmp_path / ".meshio")
    with caplog.at_level(logging.WARNING, logger="meshio"):
        await again.apply()
    assert "is stale" in caplog.text
    assert not set(agent_pids(again)) & set(old)
    await wait_gone(old[1:])
    await again.kill()


async def test_foreign_or_unsafe_cache_is_refused(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A cache others may read is refused with JobCacheError; a cache of
    another job shape is reported and not used."""
    cache = tmp_path / ".meshio"
    first = ProcessJob(meshes={"a": 1}, cache_dir=cache)
    await first.apply()
    try:
        (cache / "job.json").chmod(0o644)
        with pytest.raises(JobCacheError, match="readable or writable by others"):
            await ProcessJob(meshes={"a": 1}, cache_dir=cache).apply()
        (cache / "job.json").chmod(0o600)
        other = ProcessJob(meshes={"b": 1}, cache_dir=cache)
        with caplog.at_level(logging.WARNING, logger="meshio"):
            await other.apply()
        assert "starting a new job" in caplog.text
        assert agent_pids(other) != agent_pids(first)
        await other.kill()
    finally:
        await first.kill()


async def test_a_cache_directory_others_may_write_keeps_no_secret(tmp_path: Path) -> None:
    """The job secret is never written where another user could read or swap
    it: a cache directory others may write to (a shared project folder, one
    another user made first) or that another user owns is refused before
    anything starts, and a file already there is never written through (it
    was opened with ``O_TRUNC``, keeping the planter's owner and mode 0666)."""
    cache = tmp_path / ".meshio"
    cache.mkdir(mode=0o700)
    planted = cache / "job.secret"
    planted.write_text("planted")
    planted.chmod(0o666)
    cache.chmod(0o777)
    with pytest.raises(JobCacheError, match=r"job cache directory .* mode 777: the job's "
                       r"secret cannot be kept there") as refused:
        await ProcessJob(meshes={"a": 1}, cache_dir=cache).apply()
    assert str(cache) in str(refused.value)
    assert planted.read_text() == "planted"
    assert sorted(p.name for p in cache.iterdir()) == ["job.secret"]  # nothing started
    if os.getuid() == 0:  # another user's directory, private to them
        cache.chmod(0o700)
        os.chown(cache, 65534, 65534)
        with pytest.raises(JobCacheError, match="belongs to uid 65534"):
            await ProcessJob(meshes={"a": 1}, cache_dir=cache).apply()
        os.chown(cache, 0, 0)
    cache.chmod(0o700)  # ours now: the planted file is replaced, not written through
    job = ProcessJob(meshes={"a": 1}, cache_dir=cache)
    await job.apply()
    try:
        st = planted.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.getuid(), 0o600)
        assert len(planted.read_text()) == 64
    finally:
        await job.kill()


async def test_killed_agent_fails_calls_promptly(job: ProcessJob) -> None:
    """SIGKILL of a host's agent takes its workers down: a call in flight
    there fails with SupervisionError instead of hanging."""
    state = await job.state()
    async with state.generators.spawn_procs() as procs:
        w = await procs.spawn("w", Where)
        stuck = w.hang.call_one()
        os.kill(agent_pids(job)[-1], signal.SIGKILL)
        with pytest.raises(SupervisionError):
            await asyncio.wait_for(stuck, DEADLINE)


async def test_unresponsive_agent_fails_spawn_within_the_start_timeout(
        job: ProcessJob, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host agent that never answers (SIGSTOPped: its connection accepted by
    the kernel, nothing more) fails ``spawn_procs`` with ProcessStartError
    naming its host once the start timeout is over, instead of hanging; the
    worker already started on the other host goes; once the agent runs
    again, it serves."""
    monkeypatch.setattr(meshio._proc_state, "START_TIMEOUT", 3.0)
    state = await job.state()
    stopped = agent_pids(job)[1]  # the second host of "trainers"
    os.kill(stopped, signal.SIGSTOP)
    try:
        with pytest.raises(ProcessStartError) as info:
            await asyncio.wait_for(state.trainers.spawn_procs(), DEADLINE)
        assert info.value.rank == 1 and "did not start it within 3.0s" in str(info.value)
    finally:
        os.kill(stopped, signal.SIGCONT)
    async with state.trainers.spawn_procs() as procs:
        w = await procs.spawn("w", Where)
        assert len(await w.echo.call(1)) == 2


_MANY_TLS = """
import asyncio, sys
from pathlib import Path
import meshio
from meshio._transport._credentials import Credentials
from meshio._transport._handshake import CHALLENGE_SIZE, Handshake
from meshio._transport._runtime import runtime
from meshio.jobs import TLSConfig

async def main(d: Path, n: int) -> None:
    tls = TLSConfig(d / "job.pem", d / "job.pem", d / "job-ca.pem")
    secret = b"s" * 32
    addr = runtime().sockets.listen_tcp("127.0.0.1", 0, advertise="127.0.0.1",
                                job=Credentials(secret, tls))
    host, port = addr.removeprefix("tcp://").rsplit(":", 1)
    ctx = tls.client_context()

    async def one() -> None:
        r, w = await asyncio.open_connection(host, int(port), ssl=ctx,
                                             server_hostname="127.0.0.1")
        hs = Handshake(secret, dialler=True, end=addr)
        w.write(hs.start())
        w.write(hs.feed(await r.readexactly(CHALLENGE_SIZE)))
        await w.drain()
        w.close()
        await w.wait_closed()

    await asyncio.wait_for(asyncio.gather(*[one() for _ in range(n)]), 60)
    print("proven:", n)

meshio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
"""


async def test_tls_listener_on_uvloop_serves_many_connections_at_once(tmp_path: Path) -> None:
    """A TLS listener in a ``meshio.run`` (uvloop) program completes TLS and
    the job handshake for 100 connections opened at once.  (It ran TLS with
    ``start_tls`` after the accept, and uvloop then lost bytes: handshakes
    stalled or were reset.)"""
    _certs(tmp_path)
    (tmp_path / "many.py").write_text(_MANY_TLS)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(tmp_path / "many.py"), str(tmp_path), "100",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), DEADLINE)
    assert proc.returncode == 0 and b"proven: 100" in out, out.decode()[-2000:]


def _certs(tmp_path: Path) -> tuple[TLSConfig, TLSConfig]:
    """A job CA's certificate for 127.0.0.1, and one of a foreign CA."""
    paths = []
    for name in ("job", "foreign"):
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        cert.private_key_and_cert_chain_pem.write_to_path(tmp_path / f"{name}.pem")
        ca.cert_pem.write_to_path(tmp_path / f"{name}-ca.pem")
        paths.append(TLSConfig(tmp_path / f"{name}.pem", tmp_path / f"{name}.pem",
                               tmp_path / f"{name}-ca.pem"))
    return paths[0], paths[1]


async def test_tls_job_calls_and_refuses_plain_text_and_foreign_certs(tmp_path: Path) -> None:
    """Agents and workers started with TLS serve calls over TLS; a plain-text
    peer, or one with a certificate of another CA, is refused before the
    job handshake and the agent keeps serving."""
    tls, foreign = _certs(tmp_path)
    j = ProcessJob(meshes={"hosts": 1}, cache_dir=tmp_path / ".meshio", tls=tls)
    try:
        state = await j.state()
        async with state.hosts.spawn_procs(per_host={"procs": 2}) as procs:
            w = await procs.spawn("w", Where)
            assert (await asyncio.wait_for(w.echo.call(5), DEADLINE)).values() == [5, 5]
        agent = job_record(j)["hosts"]["hosts"][0]["addr"] if job_record(j) else ""
        host, port = agent.removeprefix("tcp://").rsplit(":", 1)
        # plain text: the agent drops it during TLS, before the job handshake
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"\x00" * 64)
        await asyncio.wait_for(reader.read(), DEADLINE)  # returns: the agent closed it
        writer.close()
        # a certificate of another CA
        with pytest.raises(OSError):
            _, w2 = await asyncio.wait_for(asyncio.open_connection(
                host, int(port), ssl=foreign.client_context()), DEADLINE)
            w2.close()
        # still serving
        async with state.hosts.spawn_procs() as procs:
            w = await procs.spawn("w", Where)
            assert await asyncio.wait_for(w.echo.call_one(6), DEADLINE) == 6
        log = (tmp_path / ".meshio" / "job.log").read_text()
        assert log.count("refused a connection") >= 2 and "TLS failed" in log
        assert "from 127.0.0.1 port" in log
    finally:
        await j.kill()


async def test_tls_listener_survives_running_out_of_descriptors(tmp_path: Path) -> None:
    """A TLS listener whose accept fails (the process out of descriptors:
    its limit lowered, then restored) accepts again once it can, as a
    plain-TCP listener does.  Before, its accept loop ended at the first
    EMFILE: the process lived on with its port listening and never
    accepted again, every TLS dial to it timed out ("Task exception was
    never retrieved" its only trace)."""
    import resource

    tls, _ = _certs(tmp_path)
    log = tmp_path / ".meshio" / "job.log"
    j = ProcessJob(meshes={"hosts": 1}, cache_dir=tmp_path / ".meshio", tls=tls)
    try:
        state = await j.state()
        agent = (job_record(j) or {})["hosts"]["hosts"][0]
        host, port = agent["addr"].removeprefix("tcp://").rsplit(":", 1)
        pid = agent["pid"]
        limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE,
                         (len(os.listdir(f"/proc/{pid}/fd")), limits[1]))
        conns = []
        try:
            async def refused() -> None:  # (its warning: there is no other event)
                while "cannot accept connections at" not in log.read_text():
                    conns.append(socket.create_connection((host, int(port))))
                    await asyncio.sleep(0.05)
            await asyncio.wait_for(refused(), DEADLINE)
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
            for c in conns:
                c.close()
        assert "Too many open files; trying again in 1 s" in log.read_text()
        async with state.hosts.spawn_procs() as procs:
            w = await procs.spawn("w", Where)
            assert await asyncio.wait_for(w.echo.call_one(7), DEADLINE) == 7
    finally:
        await j.kill()


def test_agent_cli_help_and_bad_tls_arguments() -> None:
    """``meshio agent --help`` documents its options; half a TLS set is refused."""
    import subprocess

    out = subprocess.run([sys.executable, "-m", "meshio", "agent", "--help"],
                         capture_output=True, text=True, timeout=DEADLINE)
    assert out.returncode == 0 and "--secret-file" in out.stdout and "--tls-ca" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "meshio", "agent", "--listen", "127.0.0.1:0",
                          "--secret-file", "/dev/null", "--tls-cert", "x"],
                         capture_output=True, text=True, timeout=DEADLINE)
    assert bad.returncode == 2 and "go together" in bad.stderr


async def test_wrong_secret_garbage_and_oversized_preauth_are_refused(
        job: ProcessJob, tmp_path: Path) -> None:
    """A peer with another secret fails the job handshake; garbage and a
    far-too-large first message are dropped before anything is decoded;
    each refusal is logged with the peer's address and the agent still
    serves."""
    state = await job.state()
    addr = job_record(job)["hosts"]["generators"][0]["addr"] if job_record(job) else ""
    host, port = addr.removeprefix("tcp://").rsplit(":", 1)
    # (a host mesh shows its hosts: it showed as <meshio.HostMesh object at 0x...>)
    assert repr(state.generators) == f"<HostMesh {{'hosts': 1}} on {host}>"
    # another job's secret: the agent proves itself first and then refuses;
    # the agent logs the dialler that hung up on its proof (it logged nothing)
    log = tmp_path / ".meshio" / "job.log"
    await refused_by(host, int(port))

    async def logged() -> None:  # (the agent's line: there is no other event)
        while "hung up on this process's proof of the job's secret" not in log.read_text():
            await asyncio.sleep(0.05)
    await asyncio.wait_for(logged(), DEADLINE)
    # garbage, and 1 MiB where a challenge belongs
    for junk in (b"GET / HTTP/1.1\r\n\r\n", b"\xff" * (1 << 20)):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(junk)
        try:  # returns at end of stream: the agent dropped it
            await asyncio.wait_for(reader.read(), DEADLINE)
        except ConnectionResetError:
            pass  # dropped with our bytes unread
        writer.close()
    async with state.generators.spawn_procs() as procs:
        w = await procs.spawn("w", Where)
        assert await asyncio.wait_for(w.echo.call_one(2), DEADLINE) == 2
    text = log.read_text()
    assert text.count("refused a connection") >= 3 and "from 127.0.0.1 port" in text


def listening_tcp(pid: int) -> set[str]:
    """The IPv4 ``address:port`` pairs process ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):  # (closed meanwhile)
            if (link := os.readlink(fd)).startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
            ip, port = fields[1].split(":")
            found.add(f"{socket.inet_ntoa(bytes.fromhex(ip)[::-1])}:{int(port, 16)}")
    return found


async def test_a_job_on_this_host_only_listens_on_loopback(job: ProcessJob) -> None:
    """A controller whose job's agents are all on loopback listens for
    their workers on loopback only: it listened on every address
    (``0.0.0.0``), so anyone on the network could reach its handshake."""
    state = await job.state()
    before = listening_tcp(os.getpid())
    async with state.generators.spawn_procs() as procs:
        w = await procs.spawn("w", Where)
        assert await asyncio.wait_for(w.echo.call_one(1), DEADLINE) == 1
        opened = listening_tcp(os.getpid()) - before
    assert opened and all(a.startswith("127.0.0.1:") for a in opened), opened


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_a_flood_of_unproven_connections_leaves_the_agent_serving(
        tmp_path: Path, tls: bool) -> None:
    """Connections that never prove anything (an unauthenticated peer
    opening thousands and sending nothing, not even TLS's first message)
    used to hold a descriptor each for the whole handshake timeout: the
    agent ran out of descriptors and could start no worker, and logged a
    line per connection.  Now at most MAX_HANDSHAKING wait at once (the
    oldest dropped for the newest), a new proc mesh starts while the flood
    holds its connections, and the log gets REFUSALS_LOGGED lines at once,
    then one a second."""
    j = ProcessJob(meshes={"hosts": 1}, cache_dir=tmp_path / ".meshio",
                   tls=_certs(tmp_path)[0] if tls else None)
    try:
        state = await j.state()
        agent = agent_pids(j)[0]
        addr = job_record(j)["hosts"]["hosts"][0]["addr"] if job_record(j) else ""
        host, port = addr.removeprefix("tcp://").rsplit(":", 1)
        base = len(os.listdir(f"/proc/{agent}/fd"))
        extra = 100
        flood = [await asyncio.open_connection(host, int(port))
                 for _ in range(MAX_HANDSHAKING + extra)]
        try:
            for reader, _ in flood[:extra]:  # the oldest were dropped as the newest came
                await asyncio.wait_for(reader.read(), DEADLINE)
            assert len(os.listdir(f"/proc/{agent}/fd")) <= base + MAX_HANDSHAKING + 4
            async with state.hosts.spawn_procs() as procs:  # the flood still holds its 256
                w = await procs.spawn("w", Where)
                assert await asyncio.wait_for(w.echo.call_one(3), DEADLINE) == 3
        finally:
            for _, writer in flood:
                writer.close()
        log = (tmp_path / ".meshio" / "job.log").read_text()
        lines = [x for x in log.splitlines() if "refused a connection" in x]
        assert lines and "dropped unproven: 256 connections were in the handshake" in lines[0]
        assert len(lines) < extra, len(lines)  # not one a connection
    finally:
        await j.kill()


def connect_from(source: str, host: str, port: int) -> socket.socket:
    """A TCP connection to ``host``:``port`` from address ``source``."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect((host, port))
    return sock


def dropped(sock: socket.socket) -> bool:
    """Whether the other end has closed ``sock`` (what it sent read)."""
    try:
        while sock.recv(1 << 16, socket.MSG_DONTWAIT):
            pass
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    return True  # (end of stream)


@pytest.mark.parametrize(("peer", "source"), [
    (("10.0.0.9", 5), "10.0.0.9"),
    (("::ffff:10.0.0.9", 5, 0, 0), "10.0.0.9"),  # (IPv4 as an IPv6 listener sees it)
    (("2001:db8::1", 5, 0, 0), "2001:db8::/64"),
    (("2001:db8::ffff:2", 5, 0, 0), "2001:db8::/64"),  # (one host may hold a whole /64)
    (("fe80::1%eth0", 5, 0, 0), "fe80::/64"),
    ("@meshio-x/controller", "")])  # (a Unix socket's peer)
def test_what_an_unproven_connection_counts_against(peer: object, source: str) -> None:
    assert sockets_module._source(peer) == source


async def test_a_flood_from_one_address_does_not_crowd_out_another(tmp_path: Path) -> None:
    """Unproven connections from one address (127.0.0.2) fill the agent's
    handshake slots, one from another (127.0.0.1, a peer of the job in its
    handshake) comes, then the flood goes on: the oldest was dropped for
    each new one, whoever made it, so under a flood the job's own
    connection never lived through its handshake (every spawn failed).
    The oldest of the address holding the most goes now: a flood from one
    address crowds out only itself."""
    j = ProcessJob(meshes={"hosts": 1}, cache_dir=tmp_path / ".meshio")
    flood: list[socket.socket] = []
    try:
        await j.state()
        addr = job_record(j)["hosts"]["hosts"][0]["addr"] if job_record(j) else ""
        host, port = addr.removeprefix("tcp://").rsplit(":", 1)
        flood += [connect_from("127.0.0.2", host, int(port)) for _ in range(MAX_HANDSHAKING)]
        peer = connect_from("127.0.0.1", host, int(port))
        flood += [connect_from("127.0.0.2", host, int(port)) for _ in range(300)]
        for sock in flood[:301]:  # dropped, oldest first, as the last 300 and the peer came
            sock.settimeout(DEADLINE)
            with contextlib.suppress(ConnectionResetError):
                assert await asyncio.to_thread(sock.recv, 1 << 16) == b""
        assert not dropped(peer)  # (dropped before the last of those, if at all)
        assert not any(dropped(sock) for sock in flood[301:])  # the newest 255 and the peer
        peer.close()
    finally:
        for sock in flood:
            sock.close()
        await j.kill()


# ------------------------------------------------------------ several jobs

def listening_ports() -> set[int]:
    """The TCP ports this process listens on (its sockets in /proc/net/tcp*)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def agent_addrs(j: ProcessJob, mesh: str) -> list[str]:
    entry = job_record(j)
    assert entry is not None
    return [a["addr"] for a in entry["hosts"][mesh]]


async def test_wrong_secret_leaves_nothing_behind_and_the_right_one_attaches(
        job: ProcessJob, caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str]) -> None:
    """issue 15 item 6: attaching with a mistyped secret fails with
    AuthenticationError and leaves nothing behind (no listener for it), so
    the same controller then attaches with the right secret and calls run;
    a wrong secret for agents in use is refused too, and the secret shows
    in no error and no log line."""
    await job.apply()
    addrs = agent_addrs(job, "generators")
    wrong = secrets.token_hex(16)
    before = listening_ports()
    with caplog.at_level(logging.DEBUG, logger="meshio"):
        with pytest.raises(AuthenticationError, match="failed authentication") as info:
            await asyncio.wait_for(meshio.attach(addrs, secret=wrong.encode()).spawn_procs(),
                                   DEADLINE)
        assert listening_ports() == before
        entry = job_record(job)
        assert entry is not None
        hosts = meshio.attach(addrs, secret_file=entry["secret_file"])
        async with hosts.spawn_procs() as procs:
            w = await procs.spawn("w", Where)
            assert await asyncio.wait_for(w.echo.call_one(4), DEADLINE) == 4
            with pytest.raises(AuthenticationError, match="another secret") as again:
                await asyncio.wait_for(
                    meshio.attach(addrs, secret=wrong.encode()).spawn_procs(), DEADLINE)
            assert await asyncio.wait_for(w.echo.call_one(5), DEADLINE) == 5
    right = Path(entry["secret_file"]).read_text().strip()
    shown = [str(info.value), repr(info.value), str(again.value), repr(again.value),
             caplog.text, *capfd.readouterr(), repr(hosts), repr(job), repr(await job.state())]
    assert not [text for text in shown if wrong in text or right in text]


async def test_one_controller_drives_jobs_of_other_secrets_and_tls_at_once(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """issue 15 item 6: one controller drives three jobs at once, each with
    its own secret, one under TLS: calls reach the actors of each, and
    actors call the actors of their own job.  An actor calls the actors of
    its own job only: one of another job refuses its connection, and the
    call fails at once (AuthenticationError for another secret, a refusal
    during TLS for another TLS setting), never hangs."""
    tls, _ = _certs(tmp_path)
    cache = tmp_path / ".meshio"
    jobs = [ProcessJob(meshes={"hosts": 1}, name="plain", cache_dir=cache),
            ProcessJob(meshes={"hosts": 1}, name="other", cache_dir=cache),
            ProcessJob(meshes={"hosts": 1}, name="tls", cache_dir=cache, tls=tls)]
    try:
        states = await asyncio.gather(*(j.state() for j in jobs))
        async with states[0].hosts.spawn_procs() as p0, states[1].hosts.spawn_procs() as p1, \
                states[2].hosts.spawn_procs(per_host={"procs": 2}) as p2:
            plain, other, both = [await p.spawn("w", Where) for p in (p0, p1, p2)]
            secure = both.slice(procs=0)
            found = await asyncio.wait_for(asyncio.gather(
                plain.where.call_one(), other.where.call_one(), secure.where.call_one()),
                DEADLINE)
            assert len({pid for pid, _, _ in found}) == 3
            # within a job, actor to actor
            assert await asyncio.wait_for(secure.ask.call_one(both.slice(procs=1), 3),
                                          DEADLINE) == [3]
            with pytest.raises(MeshioError, match="failed authentication"):
                await asyncio.wait_for(plain.ask.call_one(other, 1), DEADLINE)
            for caller, callee, why in ((plain, secure, "closed during the handshake"),
                                        (secure, plain, "TLS failed")):
                with pytest.raises(MeshioError, match=f"cannot connect.*{why}"):
                    await asyncio.wait_for(caller.ask.call_one(callee, 2), DEADLINE)
            # the refusals harmed nothing
            assert list(await asyncio.wait_for(asyncio.gather(
                plain.echo.call_one(6), other.echo.call_one(7), secure.echo.call_one(8)),
                DEADLINE)) == [6, 7, 8]
    finally:
        for j in jobs:
            await j.kill()
    assert "never retrieved" not in capfd.readouterr().err  # no handshake left behind


def test_secret_is_bytes_and_a_file_is_secret_file(tmp_path: Path) -> None:
    """issue 15 item 7: ``secret=`` takes bytes only: a str (the token
    itself, as a user would paste it) is a TypeError naming
    ``secret_file=``, never read as a file name, and neither the error nor
    a repr shows it; ``secret_file=`` reads the file."""
    token = secrets.token_hex(24)
    for bad in (token, bytearray(token.encode())):
        with pytest.raises(TypeError, match="secret_file=") as info:
            meshio.attach(["127.0.0.1:1"], secret=bad)  # type: ignore[arg-type]
        assert token not in str(info.value) and token not in repr(info.value)
    with pytest.raises(TypeError, match="one of the two"):
        meshio.attach(["127.0.0.1:1"])
    path = tmp_path / "job.secret"
    path.write_text(token + "\n")
    path.chmod(0o600)
    with pytest.raises(TypeError, match="one of the two"):
        meshio.attach(["127.0.0.1:1"], secret=token.encode(), secret_file=path)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        meshio.attach(["127.0.0.1:1"], secret=b"short")
    for hosts in (meshio.attach(["127.0.0.1:1"], secret_file=path),
                  meshio.attach(["127.0.0.1:1"], secret=token.encode())):
        assert token not in repr(hosts) and token not in str(hosts)


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o602], ids=lambda m: f"{m:o}")
def test_attach_refuses_a_secret_file_others_may_use(tmp_path: Path, mode: int) -> None:
    """``attach(secret_file=...)`` refuses a file every user may read or
    write, as ``meshio agent --secret-file`` does, naming the file and its
    mode; before, it read the secret from it.  Mode 600 is taken.  (Run as
    root, a file its group may read passes, as a Kubernetes Secret must.)"""
    token = secrets.token_hex(24)
    path = tmp_path / "job.secret"
    path.write_text(token)
    path.chmod(mode)
    with pytest.raises(ValueError, match=(
            rf"^attach: secret_file {re.escape(repr(str(path)))}: the file is readable or "
            rf"writable by (others|every user) \(mode {mode:o}\).*chmod 600")) as info:
        meshio.attach(["127.0.0.1:1"], secret_file=path)
    assert token not in str(info.value)
    path.chmod(0o600)
    assert len(meshio.attach(["127.0.0.1:1"], secret_file=str(path))) == 1


async def test_tls_without_hostname_checks_reaches_the_agents_workers(tmp_path: Path) -> None:
    """docs/cluster.md's setup for certificates that cannot name the hosts'
    IPs: one certificate (a DNS name only) and
    ``TLSConfig(check_hostname=False)``.  The agents get the setting, and
    so do their workers, which dial the controller by IP.  Before, the
    workers checked names, failed every TLS handshake, and the proc mesh
    never started (ProcessStartError after 60 s)."""
    ca = trustme.CA()
    ca.issue_cert("agents.example").private_key_and_cert_chain_pem.write_to_path(
        tmp_path / "job.pem")
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    tls = TLSConfig(tmp_path / "job.pem", tmp_path / "job.pem", tmp_path / "ca.pem",
                    check_hostname=False)
    j = ProcessJob(meshes={"hosts": 2}, cache_dir=tmp_path / ".meshio", tls=tls)
    try:
        state = await j.state()
        async with state.hosts.spawn_procs() as procs:
            w = await procs.spawn("w", Where)
            assert (await asyncio.wait_for(w.echo.call(4), DEADLINE)).values() == [4, 4]
    finally:
        await j.kill()


async def test_an_agent_that_does_not_start_leaves_no_secret(tmp_path: Path) -> None:
    """An agent that cannot start (a listen address that does not resolve)
    fails apply() and leaves neither the job secret nor a cache: no cache
    names the secret, so no kill() would remove it."""
    cache = tmp_path / ".meshio"
    j = ProcessJob(meshes={"hosts": 1}, host="no-such-host.invalid", cache_dir=cache)
    with pytest.raises(RuntimeError, match="an agent did not start"):
        await j.apply()
    assert sorted(p.name for p in cache.iterdir()) == ["job.lock", "job.log"]  # (a lock is kept)
    assert "cannot resolve 'no-such-host.invalid'" in (cache / "job.log").read_text()
    await j.kill()


_GIVEN_UP = """
import asyncio, os, signal, sys
import meshio
from meshio.jobs import ProcessJob
from meshio.testing import job_record

async def main(cache: str) -> None:
    j = ProcessJob(meshes={"hosts": 1}, cache_dir=cache)
    try:
        state = await j.state()
        agent = job_record(j)["hosts"]["hosts"][0]["pid"]
        os.kill(agent, signal.SIGSTOP)  # (the kernel accepts its connections, nothing more)
        try:
            await asyncio.wait_for(state.hosts.spawn_procs(), 1.0)
        except TimeoutError:
            print("given up", flush=True)
        finally:
            os.kill(agent, signal.SIGCONT)
        async with state.hosts.spawn_procs() as procs:  # it serves again
            print("served", len(procs.pids), flush=True)
    finally:
        await j.kill()

meshio.run(main(sys.argv[1]))
"""


def test_a_spawn_given_up_while_its_agent_is_silent_leaves_nothing_behind(
        tmp_path: Path) -> None:
    """``spawn_procs`` given up (a timeout around it) while the host agent
    does not answer: the agent serves the next one, and the start given up
    leaves no "Future exception was never retrieved" for the controller to
    print (its request, never sent, is dropped; one sent whose worker then
    starts has that worker killed).  Run in a controller of its own, whose
    exit collects every future."""
    out = subprocess.run([sys.executable, "-c", _GIVEN_UP, str(tmp_path / ".meshio")],
                         capture_output=True, text=True, timeout=DEADLINE * 4)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["given up", "served 1"], out.stdout
    assert "never retrieved" not in out.stderr, out.stderr


async def test_agents_on_ipv6_serve(tmp_path: Path) -> None:
    """Agents listening on an IPv6 address (``host="::1"``) serve: the
    controller listens for their workers on IPv6 too (it listened on IPv4
    only while telling them an IPv6 address: every start timed out)."""
    j = ProcessJob(meshes={"hosts": 1}, host="::1", cache_dir=tmp_path / ".meshio")
    try:
        state = await j.state()
        async with state.hosts.spawn_procs(per_host={"procs": 2}) as procs:
            w = await procs.spawn("w", Where)
            assert (await asyncio.wait_for(w.echo.call(7), DEADLINE)).values() == [7, 7]
    finally:
        await j.kill()


def test_the_same_agent_twice_is_refused() -> None:
    """``attach`` makes one host per address: an agent named twice (as
    written, or once without ``tcp://``) would be a two-host mesh on one
    host, and is a ValueError naming it; two names of one host are not
    compared (as the addresses are not resolved)."""
    secret = secrets.token_bytes(32)
    for twice in (["tcp://127.0.0.1:1", "tcp://127.0.0.1:1"], ["127.0.0.1:1", "tcp://127.0.0.1:1"]):
        with pytest.raises(ValueError, match=r"agent tcp://127\.0\.0\.1:1 is given twice "
                                             r"\(addresses 0 and 1\)"):
            meshio.attach([*twice, "127.0.0.1:2"], secret=secret)
    assert len(meshio.attach(["127.0.0.1:1", "localhost:1", "127.0.0.1:2"], secret=secret)) == 3
