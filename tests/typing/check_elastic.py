"""Type inference of elastic meshes: holes, ``replace``, ``grow``/``shrink``.

Checked by ``mypy --strict tests/typing/`` and ``pyright`` (strict), never
run.  Each ``assert_type`` line is a claim about what the checker infers;
each ``# type: ignore[code]`` line is an error it must report.
"""

# pyright: reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from typing import assert_type

import meshio
from meshio import Actor, Point, ValueMesh, endpoint


class Trainer(Actor):
    def __init__(self, lr: float) -> None:
        self.lr = lr

    @endpoint
    async def step(self, n: int) -> float:
        return self.lr * n


async def use(procs: meshio.ProcMesh) -> None:
    trainers = await procs.spawn("trainers", Trainer, lr=0.1)
    losses = await trainers.step.call(n=1)
    assert_type(losses, ValueMesh[float])
    assert_type(losses.holes, list[Point])
    assert_type(losses.values(), list[float])
    assert_type(losses.item(gpus=0), float)
    assert_type(procs.holes, list[Point])

    assert_type(await procs.replace(1), None)
    assert_type(await procs.replace(losses.holes[0]), None)
    assert_type(await procs.replace({"gpus": 1}), None)
    assert_type(await procs.grow(gpus=2), None)
    assert_type(await procs.shrink(gpus=2), None)

    await procs.replace("1")  # type: ignore[arg-type]
    await procs.grow(gpus=1.5)  # type: ignore[arg-type]
    await procs.shrink(gpus="2")  # type: ignore[arg-type]
    losses.holes = []  # type: ignore[misc]
