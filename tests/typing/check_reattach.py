"""What type checkers infer for ``spawn_procs(keep_alive=...)``,
``reattach`` and ``procs.actors`` (issue 18 item 8), and the misuses they
reject (the ``# type: ignore[code]`` lines: unused, they fail the check).
mypy --strict and pyright strict read it; nothing runs it."""

# pyright: reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from typing import assert_type

import meshio
from meshio import Actor, ProcMesh, ValueMesh, endpoint


class Trainer(Actor):
    def __init__(self, lr: float) -> None:
        self.lr = lr

    @endpoint
    async def train(self, steps: int) -> float:
        return self.lr * steps


async def use(sup: meshio.Supervisor) -> None:
    kept = meshio.this_host().spawn_procs(per_host={"gpus": 2}, name="train", keep_alive=600)
    assert_type(kept, ProcMesh)
    procs = await meshio.this_host().reattach("train")
    assert_type(procs, ProcMesh)
    assert_type(await meshio.this_host().reattach("train", supervisor=sup), ProcMesh)
    trainers = procs.actors("trainers", Trainer)
    assert_type(trainers, Trainer)  # (as spawn's: one function takes either)
    assert_type(await trainers.call(Trainer.train, steps=2), ValueMesh[float])
    assert_type(await trainers.train.call(steps=2), ValueMesh[float])
    spawned: Trainer = await procs.spawn("more", Trainer, lr=0.1)
    for mesh in (trainers, spawned):
        assert_type(mesh, Trainer)
    trainers.train.call(steps="2")  # type: ignore[arg-type]
    meshio.this_host().spawn_procs(keep_alive="600")  # type: ignore[arg-type]
    procs.actors("trainers", 3)  # type: ignore[arg-type]
    await meshio.this_host().reattach("train", sup)  # type: ignore[call-arg]
