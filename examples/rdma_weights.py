"""Weight sync through an RDMABuffer: the trainer registers its weights
once; the generators pull them one-sidedly whenever they like (the trainer's
code does not run per transfer)."""

from __future__ import annotations

import torch

import meshio
from meshio import Actor, RDMABuffer, endpoint


class Trainer(Actor):
    def __init__(self) -> None:
        self.weights = torch.zeros(1 << 18)  # 1 MiB of float32
        self.handle = RDMABuffer(self.weights.view(torch.uint8))

    @endpoint
    async def weights_handle(self) -> RDMABuffer:
        return self.handle

    @endpoint
    async def step(self) -> None:
        self.weights += 1.0  # in place: readers see the new values


class Generator(Actor):
    def __init__(self) -> None:
        self.weights = torch.empty(1 << 18)

    @endpoint
    async def pull(self, source: RDMABuffer) -> float:
        await source.read_into(self.weights.view(torch.uint8))
        return float(self.weights[0])

    @endpoint
    async def backend(self, source: RDMABuffer) -> str:
        return source.backend


async def main() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 3}) as procs:
        trainer = await procs.slice(procs=0).spawn("trainer", Trainer)
        generators = await procs.slice(procs=slice(1, 3)).spawn("generators", Generator)
        handle = await trainer.weights_handle.call_one()
        print("backend", (await generators.backend.call(handle)).values())
        for _ in range(3):
            await trainer.step.call_one()
            print("pulled", (await generators.pull.call(handle)).values())
        await handle.drop()


if __name__ == "__main__":
    meshio.run(main())
