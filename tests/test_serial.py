"""Serialisation: tensors, big buffers, untyped Python values and typed,
validated values through real worker processes; out-of-band packing
(``meshio._transport._serial.Packer``) and the frame parser
(``meshio._transport._connection.Connection``) as units."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import random
import struct
import typing
from collections.abc import AsyncIterator
from typing import Any
from unittest import mock

import msgspec
import numpy as np
import pytest
import pytest_asyncio
import torch
from hypothesis import given
from hypothesis import strategies as st

import meshio
from fuzz import FUZZ
from meshio import Actor, ActorMesh, endpoint
from meshio._transport import _messages as M
from meshio._transport import _pool
from meshio._transport._connection import Connection
from meshio._transport._frames import MAX_BUFS, frame_header
from meshio._transport._serial import (
    EXT_BUFFER,
    EXT_TENSOR,
    KIND_ASCII,
    KIND_BUFFER,
    KIND_BYTEARRAY,
    KIND_BYTES,
    OOB_THRESHOLD,
    Packer,
    TypedDecoder,
    _to_host,
    dumps,
    hands_port,
    loads,
)
from meshio.endpoints._schema import Schema

#: async tests share the module's event loop (and its worker process)
LOOP = pytest.mark.asyncio(loop_scope="module")

DEADLINE = 60.0
MiB = 1 << 20
MAX_BUFS_PLUS = MAX_BUFS + 1


# -------------------------------------------------------------- value types


@dataclasses.dataclass
class Pt:
    x: int
    y: float


@dataclasses.dataclass(frozen=True)
class Tagged:
    """Hashable, so it can live in a set."""

    name: str
    n: int


class Custom:
    def __init__(self, a: Any, b: Any) -> None:
        self.a = a
        self.b = b

    def __eq__(self, other: object) -> bool:
        return type(other) is Custom and (self.a, self.b) == (other.a, other.b)

    __hash__ = None  # type: ignore[assignment]


class Cfg(msgspec.Struct):
    lr: float
    layers: list[int]
    name: str = "cfg"


class Store(Actor):
    # ---- tensors
    @endpoint
    async def tensor(self, t: torch.Tensor) -> torch.Tensor:
        return t

    @endpoint
    async def describe(self, t: torch.Tensor) -> tuple[str, list[int], Any]:
        return str(t.dtype), list(t.shape), t.tolist()

    @endpoint
    async def make(self, dtype: str, n: int) -> torch.Tensor:
        base = torch.arange(n * 6).reshape(n, 6)
        return base.to(getattr(torch, dtype)).t()[1:, ::2]  # non-contiguous result

    @endpoint
    async def device_of(self, t: torch.Tensor) -> str:
        return str(t.device)

    @endpoint
    async def writable_sum(self, t: torch.Tensor) -> float:
        t.add_(1)  # received tensors are writable, in place
        return float(t.sum())

    # ---- buffers
    @endpoint
    async def bytes_(self, b: bytes) -> bytes:
        return b

    @endpoint
    async def memoryview_(self, m: memoryview) -> memoryview:
        return m

    @endpoint
    async def bytearray_(self, b: bytearray) -> bytearray:
        b[0] ^= 0xFF  # writable on arrival
        return b

    @endpoint
    async def types_of(self, v: Any) -> str:
        return type(v).__name__

    # ---- untyped
    @endpoint
    async def anything(self, v):  # type: ignore[no-untyped-def]
        return v

    @endpoint
    async def anything_any(self, v: Any) -> Any:
        return v

    @endpoint
    async def length(self, s: str) -> int:
        return len(s)

    @endpoint
    async def type_name(self, v):  # type: ignore[no-untyped-def]
        return f"{type(v).__module__}.{type(v).__qualname__}"

    # ---- typed
    @endpoint
    async def ints(self, xs: list[int]) -> int:
        assert all(type(x) is int for x in xs)
        return sum(xs)

    @endpoint
    async def floats(self, d: dict[str, float]) -> dict[str, float]:
        assert all(type(v) is float for v in d.values())
        return {k: v * 2 for k, v in d.items()}

    @endpoint
    async def cfg(self, c: Cfg) -> Cfg:
        assert type(c) is Cfg
        return Cfg(lr=c.lr / 10, layers=[*c.layers, 0], name=c.name.upper())

    @endpoint
    async def point(self, p: Pt) -> Pt:
        assert type(p) is Pt
        return Pt(p.x + 1, p.y * 2)

    @endpoint
    async def bad_result(self) -> int:
        return "not an int"  # type: ignore[return-value]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def store() -> AsyncIterator[ActorMesh[Store]]:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name="serial") as pm:
        yield await pm.spawn("store", Store)  # type: ignore[misc]


def call(mesh: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    return asyncio.wait_for(getattr(mesh, name).call_one(*args, **kwargs), DEADLINE)


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert type(b) is torch.Tensor
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a, b)


# ------------------------------------------------------------- tensors e2e

TENSORS = {
    "float32": torch.linspace(-3, 3, 24, dtype=torch.float32).reshape(2, 3, 4),
    "int64": torch.arange(-5, 7, dtype=torch.int64) * (1 << 40),
    "bool": torch.tensor([True, False, True, True]).reshape(2, 2),
    "bfloat16": torch.tensor([1.5, -2.25, 3e38, 1e-3], dtype=torch.bfloat16),
    "float64-0dim": torch.tensor(3.25, dtype=torch.float64),
    "int8-0dim": torch.tensor(-7, dtype=torch.int8),
    "empty": torch.empty(0, dtype=torch.float32),
    "empty-2d": torch.empty(3, 0, dtype=torch.int32),
    "transposed": torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),
    "strided-slice": torch.arange(100, dtype=torch.int64).reshape(10, 10)[1:9:3, ::4],
    "expanded": torch.tensor([1.0, 2.0]).expand(3, 2),
    "offset-view": torch.arange(50, dtype=torch.int16)[17:29],
    "complex64": torch.tensor([1 + 2j, -3.5j], dtype=torch.complex64),
    "uint8": torch.arange(256, dtype=torch.uint8),
    "float16": torch.tensor([[0.5, -1.0], [65504.0, 0.0]], dtype=torch.float16),
    # lazy views: their storage holds other values than they show
    "conj-view": torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj(),
    "neg-view": torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj().imag,
}


@pytest.mark.parametrize("name", list(TENSORS))
@LOOP
async def test_tensor_round_trip(store: ActorMesh[Store], name: str) -> None:
    t = TENSORS[name]
    before = t.clone()
    back = await call(store, "tensor", t)
    same(t, back)
    dtype, shape, values = await call(store, "describe", t)
    assert dtype == str(t.dtype) and shape == list(t.shape)
    assert values == t.tolist()
    same(before, t)  # the argument is untouched


@LOOP
async def test_tensor_untyped_and_nested(store: ActorMesh[Store]) -> None:
    a, b = TENSORS["transposed"], TENSORS["bfloat16"]
    back = await call(store, "anything", {"a": a, "nested": [b, (a, 1)]})
    same(a, back["a"])
    same(b, back["nested"][0])
    assert type(back["nested"][1]) is tuple
    same(a, back["nested"][1][0])


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "bfloat16"])
@LOOP
async def test_non_contiguous_tensor_result(store: ActorMesh[Store], dtype: str) -> None:
    expected = torch.arange(4 * 6).reshape(4, 6).to(getattr(torch, dtype)).t()[1:, ::2]
    same(expected, await call(store, "make", dtype, 4))


@LOOP
async def test_received_tensor_is_writable_and_separate(store: ActorMesh[Store]) -> None:
    t = torch.ones(1000)
    assert await call(store, "writable_sum", t) == 2000.0
    assert float(t.sum()) == 1000.0  # the caller's tensor was not touched


@LOOP
async def test_large_tensor_round_trip(store: ActorMesh[Store]) -> None:
    t = torch.randn(1024, 1024 * 2)  # 8 MiB
    same(t, await call(store, "tensor", t))


@pytest.mark.parametrize("size", [3, 1 << 20])  # in the message; beside it (8 MiB)
@LOOP
async def test_lazy_views_and_gradients_travel_as_they_read(
        store: ActorMesh[Store], size: int) -> None:
    """A conjugate or negative view arrives with the values it shows, not
    its storage's; a leaf that requires grad arrives as one (as pickle, and
    so Ray and Monarch, keep it), a tensor computed from one as a leaf; a
    sparse tensor arrives sparse.  Typed and untyped."""
    z = torch.complex(torch.arange(size, dtype=torch.float32), torch.ones(size))
    w = torch.arange(size, dtype=torch.float64, requires_grad=True)
    sparse = torch.zeros(4, size).index_fill_(1, torch.tensor([1, size - 1]), 2.5).to_sparse()
    for name in ("tensor", "anything"):
        for sent in (z.conj(), z.conj().imag):
            same(sent.resolve_conj().resolve_neg(), await call(store, name, sent))
        for sent in (w, w * 2):
            back = await call(store, name, sent)
            assert back.requires_grad and back.is_leaf
            same(sent.detach(), back.detach())
        back = await call(store, name, sparse)
        assert back.layout is torch.sparse_coo and torch.equal(back.to_dense(), sparse.to_dense())
    assert not (await call(store, "tensor", z)).requires_grad


# ------------------------------------------------------------ GPU tensors

#: the CUDA tests run where torch sees a GPU (a CPU-only machine skips them;
#: what arrives there from a GPU is tested below without one)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


@CUDA
@LOOP
async def test_cuda_tensor_arrives_on_its_device(store: ActorMesh[Store]) -> None:
    """A CUDA tensor is rebuilt on the same device where it arrives, as an
    argument and as a result, non-contiguous and nested too: an endpoint
    computes with its model on the GPU without a ``.cuda()``."""
    t = torch.arange(48, dtype=torch.bfloat16, device="cuda").reshape(6, 8).t()[::2]
    assert await call(store, "device_of", t) == "cuda:0"
    back = await call(store, "tensor", t)
    assert back.device == t.device and back.dtype == t.dtype and back.shape == t.shape
    assert torch.equal(back, t)
    nested = await call(store, "anything", {"w": [t, torch.ones(3)]})
    assert nested["w"][0].device == t.device and torch.equal(nested["w"][0], t)
    assert nested["w"][1].device.type == "cpu"
    pickled = await call(store, "anything", Custom(t, 1))  # a tensor in a pickle
    assert pickled.a.device == t.device and torch.equal(pickled.a, t)
    big = torch.randn(4096, 4096, device="cuda")  # 64 MiB: the same-host path
    assert torch.equal(await call(store, "tensor", big), big)


@CUDA
@LOOP
async def test_cuda_tensor_arrives_on_the_cpu_where_there_is_no_gpu() -> None:
    """A process that sees no GPU (``CUDA_VISIBLE_DEVICES`` empty: a CPU
    controller, a data-loading worker) gets a CUDA tensor on the CPU."""
    async with meshio.this_host().spawn_procs(
            per_host={"procs": 1}, env={"CUDA_VISIBLE_DEVICES": ""}, name="no_gpu") as pm:
        cpu_only = await pm.spawn("cpu_only", Store)
        t = torch.arange(10, dtype=torch.float32, device="cuda")
        assert await call(cpu_only, "device_of", t) == "cpu"
        back = await call(cpu_only, "tensor", t)  # a CPU tensor goes back as one
        assert back.device.type == "cpu" and torch.equal(back, t.cpu())


@CUDA
@LOOP
async def test_gpu_copies_go_through_pinned_pooled_memory(store: ActorMesh[Store]) -> None:
    """The pooled memory a GPU copies through is registered with CUDA
    (page-locked: the copy runs at the bus's speed), once: the block keeps
    it idle in the pool, and a block closed goes back unregistered."""
    view = _pool.pool_view(4 * MiB)
    host = torch.frombuffer(view, dtype=torch.uint8)
    assert not host.is_pinned()
    _pool.pin_for_cuda(view)
    assert host.is_pinned()
    block = _pool._block_of(view)
    del host, view
    again = _pool.pool_view(4 * MiB)  # the idle block, still registered
    assert _pool._block_of(again) is block
    assert torch.frombuffer(again, dtype=torch.uint8).is_pinned()
    del again
    big = torch.randn(4096, 4096, device="cuda")  # 64 MiB: sent and received in pooled memory
    assert torch.equal(await call(store, "tensor", big), big)
    pool = _pool._pool
    assert any(b.pinned and b.size >= 64 * MiB for b in [*pool.idle, *pool.returned])
    own = _pool._Pool()  # a block closed (over the idle cap) is unregistered first
    view = own.view(2 * MiB)
    _pool.pin_for_cuda(view)
    block = _pool._block_of(view)
    del view
    own.returned.popleft().close()
    assert block.map.closed
    assert torch.equal(big * 2, big + big)  # CUDA has no error pending


@CUDA
def test_a_registration_cuda_refuses_leaves_no_error_behind() -> None:
    """A block CUDA will not register stays pageable, and the error CUDA
    keeps pending for it does not surface in the next kernel launch."""
    view = _pool.pool_view(2 * MiB)
    _pool.pin_for_cuda(view)
    block = _pool._block_of(view)
    block.pinned = False  # registering it again: CUDA refuses (already registered)
    _pool.pin_for_cuda(view)
    assert not block.pinned
    block.pinned = True  # (it is: it goes back to the pool so)
    t = torch.ones(8, device="cuda")
    assert (t * 2).sum().item() == 16.0


def test_pinning_leaves_other_memory_alone() -> None:
    """Memory that is not a pooled block, or a block under the threshold,
    is not registered (on this CPU build, registering at all would raise)."""
    _pool.pin_for_cuda(bytearray(8 * MiB))
    _pool.pin_for_cuda(memoryview(bytearray(8 * MiB)))
    small = _pool.pool_view(64 * 1024)
    _pool.pin_for_cuda(small)
    assert not _pool._block_of(small).pinned


@pytest.mark.parametrize("name", list(TENSORS))
def test_a_device_tensor_goes_through_pooled_memory(name: str) -> None:
    """What a GPU tensor is copied into to travel (``_to_host``; run here on
    CPU tensors of every shape and dtype above): contiguous, equal, and
    pooled memory that goes back to the pool once dropped."""
    t = TENSORS[name]
    host = _to_host(t)
    assert host.is_contiguous() and host.dtype == t.dtype and host.shape == t.shape
    assert torch.equal(host, t)
    if t.numel():
        assert host.data_ptr() != t.data_ptr()
        returned = len(_pool._pool.returned)
        del host
        assert len(_pool._pool.returned) == returned + 1


def tensor_from(device: str, values: list[float]) -> tuple[bytes, list[Any]]:
    """A tensor as a process on ``device`` sends it: its body and buffers."""
    data = struct.pack(f"<{len(values)}f", *values)
    ref = msgspec.msgpack.encode(("torch.float32", [len(values)], [1], 0, device))
    return msgspec.msgpack.encode(msgspec.msgpack.Ext(EXT_TENSOR, ref)), [bytearray(data)]


@pytest.mark.parametrize("device", ["cuda:0", "cuda:7", "mps", "xpu:1"])
@pytest.mark.parametrize("tp", [Any, torch.Tensor])
def test_tensor_from_a_device_this_process_lacks_arrives_on_the_cpu(device: str, tp: Any) -> None:
    body, bufs = tensor_from(device, [1.5, -2.0, 3.25])
    here = torch.device(device)
    backend = getattr(torch, here.type)
    if backend.is_available() and (here.index or 0) < backend.device_count():
        pytest.skip(f"this process has {device}")
    t = TypedDecoder(tp).decode(body, bufs)
    assert t.device.type == "cpu" and t.tolist() == [1.5, -2.0, 3.25]


def test_tensor_from_an_unknown_device_is_a_clear_error() -> None:
    body, bufs = tensor_from("warp:7", [1.0])
    with pytest.raises(ValueError, match="unknown tensor device 'warp:7'"):
        TypedDecoder(torch.Tensor).decode(body, bufs)


# ------------------------------------------------------------ buffers e2e


@LOOP
async def test_large_bytes_round_trip(store: ActorMesh[Store]) -> None:
    data = random.Random(1).randbytes(8 * MiB)
    back = await call(store, "bytes_", data)
    assert type(back) is bytes and back == data
    assert await call(store, "types_of", data) == "bytes"


@LOOP
async def test_large_bytearray_round_trip(store: ActorMesh[Store]) -> None:
    data = bytearray(random.Random(2).randbytes(8 * MiB))
    back = await call(store, "bytearray_", data)
    assert type(back) is bytearray
    assert back[0] == data[0] ^ 0xFF and back[1:] == data[1:]
    assert await call(store, "types_of", data) == "bytearray"


@LOOP
async def test_memoryview_arrives_as_memoryview(store: ActorMesh[Store]) -> None:
    raw = random.Random(3).randbytes(8 * MiB)
    back = await call(store, "anything", memoryview(raw))
    assert type(back) is memoryview and back.tobytes() == raw
    assert await call(store, "types_of", memoryview(raw)) == "memoryview"
    # a non-contiguous view still arrives with the right bytes
    strided = memoryview(raw)[::2]
    back = await call(store, "anything", strided)
    assert type(back) is memoryview and back.tobytes() == raw[::2]


MEMORYVIEWS = {
    "int32-2d": lambda: memoryview(np.arange(8, dtype=np.int32).reshape(2, 4)),
    "float64-3d-strided": lambda: memoryview(
        np.arange(60, dtype=np.float64).reshape(3, 4, 5)[:, ::2]),
    "uint16-large": lambda: memoryview(np.arange(MiB, dtype=np.uint16).reshape(2, -1)),
    "int8-0d": lambda: memoryview(np.array(7, dtype=np.int8)),
    "bytes-empty": lambda: memoryview(b""),
}


@pytest.mark.parametrize("name", list(MEMORYVIEWS))
@LOOP
async def test_a_memoryview_keeps_its_format_and_shape(store: ActorMesh[Store], name: str) -> None:
    """Before, every memoryview arrived flat, of bytes (format 'B')."""
    view = MEMORYVIEWS[name]()
    for name_ in ("anything", "memoryview_"):
        back = await call(store, name_, view)
        assert type(back) is memoryview
        assert (back.format, back.shape, back.tobytes()) == (
            view.format, view.shape, view.tobytes())


@given(fmt=st.text(max_size=4), shape=st.lists(st.integers(-2, 40), max_size=4),
       size=st.integers(0, 48))
@FUZZ
def test_any_memoryview_reference_decodes_or_is_refused(
        fmt: str, shape: list[int], size: int) -> None:
    """A peer's memoryview reference (format, shape) that does not fit its
    bytes is refused with an error naming both; one that fits decodes."""
    ref = msgspec.msgpack.encode((0, 2, fmt, shape))
    body = msgspec.msgpack.encode(msgspec.msgpack.Ext(EXT_BUFFER, ref))
    try:
        view = TypedDecoder(Any).decode(body, [bytearray(size)])
    except (ValueError, meshio.SchemaError) as e:
        assert "memoryview of format" in str(e)
    else:
        assert view.nbytes == size and view.shape == tuple(shape)


@pytest.mark.parametrize("size", [0, 1, OOB_THRESHOLD - 1, OOB_THRESHOLD, OOB_THRESHOLD + 1])
@LOOP
async def test_bytes_around_threshold_keep_type(store: ActorMesh[Store], size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    back = await call(store, "anything", (data, bytearray(data)))
    assert type(back) is tuple
    assert type(back[0]) is bytes and back[0] == data
    assert type(back[1]) is bytearray and back[1] == data


# ------------------------------------------------------------ untyped e2e


@LOOP
async def test_untyped_keeps_python_types(store: ActorMesh[Store]) -> None:
    value = {
        "tuple": (1, "two", (3.0, None)),
        "set": {1, 2, 3},
        "frozenset": frozenset({"a"}),
        "custom": Custom([1, 2], {"k": (1,)}),
        "dataclass": Pt(1, 2.5),
        "tagged_set": {Tagged("a", 1), Tagged("b", 2)},
        "int_keys": {1: "one", (2, 3): "tuple key"},
        "complex": 1 + 2j,
        "big_int": 1 << 100,
        "list": [1, [2, (3,)]],
    }
    for name in ("anything", "anything_any"):
        back = await call(store, name, value)
        assert back == value
        for k, v in value.items():
            assert type(back[k]) is type(v), k
        assert type(back["tuple"][2]) is tuple
        assert type(back["list"][1][1]) is tuple


@LOOP
async def test_untyped_types_seen_by_the_actor(store: ActorMesh[Store]) -> None:
    assert await call(store, "type_name", (1, 2)) == "builtins.tuple"
    assert await call(store, "type_name", {1}) == "builtins.set"
    assert await call(store, "type_name", Pt(1, 2.0)) == f"{Pt.__module__}.Pt"
    assert await call(store, "type_name", Custom(1, 2)) == f"{Custom.__module__}.Custom"


# -------------------------------------------------------------- typed e2e


@LOOP
async def test_typed_list_of_int(store: ActorMesh[Store]) -> None:
    assert await call(store, "ints", [1, 2, 3]) == 6
    assert await call(store, "ints", []) == 0
    with pytest.raises(meshio.SchemaError) as info:
        await call(store, "ints", [1, "2", 3])
    assert "$.xs[1]" in str(info.value)
    with pytest.raises(meshio.SchemaError):
        await call(store, "ints", {"not": "a list"})


@LOOP
async def test_typed_dict_str_float(store: ActorMesh[Store]) -> None:
    assert await call(store, "floats", {"a": 1.5, "b": 2}) == {"a": 3.0, "b": 4.0}
    with pytest.raises(meshio.SchemaError) as info:
        await call(store, "floats", {"a": "x"})
    assert "$.d" in str(info.value)


@LOOP
async def test_typed_struct(store: ActorMesh[Store]) -> None:
    back = await call(store, "cfg", Cfg(lr=0.5, layers=[4, 8]))
    assert back == Cfg(lr=0.05, layers=[4, 8, 0], name="CFG")
    with pytest.raises(meshio.SchemaError) as info:
        await call(store, "cfg", Cfg(lr=0.5, layers=["x"]))  # type: ignore[list-item]
    assert "$.c.layers[0]" in str(info.value)


@LOOP
async def test_typed_dataclass(store: ActorMesh[Store]) -> None:
    back = await call(store, "point", Pt(2, 3.5))
    assert type(back) is Pt and back == Pt(3, 7.0)
    with pytest.raises(meshio.SchemaError) as info:
        await call(store, "point", Pt("x", 1.0))  # type: ignore[arg-type]
    assert "$.p.x" in str(info.value)
    with pytest.raises(meshio.SchemaError):
        await call(store, "point", {"x": 1})


@LOOP
async def test_bad_result_is_schema_error(store: ActorMesh[Store]) -> None:
    with pytest.raises(meshio.SchemaError) as info:
        await call(store, "bad_result")
    assert "bad_result" in str(info.value)
    assert await call(store, "ints", [5]) == 5  # the actor is fine


def test_a_class_msgspec_decoded_still_pickles_by_value() -> None:
    """msgspec keeps a cache of its own on a dataclass, an enum, a
    NamedTuple or a TypedDict it decoded (``__msgspec_cache__``, which
    cannot be pickled): a class shipped by value (here: defined in a
    function) then failed to pickle ("cannot pickle
    'msgspec._core.DataclassInfo' object")."""

    @dataclasses.dataclass
    class Point:
        x: int

    class Color(enum.Enum):
        RED = 1

    class Row(typing.NamedTuple):
        n: int

    class Doc(typing.TypedDict):
        n: int

    for cls, raw in ((Point, {"x": 1}), (Color, 1), (Row, [1]), (Doc, {"n": 1})):
        value = msgspec.convert(raw, cls)
        assert "__msgspec_cache__" in vars(cls), cls  # (what this test is about)
        for obj in (cls, value, [value]):
            assert loads(dumps(obj), [], 0) == obj
        assert msgspec.convert(raw, loads(dumps(cls), [], 0)) == value


class Opaque:
    """A value msgpack cannot carry: it travels pickled."""

    def __init__(self, n: object) -> None:
        self.n = n


def _refuse(why: str) -> None:
    raise ValueError(why)


class Unpicklable:
    """Travels pickled; its unpickling raises."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _refuse, ("not here",)


class Results:
    def ints(self) -> list[int]:
        raise NotImplementedError

    def one(self) -> int:
        raise NotImplementedError

    def nothing(self) -> None:
        raise NotImplementedError


INTS = Schema(Results.ints, "Results.ints")
ONE = Schema(Results.one, "Results.one")


@FUZZ
@given(value=st.complex_numbers(allow_nan=False) | st.fractions()
       | st.builds(Opaque, st.integers() | st.just(b"o" * OOB_THRESHOLD)),  # (a big pickle:
       #   out of band)
       before=st.integers(0, 3), after=st.integers(0, 2), top=st.booleans())
def test_a_pickled_result_that_does_not_fit_names_its_python_type(
        value: Any, before: int, after: int, top: bool) -> None:
    """A result pickled where the annotation wants no pickle said only
    "Expected `int`, got `ext`": it names the type that arrived, and where."""
    schema, result, where = ((ONE, value, "") if top else
                             (INTS, [0] * before + [value] + [1] * after, f" - at `$[{before}]`"))
    packer = Packer()
    body = schema.pack_result(result, packer)
    bufs = [bytes(memoryview(b)) for b, _ in packer]
    with pytest.raises(meshio.SchemaError) as info:
        schema.unpack_result(body, bufs)
    assert str(info.value) == (f"result of Results.{'one' if top else 'ints'} does not match its "
                               f"annotation: Expected `int`, got `{type(value).__name__}`{where}")


def test_a_pickled_result_that_cannot_be_unpickled_says_why() -> None:
    for schema, result, where in ((ONE, Unpicklable(), ""),
                                  (INTS, [1, Unpicklable()], " - at `$[1]`")):
        packer = Packer()
        body = schema.pack_result(result, packer)
        with pytest.raises(meshio.SchemaError) as info:
            schema.unpack_result(body, [bytes(memoryview(b)) for b, _ in packer])
        assert str(info.value).endswith(
            "Expected `int`, got a pickle, which cannot be unpickled here "
            f"(ValueError: not here){where}"), info.value


@FUZZ
@given(body=st.binary(max_size=256), bufs=st.lists(st.binary(max_size=32), max_size=2))
def test_any_result_bytes_decode_or_are_refused(body: bytes, bufs: list[bytes]) -> None:
    """Naming a pickle's type decodes the result again: any bytes still give
    a value or a SchemaError."""
    for schema in (INTS, ONE, Schema(Results.nothing, "Results.nothing")):
        try:
            schema.unpack_result(body, list(bufs))
        except meshio.SchemaError:
            pass


# ------------------------------------------------------ Packer (unit tests)


def decode_any(body: bytes, out: list[tuple[Any, int]]) -> Any:
    """What a receiver makes of ``body`` with its buffers (copied as the
    wire would)."""
    bufs = [bytes(b) if k == KIND_BYTES else bytearray(b) for b, k in out]
    return TypedDecoder(Any).decode(body, bufs)


@pytest.mark.parametrize("typed", [True, False])
def test_packer_tensor_is_out_of_band(typed: bool) -> None:
    t = torch.randn(256, 1024)  # 1 MiB
    p = Packer()
    body = p.pack(t, typed)
    nbytes = t.numel() * t.element_size()
    assert len(body) < 200 < nbytes
    assert len(p) == 1
    buf, kind = p[0]
    assert kind == KIND_BUFFER
    assert memoryview(buf).nbytes == nbytes
    # the out-of-band buffer *is* the tensor's storage: no copy was made
    assert bytes(memoryview(buf)[:16]) == t.numpy().tobytes()[:16]
    t[0, 0] = 12345.0
    assert bytes(memoryview(buf)[:4]) == struct.pack("<f", 12345.0)
    same(t, decode_any(body, p))


def test_packer_tensor_data_is_never_pickled() -> None:
    t = torch.full((1 << 16,), 7, dtype=torch.int32)
    for value in ({"t": t}, [t, (t,)], Custom(t, 1), (t,)):
        p = Packer()
        body = p.pack(value, False)
        assert len(body) < 4096, type(value)
        assert sum(memoryview(b).nbytes for b, _ in p) >= t.numel() * 4
        back = decode_any(body, p)
        assert back is not None


def test_packer_non_contiguous_tensor() -> None:
    t = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64).t()[::2]
    p = Packer()
    body = p.pack(t, True)
    assert len(body) < 200
    assert memoryview(p[0][0]).nbytes == t.numel() * 4  # only the visible elements
    same(t, decode_any(body, p))


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview"])
@pytest.mark.parametrize("typed", [True, False])
def test_packer_large_buffers_out_of_band_without_copy(kind: str, typed: bool) -> None:
    raw = random.Random(4).randbytes(8 * MiB)
    value: Any = {"bytes": raw, "bytearray": bytearray(raw), "memoryview": memoryview(raw)}[kind]
    p = Packer()
    body = p.pack(value, typed)
    assert len(body) < 64
    assert len(p) == 1
    buf, wire_kind = p[0]
    assert buf is value  # no copy
    assert wire_kind == {"bytes": KIND_BYTES, "bytearray": KIND_BYTEARRAY,
                         "memoryview": KIND_BUFFER}[kind]
    back = decode_any(body, p)
    assert type(back) is type(value)
    assert bytes(back) == raw


def test_packer_small_bytes_inline() -> None:
    p = Packer()
    body = p.pack(b"abc", True)
    assert p == [] and b"abc" in body


def test_packer_pickle_fallback_keeps_tensors_out_of_band() -> None:
    """A tensor held by a custom (pickled) object still goes out of band."""
    t = torch.zeros(1 << 18)  # 1 MiB
    p = Packer()
    body = p.pack(Custom(t, "x"), False)
    assert len(body) < 4096
    assert [memoryview(b).nbytes for b, _ in p] == [1 << 20]
    back = decode_any(body, p)
    assert type(back) is Custom and back.b == "x"
    same(t, back.a)


# --------------------------------------------- frame parser (unit tests)


class Recorder(Connection):
    """A Connection with no socket: frames delivered are recorded."""

    def __init__(self) -> None:
        # a runtime whose timers never fire (and no actor to serve calls)
        super().__init__(mock.Mock(admitted=[]), None)
        self.got: list[tuple[bytes, list[Any]]] = []
        self.written: list[bytes] = []
        self.aborted = False
        rec = self

        class FakeTransport:
            def write(self, data: bytes) -> None:
                rec.written.append(bytes(data))

            def writelines(self, parts: list[Any]) -> None:
                rec.written.append(b"".join(bytes(x) for x in parts))

            def abort(self) -> None:
                rec.aborted = True

        self.transport = FakeTransport()  # type: ignore[assignment]

    def deliver(self, body: bytes, bufs: list[Any]) -> None:
        self.got.append((body, bufs))

    def feed(self, data: bytes | memoryview, chunk: int | None = None) -> None:
        """What the event loop does: get_buffer, fill it, buffer_updated."""
        data = memoryview(data)
        pos = 0
        while pos < len(data):
            target = self.get_buffer(-1)
            assert len(target) > 0
            n = min(len(target), len(data) - pos, chunk or len(data))
            target[:n] = data[pos:pos + n]
            self.buffer_updated(n)
            pos += n


def make_frame(body: bytes, bufs: list[tuple[bytes, int]]) -> bytes:
    return frame_header(len(body), bufs) + body + b"".join(b for b, _ in bufs)


def expected(body: bytes, bufs: list[tuple[bytes, int]]) -> tuple[bytes, list[Any]]:
    return body, [bytes(b) if k == KIND_BYTES else bytearray(b) for b, k in bufs]


def check(got: list[tuple[bytes, list[Any]]], want: list[tuple[bytes, list[Any]]]) -> None:
    assert len(got) == len(want)
    for (gb, gbufs), (wb, wbufs) in zip(got, want):
        assert type(gb) is bytes and gb == wb
        assert len(gbufs) == len(wbufs)
        for g, w in zip(gbufs, wbufs):
            assert type(g) is type(w) and g == w


FRAMES = [
    (b"hello", []),
    (b"", []),
    (b"with buffers", [(b"abc", KIND_BYTES), (b"defg", KIND_BYTEARRAY)]),
    (b"x" * 300, [(b"", KIND_BYTES), (b"", KIND_BYTEARRAY), (b"z", KIND_BYTES)]),
    (b"\x00" * 7, [(bytes(range(256)) * 3, KIND_BYTEARRAY)]),
]


def test_parser_every_split_point() -> None:
    stream = b"".join(make_frame(b, bufs) for b, bufs in FRAMES)
    want = [expected(b, bufs) for b, bufs in FRAMES]
    for cut in range(len(stream) + 1):
        c = Recorder()
        c.feed(stream[:cut])
        c.feed(stream[cut:])
        check(c.got, want)
        assert not c.receiving[2]  # nothing of a frame held


def test_parser_byte_by_byte() -> None:
    stream = b"".join(make_frame(b, bufs) for b, bufs in FRAMES)
    c = Recorder()
    c.feed(stream, chunk=1)
    check(c.got, [expected(b, bufs) for b, bufs in FRAMES])


def test_parser_many_frames_in_one_chunk() -> None:
    frames = [(f"frame {i}".encode() * (i % 37), [(bytes([i % 256]) * (i % 5), i % 2)])
              for i in range(2000)]
    stream = b"".join(make_frame(b, bufs) for b, bufs in frames)
    assert len(stream) > 1 << 18  # more than the scratch buffer in one go
    c = Recorder()
    c.feed(stream)
    check(c.got, [expected(b, bufs) for b, bufs in frames])


@pytest.mark.parametrize("kind", [KIND_BYTES, KIND_BYTEARRAY])
def test_parser_5mib_buffer_in_many_chunks(kind: int) -> None:
    big = random.Random(5).randbytes(5 * MiB)
    frames = [(b"before", []), (b"big one", [(b"head", kind), (big, kind), (b"tail", kind)]),
              (b"after", [(b"!", KIND_BYTES)])]
    stream = b"".join(make_frame(b, bufs) for b, bufs in frames)
    want = [expected(b, bufs) for b, bufs in frames]
    rnd = random.Random(6)
    for chunking in ("random", 65536, 4093, None):
        c = Recorder()
        if chunking == "random":
            pos = 0
            while pos < len(stream):
                n = rnd.choice([1, 7, 100, 4096, 65537, 300_000])
                c.feed(stream[pos:pos + n])
                pos += n
        else:
            c.feed(stream, chunk=chunking)  # type: ignore[arg-type]
        check(c.got, want)
        # the big buffer was received straight into its own object, and the
        # scratch buffer did not grow to hold it
        assert c.receiving[0] < MiB


def _text(data: bytes) -> str | bytes:
    """How a ``KIND_ASCII`` part arrives: a str, or bytes if it is not ASCII."""
    return data.decode() if data.isascii() else data


@pytest.mark.parametrize("bad_at", [None, 0, 100, 3 * MiB, 5 * MiB - 1])
def test_parser_ascii_text_arrives_as_str(bad_at: int | None) -> None:
    """issue 15 item 5: an ASCII part (small, in the scratch buffer, or big,
    received straight into a new str and checked as it arrives) is delivered
    as a str; one with a byte that is not ASCII, wherever it is, as bytes."""
    big = bytearray(random.Random(8).randbytes(5 * MiB).translate(bytes(range(128)) * 2))
    if bad_at is not None:
        big[bad_at] = 0xE9
    frames = [(b"big", [(b"small text", KIND_ASCII), (bytes(big), KIND_ASCII),
                        (b"\xff" * 10, KIND_ASCII), (b"raw", KIND_BYTES)]),
              (b"after", [(b"!", KIND_ASCII)])]
    stream = b"".join(make_frame(b, bufs) for b, bufs in frames)
    for chunking in (None, 65536, 4093):
        c = Recorder()
        c.feed(stream, chunk=chunking)
        assert [body for body, _ in c.got] == [b"big", b"after"]
        assert c.got[0][1] == ["small text", _text(bytes(big)), b"\xff" * 10, b"raw"]
        assert [type(b) for b in c.got[0][1]] == [str, type(_text(bytes(big))), bytes, bytes]
        assert c.got[1][1] == ["!"]
        assert c.receiving[0] < MiB and not c.receiving[2]


def test_text_kinds_on_the_wire() -> None:
    """issue 15 item 5: an ASCII str travels as a str from its own memory; any
    other str as its UTF-8 bytes; a part said to be ASCII that is not is
    decoded as UTF-8, or fails its call with a SchemaError."""
    for text, kind in (("a" * MiB, KIND_ASCII), ("é" * MiB, KIND_BYTES)):
        packer = Packer()
        packer.pack(text, True)
        assert [k for _, k in packer] == [kind]

    class Target:
        def method(self, note: str) -> None:
            raise NotImplementedError

    schema = Schema(Target.method, "Target.method")
    packer = Packer()
    body = schema.pack_call(("n" * MiB,), {}, packer)
    assert schema.unpack_args(body, ["n" * MiB]) == ((), {"note": "n" * MiB})
    assert schema.unpack_args(body, ["é".encode()]) == ((), {"note": "é"})
    with pytest.raises(meshio.SchemaError, match=r"'note'.*UnicodeDecodeError"):
        schema.unpack_args(body, [b"\xff"])


def test_parser_large_body_grows_scratch() -> None:
    body = random.Random(7).randbytes(3 * MiB)
    c = Recorder()
    c.feed(make_frame(body, []) + make_frame(b"next", []), chunk=100_000)
    check(c.got, [(body, []), (b"next", [])])


def test_parser_absurd_header_reports_and_aborts() -> None:
    c = Recorder()
    c.feed(struct.pack("<II", 0xFFFF_FFFF, 0) + b"more")
    assert c.got == []
    assert c.aborted
    assert len(c.written) == 1
    body_len, nbufs = struct.unpack_from("<II", c.written[0])
    assert nbufs == 0
    msg = M.decode_message(c.written[0][8:8 + body_len])
    assert isinstance(msg, M.Fail) and msg.req == 0 and msg.error.kind == "protocol"


def test_parser_good_frames_then_garbage_header() -> None:
    c = Recorder()
    good = make_frame(b"ok", [(b"buf", KIND_BYTES)])
    c.feed(good + good + struct.pack("<II", 1, MAX_BUFS_PLUS) + good)
    check(c.got, [expected(b"ok", [(b"buf", KIND_BYTES)])] * 2)
    assert c.aborted and len(c.written) == 1


def test_parser_delivers_real_messages() -> None:
    """The unpatched deliver path: a Reply resolves its pending future."""
    loop = asyncio.new_event_loop()
    try:
        c = Connection(mock.Mock(admitted=[]), None)
        from meshio._transport._connection import Pending

        fut = loop.create_future()
        req = c.next_req(Pending(fut, lambda raw, bufs: (msgspec.msgpack.decode(raw), bufs),
                                 "ep", "mesh", 0))
        body = M.encode_message(M.Reply(req, msgspec.Raw(msgspec.msgpack.encode([1, 2]))))
        frame = make_frame(body, [(b"buf", KIND_BYTES)])
        mv = memoryview(frame)
        for i in range(len(frame)):  # byte by byte through the real path
            target = c.get_buffer(-1)
            target[:1] = mv[i:i + 1]
            c.buffer_updated(1)
        assert fut.done() and fut.result() == ([1, 2], [b"buf"])
    finally:
        loop.close()


class _Handed:
    """Notes a port as it is pickled, as a ``Port`` does (``hands_port``)."""

    def __reduce__(self) -> tuple[Any, ...]:
        hands_port("tcp://127.0.0.1:1", 7)
        return (_Handed, ())


class _Count(int):
    """A subclass of int: a value annotated ``int`` is encoded again, fitted."""


class _Refits:
    def method(self, handed: Any, n: int) -> tuple[Any, int]:
        raise NotImplementedError


def test_a_frame_encoded_again_notes_its_ports_once() -> None:
    # The first encoding notes the port, then meets the int subclass; the
    # frame is encoded again fitted (its buffers and ports forgotten first).
    schema = Schema(_Refits.method, "_Refits.method")
    packer = Packer()
    schema.pack_call((_Handed(), _Count(3)), {}, packer)
    assert packer.ports == [("tcp://127.0.0.1:1", 7)]
    packer = Packer()
    schema.pack_result((_Handed(), _Count(3)), packer)
    assert packer.ports == [("tcp://127.0.0.1:1", 7)]


# ------------------------------------------------- strs UTF-8 cannot encode


@LOOP
async def test_a_lone_surrogate_travels_untyped(store: ActorMesh[Store]) -> None:
    """A str holding a lone surrogate (which msgpack's UTF-8 str cannot
    carry) travels pickled where it is untyped, as pickle and Ray send it;
    where the annotation says ``str``, it is refused, naming the argument."""
    big = "x\ud800" * 2**20  # (out of band, were it UTF-8)
    for v in ("\ud800", ["ok", "\udcff"], {"k\ud800": 1, "b": ["\ud800"]}, big):
        assert await call(store, "anything_any", v) == v
    with pytest.raises(meshio.SchemaError,
                       match=r"'s' holds a str UTF-8 cannot encode.*annotate it `Any`"):
        await call(store, "length", "\ud800")
    assert await call(store, "length", "é") == 1
