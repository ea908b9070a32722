"""A controller crashes; training does not.

``python examples/reattach.py`` runs the first controller as a script of
its own (this file with ``--first NAME``): it spawns a proc mesh with
``keep_alive=60``, trains three steps and says so.  Then this process
SIGKILLs it, as a crash or a dead notebook kernel would end it, re-attaches
to the workers by name, finds the trainers with their state, trains on and
stops the mesh.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import meshio
from meshio import Actor, endpoint


class Trainer(Actor):
    def __init__(self, lr: float) -> None:
        self.lr = lr
        self.steps = 0
        self.weight = 0.0

    @endpoint
    async def train(self, steps: int) -> float:
        for _ in range(steps):
            self.steps += 1
            self.weight += self.lr
        return self.weight

    @endpoint
    async def progress(self) -> str:
        return f"step {self.steps} weight {self.weight:.1f}"


async def first(name: str) -> None:
    """The first controller: spawns, trains, then waits to be killed."""
    procs = await meshio.this_host().spawn_procs(per_host={"gpus": 2}, name=name,
                                                  keep_alive=60)
    trainers = await procs.spawn("trainers", Trainer, lr=0.5)
    await trainers.train.call(steps=3)
    print("trained", flush=True)
    await asyncio.Event().wait()


async def main() -> None:
    name = f"train-{os.getpid()}"  # unique on this host
    crashing = subprocess.Popen([sys.executable, __file__, "--first", name],
                                stdout=subprocess.PIPE, text=True)
    assert crashing.stdout is not None
    line = await asyncio.to_thread(crashing.stdout.readline)
    assert line == "trained\n", line
    crashing.send_signal(signal.SIGKILL)  # the controller dies mid-training
    crashing.wait()
    crashing.stdout.close()
    print("first controller killed")

    procs = await meshio.this_host().reattach(name)
    trainers = procs.actors("trainers", Trainer)
    for point, text in (await trainers.call(Trainer.progress)).items():
        print(f"reattached gpus={point['gpus']}: {text}")
    await trainers.call(Trainer.train, steps=2)
    for point, text in (await trainers.call(Trainer.progress)).items():
        print(f"trained on gpus={point['gpus']}: {text}")
    await procs.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--first"]:
        meshio.run(first(sys.argv[2]))
    else:
        meshio.run(main())
