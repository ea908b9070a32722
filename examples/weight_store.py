"""Weight hand-off through a WeightStore: the learner publishes a snapshot
of its state dict every step and goes on training at once; generators read
the newest version before each rollout, whole (never half of one step and
half of the next), and can wait for a version they need."""

from __future__ import annotations

import torch

import meshio
from meshio import Actor, endpoint
from meshio.store import WeightStore


class Learner(Actor):
    def __init__(self) -> None:
        self.model = torch.nn.Linear(256, 256)
        self.store = WeightStore("policy")  # owned by this process

    @endpoint
    async def weights(self) -> WeightStore:
        return self.store  # a value: its copies read this process's versions

    @endpoint
    async def train_step(self, step: int) -> None:
        with torch.no_grad():
            for p in self.model.parameters():
                p.fill_(float(step))  # stands for an optimizer step
        await self.store.publish(self.model.state_dict(), version=step)


class Generator(Actor):
    def __init__(self) -> None:
        self.model = torch.nn.Linear(256, 256)

    @endpoint
    async def rollout(self, store: WeightStore, at_least: int) -> tuple[int, float]:
        # in place, into the generator's own parameters (no allocation)
        version = await store.read_into(self.model.state_dict(), at_least=at_least,
                                        timeout=30.0)
        return version, self.model.weight[0, 0].item()


async def main() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 3}) as procs:
        learner = await procs.slice(procs=0).spawn("learner", Learner)
        generators = await procs.slice(procs=slice(1, 3)).spawn("generators", Generator)
        store = await learner.weights.call_one()
        for step in range(1, 4):
            await learner.train_step.call_one(step)
            used = (await generators.rollout.call(store, step)).values()
            print(f"step {step}: generators used versions {used}")
        print("newest version", store.latest)


if __name__ == "__main__":
    meshio.run(main())
