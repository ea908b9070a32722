"""A dead worker's address in the hands of another process (issue 15 items
1 and 2).

Real processes: a same-user process without the job secret that binds the
name (or, over TCP, the port) of a worker that died and relays the
handshake of a worker that dials it to the controller's listener; a process
of another user that squats the name before the supervisor's replacement
can bind it.  The relay is refused with ``AuthenticationError`` and nothing
it sends runs; the replacement listens on a fresh name and serves, reached
by the controller and by the other workers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import cast

import msgspec
import pytest
from supervision_helpers import supervised

import meshio
from gone import killed
from hop_actors import Hop
from meshio import Actor, ActorMesh, AuthenticationError, endpoint
from meshio._transport import _messages as M
from meshio._transport._connection import Pending
from meshio._transport._frames import frame_header
from meshio._transport._runtime import Runtime, runtime
from meshio._transport._serial import dumps
from meshio.jobs import ProcessJob
from meshio.testing import process_address
from meshio.testing._helpers import open_job_connection

#: generous bound on any single wait: a regression fails instead of hanging
DEADLINE = 30.0


class Spawner(Actor):
    """Runs a proc mesh of its own (nested), whose actor calls ``target``."""

    def __init__(self, target: Hop) -> None:
        self.target = target

    @endpoint
    async def start(self) -> None:
        procs = await meshio.this_host().spawn_procs(per_host={"procs": 1}, name="nested")
        self.inner = await procs.spawn("inner", Hop)

    @endpoint
    async def call_through(self, x: int) -> list[int]:
        """``target`` called from the nested process."""
        return await self.inner.ask.call_one(self.target, x)


class Marker(Actor):
    """Proves it ran: its constructor creates ``path``."""

    def __init__(self, path: str) -> None:
        Path(path).touch()


#: binds the address of a dead worker (argv[1]), relays the first
#: connection to it to the controller (argv[2]), and once it has passed the
#: controller's challenge on, sends the dialler frames of its own (argv[3],
#: hex): what it would run there if the dialler took the challenge
RELAY = r"""
import socket, sys, threading

def where(addr):
    if addr.startswith("tcp://"):
        host, port = addr[len("tcp://"):].rsplit(":", 1)
        return socket.AF_INET, (host, int(port))
    return socket.AF_UNIX, "\0" + addr[1:]

family, name = where(sys.argv[1])
server = socket.socket(family, socket.SOCK_STREAM)
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(name)
server.listen(8)
print("READY", flush=True)
dialler, _ = server.accept()
print("DIALLED", flush=True)
family, name = where(sys.argv[2])
listener = socket.socket(family, socket.SOCK_STREAM)
listener.connect(name)
inject = bytes.fromhex(sys.argv[3])

def pump(src, dst, after=None):
    sent = 0
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
            sent += len(data)
            if after is not None and sent >= after:
                dst.sendall(inject)
                after = None
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

up = threading.Thread(target=pump, args=(dialler, listener))
up.start()
pump(listener, dialler, after=72)  # the CHALLENGE is 72 bytes
up.join()
"""


def frame(msg: M.Message) -> bytes:
    body = M.encode_message(msg)
    return frame_header(len(body), []) + body


def forged_frames(mesh: ActorMesh[Hop], marker: Path) -> bytes:
    """What the relay sends the dialler after the challenge: the answer to
    its first call (666), and a SpawnActor whose constructor creates
    ``marker``."""
    ctor = msgspec.Raw(msgspec.msgpack.encode({"path": str(marker)}))
    return (frame(M.Reply(1, msgspec.Raw(msgspec.msgpack.encode(666))))
            + frame(M.SpawnActor(1, "evil/marker", "marker", dumps(Marker), 0, ["procs"],
                                 [1], dumps(mesh), ctor)))


@asynccontextmanager
async def process(*argv: str, user: int | None = None
                  ) -> AsyncIterator[asyncio.subprocess.Process]:
    """A process started from ``argv`` (as uid ``user``), killed after."""
    proc = await asyncio.create_subprocess_exec(
        *argv, user=user, group=user, stdout=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.PIPE, cwd="/")
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    return (await asyncio.wait_for(proc.stdout.readline(), DEADLINE)).decode().strip()


async def relay_is_refused(mesh: ActorMesh[Hop], pids: list[int], controller: str,
                           tmp_path: Path, user: int | None = None) -> None:
    """Rank 0 dies; the relay takes its address; rank 1 calls rank 0 and
    dials the relay, which passes its handshake to ``controller``."""
    marker = tmp_path / "spawned"
    dead = process_address(mesh, 0)
    await killed(pids[0], DEADLINE)
    async with process(sys.executable if user is None else "/usr/bin/python3", "-c", RELAY,
                       dead, controller, forged_frames(mesh, marker).hex(), user=user) as relay:
        assert await line(relay) == "READY"
        with pytest.raises(meshio.ActorError) as info:
            got = await asyncio.wait_for(
                mesh.slice(procs=1).ask.call_one(cast(Hop, mesh.slice(procs=0)), 5),
                DEADLINE)
            pytest.fail(f"the relayed connection was taken: rank 1 got {got} from it "
                        f"(spawned: {marker.exists()})")
        assert await line(relay) == "DIALLED"
    assert info.value.remote_type.endswith("AuthenticationError"), info.value
    assert f"the listener at {dead} does not hold this job's secret, or relays the handshake " \
        "of another address" in str(info.value)
    assert not marker.exists()
    assert await asyncio.wait_for(mesh.slice(procs=1).echo.call_one(7), DEADLINE) == 7


async def test_relayed_handshake_over_unix_is_refused(tmp_path: Path) -> None:
    """issue 15 item 1: a same-user process without the secret binds the
    abstract name of a worker that died, and relays the handshake of a
    worker that dials it to the controller: the dialler refuses the
    controller's proof (it is for the controller's name, not the one
    dialled) with AuthenticationError, and neither the forged answer nor
    the forged SpawnActor the relay sends after it is read."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, name="relayed") as pm:
        mesh = cast(ActorMesh[Hop], await pm.spawn("targets", Hop))
        await relay_is_refused(mesh, pm.pids, runtime().addr, tmp_path)


async def test_relayed_handshake_over_tcp_is_refused(tmp_path: Path) -> None:
    """issue 15 item 1: the same relay over TCP without TLS, by another user
    where the tests run as root: a worker's port, freed by its death, is
    bound by the relay, which passes a dialling worker's handshake to the
    controller's TCP listener; refused the same way."""
    job = ProcessJob(meshes={"hosts": 1}, cache_dir=tmp_path / ".meshio")
    try:
        state = await job.state()
        async with state.hosts.spawn_procs(per_host={"procs": 2}) as pm:
            mesh = cast(ActorMesh[Hop], await pm.spawn("targets", Hop))
            assert all(process_address(mesh, i).startswith("tcp://127.0.0.1:")
                       for i in range(len(mesh)))
            # the controller's one TCP listener, for this job's processes
            [controller] = runtime().sockets.tcp_addrs
            await relay_is_refused(mesh, pm.pids, controller, tmp_path,
                                   user=65534 if os.getuid() == 0 else None)
    finally:
        await job.kill()


async def test_dialler_checks_the_pid_it_knows(tmp_path: Path) -> None:
    """issue 15 item 1: where a runtime knows the pid of the process
    listening at a Unix address (the controller, of its own workers), a
    dial that finds another process there is refused with
    AuthenticationError before the handshake."""
    rt = runtime()
    other = Runtime(rt.loop, f"{rt.namespace}/pid-{secrets.token_hex(4)}", secret=rt.secret)
    try:
        rt.pids[other.addr] = os.getppid()
        conn = rt.connect(other.addr)
        fut: asyncio.Future[object] = rt.loop.create_future()
        req = conn.next_req(Pending(fut, lambda raw, bufs: raw, "X.ping", "probe", None))
        conn.send_message(M.Call(req, "nobody/here", "ping", msgspec.Raw(b"\x80")))
        with pytest.raises(AuthenticationError, match=f"is pid {os.getpid()}, not pid "
                                                      f"{os.getppid()}"):
            await asyncio.wait_for(fut, DEADLINE)
    finally:
        rt.pids.pop(other.addr, None)
        other.close()


async def test_hello_claiming_another_pid_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    """issue 15 item 1: on a Unix socket the kernel says which process
    dialled (SO_PEERCRED); a Hello that claims another pid, as one relayed
    from another process would, is refused and its connection dropped."""
    rt = runtime()
    claimed = f"{rt.namespace}/claimed-{secrets.token_hex(4)}"
    with caplog.at_level(logging.WARNING, logger="meshio"):
        r, w = await asyncio.wait_for(open_job_connection(rt.addr), DEADLINE)
        w.write(frame(M.Hello(claimed, os.getppid(), "claimed")))
        assert await asyncio.wait_for(r.read(), DEADLINE) == b""
        w.close()
    assert f"from pid {os.getpid()}: its Hello claims pid {os.getppid()}" in caplog.text
    assert claimed not in rt.conns


SQUATTER = r"""
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
print("TRYING", flush=True)
while True:  # until the worker that holds it dies
    try:
        s.bind("\0" + sys.argv[1][1:])
        break
    except OSError:
        time.sleep(0.001)
s.listen(8)
print("BOUND", flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a process as another user")
async def test_squatted_name_does_not_stop_a_restart() -> None:
    """issue 15 item 2: a process of another user (uid 65534) binds the
    abstract name of a supervised worker the moment it dies (names have no
    permissions); the replacement listens on a fresh name, so it starts, and
    both the controller and another worker reach it there (the squatter,
    of another uid, would be refused)."""
    async with supervised() as s:
        mesh = cast(ActorMesh[Hop], await s.procs.spawn("t", Hop))
        addr = process_address(mesh, 0)
        async with process("/usr/bin/python3", "-c", SQUATTER, addr, user=65534) as squatter:
            assert await line(squatter) == "TRYING"
            os.kill(s.old[0], signal.SIGKILL)
            assert await line(squatter) == "BOUND"
            _, restart = await s.restarted(0)
            assert runtime().routes[addr] != addr  # the replacement listens elsewhere
            assert await asyncio.wait_for(mesh.slice(procs=0).echo.call_one(3), DEADLINE) == 3
            assert await asyncio.wait_for(
                mesh.slice(procs=1).ask.call_one(cast(Hop, mesh.slice(procs=0)), 4),
                DEADLINE) == [4]
            assert squatter.returncode is None  # it held the old name all along
            assert s.procs.pids[0] == restart.pid


async def test_nested_workers_reach_a_replacement() -> None:
    """issue 15 item 2: a process of a proc mesh started by an actor (whose
    controller is that actor's process) reaches a replaced worker of the
    top controller at its new name: the actor's process passes the move on."""
    async with supervised() as s, \
            meshio.this_host().spawn_procs(per_host={"procs": 1}, name="spawner") as helper:
        mesh = cast(ActorMesh[Hop], await s.procs.spawn("t", Hop))
        spawner = await helper.spawn("spawner", Spawner, cast(Hop, mesh.slice(procs=0)))
        await asyncio.wait_for(spawner.start.call_one(), DEADLINE)
        assert await asyncio.wait_for(spawner.call_through.call_one(1), DEADLINE) == [1]
        os.kill(s.old[0], signal.SIGKILL)
        await s.restarted(0)
        assert await asyncio.wait_for(spawner.call_through.call_one(2), DEADLINE) == [2]
