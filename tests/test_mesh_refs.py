"""Mesh references are values: an ActorMesh passed to (or returned by) an
actor is a working reference that calls the actors directly.  An actor
sending itself (``self``) sends such a reference to itself alone, not a
copy of its state."""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest

import meshio
from meshio import Actor, ActorMesh, SchemaError, context, endpoint
from meshio._transport._connection import Connection
from meshio._transport._runtime import runtime


class Learner(Actor):
    @endpoint
    async def learn(self, x: int) -> tuple[int, int]:
        return (x * 2, os.getpid())

    @endpoint
    def where(self) -> str:
        """Address of the process this learner lives in."""
        return context().proc.addr


class Gen(Actor):
    def __init__(self, learners: Learner) -> None:
        self.learners = learners

    @endpoint
    async def go(self, x: int) -> list[int]:
        vm = await self.learners.learn.call(x=x)
        return [v for v, _ in vm.values()]

    @endpoint
    async def pids(self) -> list[int]:
        return [pid for _, pid in (await self.learners.learn.call(x=0)).values()]

    @endpoint
    async def via(self, learner: Learner, x: int) -> int:
        return (await learner.learn.call_one(x=x))[0]

    @endpoint
    async def via_untyped(self, meshes, x):  # type: ignore[no-untyped-def]
        out: list[int] = []
        for m in meshes:
            out.extend(v for v, _ in (await m.learn.call(x=x)).values())
        return out

    @endpoint
    async def via_list(self, meshes: list[Learner], x: int) -> list[int]:
        out: list[int] = []
        for m in meshes:
            out.extend(v for v, _ in (await m.learn.call(x=x)).values())
        return out

    @endpoint
    async def via_dict(self, meshes: dict[str, Learner], x: int) -> dict[str, int]:
        return {k: len(await m.learn.call(x=x)) for k, m in meshes.items()}

    @endpoint
    def get_learners(self) -> Learner:
        return self.learners

    @endpoint
    def get_self(self) -> Gen:
        return cast(Gen, context().mesh)

    @endpoint
    def my_addr(self) -> str:
        return context().proc.addr

    @endpoint
    def conns(self) -> list[str]:
        """The peers this worker has connections to (dialled or accepted):
        the worker runtime's own table, as routing is what the test checks."""
        return sorted(runtime().conns)


async def test_mesh_as_constructor_argument(procs: meshio.ProcMesh) -> None:
    learners = await procs.spawn("learners", Learner)
    gen = await procs.spawn("gen", Gen, learners)
    assert (await gen.go.call(x=3)).values() == [[6, 6], [6, 6]]
    assert (await gen.slice(procs=1).pids.call_one()) == procs.pids


async def test_mesh_slice_as_constructor_argument(procs: meshio.ProcMesh) -> None:
    learners = await procs.spawn("learners", Learner)
    gen = await procs.spawn("gen", Gen, learners=learners.slice(procs=1))
    assert (await gen.pids.call()).values() == [[procs.pids[1]], [procs.pids[1]]]
    gen2 = await procs.spawn("gen2", Gen, learners=learners.slice(procs=slice(None, None, -1)))
    assert await gen2.slice(procs=0).pids.call_one() == procs.pids[::-1]


async def test_mesh_as_endpoint_argument(procs: meshio.ProcMesh) -> None:
    learners = await procs.spawn("learners", Learner)
    gen = await procs.spawn("gen", Gen, learners)
    assert await gen.slice(procs=1).via.call_one(learners.slice(procs=0), 5) == 10
    assert await gen.slice(procs=0).via.call_one(learner=learners.slice(procs=1), x=6) == 12


async def test_meshes_inside_containers(procs: meshio.ProcMesh) -> None:
    learners = await procs.spawn("learners", Learner)
    gen = await procs.spawn("gen", Gen, learners)
    one = gen.slice(procs=0)
    both = [learners.slice(procs=0), learners]
    assert await one.via_untyped.call_one([learners.slice(procs=1)], 2) == [4]
    assert await one.via_untyped.call_one(both, 1) == [2, 2, 2]
    assert await one.via_list.call_one(both, 3) == [6, 6, 6]
    assert await one.via_dict.call_one({"all": learners, "one": learners.slice(procs=1)},
                                       1) == {"all": 2, "one": 1}


async def test_wrong_actor_class_is_a_schema_error(procs: meshio.ProcMesh) -> None:
    learners = await procs.spawn("learners", Learner)
    gen = await procs.spawn("gen", Gen, learners)
    with pytest.raises(SchemaError, match=r"\$\.learner"):
        await gen.slice(procs=0).via.call_one(gen, 1)  # type: ignore[arg-type]
    with pytest.raises(SchemaError, match=r"\$\.meshes\[1\]"):
        await gen.slice(procs=0).via_list.call_one([learners, gen], 1)  # type: ignore[list-item]
    with pytest.raises(SchemaError, match=r"\$\.learners"):
        await procs.spawn("gen2", Gen, learners=gen)  # type: ignore[arg-type]
    with pytest.raises(SchemaError, match=r"\$\.learners"):
        await procs.spawn("gen3", Gen, learners=3)  # type: ignore[arg-type]


async def test_mesh_returned_as_a_result(procs: meshio.ProcMesh) -> None:
    learners = await procs.spawn("learners", Learner)
    gen = await procs.spawn("gen", Gen, learners.slice(procs=1))
    got = await gen.slice(procs=0).get_learners.call_one()
    assert isinstance(got, ActorMesh) and isinstance(got, Learner)
    assert got.sizes == {} and len(got) == 1
    assert await got.learn.call_one(x=4) == (8, procs.pids[1])
    # context().mesh returned by an actor is the whole mesh it belongs to
    whole = await gen.slice(procs=1).get_self.call_one()
    assert whole.sizes == {"procs": 2}
    assert (await whole.my_addr.call()).values() == (await gen.my_addr.call()).values()


class Holder(Actor):
    """State no pickle takes (a lock), a value that changes, and an actor
    that sends itself as an argument and as a result."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.value = 7

    @endpoint(concurrent=True)
    async def current(self) -> tuple[int, int]:
        return (self.value, context().point.rank)

    @endpoint
    async def register_with(self, registry: Registry) -> tuple[int, int]:
        self.value = 8  # (the registry reads it through the reference, as it is now)
        return await registry.look.call_one(self)

    @endpoint
    def itself(self) -> Holder:
        return self

    @endpoint
    def copied(self) -> str:
        """What a plain copy of the actor is (not a message: a copy of it)."""
        twin = copy.copy(self)
        return f"{type(twin).__name__} {twin.value}"


class Registry(Actor):
    @endpoint
    async def look(self, holder: Holder) -> tuple[int, int]:
        assert isinstance(holder, ActorMesh) and len(holder) == 1, holder
        return await holder.current.call_one()


async def test_an_actor_sending_itself_sends_a_reference_to_itself(
        procs: meshio.ProcMesh) -> None:
    """``self`` as an argument (Ray's ``register.remote(self)``) and as a
    result arrives as ``context(Holder).mesh.slice(**current_rank())``: its
    lock stays behind (it was pickled: "cannot pickle '_thread.lock'"), and
    what the reference reads is the actor's state now, not a copy."""
    registry = await procs.slice(procs=0).spawn("registry", Registry)
    holders = await procs.spawn("holders", Holder)
    assert await holders.slice(procs=1).register_with.call_one(registry) == (8, 1)
    me = await holders.slice(procs=1).itself.call_one()
    assert isinstance(me, ActorMesh) and isinstance(me, Holder)
    assert me.sizes == {} and await me.current.call_one() == (8, 1)
    assert await me.copied.call_one() == "Holder 8"  # (copy and pickle as ever there)


async def test_an_actor_not_spawned_cannot_be_sent(procs: meshio.ProcMesh) -> None:
    """A plain instance of an actor class refers to no actor: refused,
    naming where it is and what to send instead."""
    registry = await procs.slice(procs=0).spawn("registry", Registry)
    with pytest.raises(SchemaError, match=(
            r"^Registry\.look: arguments cannot be sent: a Holder made as a plain object "
            r"cannot be sent - at `\$\.holder`: it is no actor spawned on a proc mesh.*send "
            r"the actor mesh procs\.spawn\(\.\.\.\) returned")):
        registry.look.call_one(Holder())


@pytest.fixture
def controller_traffic(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Count frames the controller sends and receives (on the transport's
    ``Connection``, an internal: no public API counts frames)."""
    counts = {"sent": 0, "received": 0}
    send, deliver = Connection.send, Connection.deliver

    def counting_send(self: Connection, body: bytes, out: Any) -> None:
        counts["sent"] += 1
        send(self, body, out)

    def counting_deliver(self: Connection, body: bytes, bufs: Any) -> None:
        counts["received"] += 1
        deliver(self, body, bufs)

    monkeypatch.setattr(Connection, "send", counting_send)
    monkeypatch.setattr(Connection, "deliver", counting_deliver)
    yield counts


async def test_actor_to_actor_calls_bypass_the_controller(
        procs: meshio.ProcMesh, controller_traffic: dict[str, int]) -> None:
    learners = await procs.spawn("learners", Learner)
    gen = await procs.spawn("gen", Gen, learners)
    g0 = gen.slice(procs=0)
    l1_addr = await learners.slice(procs=1).where.call_one()
    g0_addr = await g0.my_addr.call_one()
    assert l1_addr != g0_addr

    before = dict(controller_traffic)
    # gen rank 0 calls both learners, 40 times
    for x in range(20):
        assert await g0.go.call_one(x=x) == [2 * x, 2 * x]
    assert await g0.via.call_one(learners.slice(procs=1), 1) == 2
    # the controller saw its 21 calls and 21 replies, nothing of the 42 inner calls
    assert controller_traffic["sent"] - before["sent"] == 21
    assert controller_traffic["received"] - before["received"] == 21

    # and gen's worker holds a direct connection to the learner's worker
    assert l1_addr in await g0.conns.call_one()
