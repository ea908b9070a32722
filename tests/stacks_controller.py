"""A controller for ``tests/test_stacks.py``: four actors kept busy (ranks
0-1 in a ``def`` endpoint, 2-3 in an ``async`` one) until stdin closes;
prints ``ready`` once they all are, for ``meshio stacks`` to look at."""

from __future__ import annotations

import asyncio
import sys
import threading

import meshio
from meshio import Actor, Channel, Port, endpoint


class Busy(Actor):
    def __init__(self) -> None:
        self.released = threading.Event()
        self.forever = asyncio.Event()

    @endpoint
    def block(self, started: Port[int]) -> None:
        started.send(meshio.current_rank().rank)
        self.released.wait()  # def endpoint blocks here

    @endpoint
    async def hang(self, started: Port[int]) -> None:
        started.send(meshio.current_rank().rank)
        await self.forever.wait()  # async endpoint awaits here

    @endpoint(concurrent=True)
    async def release(self) -> None:
        self.released.set()
        self.forever.set()


async def main() -> None:
    async with meshio.this_host().spawn_procs(per_host={"gpus": 4}) as procs:
        busy = await procs.spawn("busy", Busy)
        port, started = Channel[int].open()
        calls = asyncio.gather(busy.slice(gpus=slice(0, 2)).block.call(port),
                               busy.slice(gpus=slice(2, 4)).hang.call(port))
        for _ in range(4):
            await started.recv()
        while not all(a.thread for a in (await busy.stacks()).actors[:2]):
            pass  # told they started; in their blocking line a moment later
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await busy.release.call()
        await calls


if __name__ == "__main__":
    meshio.run(main())
