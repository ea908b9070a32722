"""Public objects name their public home; errors are precise types; wire
kinds and RDMA ops are validated literals (issue 9)."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import pathlib
import pickle
import sys
import traceback
import typing
from typing import Any

import cloudpickle
import msgspec
import pytest

import meshio
from meshio import Actor, endpoint
from meshio._transport._connection import Connection, Pending
from meshio._transport._frames import frame_header
from meshio._transport._messages import ErrorInfo, Fail, RdmaOp, decode_message, encode_message
from meshio._transport._runtime import runtime

PACKAGES = ("meshio", "meshio.endpoints", "meshio.supervision", "meshio.rdma", "meshio.testing")
GUARD = 30.0


def _public_objects() -> list[tuple[str, str, Any]]:
    """``(package, name, obj)`` for every class and function a facade exports."""
    found: list[tuple[str, str, Any]] = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) or inspect.isroutine(obj):
                found.append((package, name, obj))
    return found


class Raiser(Actor):
    @endpoint
    def fail(self) -> None:
        raise meshio.SupervisionError("not really dead")

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def addr(self) -> str:
        return meshio.context().proc.addr


# ------------------------------------------------------------ public homes


def test_reprs_name_the_public_module() -> None:
    """issue 9: reprs of public classes, functions and methods name the
    public package, never a private module."""
    assert repr(meshio.ActorError) == "<class 'meshio.ActorError'>"
    assert repr(meshio.ProcMesh) == "<class 'meshio.ProcMesh'>"
    assert repr(meshio.Endpoint) == "<class 'meshio.Endpoint'>"
    assert repr(meshio.supervision.ManualClock) == "<class 'meshio.supervision.ManualClock'>"
    assert repr(meshio.rdma.Handle) == "<class 'meshio.rdma.Handle'>"
    assert meshio.run.__module__ == "meshio"
    assert meshio.testing.wait_exited.__module__ == "meshio.testing"
    assert meshio.ActorMesh.call.__module__ == "meshio"
    assert meshio.rdma.available_backends.__module__ == "meshio.rdma"
    # a name exported at the top and by a sub-package: the top wins
    assert meshio.supervision.SupervisionError.__module__ == "meshio"
    for package, name, obj in _public_objects():
        home = obj.__module__
        assert not any(part.startswith("_") for part in home.split(".")), (package, name, home)
        assert getattr(importlib.import_module(home), name) is obj, (package, name, home)


def test_a_raised_errors_traceback_names_the_public_module() -> None:
    """issue 9: a traceback ends ``meshio.NotInActorError: ...``."""
    with pytest.raises(meshio.NotInActorError) as info:
        meshio.context()
    last = traceback.format_exception(info.value)[-1]
    assert last.startswith("meshio.NotInActorError: meshio.context() is only available")


def test_public_classes_pickle_by_reference() -> None:
    """issue 9: classes and functions pickle by reference under their public
    name (pickle and cloudpickle alike: cloudpickle does not start copying
    meshio's classes by value), and errors round-trip with their attributes."""
    for package, name, obj in _public_objects():
        data = pickle.dumps(obj)
        assert pickle.loads(data) is obj, (package, name)
        assert cloudpickle.dumps(obj) == pickle.dumps(obj, cloudpickle.DEFAULT_PROTOCOL), name
    e = meshio.ActorError("boom", remote_type="ValueError", remote_message="boom",
                          remote_traceback="tb", actor="trainers", rank=3, endpoint="step")
    back = pickle.loads(cloudpickle.dumps(e))
    assert type(back) is meshio.ActorError
    assert (str(back), back.actor, back.rank, back.endpoint) == ("boom", "trainers", 3, "step")


def test_annotations_of_public_dataclasses_still_resolve() -> None:
    """issue 9: moving a dataclass's home does not break the names its
    annotations use (typing.get_type_hints, msgspec schemas)."""
    hints = typing.get_type_hints(meshio.SupervisionEvent)
    assert "restart" in typing.get_args(hints["kind"])
    msgspec.msgpack.Decoder(meshio.SupervisionEvent)
    msgspec.msgpack.Decoder(meshio.rdma.Handle)


async def test_a_meshio_error_raised_remotely_names_its_public_type() -> None:
    """issue 9: an endpoint raising one of meshio's errors: the caller's
    ActorError names it ``meshio.SupervisionError``, in ``remote_type`` and in
    the remote traceback."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        raiser = await procs.spawn("raiser", Raiser)
        with pytest.raises(meshio.ActorError) as info:
            await raiser.fail.call_one()
        assert info.value.remote_type == "meshio.SupervisionError"
        last = info.value.remote_traceback.strip().splitlines()[-1]
        assert last == "meshio.SupervisionError: not really dead"


# --------------------------------------------------------- precise errors


def test_no_bare_meshio_error_is_raised() -> None:
    """issue 9: meshio's source never raises the bare base class."""
    src = meshio.__path__[0]
    offenders = [f"{p.name}:{n}" for p in pathlib.Path(src).rglob("*.py")
                 for n, line in enumerate(p.read_text().splitlines(), 1)
                 if "raise MeshioError(" in line]
    assert offenders == []


def test_context_outside_an_actor_is_a_runtime_error() -> None:
    """issue 9: ``context()`` outside an actor is NotInActorError, a RuntimeError."""
    with pytest.raises(RuntimeError) as info:
        meshio.current_rank()
    assert isinstance(info.value, meshio.NotInActorError)
    assert isinstance(info.value, meshio.MeshioError)


async def test_misused_adverbs_are_value_and_type_errors() -> None:
    """issue 9: call_one on a mesh of two, choose on an empty mesh
    (MeshShapeError, a ValueError) and mesh.call of a non-endpoint
    (TypeError) or of another class's endpoint (UnknownEndpointError)."""

    class Other(Actor):
        @endpoint
        def pid(self) -> int:
            return 0

    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        raisers = await procs.spawn("raisers", Raiser)
        with pytest.raises(ValueError, match="2 actors") as shape:
            raisers.pid.call_one()
        assert isinstance(shape.value, meshio.MeshShapeError)
        with pytest.raises(meshio.MeshShapeError, match="empty"):
            raisers.slice(procs=slice(0, 0)).pid.choose()
        with pytest.raises(TypeError, match="not an endpoint"):
            raisers.call(len)  # type: ignore[arg-type]
        with pytest.raises(meshio.UnknownEndpointError, match="not an endpoint of Raiser"):
            raisers.call(Other.pid)
        assert len((await raisers.pid.call()).values()) == 2  # the mesh still serves


async def test_a_closed_port_is_a_closed_resource() -> None:
    """issue 9: recv() on a port closed by its sender, once drained, raises
    ClosedResourceError; ``async for`` just ends."""
    port, recv = meshio.Channel[int].open()
    port.send(1)
    port.close()
    assert await recv.recv() == 1
    with pytest.raises(meshio.ClosedResourceError, match="closed"):
        await recv.recv()
    assert [v async for v in recv] == []


async def test_a_worker_that_cannot_start_is_a_process_start_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 9: a worker process that exits before its hello makes
    spawn_procs raise ProcessStartError (a SupervisionError) naming the rank,
    pid and exit code."""
    monkeypatch.setattr(sys, "executable", "/bin/false")  # exits 1 at once
    with pytest.raises(meshio.ProcessStartError) as info:
        await meshio.this_host().spawn_procs(per_host={"procs": 1})
    e = info.value
    assert isinstance(e, meshio.SupervisionError)
    assert e.rank == 0 and e.pid > 0 and e.cause == "exited with code 1"
    assert "failed to start" in str(e) and f"pid {e.pid}" in str(e)


# --------------------------------------------------------- validated kinds


def test_wire_kinds_and_ops_are_validated_literals() -> None:
    """issue 9: an ErrorInfo kind or RdmaOp op outside its Literal does not
    decode (msgspec says which field); known ones round-trip."""
    for kind in typing.get_args(ErrorInfo.__annotations__["kind"]):
        assert decode_message(encode_message(Fail(1, ErrorInfo(kind, "T", "m")))) == Fail(
            1, ErrorInfo(kind, "T", "m"))
    bad_kind = encode_message(Fail(1, ErrorInfo("mystery", "T", "m")))  # type: ignore[arg-type]
    with pytest.raises(msgspec.ValidationError, match="Invalid enum value 'mystery'"):
        decode_message(bad_kind)
    bad_op = encode_message(RdmaOp(1, "erase", 0, 0))  # type: ignore[arg-type]
    with pytest.raises(msgspec.ValidationError, match="Invalid enum value 'erase'"):
        decode_message(bad_op)


# The two tests below put frames no public API can make on the controller's
# own connection to a worker (the runtime's, an internal): how each side
# takes them is what they test.


def _deliver(conn: Connection, data: bytes) -> None:
    """Hand ``data`` to ``conn`` the way the event loop does."""
    while data:
        buf = conn.get_buffer(len(data))
        n = min(len(buf), len(data))
        buf[:n] = data[:n]
        conn.buffer_updated(n)
        data = data[n:]


def _pending(what: str) -> tuple[asyncio.Future[Any], Pending]:
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    return fut, Pending(fut, lambda raw, bufs: raw, what, "raiser", "rank 0")


async def test_an_answer_with_an_unknown_error_kind_is_a_protocol_error() -> None:
    """issue 9: a Fail whose kind is not one meshio knows fails the call with
    ProtocolError naming the bad value (not taken for some other error),
    and the connection keeps serving."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        raiser = await procs.spawn("raiser", Raiser)
        pid = await raiser.pid.call_one()
        conn = runtime().conns[await raiser.addr.call_one()]
        fut, pending = _pending("Raiser.pid")
        req = conn.next_req(pending)
        bad = encode_message(Fail(req, ErrorInfo("mystery", "T", "m")))  # type: ignore[arg-type]
        _deliver(conn, frame_header(len(bad), []) + bad)  # as if the worker sent it
        with pytest.raises(meshio.ProtocolError, match="Invalid enum value 'mystery'"):
            await asyncio.wait_for(fut, GUARD)
        assert await raiser.pid.call_one() == pid


async def test_an_rdma_op_with_an_unknown_op_fails_the_request() -> None:
    """issue 9: an RdmaOp whose op is not one meshio knows is refused with a
    ProtocolError to its sender (not served as some other operation), and
    the worker keeps serving."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        raiser = await procs.spawn("raiser", Raiser)
        pid = await raiser.pid.call_one()
        conn = runtime().conns[await raiser.addr.call_one()]
        fut, pending = _pending("RDMA erase")
        req = conn.next_req(pending)
        conn.send_message(RdmaOp(req, "erase", 1, 0))  # type: ignore[arg-type]
        with pytest.raises(meshio.ProtocolError, match="Invalid enum value 'erase'"):
            await asyncio.wait_for(fut, GUARD)
        assert await raiser.pid.call_one() == pid


async def test_an_unknown_backend_in_the_environment_is_an_rdma_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 9: ``MESHIO_RDMA_BACKEND`` is checked against the Backend
    literal by msgspec; another name is an RDMAError saying what to do."""
    buf = meshio.RDMABuffer(bytearray(8))
    monkeypatch.setenv("MESHIO_RDMA_BACKEND", "gpu")
    with pytest.raises(meshio.RDMAError, match="MESHIO_RDMA_BACKEND='gpu' is not an RDMA backend"):
        meshio.rdma.backend_for(buf)
    monkeypatch.setenv("MESHIO_RDMA_BACKEND", "tcp")
    assert buf.backend == "tcp"
    await buf.drop()
