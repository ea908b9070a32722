"""issue 10, fan-out trees: a call to a mesh spanning many hosts sends one
message per range of hosts (a tree of hosts beyond ``fanout_width``); the
answers come back up it.  Hosts are agents on loopback (ProcessJob): real
processes and TCP connections."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from meshio import (
    Actor,
    ActorError,
    Channel,
    Port,
    ProtocolError,
    SupervisionError,
    ValueMesh,
    context,
    endpoint,
)
from meshio._transport._connection import Connection, Pending
from meshio._transport._messages import Answers, Call, Fanout, Reply, decode_message
from meshio._transport._runtime import runtime
from meshio.jobs import ProcessJob

HOSTS = 5
PER_HOST = 2


class Node(Actor):
    def __init__(self) -> None:
        self.log: list[int] = []
        self.started = asyncio.Event()
        self.released = asyncio.Event()

    @endpoint
    async def point(self, x: int) -> tuple[int, int, int]:
        ctx = context()
        return ctx.point.rank, os.getpid(), x

    @endpoint
    async def record(self, n: int) -> None:
        self.log.append(n)

    @endpoint
    async def recorded(self) -> list[int]:
        return self.log

    @endpoint
    async def fail_on(self, rank: int) -> int:
        if context().point.rank == rank:
            raise ValueError(f"rank {rank} fails")
        return context().point.rank

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def send_to(self, port: Port[int], x: int) -> None:
        port.send(x)

    @endpoint
    async def addr(self) -> str:
        return context().proc.addr

    @endpoint
    async def measure(self, text: str, blob: Any) -> tuple[int, int, str, int]:
        return context().point.rank, len(text), type(blob).__name__, len(blob)

    @endpoint
    async def hang(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.log.append(-1)  # cancelled: the tree passed the caller's Cancel down

    @endpoint
    async def hold(self) -> int:
        self.started.set()
        await self.released.wait()
        return context().point.rank

    @endpoint(concurrent=True)
    async def release(self) -> None:
        self.released.set()

    @endpoint(concurrent=True)
    async def wait_started(self) -> None:
        await self.started.wait()

    @endpoint
    async def rendezvous(self, path: str) -> bool:
        """Holds this process's loop, as an endpoint computing without an
        ``await`` does, until the test's server at ``path`` says that
        every actor of the call is in here too (or 60 s passed)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(60)
            s.connect(path)
            s.sendall(b"in")
            return s.recv(2) == b"go"


@pytest.fixture
async def nodes(tmp_path: Path, width: int) -> AsyncIterator[tuple[ProcessJob, Any, Node]]:
    job = ProcessJob(meshes={"hosts": HOSTS}, cache_dir=tmp_path / ".meshio")
    try:
        state = await job.state()
        async with state.hosts.spawn_procs(per_host={"procs": PER_HOST}) as procs:
            mesh = await procs.spawn("nodes", Node)
            yield job, procs, mesh
    finally:
        await job.kill()


class Sent:
    """The messages this process sends, by kind (a spy on the real connections)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kinds: list[str] = []
        send = Connection.send

        def spy(conn: Connection, body: bytes, out: list[Any]) -> None:
            self.kinds.append(type(decode_message(body)).__name__)
            send(conn, body, out)

        monkeypatch.setattr(Connection, "send", spy)

    def count(self, kind: type[Any]) -> int:
        return self.kinds.count(kind.__name__)


class Received:
    """The answers this process receives (a spy on the real connections):
    ``Reply`` messages, and the size of each ``Answers`` batch."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.replies = 0
        self.batches: list[int] = []
        deliver = Connection.deliver

        def spy(conn: Connection, body: bytes, bufs: list[Any]) -> None:
            msg = decode_message(body)
            if isinstance(msg, Reply):
                self.replies += 1
            elif isinstance(msg, Answers):
                self.batches.append(len(msg.replies) + len(msg.fails))
            deliver(conn, body, bufs)

        monkeypatch.setattr(Connection, "deliver", spy)


async def test_call_sends_one_message_per_range_and_gathers_every_point(
        nodes: tuple[ProcessJob, Any, Node], monkeypatch: pytest.MonkeyPatch) -> None:
    """call() to 10 actors on 5 hosts: the controller sends 2 Fanout messages
    (width 2) and no Call; every actor answers, in point order, each from its
    own process."""
    _, procs, mesh = nodes
    await mesh.point.call(0)  # connections up
    sent, received = Sent(monkeypatch), Received(monkeypatch)
    result = await mesh.point.call(7)
    assert sent.count(Fanout) == 2 and sent.count(Call) == 0
    # every answer comes back once, batched: the other 8 in Answers batches;
    # each top relay's own actor answers alone, as a Reply, unless the relay
    # had already sent something up in that turn of its loop (the last
    # answers of the call before, when the controller's next call reached it
    # before the turn ended): then it goes in an Answers batch of its own
    assert received.replies <= 2
    assert received.replies + sum(received.batches) == HOSTS * PER_HOST
    assert [r for r, _, _ in result.values()] == list(range(HOSTS * PER_HOST))
    assert [pid for _, pid, _ in result.values()] == procs.pids
    assert {x for _, _, x in result.values()} == {7}


async def test_a_relay_forwards_before_its_own_actor_runs(
        nodes: tuple[ProcessJob, Any, Node], tmp_path: Path) -> None:
    """An endpoint that holds its process's loop (computes without an
    ``await``) runs on every actor of a tree call at once: each relay sends
    the calls of its host's other processes and of the hosts below before
    its own actor, which a call finding it idle runs at once, takes its
    loop.  Here every actor waits until all 10 are in: a relay whose own
    actor went first would keep its part of the tree from ever arriving."""
    _, _, mesh = nodes
    await mesh.point.call(0)  # connections up
    path = str(tmp_path / "rendezvous")
    waiting: list[asyncio.StreamWriter] = []
    everyone = asyncio.Event()

    async def arrived(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(2)
        waiting.append(writer)
        if everyone.is_set():
            writer.write(b"go")  # (late: the test failed already; let it finish)
        elif len(waiting) == HOSTS * PER_HOST:
            everyone.set()

    async with await asyncio.start_unix_server(arrived, path):
        call = asyncio.ensure_future(mesh.rendezvous.call(path))
        try:
            await asyncio.wait_for(everyone.wait(), 30)
        except TimeoutError:
            pytest.fail(f"only {len(waiting)} of {HOSTS * PER_HOST} actors started: a relay "
                        "ran its own actor before sending the rest of the tree its calls")
        finally:
            everyone.set()
            for writer in waiting:
                writer.write(b"go")
            result = await call
            for writer in waiting:
                writer.close()
    assert all(result.values())


async def test_stream_yields_every_point_and_broadcast_reaches_every_actor(
        nodes: tuple[ProcessJob, Any, Node], monkeypatch: pytest.MonkeyPatch) -> None:
    """stream() still yields each point once; broadcast() goes through the
    tree too (2 messages) and reaches every actor."""
    _, _, mesh = nodes
    got = sorted([point.rank async for point, _ in mesh.point.stream(1)])
    assert got == list(range(HOSTS * PER_HOST))
    sent = Sent(monkeypatch)
    mesh.record.broadcast(5)
    logs = await mesh.recorded.call()  # a tree call after it: in order behind it
    assert sent.count(Fanout) == 4 and sent.count(Call) == 0  # 2 each
    assert all(log == [5] for log in logs.values())


async def test_large_values_travel_down_the_tree(
        nodes: tuple[ProcessJob, Any, Node], monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 15 item 5: out-of-band values of a tree call (ASCII text, which
    a relay receives as a str and sends on as text, other text, bytes, an
    untyped str) reach every actor whole."""
    _, _, mesh = nodes
    mib = 1 << 20
    sent = Sent(monkeypatch)
    for text, blob in (("a" * mib, b"b" * mib), ("é" * mib, "c" * mib)):
        result = await mesh.measure.call(text, blob)
        assert result.values() == [(rank, mib, type(blob).__name__, mib)
                                   for rank in range(HOSTS * PER_HOST)]
    assert sent.count(Fanout) == 4 and sent.count(Call) == 0


async def test_a_view_of_some_hosts_and_one_host_views(nodes: tuple[ProcessJob, Any, Node],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A slice spanning hosts 1 and 3 uses the tree; a slice on one host
    sends a Call per actor directly."""
    _, _, mesh = nodes
    sent = Sent(monkeypatch)
    some = mesh.slice(hosts=slice(1, 4, 2))
    result = await some.point.call(0)
    assert [r for r, _, _ in result.values()] == [2, 3, 6, 7]
    assert sent.count(Call) == 0
    one = mesh.slice(hosts=4)
    assert [r for r, _, _ in (await one.point.call(0)).values()] == [8, 9]
    assert sent.count(Call) == 2


async def test_direct_calls_keep_their_order_behind_tree_calls(
        nodes: tuple[ProcessJob, Any, Node]) -> None:
    """Broadcasts through the tree and call_one straight to an actor,
    interleaved: every actor sees them in the order they were sent."""
    _, _, mesh = nodes
    last = mesh.slice(hosts=HOSTS - 1, procs=PER_HOST - 1)  # deepest in the tree
    expected: list[int] = []
    for n in range(100):
        mesh.record.broadcast(2 * n)
        expected.append(2 * n)
        if n % 3 == 0:
            await last.record.call_one(2 * n + 1)
            expected.append(2 * n + 1)
        else:
            last.record.broadcast(2 * n + 1)
            expected.append(2 * n + 1)
    got = await last.recorded.call_one()
    assert got == expected, str(got)
    logs = await mesh.recorded.call()
    assert logs.values()[0] == [2 * n for n in range(100)]


async def test_errors_come_back_up_the_tree_with_their_rank(
        nodes: tuple[ProcessJob, Any, Node]) -> None:
    """An endpoint raising on one rank deep in the tree fails the call with
    an ActorError naming that rank; the other ranks answer."""
    _, _, mesh = nodes
    with pytest.raises(ActorError, match="rank 9 fails") as info:
        await mesh.fail_on.call(9)
    assert info.value.rank == 9
    ok = [r async for r in _ranks(mesh.fail_on.stream(-1))]
    assert ok == list(range(HOSTS * PER_HOST))


async def _ranks(stream: AsyncIterator[tuple[Any, int]]) -> AsyncIterator[int]:
    got = sorted([r async for _, r in stream])
    for r in got:
        yield r


async def test_cancel_follows_the_tree_down(nodes: tuple[ProcessJob, Any, Node]) -> None:
    """Cancelling a call through the tree cancels the running endpoints on
    every host (their finally blocks run)."""
    _, _, mesh = nodes
    call = mesh.hang.call()
    await mesh.wait_started.call()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    deadline = asyncio.get_running_loop().time() + 30
    while True:  # the Cancel travels down the tree after the caller gave up
        logs = await mesh.recorded.call()
        if all(log == [-1] for log in logs.values()):
            break
        assert asyncio.get_running_loop().time() < deadline, logs
        await asyncio.sleep(0.05)


async def test_a_killed_relay_fails_its_part_of_the_call_and_the_rest_answer(
        nodes: tuple[ProcessJob, Any, Node]) -> None:
    """SIGKILL the relay of hosts 3-4 (the first process of host 3) while a
    call hangs on every actor: the calls it carried fail at once with
    SupervisionError (none hangs); the next call goes round the dead
    process (host 4 is reached through host 3's other process) and only
    the dead rank fails."""
    _, procs, mesh = nodes
    stream = mesh.hang.stream()
    first = asyncio.ensure_future(anext(stream))
    await mesh.wait_started.call()
    os.kill(procs.pids[3 * PER_HOST], signal.SIGKILL)
    with pytest.raises(SupervisionError):
        await asyncio.wait_for(first, 60)
    await stream.aclose()  # cancels the calls still hanging on hosts 0-2
    values = await mesh.point.call(0)  # nothing restarts it: a hole
    assert [p.rank for p in values.holes] == [3 * PER_HOST]
    with pytest.raises(SupervisionError) as info:
        values.item(**dict(values.holes[0]))
    assert info.value.rank == 3 * PER_HOST
    result = await mesh.slice(hosts=slice(3, 5), procs=1).point.call(0)
    assert [r for r, _, _ in result.values()] == [7, 9]


@pytest.mark.parametrize("relay", [3 * PER_HOST, 4 * PER_HOST], ids=["hosts-3-4", "host-4"])
async def test_the_calls_a_killed_relay_carried_name_it_as_their_relay(
        nodes: tuple[ProcessJob, Any, Node], relay: int) -> None:
    """SIGKILL a relay while a call waits on every actor: the relay of
    hosts 3-4 (the controller sends it ranks 6-9), or that of host 4 (the
    relay of hosts 3-4 sends it ranks 8-9).  The relay's own rank is a
    hole (nothing restarts it); each actor whose call it carried fails
    with its own rank, not with the relay's pid as its own nor as if its
    process had been killed: the error names the relay and says the
    actor's own process was not seen to fail.  The other actors answer."""
    _, procs, mesh = nodes
    addr = await mesh.slice(hosts=relay // PER_HOST, procs=0).addr.call_one()
    call = asyncio.ensure_future(mesh.hold.call())
    await mesh.wait_started.call()
    pid = procs.pids[relay]
    os.kill(pid, signal.SIGKILL)
    assert (await asyncio.wait_for(procs.wait_failed(), 60)).rank == relay
    released = await mesh.release.call()  # (the tree goes round the dead relay)
    assert [p.rank for p in released.holes] == [relay]
    with pytest.raises(SupervisionError) as info:
        await asyncio.wait_for(call, 60)
    error = info.value
    failed = {p.rank: e for p, e in error.failures} if error.failures else {error.rank: error}
    assert sorted(failed) == list(range(relay + 1, HOSTS * PER_HOST))
    for rank, e in failed.items():
        assert isinstance(e, SupervisionError)
        assert e.rank == rank and e.pid != pid
        assert "was lost with the fan-out relay that carried it" in str(e)
        assert "own process" in str(e) and "was not seen to fail" in str(e)
        if relay == 3 * PER_HOST:
            assert f"(process {pid} on " in str(e) and e.cause == "lost with its fan-out relay"
        else:  # (its relay, not the controller, lost it: it knows its address, not its pid)
            assert f"(the process at {addr}: " in str(e)
    result = await mesh.point.call(0)
    assert [r for r, _, _ in result.values()] == [r for r in range(HOSTS * PER_HOST)
                                                  if r != relay]


async def test_a_malformed_tree_message_fails_its_calls_and_the_relay_serves_on(
        nodes: tuple[ProcessJob, Any, Node], caplog: pytest.LogCaptureFixture) -> None:
    """A tree message whose parts do not fit together (only a faulty or
    hostile peer of the job sends one): each call it carries fails with a
    ProtocolError saying what is wrong, a broadcast one is reported back,
    and the process serves on (none of it hangs)."""
    _, _, mesh = nodes
    first = mesh.slice(hosts=0, procs=0)
    addr = await first.addr.call_one()
    rt = runtime()
    conn = rt.conns.get(addr) or rt.connect(addr)
    loop = asyncio.get_running_loop()
    two = [(0, [(addr, 1)]), (1, [(addr, 1)])]
    faults: dict[str, dict[str, Any]] = {
        "fan-out width 0": {"width": 0},
        "no relay for any of its hosts": {"relays": ["", ""]},
        r"hosts \[0, 5\] outside its range 0..1": {"groups": [two[0], (5, [(addr, 1)])]},
        r"hosts \[1, 0\] not in increasing order": {"groups": two[::-1]},
    }
    for why, fault in faults.items():
        futs: list[asyncio.Future[Any]] = [loop.create_future() for _ in range(2)]
        req = conn.next_reqs([Pending(f, lambda raw, bufs: raw, "Node.point", "probe", i)
                              for i, f in enumerate(futs)])
        conn.send_message(Fanout(**({
            "target": "nodes", "method": "point", "args": msgspec.Raw(b"\x80"), "chain": (),
            "origin": "", "first_req": req, "lo": 0, "relays": [addr, addr], "groups": two,
            "width": 2, "gather": True} | fault)))
        for f in futs:
            with pytest.raises(ProtocolError, match=f"malformed fan-out message for "
                                                    f"nodes.point: {why}"):
                await asyncio.wait_for(f, 30)
    with caplog.at_level(logging.WARNING, "meshio"):
        conn.send_message(Fanout("nodes", "point", msgspec.Raw(b"\x80"), (), "", 0, 0,
                                 [addr], [(0, [(addr, 1)])], 0, False))
        # the same connection, answered in order: the report is in before this
        assert (await first.point.call_one(4))[2] == 4
    assert "reported: malformed fan-out message for nodes.point: fan-out width 0" in caplog.text


async def _relayed_beyond(mesh: Any) -> None:
    """Every relay has relayed the tree messages sent before: each answers
    a call that came after them on the same connections (messages keep
    their order down the tree)."""
    await asyncio.wait_for(mesh.slice(procs=0).point.call(0), 60)


async def test_a_port_relayed_to_processes_killed_before_they_read_it_ends_recv(
        nodes: tuple[ProcessJob, Any, Node]) -> None:
    """A call through the tree hands a port to the second process of every
    host (none of them a relay: the relays pass the call on), each stopped
    (SIGSTOP) so it cannot read the port nor tell the receiver it holds it,
    then killed once the relays have passed the call on: the relays held
    the port for them from the send on and tell the receiver they were
    lost, so recv raises instead of waiting forever."""
    _, procs, mesh = nodes
    leaves = mesh.slice(procs=1)
    await leaves.point.call(0)  # (the relays are connected to them)
    pids = [procs.pids[h * PER_HOST + 1] for h in range(HOSTS)]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    port, receiver = Channel[int].open()
    call = asyncio.ensure_future(leaves.send_to.call(port, 1))
    await _relayed_beyond(mesh)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    # (the call fails, or where a death was known here first, has it as a hole)
    outcome = (await asyncio.wait_for(asyncio.gather(call, return_exceptions=True), 60))[0]
    assert isinstance(outcome, (SupervisionError, ValueMesh)), outcome
    with pytest.raises(SupervisionError, match="every process that held it is gone"):
        await asyncio.wait_for(receiver.recv(), 60)


async def test_a_relay_holds_the_port_for_a_process_yet_to_read_it(
        nodes: tuple[ProcessJob, Any, Node]) -> None:
    """The port goes through the tree to the second process of every host;
    that of host 0 is stopped (it has not read the port), the others read
    it, send, and are killed: recv still waits (host 0's relay holds the
    port for it) and returns the value it sends once resumed; once it is
    killed too, recv raises."""
    _, procs, mesh = nodes
    leaves = mesh.slice(procs=1)
    await leaves.point.call(0)
    slow, *others = [procs.pids[h * PER_HOST + 1] for h in range(HOSTS)]
    os.kill(slow, signal.SIGSTOP)
    port, receiver = Channel[int].open()
    call = asyncio.ensure_future(leaves.send_to.call(port, 1))
    await _relayed_beyond(mesh)
    assert [await asyncio.wait_for(receiver.recv(), 60) for _ in others] == [1] * len(others)
    waiting = asyncio.ensure_future(receiver.recv())
    for pid in others:
        os.kill(pid, signal.SIGKILL)
    for h in range(1, HOSTS):  # (once a call fails, the death is known here)
        with pytest.raises(SupervisionError):
            await asyncio.wait_for(mesh.slice(hosts=h, procs=1).point.call_one(0), 60)
    assert not waiting.done()
    os.kill(slow, signal.SIGCONT)
    assert await asyncio.wait_for(waiting, 60) == 1
    assert not (await asyncio.wait_for(call, 60)).holes  # (the others answered before)
    os.kill(slow, signal.SIGKILL)
    with pytest.raises(SupervisionError, match="every process that held it is gone"):
        await asyncio.wait_for(receiver.recv(), 60)
