"""A supervised gang: kill a worker, watch the supervisor replace it.

The actor is rebuilt with its constructor arguments at the same coordinates,
``on_restart`` reloads its "checkpoint", and the controller's mesh reference
reaches the new incarnation.
"""

from __future__ import annotations

import os
import signal

import meshio
from meshio import Actor, endpoint


class Worker(Actor):
    def __init__(self, name: str) -> None:
        self.name = name
        self.restored = False

    def on_restart(self) -> None:
        """Runs in the new incarnation after __init__: reload state here."""
        self.restored = True

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def status(self) -> str:
        rank = meshio.current_rank().rank
        return f"{self.name}[{rank}] pid={os.getpid()} restored={self.restored}"


async def main() -> None:
    sup = meshio.Supervisor(strategy="one_for_one", max_restarts=3, within=60.0)
    async with meshio.this_host().spawn_procs(per_host={"gpus": 2}, supervisor=sup) as procs:
        workers = await procs.options(restart="permanent").spawn("workers", Worker, "w")
        victim = await workers.slice(gpus=1).pid.call_one()
        os.kill(victim, signal.SIGKILL)
        async for event in sup.events():
            print(f"{event.kind:<8} {event.mesh} rank {event.rank}: {event.cause}")
            if event.kind == "restart":
                break
        for line in (await workers.status.call()).values():
            print(line)


if __name__ == "__main__":
    meshio.run(main())
