"""A message keeps the identity of its tensors, as pickle and Ray do: the
same tensor held twice arrives as one object (sent once), and tensors that
view one storage arrive as views of one storage (tied weights stay tied)."""

from __future__ import annotations

import asyncio
from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import meshio
from meshio import Actor, endpoint
from meshio._transport._serial import Packer, TypedDecoder

GUARD = 60.0


class Keeper(Actor):
    @endpoint
    async def same(self, pair: Any) -> bool:
        return bool(pair[0] is pair[1])

    @endpoint
    async def same_args(self, a: Any, b: torch.Tensor) -> bool:
        return a is b

    @endpoint
    async def twice(self, n: int) -> Any:
        t = torch.arange(float(n))
        return [[t, t], (t,), {"again": t}]  # (the tuple travels pickled, apart)

    @endpoint
    async def tied(self, state: dict[str, torch.Tensor]) -> tuple[bool, bool, float]:
        state["emb"][0, 0] = 7.0  # written through one, read through the other
        return (state["emb"] is state["head"], state["emb"] is state["other"],
                float(state["head"][0, 0]))

    @endpoint
    async def write_view(self, pair: Any) -> float:
        base, view = pair
        view[0] = 100.0
        return float(base[2])

    @endpoint
    async def views(self) -> Any:
        x = torch.arange(6.0)
        return x, x.view(2, 3), x[3:]


def wire_bytes(value: Any) -> int:
    """The out-of-band bytes ``value`` takes in one message, untyped."""
    packer = Packer()
    packer.pack(value, False)
    return sum(memoryview(b).nbytes for b, _ in packer)


def round_trip(value: Any) -> Any:
    packer = Packer()
    body = packer.pack(value, False)
    return TypedDecoder(Any).decode(body, [bytearray(b) for b, _ in packer])


async def test_the_same_tensor_twice_in_an_argument_arrives_once(
        procs: meshio.ProcMesh) -> None:
    k = (await procs.spawn("k", Keeper)).slice(procs=0)
    t = torch.ones(4)
    assert await asyncio.wait_for(k.same.call_one([t, t]), GUARD) is True
    assert await asyncio.wait_for(k.same.call_one({0: t, 1: t}), GUARD) is True  # (pickled)
    assert await asyncio.wait_for(k.same_args.call_one(t, t), GUARD) is True
    assert await asyncio.wait_for(k.same.call_one([t, t.clone()]), GUARD) is False


async def test_the_same_tensor_twice_in_a_result_arrives_once(procs: meshio.ProcMesh) -> None:
    k = (await procs.spawn("k", Keeper)).slice(procs=0)
    (a, b), (c,), d = await asyncio.wait_for(k.twice.call_one(5), GUARD)
    assert a is b is c is d["again"]
    assert torch.equal(a, torch.arange(5.0))


async def test_tied_weights_in_a_state_dict_stay_tied(procs: meshio.ProcMesh) -> None:
    k = (await procs.spawn("k", Keeper)).slice(procs=0)
    w = torch.zeros(3, 2)
    state = {"emb": w, "head": w, "other": torch.zeros(3, 2)}
    assert await asyncio.wait_for(k.tied.call_one(state), GUARD) == (True, False, 7.0)
    assert wire_bytes(state) == 2 * w.nbytes  # the tied one once


async def test_a_view_and_its_base_share_memory_on_arrival(procs: meshio.ProcMesh) -> None:
    k = (await procs.spawn("k", Keeper)).slice(procs=0)
    x = torch.arange(6.0)
    assert await asyncio.wait_for(k.write_view.call_one([x, x[2:]]), GUARD) == 100.0
    assert x[2] == 2.0  # (the sender's own tensor is not written)
    base, grid, tail = await asyncio.wait_for(k.views.call_one(), GUARD)
    grid[1, 0] = -1.0
    assert base[3] == -1.0 and tail[0] == -1.0
    assert grid.shape == (2, 3) and tail.shape == (3,)


def test_bytes_on_the_wire_are_not_doubled() -> None:
    t = torch.ones(1024)
    assert wire_bytes([t, t]) == wire_bytes([t]) == t.nbytes
    assert wire_bytes({"a": t, "b": (t,)}) == t.nbytes
    x = torch.ones(8, 16)
    assert wire_bytes([x, x[2:], x.t()]) == x.nbytes
    assert wire_bytes([x[4:]]) == x[4:].nbytes  # a slice alone: its own elements only


def test_views_of_other_dtypes_and_layouts_keep_their_values() -> None:
    x = torch.arange(24, dtype=torch.float32).view(4, 6)
    value = [x[:, 1::2], x.view(torch.int32)[1:], x.t(), x.to(torch.bfloat16),
             torch.tensor(3.0).requires_grad_(), x[1, 1:2].view(torch.uint8)[1:]]
    out = round_trip(value)
    for sent, got in zip(value, out, strict=True):
        assert got.dtype == sent.dtype and got.shape == sent.shape
        assert got.requires_grad == sent.requires_grad
        assert torch.equal(got.detach(), sent.detach())
    assert out[0].untyped_storage().data_ptr() == out[2].untyped_storage().data_ptr()


#: each value is a tensor from a small pool: the same object, a view of one
#: (slice, transpose, reshape, another dtype) or a tensor of its own
_BASES = [torch.arange(12.0).view(3, 4), torch.arange(5, dtype=torch.int64), torch.ones(0)]


def _make(base: int, how: int) -> Any:
    b = _BASES[base]
    if b.numel() == 0:
        return b
    views = [lambda: b, lambda: b[1:], lambda: b.flatten()[::2], lambda: b.clone(),
             lambda: b.view(torch.int32) if b.dtype == torch.float32 else b[:1]]
    return views[how]()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4)), min_size=1, max_size=6),
       st.lists(st.integers(0, 5), max_size=4), st.sampled_from(["list", "tuple", "dict"]))
def test_identity_and_sharing_round_trip(picks: list[tuple[int, int]], again: list[int],
                                         kind: str) -> None:
    made = [_make(base, how) for base, how in picks]
    items = made + [made[i % len(made)] for i in again]  # some held twice
    value: Any = (items if kind == "list" else tuple(items) if kind == "tuple"
                  else {str(i): t for i, t in enumerate(items)})
    out = round_trip(value)
    got = list(out.values()) if kind == "dict" else list(out)
    assert len(got) == len(items)
    for sent, arrived in zip(items, got, strict=True):
        assert arrived.dtype == sent.dtype and torch.equal(arrived, sent)
    for i, a in enumerate(items):
        for j, b in enumerate(items):
            assert (got[i] is got[j]) == (a is b)
            if a.numel() and b.numel():
                shared = a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
                assert (got[i].untyped_storage().data_ptr()
                        == got[j].untyped_storage().data_ptr()) == shared
