"""Values and frames that used to hang calls or kill workers, against real
worker processes: values that fail to decode (issue 7 item 1), large values
and the message size limit (item 3), frame headers not trusted before their
data (item 4), deep nesting (item 20).

Raw clients dial a worker's socket (past the job handshake) and speak the
frame format by hand, as in ``test_wire.py``.
"""

from __future__ import annotations

import asyncio
import os
import struct
import sys
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio

import meshio
from meshio import Actor, ActorMesh, Channel, Port, SchemaError, endpoint
from meshio._transport import _messages as M
from meshio._transport._connection import Pending
from meshio._transport._frames import frame_header
from meshio._transport._runtime import runtime
from meshio._transport._serial import KIND_BYTEARRAY, KIND_BYTES, Packer, limits
from meshio.testing import actor_target, proc_mesh, process_address
from raw_peer import close, dial, expect_eof, read_frame

pytestmark = pytest.mark.asyncio(loop_scope="module")

DEADLINE = 20.0
MiB = 1 << 20


def _rebuild_in(pid: int, what: str) -> str:
    if os.getpid() != pid:
        raise RuntimeError(f"{what} cannot be rebuilt in process {os.getpid()}")
    return what


class Bomb:
    """Pickles anywhere; its reconstruction raises in any other process."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_in, (os.getpid(), "bomb"))


def _touch(path: str) -> str:
    Path(path).touch()
    return path


class Canary:
    """Its reconstruction leaves a file behind: proof that it was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (_touch, (self.path,))


class Store(Actor):
    def __init__(self, opt: Any = None) -> None:
        self.opt = opt

    @endpoint
    async def take(self, x: int, blob: Any = None) -> int:
        return x

    @endpoint(concurrent=True)
    async def take_now(self, x: int, blob: Any = None) -> int:
        return x

    @endpoint
    async def give_bomb(self) -> Any:
        return Bomb()

    @endpoint
    async def length(self, data: str) -> int:
        return len(data)

    @endpoint
    async def echo(self, value: Any) -> Any:
        return value

    @endpoint
    async def text(self, n: int) -> str:
        return "r" * n

    @endpoint
    async def stream(self, port: Port[Any], big: int = 0) -> None:
        port.send(1)
        port.send(Bomb() if not big else "b" * big)
        port.send(3)
        port.close()

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def store() -> AsyncIterator[ActorMesh[Store]]:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name="robust") as pm:
        mesh = await pm.spawn("store", Store)
        yield mesh  # type: ignore[misc]


async def serving(mesh: ActorMesh[Store], x: int) -> None:
    assert await asyncio.wait_for(mesh.take.call_one(x=x), DEADLINE) == x


# ------------------------------------------------------------ raw clients


def frame(msg: M.Message, out: list[tuple[Any, int]] | None = None) -> bytes:
    body = M.encode_message(msg)
    out = out or []
    return frame_header(len(body), out) + body + b"".join(bytes(b) for b, _ in out)










# ------------------------------------------------- item 1: undecodable values


async def test_undecodable_argument_fails_the_call_and_actor_serves(
        store: ActorMesh[Store]) -> None:
    """issue 7 item 1: an untyped argument whose reconstruction raises on the
    worker fails that call with a SchemaError naming endpoint, argument and
    cause; the actor's mailbox keeps serving."""
    with pytest.raises(SchemaError) as info:
        await asyncio.wait_for(store.take.call_one(x=1, blob=Bomb()), DEADLINE)
    msg = str(info.value)
    assert "Store.take" in msg and "'blob'" in msg and "cannot be rebuilt" in msg, msg
    await serving(store, 2)


async def test_undecodable_argument_on_concurrent_endpoint(store: ActorMesh[Store]) -> None:
    """issue 7 item 1: the same on a concurrent=True endpoint: the worker
    (same pid) and the actor keep serving."""
    pid = await asyncio.wait_for(store.pid.call_one(), DEADLINE)
    with pytest.raises(SchemaError, match=r"'blob' of Store\.take_now.*cannot be rebuilt"):
        await asyncio.wait_for(store.take_now.call_one(x=1, blob=Bomb()), DEADLINE)
    assert await asyncio.wait_for(store.take_now.call_one(x=4), DEADLINE) == 4
    assert await asyncio.wait_for(store.pid.call_one(), DEADLINE) == pid


async def test_class_the_worker_cannot_import(store: ActorMesh[Store]) -> None:
    """issue 7 item 1: an instance of a class whose module exists only in the
    controller is a SchemaError naming the argument and the missing module."""
    mod = types.ModuleType("meshio_ghost_module")

    class Ghost:
        pass

    Ghost.__module__, Ghost.__qualname__ = mod.__name__, "Ghost"  # pickled by reference
    mod.Ghost = Ghost  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    try:
        with pytest.raises(SchemaError, match=r"'blob'.*meshio_ghost_module"):
            await asyncio.wait_for(store.take.call_one(x=1, blob=Ghost()), DEADLINE)
    finally:
        del sys.modules[mod.__name__]
    await serving(store, 5)


async def test_typed_arguments_validate_before_anything_is_unpickled(
        store: ActorMesh[Store], tmp_path: Path) -> None:
    """issue 7 item 1: a bad typed argument fails the call before a pickled
    argument sent ahead of it on the wire is unpickled."""
    canary = tmp_path / "unpickled"
    with pytest.raises(SchemaError, match=r"\$\.x"):
        await asyncio.wait_for(
            store.take.call_one(blob=Canary(str(canary)), x="seven"),  # type: ignore[arg-type]
            DEADLINE)
    assert not canary.exists()
    # with good arguments the pickle is unpickled as usual
    assert await asyncio.wait_for(store.take.call_one(blob=Canary(str(canary)), x=6),
                                  DEADLINE) == 6
    assert canary.exists()


async def test_typed_argument_is_validated_before_unpickling_with_buffers(
        store: ActorMesh[Store], tmp_path: Path) -> None:
    """issue 15 item 4: the same when the frame carries an out-of-band
    buffer (a big ``bytes`` beside the call): a pickle sent as the ``x: int``
    argument is refused with a SchemaError naming ``$.x``, never unpickled."""
    canary = tmp_path / "unpickled"
    big = b"b" * MiB  # travels out of band
    with pytest.raises(SchemaError, match=r"Expected `int`, got `pickle` - at `\$\.x`"):
        await asyncio.wait_for(
            store.take.call_one(x=Canary(str(canary)), blob=big),
            DEADLINE)
    assert not canary.exists()
    assert await asyncio.wait_for(store.take.call_one(x=3, blob=big), DEADLINE) == 3


async def test_undecodable_result_fails_the_call_connection_stays(
        store: ActorMesh[Store]) -> None:
    """issue 7 item 1: a result whose reconstruction raises in the controller
    fails that call with a SchemaError; the connection to the worker stays up
    and serves the next call."""
    await serving(store, 7)
    conn = runtime().conns[process_address(store, 0)]
    with pytest.raises(SchemaError, match=r"Store\.give_bomb.*cannot be rebuilt"):
        await asyncio.wait_for(store.give_bomb.call_one(), DEADLINE)
    await serving(store, 8)
    assert runtime().conns[process_address(store, 0)] is conn and not conn.closed


async def test_undecodable_port_value_is_an_error_from_recv(store: ActorMesh[Store]) -> None:
    """issue 7 item 1: a port value that cannot be decoded surfaces from
    recv() as a SchemaError; the values after it still arrive."""
    port, receiver = Channel[Any].open()
    await asyncio.wait_for(store.stream.call_one(port), DEADLINE)
    assert await asyncio.wait_for(receiver.recv(), DEADLINE) == 1
    with pytest.raises(SchemaError, match="cannot be rebuilt"):
        await asyncio.wait_for(receiver.recv(), DEADLINE)
    assert [v async for v in receiver] == [3]


async def test_undecodable_constructor_argument(store: ActorMesh[Store]) -> None:
    """issue 7 item 1: a constructor argument that cannot be decoded fails the
    spawn with a SchemaError naming __init__ and the argument; the worker
    keeps hosting its other actors."""
    procs = proc_mesh(store)
    with pytest.raises(SchemaError, match=r"'opt' of Store\.__init__.*cannot be rebuilt"):
        await asyncio.wait_for(procs.spawn("bad", Store, opt=Bomb()), DEADLINE)
    await serving(store, 9)


# ------------------------------------------------------ item 20: deep nesting


def _deep(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


async def test_deep_nesting_is_a_schema_error_on_send(store: ActorMesh[Store]) -> None:
    """issue 7 item 20: a value nested too deeply to encode is a SchemaError
    on the sending side, naming the endpoint."""
    with pytest.raises(SchemaError, match=r"Store\.echo.*nested too deeply"):
        await asyncio.wait_for(store.echo.call_one(value=_deep(5000)), DEADLINE)
    await serving(store, 10)


async def test_deep_nesting_is_a_schema_error_on_receive(store: ActorMesh[Store]) -> None:
    """issue 7 item 20: arguments nested too deeply to decode are a schema
    failure for that call; the actor keeps serving."""
    r, w = await dial(process_address(store, 0))
    try:
        args = b"\x81\xa5value" + b"\x91" * 100_000 + b"\x01"
        w.write(frame(M.Call(1, actor_target(store), "echo", msgspec.Raw(args))))
        msg, _ = await asyncio.wait_for(read_frame(r), DEADLINE)
        assert isinstance(msg, M.Fail) and msg.req == 1, msg
        assert msg.error.kind == "schema" and "nested too deeply" in msg.error.message
    finally:
        await close(w)
    await serving(store, 11)


# ------------------------------------------- item 3: large values, the limit


async def test_large_str_travels_out_of_band(store: ActorMesh[Store]) -> None:
    """issue 7 item 3: a large str (typed or not, ASCII or not) is a buffer
    beside the message body, not in it (an ASCII one without a copy), and
    arrives intact as an argument and as a result."""
    for text in ("a" * MiB, "é" * MiB):
        for typed in (True, False):
            packer = Packer()
            body = packer.pack(text, typed)
            assert len(body) < 64 and len(packer) == 1
            assert memoryview(packer[0][0]).nbytes == len(text.encode())
    packer = Packer()
    packer.pack("a" * MiB, True)
    assert isinstance(packer[0][0], memoryview)  # the str's own memory
    text = "ab" * (3 * MiB)
    assert await asyncio.wait_for(store.length.call_one(data=text), DEADLINE) == len(text)
    wide = "é€" * MiB
    assert await asyncio.wait_for(store.echo.call_one(value=wide), DEADLINE) == wide
    assert await asyncio.wait_for(store.text.call_one(n=5 * MiB), DEADLINE) == "r" * (5 * MiB)


async def test_over_the_limit_is_refused_by_the_sender(
        store: ActorMesh[Store], restore_limits: None) -> None:
    """issue 7 item 3: an argument over the message size limit is a
    SchemaError on the sending side naming endpoint, argument and limit."""
    meshio.set_limits(max_message=MiB)
    with pytest.raises(SchemaError) as info:
        await asyncio.wait_for(store.length.call_one(data="x" * (2 * MiB)), DEADLINE)
    msg = str(info.value)
    assert "Store.length" in msg and "'data'" in msg and str(MiB) in msg, msg
    assert await asyncio.wait_for(store.length.call_one(data="small"), DEADLINE) == 5


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"max_message": True}, TypeError), ({"max_message": 1.5}, TypeError),
    ({"receive_budget": "10"}, TypeError), ({"frame_timeout": None}, None),
    ({"frame_timeout": 0}, ValueError), ({"max_message": -1}, ValueError),
    ({"fanout_width": -1}, ValueError), ({"fanout_width": 2.0}, TypeError),
    ({"busy_poll": -1e-6}, ValueError), ({"busy_poll": "0.1"}, TypeError)])
async def test_set_limits_rejects_bad_values_before_changing_anything(
        restore_limits: None, kwargs: dict[str, Any], error: type[Exception] | None) -> None:
    """issue 7 item 3: a bad limit is a clear TypeError/ValueError naming it,
    and nothing (this process or the environment workers inherit) changes."""
    before = (dict(os.environ), limits.max_message, limits.receive_budget, limits.fanout_width,
              limits.busy_poll)
    if error is None:
        meshio.set_limits(**kwargs)
    else:
        arg = next(iter(kwargs))  # (seconds are named as set_limits(frame_timeout=...))
        with pytest.raises(error, match=rf"set_limits(: {arg}|\({arg}=\.\.\.\)) must be"):
            meshio.set_limits(**kwargs)
    assert (dict(os.environ), limits.max_message, limits.receive_budget,
            limits.fanout_width, limits.busy_poll) == before


async def test_receiver_enforces_its_limit_without_dropping(restore_limits: None) -> None:
    """issue 7 item 3: a worker with a smaller limit than the caller skips an
    oversized call unread and fails it with a SchemaError naming the limit;
    the controller, with a smaller limit than the worker, does the same for an
    oversized result and port value; no connection drops."""
    meshio.set_limits(max_message=2 * MiB)  # the workers' limit, from the environment
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name="small") as pm:
        mesh = await pm.spawn("store", Store)
        meshio.set_limits(max_message=8 * MiB)  # the controller's own
        conn = runtime().conns[process_address(mesh, 0)]
        with pytest.raises(SchemaError,
                           match=rf"^Store\.length: .*over the message size limit of {2 * MiB}"):
            await asyncio.wait_for(mesh.length.call_one(data="x" * (3 * MiB)), DEADLINE)
        assert await asyncio.wait_for(mesh.length.call_one(data="ok"), DEADLINE) == 2
        meshio.set_limits(max_message=MiB)
        with pytest.raises(SchemaError, match=r"Store\.text.*over the message size limit"):
            await asyncio.wait_for(mesh.text.call_one(n=MiB + MiB // 2), DEADLINE)
        port, receiver = Channel[Any].open()
        await asyncio.wait_for(mesh.stream.call_one(port, big=MiB + MiB // 2), DEADLINE)
        assert await asyncio.wait_for(receiver.recv(), DEADLINE) == 1
        with pytest.raises(SchemaError, match="over the message size limit"):
            await asyncio.wait_for(receiver.recv(), DEADLINE)
        assert [v async for v in receiver] == [3]
        assert await asyncio.wait_for(mesh.text.call_one(n=3), DEADLINE) == "rrr"
        assert runtime().conns[process_address(mesh, 0)] is conn and not conn.closed


# ----------------------------------------- item 4: headers are not trusted


async def test_incomplete_frame_times_out(restore_limits: None) -> None:
    """issue 7 item 4: a header whose data never comes drops that connection
    after the frame timeout; the worker serves everyone else meanwhile."""
    meshio.set_limits(frame_timeout=0.5)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name="stall") as pm:
        mesh = await pm.spawn("store", Store)
        r, w = await dial(process_address(mesh, 0))
        try:
            w.write(struct.pack("<IIQ", 16, 1, (KIND_BYTEARRAY << 56) | (512 * MiB)) + b"abc")
            await serving(mesh, 1)
            await expect_eof(r)
        finally:
            await close(w)
        await serving(mesh, 2)


async def test_receive_budget_is_shared_by_connections(restore_limits: None) -> None:
    """issue 7 item 4: memory for incomplete frames is bounded per process: a
    frame that does not fit beside another's claim waits (its connection
    paused) until that claim is given back, here when the stalled frame
    times out."""
    meshio.set_limits(receive_budget=8 * MiB, frame_timeout=1.0)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name="budget") as pm:
        mesh = await pm.spawn("store", Store)
        ra, wa = await dial(process_address(mesh, 0))
        rb, wb = await dial(process_address(mesh, 0))
        try:
            # A: a small call, then the header of a 6 MiB frame that never ends
            small = frame(M.Call(1, actor_target(mesh), "take", msgspec.Raw(
                msgspec.msgpack.encode({"x": 1}))))
            stalled = struct.pack("<IIQ", 4, 1, (KIND_BYTES << 56) | (6 * MiB)) + b"\x90" * 8
            wa.write(small + stalled)
            first, _ = await asyncio.wait_for(read_frame(ra), DEADLINE)
            assert isinstance(first, M.Reply) and first.req == 1
            # B: a whole 6 MiB call; it cannot be taken in beside A's claim
            args = msgspec.msgpack.encode({"value": msgspec.msgpack.Ext(
                2, msgspec.msgpack.encode((0, 0)))})  # the frame's buffer 0, as bytes
            wb.write(frame(M.Call(2, actor_target(mesh), "echo", msgspec.Raw(args)),
                           [(b"d" * (6 * MiB), KIND_BYTES)]))
            beats: list[M.Pong] = []

            async def answer() -> M.Message:
                # while its frame waits, B's connection says it is alive
                # (unasked Pongs: it reads no Ping meanwhile)
                while isinstance(msg := (await read_frame(rb))[0], M.Pong):
                    beats.append(msg)
                return msg

            reply_b = asyncio.ensure_future(answer())
            await expect_eof(ra)  # A timed out ...
            assert not reply_b.done()  # ... and until then B waited
            msg = await asyncio.wait_for(reply_b, DEADLINE)
            assert isinstance(msg, M.Reply) and msg.req == 2, msg
            assert beats, "no beat while the frame waited for its receive budget"
        finally:
            await close(wa)
            await close(wb)
        await serving(mesh, 3)


# ------------------------------------ issue 15 item 8: idle connections


def _rss(pid: int) -> int:
    """The resident memory of process ``pid``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


async def test_idle_connections_commit_little_memory() -> None:
    """issue 15 item 8: 400 authenticated peers of a worker, each of which
    made one call and then stays idle, grow the worker's resident memory by
    far less than a 256 KiB receive buffer each (they cost ~100 MiB when
    every connection zero-filled one)."""
    n = 400
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name="idle") as pm:
        mesh = await pm.spawn("store", Store)
        pid = await asyncio.wait_for(mesh.pid.call_one(), DEADLINE)
        call = frame(M.Call(1, actor_target(mesh), "take", msgspec.Raw(
            msgspec.msgpack.encode({"x": 1}))))
        before = _rss(pid)
        peers = []
        try:
            for _ in range(n):
                r, w = await dial(process_address(mesh, 0))
                peers.append(w)
                w.write(call)
                reply, _ = await asyncio.wait_for(read_frame(r), DEADLINE)
                assert isinstance(reply, M.Reply) and reply.req == 1, reply
            grown = _rss(pid) - before
        finally:
            for w in peers:
                await close(w)
        assert grown < n * 32 * 1024, f"{n} idle connections cost {grown / MiB:.1f} MiB"
        await serving(mesh, 4)


def _break_dispatch() -> None:
    """A bootstrap: this process fails admitting a call of a method named
    ``explode`` to its actor (alone, in a burst of calls, or from the
    mailbox), and relaying a tree call of it (bugs injected where the
    runtime hands a message on)."""
    from meshio._transport import _runtime
    from meshio.endpoints import _schema

    unpack, relay = _schema.Schema.unpack_args, _runtime.relay

    def broken_unpack(schema: Any, data: Any, bufs: Any) -> Any:
        if schema.qualname.endswith(".explode"):
            raise RuntimeError("injected admit bug")
        return unpack(schema, data, bufs)

    def broken_relay(rt: Any, up: Any, msg: Any, bufs: Any, post: Any) -> None:
        if msg.method == "explode":
            raise RuntimeError("injected relay bug")
        relay(rt, up, msg, bufs, post)

    _schema.Schema.unpack_args = broken_unpack  # type: ignore[method-assign]
    _runtime.relay = broken_relay


class Exploder(Actor):
    def __init__(self) -> None:
        self.held = asyncio.Event()
        self.go = asyncio.Event()

    @endpoint
    async def explode(self) -> int:
        return 1

    @endpoint
    async def hold(self) -> None:
        self.held.set()
        await self.go.wait()

    @endpoint(concurrent=True)
    async def release(self) -> None:
        await self.held.wait()  # (the calls after hold are in the mailbox by now)
        self.go.set()

    @endpoint
    async def addr(self) -> str:
        return meshio.context().proc.addr


async def test_a_failing_handler_answers_its_calls_and_the_process_serves_on() -> None:
    """When handing a call or a tree call on fails inside the runtime (a
    bug), each call it carries fails with a ProtocolError naming the process,
    instead of waiting for an answer that never comes; the process serves on."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1},
                                              bootstrap=_break_dispatch) as procs:
        mesh = await procs.spawn("exploders", Exploder)
        pid = procs.pids[0]
        with pytest.raises(meshio.ProtocolError,
                           match=rf"failed serving this call in pid {pid} .*injected admit bug"):
            await asyncio.wait_for(mesh.explode.call_one(), 30)
        # a burst (one frame after the turn's first): each fails, those between serve
        burst = await asyncio.wait_for(asyncio.gather(
            *[(mesh.explode if i % 2 else mesh.addr).call_one() for i in range(9)],
            return_exceptions=True), 30)
        for i, got in enumerate(burst):
            if i % 2:
                assert isinstance(got, meshio.ProtocolError) and "injected admit bug" in str(
                    got), got
            else:
                assert isinstance(got, str), got
        # from the mailbox (behind a call that waits): the same
        queued: list[asyncio.Future[Any]] = [mesh.hold.call_one(), mesh.explode.call_one(),
                                             mesh.addr.call_one()]
        await asyncio.wait_for(mesh.release.call_one(), 30)
        held, exploded, served = await asyncio.wait_for(
            asyncio.gather(*queued, return_exceptions=True), 30)
        assert held is None and isinstance(served, str), (held, served)
        assert isinstance(exploded, meshio.ProtocolError), exploded
        addr = await mesh.addr.call_one()
        rt = runtime()
        conn = rt.conns.get(addr) or rt.connect(addr)
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[Any]] = [loop.create_future() for _ in range(2)]
        req = conn.next_reqs([Pending(f, lambda raw, bufs: raw, "Exploder.explode", "probe", i)
                              for i, f in enumerate(futs)])
        conn.send_message(M.Fanout("exploders", "explode", msgspec.Raw(b"\x90"), (), "", req, 0,
                                   [addr], [(0, [(addr, 1), (addr, 2)])], 2, True))
        for f in futs:
            with pytest.raises(meshio.ProtocolError,
                               match=rf"failed serving this tree call in pid {pid} .*injected "
                                     "relay bug"):
                await asyncio.wait_for(f, 30)
        assert await asyncio.wait_for(mesh.addr.call_one(), 30) == addr
