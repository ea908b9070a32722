"""What ``WeightStore.publish`` takes: tensors with no dense data of their
own (quantized, nested, sparse, meta) are refused with a ``TypeError``
naming the key before any memory is touched (a quantized one crashed the
publishing process), and versions the store cannot number (2**63 and up
wrapped its 64-bit cell) are a ``ValueError``, for ``at_least`` too."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable

import pytest
import torch

import meshio
from meshio import Actor, endpoint
from meshio.store import WeightStore

GUARD = 60.0


class Sub(torch.Tensor):
    """A tensor subclass of the ``__torch_function__`` kind."""


REFUSED: dict[str, tuple[Callable[[], torch.Tensor], str]] = {
    "quantized": (lambda: torch.quantize_per_tensor(torch.randn(8), 0.1, 0, torch.qint8),
                  "a quantized tensor cannot be published: publish its dequantize()"),
    "quantized per channel": (
        lambda: torch.quantize_per_channel(torch.randn(2, 3), torch.tensor([0.1, 0.2]),
                                           torch.tensor([0, 0]), 0, torch.quint8),
        "a quantized tensor"),
    "sparse coo": (lambda: torch.eye(3).to_sparse(),
                   "a tensor of layout torch.sparse_coo cannot be published: publish its "
                   "to_dense()"),
    "sparse csr": (lambda: torch.eye(3).to_sparse_csr(), "layout torch.sparse_csr"),
    "nested": (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
               "a nested tensor cannot be published"),
    "nested jagged": (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)],
                                                         layout=torch.jagged),
                      "a nested tensor"),
    "meta": (lambda: torch.empty(3, device="meta"), "a meta tensor has no data to publish"),
}


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage",
                            "ignore:Sparse CSR tensor support is in beta state",
                            "ignore:torch.quantize_per_tensor, torch.quantize_per_channel")
@pytest.mark.parametrize("kind", list(REFUSED))
async def test_a_tensor_without_dense_data_is_refused_naming_its_key(kind: str) -> None:
    make, why = REFUSED[kind]
    store = WeightStore(f"values-{kind}")
    with pytest.raises(TypeError) as ei:
        await store.publish({"fine": torch.ones(2), "odd": make()}, version=1)
    assert str(ei.value).startswith("WeightStore.publish: key 'odd': ")
    assert why in str(ei.value)
    assert store.latest is None and store.kept == ()
    await store.publish({"fine": torch.ones(2)}, version=1)  # nothing taken
    assert store.latest == 1


async def test_parameters_subclasses_and_grad_tensors_are_published() -> None:
    store = WeightStore("values-ok")
    sd = {"p": torch.nn.Parameter(torch.full((2, 3), 2.0)),
          "g": torch.ones(4, requires_grad=True),
          "s": torch.arange(5.0).as_subclass(Sub)}
    await store.publish(sd, version=1)
    got = await store.read()
    assert all(type(t) is torch.Tensor and torch.equal(t, sd[k].detach().as_subclass(torch.Tensor))
               for k, t in got.items())


async def test_versions_from_2_63_on_are_refused() -> None:
    store = WeightStore("values-versions", keep=1)
    for bad in (2**63, 2**64 + 7):
        with pytest.raises(ValueError, match=r"version must be at most 2\*\*63-1 \(.*\), got "
                                             + str(bad)):
            await store.publish({"a": torch.ones(1)}, version=bad)
    assert store.latest is None and store.kept == ()
    top = 2**63 - 1
    await store.publish({"a": torch.ones(1)}, version=top)
    assert store.latest == top and store.kept == (top,)
    with pytest.raises(ValueError, match="not above"):
        await store.publish({"a": torch.ones(1)}, version=5)
    assert (await store.read(at_least=top))["a"].item() == 1.0
    for read in (store.read, functools.partial(store.read_into, {"a": torch.zeros(1)})):
        with pytest.raises(ValueError, match=r"at_least must be at most 2\*\*63-1"):
            await read(at_least=2**63, timeout=0)


class Publisher(Actor):
    def __init__(self) -> None:
        self.store = WeightStore("values-actor")

    @endpoint
    async def publish(self, kind: str, version: int) -> None:
        sd = {"a": REFUSED[kind][0]() if kind else torch.full((3,), float(version))}
        await self.store.publish(sd, version=version)

    @endpoint
    async def handle(self) -> WeightStore:
        return self.store

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


class Reader(Actor):
    @endpoint
    async def read(self, store: WeightStore, at_least: int) -> float:
        return float((await store.read(at_least=at_least, timeout=0))["a"][0])


async def test_an_actor_publishing_a_bad_value_raises_and_its_worker_lives() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        publisher = (await procs.spawn("publisher", Publisher)).slice(procs=0)
        reader = (await procs.spawn("reader", Reader)).slice(procs=1)
        pid = await publisher.pid.call_one()
        for kind, version in (("quantized", 1), ("", 2**63)):
            with pytest.raises(meshio.ActorError) as ei:
                await asyncio.wait_for(publisher.publish.call_one(kind, version), GUARD)
            assert ei.value.remote_type.endswith("TypeError" if kind else "ValueError")
            assert ("key 'a': a quantized tensor" if kind else "at most 2**63-1") in str(ei.value)
        assert await publisher.pid.call_one() == pid  # the same worker answers
        await publisher.publish.call_one("", 2)
        store = await publisher.handle.call_one()
        assert await asyncio.wait_for(reader.read.call_one(store, 2), GUARD) == 2.0
        with pytest.raises(meshio.ActorError, match=r"at_least must be at most 2\*\*63-1") as ei:
            await asyncio.wait_for(reader.read.call_one(store, 2**63), GUARD)
        assert ei.value.remote_type.endswith("ValueError")
