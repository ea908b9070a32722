"""The README's "In one screen" program, made visible: a trainer mesh driven
with every adverb, printing what each returns.  Unlike the README's, each
trainer adds its rank to the loss (so the values tell the ranks apart), and
a ``count`` endpoint says how many calls each actor served."""

from __future__ import annotations

import meshio
from meshio import Actor, endpoint


class Trainer(Actor):
    def __init__(self, lr: float) -> None:
        self.lr = lr
        self.steps = 0

    @endpoint
    async def train(self, step: int) -> float:
        self.steps += 1
        rank = meshio.current_rank().rank
        return self.lr * step + rank

    @endpoint
    def count(self) -> int:
        return self.steps


async def main() -> None:
    async with meshio.this_host().spawn_procs(per_host={"gpus": 4}) as procs:
        trainers = await procs.spawn("trainers", Trainer, lr=1e-3)
        losses = await trainers.train.call(step=0)  # ValueMesh[float]
        print("call     ", losses.values())
        one = await trainers.slice(gpus=0).train.call_one(step=1)  # float
        print("call_one ", one)
        async for point, loss in trainers.train.stream(step=2):
            print("stream   ", dict(point), loss)
        trainers.train.broadcast(step=3)  # no reply; in a loop, await it
        any_one = await trainers.train.choose(step=4)  # load-balanced
        print("choose   ", any_one)
        counts = await trainers.count.options(timeout=10.0).call()
        print("count    ", counts.values())


if __name__ == "__main__":
    meshio.run(main())
