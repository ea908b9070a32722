"""Seeing a running job: the workers' `logging` records on the controller
(filtered by rank), `meshio.stats()` while an actor is busy, and the same
numbers scraped as Prometheus text from `meshio.serve_metrics()`."""

from __future__ import annotations

import asyncio
import logging
import sys
import urllib.request

import meshio
from meshio import Actor, endpoint


class Trainer(Actor):
    def __init__(self) -> None:
        self.steps = 0

    @endpoint
    async def step(self, lr: float) -> float:
        self.steps += 1
        if lr > 1.0:
            raise ValueError(f"lr {lr} is too high")
        loss = 1.0 / self.steps
        if meshio.current_rank().rank == 1:
            logging.getLogger("train").warning("loss %.3f at step %d", loss, self.steps)
        return loss


class OnlyRank(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "rank", None) == self.rank


async def main() -> None:
    seen = logging.StreamHandler(sys.stdout)
    seen.setFormatter(logging.Formatter("record  %(name)s %(actor)s rank %(rank)s: %(message)s"))
    seen.addFilter(OnlyRank(1))
    logging.getLogger("train").addHandler(seen)
    logging.getLogger("train").propagate = False

    async with meshio.this_host().spawn_procs(per_host={"gpus": 2}, name="train") as procs:
        trainers = await procs.spawn("trainers", Trainer)
        for lr in (0.1, 0.1, 2.0):
            try:
                await trainers.step.call(lr)
            except meshio.ActorError as e:
                print(f"failed   {e.remote_type}")

        stats = await meshio.stats()
        for pm, proc, actor, ep in stats.endpoints():
            print(f"stats    {pm.name} proc {proc.rank} {actor.actor}[{actor.rank}] "
                  f"{ep.endpoint}: calls {ep.calls} errors {ep.errors} "
                  f"p50 {'-' if ep.p50 is None else 'ok'}; restarts {proc.restarts}, "
                  f"cpu>0 {proc.cpu_seconds > 0}, rss>0 {proc.rss > 0}")

        async with meshio.serve_metrics(port=0) as server:
            text = await asyncio.to_thread(
                lambda: urllib.request.urlopen(server.url, timeout=30).read().decode())
        for line in text.splitlines():
            if line.startswith("meshio_endpoint_calls_total"):
                print(f"scraped  {line}")


if __name__ == "__main__":
    meshio.run(main())
