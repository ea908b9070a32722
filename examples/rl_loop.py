"""Actor-to-actor calls: generators hold a reference to the learner mesh and
call it directly; the controller only starts the loop and streams progress
back through a Port."""

from __future__ import annotations

import meshio
from meshio import Actor, Channel, Port, endpoint


class Learner(Actor):
    def __init__(self) -> None:
        self.version = 0

    @endpoint
    async def update(self, reward: float) -> int:
        self.version += 1
        return self.version


class Generator(Actor):
    def __init__(self, learners: Learner) -> None:
        self.learners = learners  # a mesh reference, usable here directly

    @endpoint
    async def run(self, episodes: int, progress: Port[int]) -> int:
        version = 0
        for episode in range(episodes):
            version = await self.learners.update.choose(reward=float(episode))
            progress.send(version)
        progress.close()
        return version


async def main() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        learners = await procs.slice(procs=0).spawn("learners", Learner)
        generators = await procs.slice(procs=1).spawn("generators", Generator, learners)
        port, progress = Channel[int].open()
        final = generators.run.call_one(episodes=5, progress=port)
        seen = [v async for v in progress]
        print("progress", seen, "final version", await final)


if __name__ == "__main__":
    meshio.run(main())
