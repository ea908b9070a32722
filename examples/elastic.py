"""An elastic mesh: a rank SIGKILLed with no supervisor becomes a hole
(calls go on without it), is replaced with a fresh process built from the
actors' constructor arguments, then the mesh grows and shrinks in place."""

from __future__ import annotations

import os
import signal

import meshio
from meshio import Actor, endpoint


class Worker(Actor):
    def __init__(self, step: int) -> None:
        self.step = step

    @endpoint
    async def advance(self) -> int:
        self.step += 1
        return self.step

    @endpoint
    async def world(self) -> int:
        return meshio.current_rank().extent["gpus"]


async def main() -> None:
    async with meshio.this_host().spawn_procs(per_host={"gpus": 3}) as procs:
        workers = await procs.spawn("workers", Worker, step=0)
        print("steps", (await workers.advance.call()).values())

        os.kill(procs.pids[1], signal.SIGKILL)
        await procs.wait_failed()  # rank 1 died and nothing restarts it: a hole
        steps = await workers.advance.call()
        print("steps", steps.values(), "holes", [dict(p) for p in steps.holes])

        await procs.replace(steps.holes[0])  # a fresh process, its actor built again
        print("after replace", (await workers.advance.call()).values())

        await procs.grow(gpus=2)
        print("after grow", workers.sizes, (await workers.advance.call()).values(),
              "world", (await workers.world.call()).values())
        await procs.shrink(gpus=3)
        print("after shrink", workers.sizes, (await workers.advance.call()).values())


if __name__ == "__main__":
    meshio.run(main())
