"""``read(shard=...)`` copies the elements the shard function's view
selects, and refuses what is not a view of the tensor it was given: the
meta tensor it gets has no elements, so a copy of it (indexing by a tensor
or a mask, ``flip``, ``.to``, a ``reshape`` that must copy) carried only a
shape, and the store read the wrong elements under it, silently."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import torch

import meshio
from meshio import Actor, endpoint
from meshio.store import WeightStore

GUARD = 30.0
Shard = Callable[[str, torch.Tensor], torch.Tensor]

#: views of an (8, 6) float32 tensor, each checked against what it selects
#: of the real tensor
VIEWS: dict[str, Shard] = {
    "whole": lambda n, t: t,
    "rows": lambda n, t: t[1::3],
    "column": lambda n, t: t[:, 2],
    "element": lambda n, t: t[5, 4],
    "narrow": lambda n, t: t.narrow(1, 1, 3),
    "select": lambda n, t: t.select(0, 6),
    "T": lambda n, t: t.T,
    "T rows": lambda n, t: t.T[1:4, ::2],
    "unsqueeze": lambda n, t: t.unsqueeze(1)[2:5],
    "None index": lambda n, t: t[None, 3],
    "expand": lambda n, t: t[2:3].expand(4, 6),
    "as_strided": lambda n, t: t.as_strided((3, 4), (1, 6), 7),
    "as_strided to the end": lambda n, t: t.as_strided((2,), (47,), 0),
    "view": lambda n, t: t.view(-1)[5:17],
    "reshape (a view)": lambda n, t: t[2:6].reshape(4, 3, 2),
    "detach": lambda n, t: t.detach()[::2],
    "view int32": lambda n, t: t.view(torch.int32)[3],
    "view uint8": lambda n, t: t[4, 1:3].view(torch.uint8),
    "view float64": lambda n, t: t.view(torch.float64)[1::2, 1],
    "view int16 T": lambda n, t: t[1].view(torch.int16).view(2, 6).T,
    "empty": lambda n, t: t[3:3],
    "empty as another dtype": lambda n, t: t.view(torch.float16)[:, 0:0],
}

#: views of a (5,) complex64 tensor, with the lazy conjugate and negative bits
COMPLEX_VIEWS: dict[str, Shard] = {
    "real": lambda n, t: t.real,
    "imag": lambda n, t: t.imag[1:],
    "conj": lambda n, t: t.conj()[::2],
    "conj imag (negative)": lambda n, t: t.conj().imag,
    "view_as_real": lambda n, t: torch.view_as_real(t)[1:4],
    "view_as_real of conj": lambda n, t: torch.view_as_real(t[2:]).T,
}

#: what returns a new tensor, and the shape each one reports
COPIES: dict[str, tuple[Shard, tuple[int, ...]]] = {
    "tensor index": (lambda n, t: t[torch.tensor([0, 2])], (2, 6)),
    "mask": (lambda n, t: t[torch.tensor([True, False] * 4)], (4, 6)),
    "flip": (lambda n, t: t.flip(0), (8, 6)),
    "reshape of T": (lambda n, t: t.T.reshape(-1), (48,)),
    "to float64": (lambda n, t: t.to(torch.float64), (8, 6)),
    "clone": (lambda n, t: t.clone(), (8, 6)),
    "contiguous T": (lambda n, t: t.T.contiguous(), (6, 8)),
    "another meta tensor": (lambda n, t: torch.empty(3, 2, device="meta"), (3, 2)),
    "a cpu tensor": (lambda n, t: torch.zeros(8, 6), (8, 6)),
}


def weights() -> dict[str, torch.Tensor]:
    """Values whose every view is exact in another dtype (no NaN bit patterns)."""
    return {"w": torch.arange(48.0).reshape(8, 6),
            "c": torch.complex(torch.arange(5.0), -torch.arange(5.0) - 0.5)}


def expected(fn: Shard, key: str) -> torch.Tensor:
    return fn(key, weights()[key]).resolve_conj().resolve_neg()


async def read_views(store: WeightStore, key: str, names: list[str]) -> dict[str, torch.Tensor]:
    views = VIEWS if key == "w" else COMPLEX_VIEWS
    return {name: (await store.read(keys=[key], shard=views[name]))[key] for name in names}


def nothing(name: str, t: torch.Tensor) -> Any:
    """A shard function that forgot to return."""
    return None


async def refusals(store: WeightStore, names: list[str]) -> dict[str, tuple[str, str]]:
    """What each copy's read raised: its type and message."""
    shards: dict[str, Shard] = {name: COPIES[name][0] for name in names}
    shards["None"] = nothing
    shards["out of bounds"] = lambda n, t: t.as_strided((3, 17), (17, 1), 0)
    raised: dict[str, tuple[str, str]] = {}
    for name, fn in shards.items():
        try:
            await store.read(keys=["w"], shard=fn)
        except (TypeError, ValueError) as e:
            raised[name] = (type(e).__name__, str(e))
        else:
            raised[name] = ("nothing", "")
    return raised


class Reader(Actor):
    """Reads from another process (the RDMA path rather than the owner's memory)."""

    @endpoint
    async def views(self, store: WeightStore, key: str, names: list[str]
                    ) -> dict[str, torch.Tensor]:
        return await read_views(store, key, names)

    @endpoint
    async def refusals(self, store: WeightStore, names: list[str]) -> dict[str, tuple[str, str]]:
        return await refusals(store, names)


def check_views(got: dict[str, torch.Tensor], key: str) -> None:
    views = VIEWS if key == "w" else COMPLEX_VIEWS
    for name, t in got.items():
        want = expected(views[name], key)
        assert t.dtype == want.dtype and t.shape == want.shape, (name, t, want)
        assert torch.equal(t, want), (name, t.tolist(), want.tolist())


def check_refusals(raised: dict[str, tuple[str, str]]) -> None:
    for name, (kind, message) in raised.items():
        if name == "None":
            assert kind == "TypeError" and "'w'" in message and "NoneType" in message, message
        elif name == "out of bounds":
            assert kind == "ValueError" and "'w'" in message and "reaches" in message, message
            assert "(3, 17)" in message, message
        else:
            assert kind == "ValueError", (name, kind, message)
            assert "shard('w', t) must return a view of t" in message, message
            assert str(COPIES[name][1]) in message, (name, message)  # what it returned


async def test_a_view_reads_exactly_what_it_selects() -> None:
    store = WeightStore("shard-views")
    await store.publish(weights(), version=1)
    check_views(await read_views(store, "w", list(VIEWS)), "w")  # the owner's own read
    check_views(await read_views(store, "c", list(COMPLEX_VIEWS)), "c")
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        reader = (await procs.spawn("reader", Reader)).slice(procs=0)
        check_views(await asyncio.wait_for(reader.views.call_one(store, "w", list(VIEWS)),
                                           GUARD), "w")
        check_views(await asyncio.wait_for(
            reader.views.call_one(store, "c", list(COMPLEX_VIEWS)), GUARD), "c")


async def test_a_copy_is_refused_naming_the_key_and_what_it_was() -> None:
    store = WeightStore("shard-copies")
    await store.publish(weights(), version=1)
    check_refusals(await refusals(store, list(COPIES)))
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        reader = (await procs.spawn("reader", Reader)).slice(procs=0)
        check_refusals(await asyncio.wait_for(reader.refusals.call_one(store, list(COPIES)),
                                              GUARD))
        # the store goes on: a refused read held no version
        check_views(await asyncio.wait_for(reader.views.call_one(store, "w", ["rows"]), GUARD),
                    "w")


@pytest.mark.parametrize("name", ["tensor index", "flip"])
async def test_the_error_is_a_value_error(name: str) -> None:
    store = WeightStore(f"shard-raise-{name}")
    await store.publish(weights(), version=1)
    with pytest.raises(ValueError, match=r"shard\('w', t\) must return a view of t"):
        await store.read(keys=["w"], shard=COPIES[name][0])
    assert store.kept == (1,)
