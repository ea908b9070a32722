"""A tensor of a ``torch.Tensor`` subclass arrives as its class, as pickle
and Ray send it: a ``torch.nn.Parameter`` as a ``Parameter`` (its
``requires_grad`` kept), another subclass with its attributes; still sent as
its bytes, out of band, and by identity (tied parameters stay tied)."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import torch

import meshio
from meshio import Actor, endpoint
from meshio._transport._serial import Packer, TypedDecoder, dumps, loads

GUARD = 60.0


class Tagged(torch.Tensor):
    """A subclass torch pickles as a tensor and its attributes."""

    note: str


class Wrapped(torch.Tensor):
    """A subclass with a pickling of its own: pickled as it says."""

    def __reduce_ex__(self, proto: Any) -> Any:
        return _wrapped, (self.as_subclass(torch.Tensor).tolist(),)


def _wrapped(values: list[float]) -> Wrapped:
    return torch.tensor(values).as_subclass(Wrapped)


def tagged(values: torch.Tensor, note: str) -> Tagged:
    t = values.as_subclass(Tagged)
    t.note = note
    return t


class Holder(Actor):
    @endpoint
    async def kinds(self, v: Any) -> list[tuple[str, bool]]:
        return [(type(x).__name__, bool(x.requires_grad)) for x in v]

    @endpoint
    async def back(self, v: Any) -> Any:
        return v

    @endpoint
    async def typed(self, p: torch.nn.Parameter, t: torch.Tensor) -> tuple[str, str, bool]:
        return type(p).__name__, type(t).__name__, p is t

    @endpoint
    async def tied(self, state: dict[str, Any]) -> tuple[bool, str, float]:
        state["emb"].data[0, 0] = 7.0  # written through one, read through the other
        return (state["emb"] is state["head"], type(state["emb"]).__name__,
                float(state["head"][0, 0]))

    @endpoint
    async def parameters(self, n: int) -> Any:
        model = torch.nn.Linear(n, 2)
        model.bias = model.weight  # type: ignore[assignment]  # (tied: one Parameter twice)
        return model.state_dict(keep_vars=True), list(model.parameters())


def round_trip(value: Any, tp: Any = Any) -> Any:
    packer = Packer()
    body = packer.pack(value, False if tp is Any else True)
    return TypedDecoder(tp).decode(body, [bytearray(b) for b, _ in packer])


def wire_bytes(value: Any) -> int:
    packer = Packer()
    packer.pack(value, False)
    return sum(memoryview(b).nbytes for b, _ in packer)


async def test_a_parameter_arrives_as_a_parameter(procs: meshio.ProcMesh) -> None:
    h = (await procs.spawn("h", Holder)).slice(procs=0)
    p = torch.nn.Parameter(torch.ones(3))
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    assert await asyncio.wait_for(h.kinds.call_one([p, frozen, p.data]), GUARD) == [
        ("Parameter", True), ("Parameter", False), ("Tensor", False)]
    a, b = await asyncio.wait_for(h.back.call_one([p, p]), GUARD)
    assert type(a) is torch.nn.Parameter and a is b and a.requires_grad and a.is_leaf
    assert torch.equal(a, p)
    assert await asyncio.wait_for(h.typed.call_one(p, p), GUARD) == (
        "Parameter", "Parameter", True)


async def test_tied_parameters_stay_tied(procs: meshio.ProcMesh) -> None:
    h = (await procs.spawn("h", Holder)).slice(procs=0)
    w = torch.nn.Parameter(torch.zeros(3, 2))
    state = {"emb": w, "head": w}
    assert await asyncio.wait_for(h.tied.call_one(state), GUARD) == (True, "Parameter", 7.0)
    sd, params = await asyncio.wait_for(h.parameters.call_one(4), GUARD)
    assert sd["weight"] is sd["bias"] is params[0]
    assert type(params[0]) is torch.nn.Parameter and params[0].shape == (2, 4)


async def test_a_subclass_arrives_as_its_class(procs: meshio.ProcMesh) -> None:
    h = (await procs.spawn("h", Holder)).slice(procs=0)
    t = tagged(torch.arange(4.0), "mine")
    w = torch.tensor([1.0, 2.0]).as_subclass(Wrapped)
    a, b, c = await asyncio.wait_for(h.back.call_one([t, t, w]), GUARD)
    assert type(a) is Tagged and a is b and a.note == "mine" and torch.equal(a, t)
    assert type(c) is Wrapped and torch.equal(c.as_subclass(torch.Tensor), torch.tensor([1.0, 2.0]))


def test_in_process_parameters_keep_class_identity_and_storage() -> None:
    p = torch.nn.Parameter(torch.arange(6.0))
    q = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    q.shard = 3  # type: ignore[attr-defined]  # an attribute, as pickle keeps it
    a, b, c, d = round_trip([p, p, q, p.data[2:]])
    assert type(a) is type(c) is torch.nn.Parameter and a is b
    assert a.requires_grad and a.is_leaf and not c.requires_grad
    assert c.shard == 3  # type: ignore[attr-defined]
    assert type(d) is torch.Tensor  # (.data is a plain tensor) viewing a's storage
    d[0] = -1.0
    assert a[2] == -1.0
    assert wire_bytes([p, p, q]) == p.nbytes + q.nbytes  # its bytes, out of band, once
    (one,) = round_trip([p])
    assert type(one) is torch.nn.Parameter and torch.equal(one, p)


def test_in_process_subclasses_typed_and_untyped() -> None:
    t = tagged(torch.arange(3.0), "x")
    for value in (round_trip(t), round_trip(t, torch.Tensor), round_trip({"k": (t,)})["k"][0]):
        assert type(value) is Tagged and value.note == "x" and torch.equal(value, t)
    p = torch.nn.Parameter(torch.ones(2))
    assert type(round_trip(p, torch.nn.Parameter)) is torch.nn.Parameter
    assert type(round_trip(p, torch.Tensor)) is torch.nn.Parameter
    w = torch.tensor([3.0]).as_subclass(Wrapped)
    assert type(round_trip(w)) is Wrapped


def test_a_blob_keeps_the_class() -> None:
    p = torch.nn.Parameter(torch.ones(2))
    t = tagged(torch.ones(2), "b")
    a, b, c = loads(dumps([p, p, t]), [], 0)
    assert type(a) is torch.nn.Parameter and a is b and a.requires_grad
    assert type(c) is Tagged and c.note == "b"
    assert [type(x) for x in pickle.loads(pickle.dumps([p, t]))] == [type(a), type(c)]
