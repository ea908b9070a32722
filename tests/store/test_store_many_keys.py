"""A state dict of many small tensors: a reader's ``read_into`` of 100,000
of them (1.6 MB in all) held its event loop for seconds (a transfer, two
syscalls and the Python around them, a tensor, and no turn of the loop in
between), so the worker answered no heartbeat and its call failed
"not responding for 3.0 s (no heartbeat answer)" (audit of issue 17, F2);
``read``, ``read(keys=...)`` and ``publish`` held it a second or more too.
Now small tensors go many to a transfer and the loop runs between slices
of them.  Real processes, real heartbeats, judged after 1 s of silence,
far longer than the loop is held now and far shorter than it was."""

from __future__ import annotations

import asyncio

import torch

import meshio
from meshio import Actor, endpoint
from meshio.store import WeightStore

GUARD = 60.0
#: tensors of 4 floats each
N = 100_000
BEATS = {"heartbeat_interval": 0.1, "heartbeat_timeout": 1.0}
#: a tensor too large to go through staging memory with its neighbours
BIG = 1 << 15


def names(n: int) -> list[str]:
    return [f"k{i}" for i in range(n)]


def version(v: int, n: int) -> dict[str, torch.Tensor]:
    """``n`` small tensors (row ``i`` holds ``i + v``) in a row, with a large
    one first and one in the middle (``v`` throughout)."""
    rows = list(zip(names(n), (torch.arange(n, dtype=torch.float32) + v).unsqueeze(1)
                    .repeat(1, 4).unbind(), strict=True))
    return dict([("big0", torch.full((BIG,), float(v))), *rows[:n // 2],
                 ("big1", torch.full((4, BIG // 4), float(v))), *rows[n // 2:]])


async def holds(sd: dict[str, torch.Tensor], v: int, n: int) -> bool:
    """Whether ``sd`` holds version ``v`` of :func:`version` (letting the
    event loop run between slices of it, as the store does)."""
    want = (torch.arange(n, dtype=torch.float32) + v).unsqueeze(1).expand(n, 4)
    keys = names(n)
    for at in range(0, n, 4096):
        await asyncio.sleep(0)
        if not torch.equal(torch.stack([sd[k] for k in keys[at:at + 4096]]),
                           want[at:at + 4096]):
            return False
    return bool((sd["big0"] == v).all()) and bool((sd["big1"] == v).all())


class Reader(Actor):
    def __init__(self) -> None:
        # rows of one tensor; one a strided view, and one of the large ones
        # transposed: copied through staging memory among the others
        self.dst = {"big0": torch.zeros(BIG), **dict(zip(names(N), torch.zeros(N, 4).unbind(),
                                                         strict=True)),
                    "big1": torch.zeros(BIG // 4, 4).t()}
        self.dst["k7"] = torch.zeros(8)[::2]
        self.mine = version(5, N)  # (made here: a constructor holds the loop unjudged)

    @endpoint
    async def read_all(self, store: WeightStore) -> tuple[int, bool, bool, bool]:
        v = await store.read_into(self.dst)
        into = await holds(self.dst, v, N)
        whole = await holds(await store.read(), v, N)
        odd = names(N)[::-2]  # the odd ones, last first
        some = await store.read(keys=["big1", *odd])
        picked = (list(some) == ["big1", *odd] and bool((some["big1"] == v).all())
                  and torch.equal(torch.stack([some[k] for k in odd]),
                                  (torch.arange(N - 1, 0, -2, dtype=torch.float32) + v)
                                  .unsqueeze(1).expand(N // 2, 4)))
        return v, into, whole, picked

    @endpoint
    async def publish_own(self) -> bool:
        """The publisher's side: its own store, read in its own process."""
        store = WeightStore("own")
        await store.publish(self.mine, version=5)
        return await store.read_into(self.dst) == 5 and await holds(self.dst, 5, N)


async def test_many_small_tensors_keep_the_reader_answering() -> None:
    store = WeightStore("many")
    await store.publish(version(1, N), version=1)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, **BEATS) as procs:
        reader = await procs.spawn("reader", Reader)
        assert await asyncio.wait_for(reader.read_all.call_one(store), GUARD) == (
            1, True, True, True)
        assert await asyncio.wait_for(reader.publish_own.call_one(), GUARD)
        assert procs.holes == []
