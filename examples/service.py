"""Generator replicas behind a service: sticky sessions, a replica killed
mid-run (its calls go to the live one), restarted by its supervisor, then
the service scaled up and down, with per-replica statistics."""

from __future__ import annotations

import os
import signal

import meshio
from meshio import Actor, endpoint


class Generator(Actor):
    def __init__(self, temperature: float) -> None:
        self.temperature = temperature

    @endpoint(retryable=True)  # safe to run again: a call in flight to a dying replica fails over
    async def generate(self, prompt: str) -> tuple[int, str]:
        return os.getpid(), prompt.upper()


async def main() -> None:
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        generators = await procs.spawn("generators", Generator, temperature=0.7)
        svc = meshio.Service(generators, routing="sticky")
        replica_of = {pid: i for i, pid in enumerate(procs.pids)}
        for user in ("alice", "bob", "alice", "bob"):
            pid, text = await svc.generate.route(f"hi from {user}", session=user)
            print(f"{user:<5} -> replica {replica_of[pid]}: {text}")

        victim, _ = await svc.generate.route("who serves alice?", session="alice")
        os.kill(victim, signal.SIGKILL)
        pid, _ = await svc.generate.route("still there?", session="alice")
        print(f"alice after the kill: served by a live process: {pid != victim}")
        async for event in sup.events():
            if event.kind == "restart":
                print(f"restart  {event.mesh} rank {event.rank}")
                break

        await svc.scale(replicas=3)
        print("replicas", len(svc), "answers", len((await svc.generate.call("all")).values()))
        for _ in range(6):
            await svc.generate.route("load")
        for s in svc.stats():
            print(f"replica {s.replica}: alive={s.alive} in_flight={s.in_flight} "
                  f"completed={s.completed}")
        await svc.scale(replicas=2)
        print("replicas", len(svc))
        await svc.stop()


if __name__ == "__main__":
    meshio.run(main())
