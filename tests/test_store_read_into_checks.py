"""What ``WeightStore.read_into`` writes into: a destination tensor it
cannot write whole (elements that share memory, as an ``expand()``ed view's
do; no dense data: sparse, nested, meta) is refused with a ``ValueError``
naming its key before any tensor is written, so ``dst`` never holds half of
a version (the copy into an expanded ``b`` failed in torch after ``a`` was
overwritten).  Views it can write (of a leaf that requires grad, of an
inference tensor, a conjugated view) take the version's values."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import torch

import meshio
from meshio import Actor, endpoint
from meshio.store import WeightStore

GUARD = 60.0
N = 1000


def published() -> dict[str, torch.Tensor]:
    return {"a": torch.full((N,), 7.0), "b": torch.full((8, 4), 7.0), "z": torch.full((3,), 7.0)}


def old(b: torch.Tensor) -> dict[str, torch.Tensor]:
    """A destination holding zeros, with ``b`` (between the others in the
    version's order) as given."""
    return {"a": torch.zeros(N), "b": b, "z": torch.zeros(3)}


BAD: dict[str, tuple[Callable[[], torch.Tensor], str]] = {
    "expanded": (lambda: torch.zeros(1, 4).expand(8, 4), "share memory"),
    "as_strided": (lambda: torch.zeros(18).as_strided((8, 4), (2, 1)), "share memory"),
    "unfolded": (lambda: torch.zeros(11).unfold(0, 4, 1), "share memory"),
    "meta": (lambda: torch.zeros(8, 4, device="meta"), "is a meta tensor"),
    "sparse": (lambda: torch.zeros(8, 4).to_sparse(), "is a tensor of layout torch.sparse_coo"),
    "nested": (lambda: torch.nested.nested_tensor([torch.zeros(4)] * 8),
               "is a nested tensor"),
}


def untouched(dst: dict[str, torch.Tensor]) -> bool:
    return bool((dst["a"] == 0).all() and (dst["z"] == 0).all())


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.parametrize("kind", list(BAD))
async def test_a_destination_it_cannot_write_is_refused_before_any_copy(kind: str) -> None:
    make, why = BAD[kind]
    store = WeightStore(f"into-{kind}")
    await store.publish(published(), version=1)
    dst = old(make())
    with pytest.raises(ValueError, match=r"^WeightStore.read_into: dst\['b'\] ") as ei:
        await asyncio.wait_for(store.read_into(dst, timeout=0), GUARD)
    assert why in str(ei.value)
    assert untouched(dst)
    fine = old(torch.zeros(8, 4))
    assert await store.read_into(fine, timeout=0) == 1
    assert all((t == 7).all() for t in fine.values())


@pytest.mark.parametrize("dst", [[torch.zeros(N)], torch.zeros(N), None],
                         ids=["list", "tensor", "None"])
async def test_a_destination_that_is_not_a_mapping_is_a_type_error(dst: object) -> None:
    """Before, a list or a tensor gave a ValueError listing its elements as
    keys, and None "'NoneType' object is not iterable"."""
    store = WeightStore(f"into-{type(dst).__name__}")
    want = (rf"^WeightStore.read_into: dst must be a mapping of name to tensor .*got "
            rf"{type(dst).__name__}$")
    with pytest.raises(TypeError, match=want):  # before waiting for a version
        await asyncio.wait_for(store.read_into(dst, timeout=0), GUARD)  # type: ignore[arg-type]
    await store.publish(published(), version=1)
    with pytest.raises(TypeError, match=want):
        await asyncio.wait_for(store.read_into(dst), GUARD)  # type: ignore[arg-type]


async def test_views_it_can_write_take_the_version() -> None:
    store = WeightStore("into-views")
    c = torch.tensor([1 + 2j, 3 - 4j])
    await store.publish({"leaf": torch.arange(32.0).view(8, 4), "inf": torch.arange(6.0),
                         "c": c}, version=1)
    with torch.inference_mode():
        inference = torch.zeros(6)
    grad = torch.zeros(4, 8, requires_grad=True)
    plain = torch.zeros(2, dtype=torch.complex64)
    dst = {"leaf": grad.t(), "inf": inference[::1], "c": plain.conj()}
    assert await store.read_into(dst, timeout=0) == 1
    assert torch.equal(grad.detach().t(), torch.arange(32.0).view(8, 4))
    assert torch.equal(inference, torch.arange(6.0))
    assert torch.equal(dst["c"].resolve_conj(), c) and torch.equal(plain, c.conj())


@pytest.mark.parametrize(("dst_keys", "said"), [
    ("az", r"has keys \['b'\] missing from dst$"),
    ("abzq", r"lacks keys \['q'\] that dst has$"),
    ("aq", r"has keys \['b', 'z'\] missing from dst, and lacks keys \['q'\] that dst has$"),
], ids=["dst-lacks", "version-lacks", "both"])
async def test_a_key_set_mismatch_names_only_the_keys_that_differ(dst_keys: str,
                                                                   said: str) -> None:
    """A dst whose keys are not the version's: the error names the keys
    each side lacks, and says nothing of a side that lacks none (before:
    "..., and dst has keys [] it lacks")."""
    store = WeightStore(f"into-keys-{dst_keys}")
    await store.publish(published(), version=1)
    dst = {k: published().get(k, torch.zeros(3)) for k in dst_keys}
    with pytest.raises(ValueError, match=rf"^WeightStore.read_into: version 1 of "
                                         rf"'into-keys-{dst_keys}' {said}"):
        await asyncio.wait_for(store.read_into(dst, timeout=0), GUARD)


class Reader(Actor):
    @endpoint
    async def read_into(self, store: WeightStore) -> tuple[str, bool]:
        """What a read into a dst with an expanded ``b`` raises, and
        whether dst is untouched."""
        dst = old(torch.zeros(1, 4).expand(8, 4))
        try:
            await store.read_into(dst, timeout=0)
        except ValueError as e:
            return str(e), untouched(dst)
        return "", untouched(dst)


async def test_a_reader_of_another_process_is_refused_before_any_copy() -> None:
    store = WeightStore("into-remote")
    await store.publish(published(), version=1)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        reader = await procs.spawn("reader", Reader)
        why, kept = await asyncio.wait_for(reader.read_into.call_one(store), GUARD)
    assert why.startswith("WeightStore.read_into: dst['b'] has elements that share memory")
    assert kept
