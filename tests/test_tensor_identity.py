"""A message keeps the identity of its tensors and NumPy arrays, as pickle
and Ray do: the same tensor or array held twice arrives as one object (sent
once), and tensors that view one storage arrive as views of one storage
(tied weights stay tied)."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import numpy as np
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
    async def same_arrays(self, a: Any, b: np.ndarray[Any, Any]) -> bool:
        return a is b

    @endpoint
    async def arrays(self, n: int) -> Any:
        a = np.arange(float(n))
        return [[a, a], {"again": a}, np.arange(float(n))]

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


async def test_the_same_array_twice_arrives_once(procs: meshio.ProcMesh) -> None:
    k = (await procs.spawn("k", Keeper)).slice(procs=0)
    a = np.ones(4)
    assert await asyncio.wait_for(k.same.call_one([a, a]), GUARD) is True
    assert await asyncio.wait_for(k.same.call_one({0: a, 1: a}), GUARD) is True  # (pickled)
    assert await asyncio.wait_for(k.same_arrays.call_one(a, a), GUARD) is True
    assert await asyncio.wait_for(k.same.call_one([a, a.copy()]), GUARD) is False
    (b, c), d, e = await asyncio.wait_for(k.arrays.call_one(5), GUARD)
    assert b is c is d["again"] and e is not b
    assert np.array_equal(b, np.arange(5.0)) and np.array_equal(e, b)


class Busy(Actor):
    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    @endpoint
    async def hold(self) -> None:
        await self.go.wait()

    @endpoint(concurrent=True)
    async def release(self) -> None:
        self.go.set()

    @endpoint
    async def same(self, a: Any, b: torch.Tensor, pair: Any) -> bool:
        return a is b and pair[0] is pair[1] is a

    @endpoint
    async def same_arrays(self, a: Any, b: np.ndarray[Any, Any], pair: Any) -> bool:
        return a is b and pair[0] is pair[1] is a


async def test_calls_queued_together_each_keep_their_identity(procs: meshio.ProcMesh) -> None:
    # Calls queued in a mailbox behind a busy one are decoded as they come
    # and again as they run, frames of others in between: each finds its own.
    k = (await procs.spawn("busy", Busy)).slice(procs=0)
    held = k.hold.call_one()
    t, u, a, b = torch.arange(4.0), torch.arange(6.0), np.arange(4.0), np.arange(6.0)
    queued = [k.same.call_one(t, t, [t, t]), k.same_arrays.call_one(a, a, [a, a]),
              k.same.call_one(u, u, [u, u]), k.same_arrays.call_one(b, b, [b, b])]
    await asyncio.wait_for(k.release.call_one(), GUARD)  # (sent after them: they queued)
    await asyncio.wait_for(held, GUARD)
    assert await asyncio.wait_for(asyncio.gather(*queued), GUARD) == [True] * 4


def test_an_array_held_twice_is_sent_once() -> None:
    a = np.ones(1024)
    assert wire_bytes([a, a]) == wire_bytes({"x": a, "y": a}) == wire_bytes([a]) == a.nbytes
    assert wire_bytes([a, a.copy()]) == 2 * a.nbytes
    t = torch.ones(16)
    out = round_trip({"a": a, "t": t, "again": [t, a], "other": np.zeros(3)})
    assert out["a"] is out["again"][1] and out["t"] is out["again"][0]
    assert np.array_equal(out["a"], a) and np.array_equal(out["other"], np.zeros(3))


def test_decoding_leaves_the_buffers_as_they_came() -> None:
    x, a = torch.arange(6.0), np.arange(3.0)
    packer = Packer()
    body = packer.pack([x, x[2:], x, a, a], False)
    bufs = [bytearray(b) for b, _ in packer]
    before = list(bufs)
    out = TypedDecoder(Any).decode(body, bufs)
    assert len(bufs) == len(before) and all(b is c for b, c in zip(bufs, before, strict=True))
    assert out[0] is out[2] and out[3] is out[4]
    again = TypedDecoder(Any).decode(body, bufs)  # (the same frame decoded again)
    assert again[0] is out[0] and again[3] is out[3]
    out[1][0] = -1.0  # views of one storage still
    assert out[0][2] == -1.0


class Received(bytearray):
    """A received buffer whose freeing a test can see (a weak reference)."""


def test_the_buffers_are_freed_with_what_was_made_of_them() -> None:
    x, a = torch.arange(6.0), np.arange(3.0)
    packer = Packer()
    body = packer.pack([x, x[2:], a, a], False)
    bufs = [Received(b) for b, _ in packer]
    freed = [weakref.ref(b) for b in bufs]
    out = TypedDecoder(Any).decode(body, bufs)
    del bufs
    assert all(r() is not None for r in freed)  # (the tensors view them)
    del out
    assert all(r() is None for r in freed)
