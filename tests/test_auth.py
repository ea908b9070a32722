"""Who may talk to a job's processes (issue 7 items 9, 10, 11).

Real sockets against a real mesh: peers without the job secret, with a wrong
one, replaying a recorded handshake, sending garbage or forged frames, or
running as another user are refused before any frame is read, the refusal is
logged, and the mesh keeps serving.  Sockets are abstract (no file), and a
burst of connects to a briefly stopped worker all get through.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import os
import secrets
import signal
import socket
import struct
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
import pytest_asyncio

import meshio
import meshio._transport._runtime
import meshio._transport._sockets
from log_watch import LogWatch
from meshio import Actor, ActorMesh, AuthenticationError, SupervisionError, endpoint
from meshio._transport import _messages as M
from meshio._transport._connection import Pending
from meshio._transport._frames import frame_header
from meshio._transport._handshake import CHALLENGE_SIZE, HELLO_SIZE, MAGIC, Handshake
from meshio._transport._runtime import Runtime, runtime
from meshio._transport._serial import dumps
from meshio._transport._sockets import sockaddr
from meshio.testing import actor_target, forged_mesh, proc_mesh, process_address
from meshio.testing._helpers import open_job_connection, wait_exited

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: generous bound on any single wait: a regression fails instead of hanging
DEADLINE = 30.0


class Target(Actor):
    @endpoint
    async def ping(self, x: int) -> int:
        return x

    @endpoint
    async def relay(self, other: Target, x: int) -> int:
        """Call ``other`` from inside this actor (actor-to-actor)."""
        return sum((await other.ping.call(x)).values())


class Marker(Actor):
    """Proves it ran: its constructor creates ``path``."""

    def __init__(self, path: str) -> None:
        Path(path).touch()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def targets() -> AsyncIterator[ActorMesh[Target]]:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, name="auth") as pm:
        yield cast(ActorMesh[Target], await pm.spawn("targets", Target))


def pids(mesh: ActorMesh[Any]) -> list[int]:
    return proc_mesh(mesh).pids


# ----------------------------------------------------------------- helpers


def frame(msg: M.Message) -> bytes:
    body = M.encode_message(msg)
    return frame_header(len(body), []) + body


def ping_frame(mesh: ActorMesh[Target], req: int, x: int) -> bytes:
    args = msgspec.Raw(msgspec.msgpack.encode({"x": x}))
    return frame(M.Call(req, actor_target(mesh), "ping", args))


async def raw(addr: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_unix_connection(sockaddr(addr)), DEADLINE)


async def expect_dropped(r: asyncio.StreamReader, w: asyncio.StreamWriter,
                         challenge: bool = False) -> None:
    """The peer closes the connection having sent nothing (or, if
    ``challenge``, at most a handshake challenge)."""
    try:
        rest = await asyncio.wait_for(r.read(), DEADLINE)
    except (ConnectionResetError, BrokenPipeError):  # dropped while we still wrote
        rest = b""
    assert rest == b"" or (challenge and len(rest) == CHALLENGE_SIZE), \
        f"a refused peer got {rest!r}"
    w.close()


async def assert_serving(mesh: ActorMesh[Target], x: int) -> None:
    assert (await asyncio.wait_for(mesh.ping.call(x=x), DEADLINE)).values() == [x] * len(mesh)


# ------------------------------------------------------------------- item 11


async def test_frames_without_handshake_are_refused(
        targets: ActorMesh[Target], tmp_path: Path, controller_log: LogWatch) -> None:
    """issue 7 item 11: a same-user process that connects to a worker and
    sends frames without the handshake (a SpawnActor whose constructor would
    create a file, a Call) is dropped before anything is decoded; the
    refusal is logged and the worker keeps serving.  (The same SpawnActor
    sent after the handshake does run: the refusal is what protects.)"""
    marker = tmp_path / "spawned"
    ctor = msgspec.Raw(msgspec.msgpack.encode({"path": str(marker)}))
    spawn = M.SpawnActor(1, "evil/marker", "marker", dumps(Marker), 0, ["procs"], [1],
                         dumps(targets), ctor)
    before = pids(targets)
    for forged in (frame(spawn), ping_frame(targets, 2, 7)):
        r, w = await raw(process_address(targets, 0))
        w.write(forged)
        await expect_dropped(r, w)
    text = await controller_log.wait_for("not a meshio handshake")
    assert f"refused a connection to {process_address(targets, 0)}" in text
    assert f"(uid {os.getuid()})" in text  # the peer is described
    assert not marker.exists()
    await assert_serving(targets, 1)
    assert pids(targets) == before
    r, w = await asyncio.wait_for(open_job_connection(process_address(targets, 0)), DEADLINE)
    w.write(frame(spawn))
    body_len, _ = struct.unpack("<II", await asyncio.wait_for(r.readexactly(8), DEADLINE))
    reply = M.decode_message(await r.readexactly(body_len))
    w.close()
    assert isinstance(reply, M.Reply), reply
    assert marker.exists()


async def test_forged_fault_does_not_kill_a_supervised_worker(
        controller_log: LogWatch) -> None:
    """issue 7 item 11: a forged Hello naming a worker followed by a Fault,
    sent to the controller's socket without the handshake, is refused: the
    supervisor kills nothing and the mesh keeps serving."""
    sup = meshio.Supervisor(heartbeat_interval=60.0)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name="sup",
                                              supervisor=sup) as pm:
        mesh = cast(ActorMesh[Target], await pm.spawn("t", Target))
        before = pm.pids
        fault = M.Fault(M.ErrorInfo("actor", "RuntimeError", "forged", actor="t", rank=0))
        r, w = await raw(runtime().addr)
        w.write(frame(M.Hello(process_address(mesh, 0), before[0], "forged")) + frame(fault))
        await expect_dropped(r, w)
        assert "not a meshio handshake" in await controller_log.wait_for("refused a connection")
        await assert_serving(mesh, 3)
        assert pm.pids == before
        assert sup.failure is None


async def test_wrong_secret_and_replayed_handshake_are_refused(
        targets: ActorMesh[Target], controller_log: LogWatch) -> None:
    """issue 7 item 11: a dialler with a wrong secret, and one replaying the
    bytes of a real handshake recorded earlier, are refused after the
    challenge and their frames never run; both are logged."""
    addr = process_address(targets, 1)
    # a real handshake, recorded: HELLO then PROOF (then one call, answered)
    hs = Handshake(runtime().secret, dialler=True, end=addr)
    r, w = await raw(addr)
    hello = hs.start()
    w.write(hello)
    proof = hs.feed(await asyncio.wait_for(r.readexactly(CHALLENGE_SIZE), DEADLINE))
    w.write(proof + ping_frame(targets, 1, 5))
    body_len, _ = struct.unpack("<II", await asyncio.wait_for(r.readexactly(8), DEADLINE))
    reply = M.decode_message(await r.readexactly(body_len))
    assert isinstance(reply, M.Reply) and reply.req == 1
    w.close()
    # the replay: same HELLO and PROOF on a new connection
    r, w = await raw(addr)
    w.write(hello)
    await asyncio.wait_for(r.readexactly(CHALLENGE_SIZE), DEADLINE)
    w.write(proof + ping_frame(targets, 2, 6))
    await expect_dropped(r, w)
    await controller_log.wait_for("the dialler does not hold this job's secret")
    # a wrong secret: the listener's challenge does not verify with it, and
    # a proof made with it is refused
    wrong = secrets.token_bytes(32)
    r, w = await raw(addr)
    nonce = secrets.token_bytes(32)
    w.write(MAGIC + nonce)
    challenge = await asyncio.wait_for(r.readexactly(CHALLENGE_SIZE), DEADLINE)
    with pytest.raises(AuthenticationError, match="does not hold this job's secret"):
        Handshake(wrong, dialler=True, end=addr).feed(challenge)
    nl = challenge[len(MAGIC):len(MAGIC) + 32]
    forged = hmac.digest(wrong, b"meshio-auth-v2 dialler\x00" + MAGIC + nonce + nl
                         + addr.encode(), "sha256")
    controller_log.messages.clear()  # (a worker's records reach it: issue 19)
    w.write(forged + ping_frame(targets, 3, 7))
    await expect_dropped(r, w)
    await controller_log.wait_for("the dialler does not hold this job's secret")
    await assert_serving(targets, 2)


@pytest.mark.parametrize("junk", [
    pytest.param(b"\x00" * (1 << 20), id="garbage-1MiB"),
    pytest.param(MAGIC + secrets.token_bytes(32) + b"x" * (1 << 20), id="oversized-hello"),
    pytest.param(b"GET / HTTP/1.1\r\n\r\n", id="http"),
])
async def test_garbage_before_the_handshake_is_refused(
        targets: ActorMesh[Target], controller_log: LogWatch, junk: bytes) -> None:
    """issue 7 item 11: garbage, or a hello followed by more than the
    handshake allows, is dropped at once (the pre-auth buffer never grows
    past one read), logged, and the worker keeps serving."""
    r, w = await raw(process_address(targets, 0))
    w.write(junk)
    await expect_dropped(r, w, challenge=True)
    await controller_log.wait_for(f"refused a connection to {process_address(targets, 0)}")
    await assert_serving(targets, 4)


async def test_a_peer_gone_during_the_handshake_is_no_warning(
        controller_log: LogWatch) -> None:
    """A peer that connects and goes away before the handshake ends (a
    worker killed as its start is cancelled, a CLI client past its
    timeout) refused nothing: an INFO record, no warning (a notebook cell
    showed one for an interrupted start)."""
    ended = LogWatch()
    ended.setLevel(logging.INFO)
    logger = logging.getLogger("meshio")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(ended)
    try:
        rt = runtime()
        _, w = await raw(rt.addr)
        w.close()
        line = await ended.wait_for(f"a connection to {rt.addr} from ")
    finally:
        logger.removeHandler(ended)
        logger.setLevel(level)
    assert "ended: connection closed during the handshake" in line
    assert not any("refused a connection" in m for m in controller_log.messages)


async def test_silent_peer_times_out(monkeypatch: pytest.MonkeyPatch,
                                     controller_log: LogWatch) -> None:
    """issue 7 item 11: a peer that connects and sends nothing is dropped
    after the handshake timeout and logged; the listener keeps serving."""
    monkeypatch.setattr(meshio._transport._sockets, "HANDSHAKE_TIMEOUT", 0.2)
    rt = runtime()
    r, w = await raw(rt.addr)
    await expect_dropped(r, w)
    assert "no handshake within 0.2s" in await controller_log.wait_for("refused a connection")
    r, w = await asyncio.wait_for(open_job_connection(rt.addr), DEADLINE)  # still serving
    w.close()


async def test_secret_not_in_worker_cmdline_or_environ(targets: ActorMesh[Target]) -> None:
    """issue 7 item 11: the job secret is handed over out of band: it is in
    no worker's /proc/<pid>/cmdline or environ, in any common encoding."""
    secret = runtime().secret
    forms = [secret, secret.hex().encode(), base64.b64encode(secret),
             base64.urlsafe_b64encode(secret).rstrip(b"=")]
    for pid in pids(targets):
        for what in ("cmdline", "environ"):
            data = Path(f"/proc/{pid}/{what}").read_bytes()
            assert data, what
            assert not any(f in data for f in forms), f"secret in /proc/{pid}/{what}"


async def test_fake_worker_cannot_answer_actor_calls(targets: ActorMesh[Target]) -> None:
    """issue 7 item 11: a fake "worker" without the secret listening at an
    address an actor calls gets only the dialler's HELLO: the dialler
    verifies the listener first, sends no frame, and the call fails with
    AuthenticationError (mutual authentication)."""
    fake_addr = f"@meshio-fake-{secrets.token_hex(4)}/w"
    got: asyncio.Queue[bytes] = asyncio.Queue()
    wrong = secrets.token_bytes(32)

    async def fake(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        hello = await r.readexactly(HELLO_SIZE)
        nonce = secrets.token_bytes(32)
        mac = hmac.digest(wrong, b"meshio-auth-v2 listener\x00" + MAGIC + hello[len(MAGIC):]
                          + nonce + fake_addr.encode(), "sha256")
        w.write(MAGIC + nonce + mac)
        got.put_nowait(hello + await r.read())  # everything until the dialler hangs up
        w.close()

    server = await asyncio.start_unix_server(fake, sockaddr(fake_addr))
    try:
        impostor = forged_mesh(targets, Target, addrs=[fake_addr] * len(targets))
        with pytest.raises(meshio.ActorError) as info:
            await asyncio.wait_for(targets.slice(procs=0).relay.call_one(
                cast(Target, impostor), 1), DEADLINE)
        assert info.value.remote_type.endswith("AuthenticationError"), info.value
        assert f"listener at {fake_addr} does not hold this job's secret" in str(info.value)
        sent = await asyncio.wait_for(got.get(), DEADLINE)
        assert len(sent) == HELLO_SIZE and sent.startswith(MAGIC), sent
        # the controller's own calls check the listener the same way
        with pytest.raises(AuthenticationError, match=fake_addr):
            await asyncio.wait_for(impostor.slice(procs=1).ping.call_one(1), DEADLINE)
    finally:
        server.close()
    await assert_serving(targets, 5)


OTHER_USER = r"""
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1].replace("@", "\0", 1))
try:
    s.sendall(b"MESHIO\x00\x02" + os.urandom(32))
    data = s.recv(1000)
except OSError:  # already dropped
    data = b""
print(repr(data), flush=True)
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a process as another user")
async def test_other_user_is_refused(targets: ActorMesh[Target], controller_log: LogWatch) -> None:
    """issue 7 item 11: a process of another user (uid 65534) that connects
    to a worker's abstract socket is refused on its peer credentials before
    the handshake starts (abstract sockets have no file permissions)."""
    proc = await asyncio.create_subprocess_exec(
        "/usr/bin/python3", "-c", OTHER_USER, process_address(targets, 0), user=65534, group=65534,
        stdout=asyncio.subprocess.PIPE, cwd="/")
    out, _ = await asyncio.wait_for(proc.communicate(), DEADLINE)
    assert out.strip() == b"b''", out  # no challenge: dropped at once
    await controller_log.wait_for("peer runs as uid 65534")
    await assert_serving(targets, 6)


# ------------------------------------------------------------------- item 10


async def test_burst_of_connects_to_a_stopped_worker(targets: ActorMesh[Target]) -> None:
    """issue 7 item 10: 150 connections made while a worker is stopped
    (SIGSTOP: its loop accepts nothing) all queue in its listen backlog and
    are served once it resumes (the old backlog of 128 refused the rest)."""
    addr = process_address(targets, 1)
    pid = pids(targets)[1]
    os.kill(pid, signal.SIGSTOP)
    socks: list[socket.socket] = []
    try:
        for _ in range(150):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            socks.append(s)
            s.connect(sockaddr(addr))  # EAGAIN here if the backlog is full
    finally:
        os.kill(pid, signal.SIGCONT)

    async def call(s: socket.socket, x: int) -> int:
        r, w = await asyncio.open_unix_connection(sock=s)
        hs = Handshake(runtime().secret, dialler=True, end=addr)
        w.write(hs.start())
        w.write(hs.feed(await r.readexactly(CHALLENGE_SIZE)) + ping_frame(targets, 1, x))
        body_len, _ = struct.unpack("<II", await r.readexactly(8))
        reply = M.decode_message(await r.readexactly(body_len))
        w.close()
        assert isinstance(reply, M.Reply)
        return int(msgspec.msgpack.decode(reply.value))

    try:
        got = await asyncio.wait_for(
            asyncio.gather(*(call(s, i) for i, s in enumerate(socks))), DEADLINE)
    finally:
        for s in socks:
            s.close()
    assert got == list(range(150))
    await assert_serving(targets, 7)


async def _call_missing(rt: Runtime, addr: str) -> Any:
    """A call to a missing actor through ``rt``'s dialler (any answer proves
    the connection works)."""
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    conn = rt.connect(addr)
    req = conn.next_req(Pending(fut, lambda raw, bufs: raw, "X.ping", "probe", None))
    conn.send_message(M.Call(req, "nobody/here", "ping", msgspec.Raw(b"\x80")))
    return await asyncio.wait_for(fut, DEADLINE)


async def test_dial_retries_a_full_backlog(monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 7 item 10: a dial that finds the listen backlog full (EAGAIN)
    retries until the listener accepts, instead of failing the call as "the
    process is gone"."""
    rt = runtime()
    monkeypatch.setattr(meshio._transport._sockets, "LISTEN_BACKLOG", 1)
    busy = Runtime(rt.loop, f"{rt.namespace}/busy", secret=rt.secret)
    fillers = []
    try:
        while True:  # fill its backlog before its loop gets to accept anything
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            fillers.append(s)
            try:
                s.connect(sockaddr(busy.addr))
            except BlockingIOError:
                break
        with pytest.raises(meshio.UnknownActorError):
            await _call_missing(rt, busy.addr)
    finally:
        for s in fillers:
            s.close()
        busy.close()


async def test_slow_or_full_connects_say_so(monkeypatch: pytest.MonkeyPatch,
                                            targets: ActorMesh[Target]) -> None:
    """issue 7 item 10: a connect that cannot complete in time says what
    happened: a backlog that stays full, or a stopped process that never
    answers the handshake, is "timed out connecting ... (process busy or
    stopped?)", not "the process is gone"."""
    rt = runtime()
    monkeypatch.setattr(meshio._transport._sockets, "CONNECT_TIMEOUT", 0.3)
    full = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    full_addr = f"@meshio-full-{secrets.token_hex(4)}/w"
    full.bind(sockaddr(full_addr))
    full.listen(0)
    fillers = []
    try:
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            fillers.append(s)
            try:
                s.connect(sockaddr(full_addr))
            except BlockingIOError:
                break
        with pytest.raises(SupervisionError, match="timed out connecting") as info:
            await _call_missing(rt, full_addr)
        assert "listen backlog stayed full" in str(info.value)
        assert info.value.cause == "connect timed out"
    finally:
        for s in fillers:
            s.close()
        full.close()
    # a TCP host that never completes the connect (here: a full accept queue
    # drops the SYN; a partitioned host alike): the reason is said, not ""
    tcp = socket.create_server(("127.0.0.1", 0), backlog=0)
    fillers = []
    try:
        for _ in range(3):  # (the queue holds one; connects in progress beyond it)
            fillers.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            fillers[-1].setblocking(False)
            fillers[-1].connect_ex(tcp.getsockname())
        with pytest.raises(SupervisionError, match="timed out connecting") as info:
            await _call_missing(rt, f"tcp://127.0.0.1:{tcp.getsockname()[1]}")
        assert "no connection within 0.3s (process busy or stopped, or its host " \
               "unreachable?)" in str(info.value), info.value
    finally:
        for s in fillers:
            s.close()
        tcp.close()
    # a stopped worker: the connect is queued, the handshake never answered
    other = Runtime(rt.loop, f"{rt.namespace}/other", secret=rt.secret)
    pid = pids(targets)[0]
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(SupervisionError, match="timed out connecting") as info:
            await _call_missing(other, process_address(targets, 0))
        assert "no handshake within" in str(info.value)
        assert "process is gone" not in str(info.value)
    finally:
        os.kill(pid, signal.SIGCONT)
        other.close()
    await assert_serving(targets, 8)


# -------------------------------------------------------------------- item 9

CONTROLLER = """
import asyncio, os
import meshio
from meshio._transport._runtime import runtime

async def main():
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 2})
    os.write(1, f"READY {runtime().namespace} {' '.join(map(str, procs.pids))}\\n".encode())
    await asyncio.Event().wait()

meshio.run(main())
"""


def _unix_names() -> str:
    return Path("/proc/net/unix").read_text()


def _tmp_meshio() -> set[str]:
    return {p.name for p in Path("/tmp").iterdir() if p.name.startswith("meshio-")}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
async def test_dead_controller_leaves_no_sockets(tmp_path: Path, sig: signal.Signals) -> None:
    """issue 7 item 9: a controller killed by SIGKILL or stopped by SIGTERM
    leaves nothing behind: its workers exit, no socket of its job remains in
    /proc/net/unix, and no meshio file or directory is left in /tmp."""
    before = _tmp_meshio()
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent(CONTROLLER))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), stdout=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL, cwd=tmp_path)
    assert proc.stdout is not None
    pids: list[int] = []
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), DEADLINE)).decode().split()
        assert line[:1] == ["READY"], line
        namespace, pids = line[1], [int(p) for p in line[2:]]
        assert namespace.startswith("@meshio-")
        name = namespace[1:]
        assert _unix_names().count(name) >= 3  # controller + 2 workers listening
        fds = [os.pidfd_open(p) for p in pids]
        proc.send_signal(sig)
        # (SIGTERM: meshio.run stops gracefully and exits with 128 + 15, issue 15 item 11)
        assert await asyncio.wait_for(proc.wait(), DEADLINE) == (
            -sig if sig == signal.SIGKILL else 128 + sig)
        for fd in fds:
            await wait_exited(fd, DEADLINE)
            os.close(fd)
        assert name not in _unix_names()
        assert _tmp_meshio() <= before
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
