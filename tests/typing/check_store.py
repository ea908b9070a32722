"""Type inference of the weight store (``meshio.store``).

Checked by ``mypy --strict tests/typing/`` and ``pyright`` (strict), never
run.  Each ``assert_type`` line is a claim about what the checker infers;
each ``# type: ignore[code]`` line is an error it must report.
"""

# pyright: reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from typing import assert_type

import torch

from meshio import Actor, endpoint
from meshio.store import WeightStore


class Learner(Actor):
    def __init__(self) -> None:
        self.store = WeightStore("policy", keep=3)

    @endpoint
    async def handle(self) -> WeightStore:
        return self.store


async def use(learner: Learner, store: WeightStore) -> None:
    assert_type(await learner.handle.call_one(), WeightStore)
    assert_type(await store.read(), dict[str, torch.Tensor])
    assert_type(await store.read(at_least=3, timeout=1.0, keys=["w"],
                                 shard=lambda name, t: t[0::2]), dict[str, torch.Tensor])
    assert_type(await store.read_into({"w": torch.zeros(2)}), int)
    assert_type(store.latest, int | None)
    assert_type(store.kept, tuple[int, ...])
    await store.publish({"w": torch.zeros(2)}, version=1)
    async for v in store.versions():
        assert_type(v, int)
    newest = store.versions()
    assert_type(await anext(newest), int)
    await newest.aclose()  # an async generator: closing it ends the wait
    await store.publish({"w": torch.zeros(2)}, version="1")  # type: ignore[arg-type]
    await store.read(at_least="3")  # type: ignore[arg-type]
