"""A controller whose actors stop in ``breakpoint()``, for
``tests/test_debug.py`` to drive with ``meshio debug``.

``python debug_controller.py pair``: two ranks (two processes) of
``Paused``; rank 0 runs the ``async`` endpoint ``step``, which calls ``breakpoint()``,
rank 1 the ``def`` endpoint ``step_sync``, which calls ``pdb.set_trace()``.
Once a line arrives on its stdin it calls another actor of rank 1's
process and prints that it answered; then it prints the results once both
paused calls return, and what the paused actors answer to one more call
(each rank its rank).

``python debug_controller.py terminal``: the same two ranks paused, and
nothing else: debugged on the controller's own terminal; it prints the
results once both return.

``python debug_controller.py heartbeats``: rank 0 of a proc mesh with
short heartbeats (0.2 s, timeout 1 s) stops in ``breakpoint()`` inside the
``async`` endpoint (holding its worker's loop); meanwhile the controller
calls the actor of another process for three heartbeat timeouts and
prints how many calls it answered, then waits for the paused call, which
returns once ``meshio debug`` continues it (a process declared not
responding would fail it).

``python debug_controller.py agents CACHE_DIR``: once a line arrives on
its stdin (after it printed ``spawned``), rank 0 of a proc mesh on a host
agent (``ProcessJob``: its workers reach the controller over TCP) stops in
``breakpoint()``; it prints the result, or the type of the remote error.
"""

from __future__ import annotations

import asyncio
import pdb
import sys
from pathlib import Path

import meshio
from meshio import Actor, Channel, Port, endpoint
from meshio.jobs import ProcessJob

#: heartbeat timeout of the ``heartbeats`` run
TIMEOUT = 1.0


class Paused(Actor):
    @endpoint
    async def step(self, x: int) -> int:
        doubled = x * 2
        breakpoint()  # async breakpoint
        shifted = doubled + 1
        await asyncio.sleep(0)  # the loop runs other tasks meanwhile
        return shifted  # async

    @endpoint
    def step_sync(self, x: int) -> int:
        doubled = x * 3
        pdb.set_trace(header="rank 1 stops here")  # def breakpoint
        shifted = doubled + 1
        return shifted

    @endpoint
    async def step_announced(self, x: int, started: Port[int]) -> int:
        started.send(meshio.current_rank().rank)
        doubled = x * 2
        breakpoint()
        return doubled + 1

    @endpoint
    def ping(self) -> int:
        return meshio.current_rank().rank


#: ``stall_after`` of the paused actors: far shorter than a session (time
#: paused in pdb is not a stall, so none is reported)
STALL_AFTER = 0.5


async def pair() -> None:
    async with meshio.this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        paused = await procs.options(stall_after=STALL_AFTER).spawn("steppers", Paused)
        bystanders = await procs.spawn("bystanders", Paused)
        calls = asyncio.gather(paused.slice(gpus=0).step.call_one(10),
                               paused.slice(gpus=1).step_sync.call_one(20))
        try:
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            rank = await bystanders.slice(gpus=1).ping.call_one()
            print(f"bystander {rank} answered", flush=True)
            print(f"results {await calls}", flush=True)
            print(f"steppers answered {(await paused.ping.call()).values()}", flush=True)
        finally:
            calls.cancel()


async def terminal() -> None:
    async with meshio.this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        paused = await procs.spawn("steppers", Paused)
        results = await asyncio.gather(paused.slice(gpus=0).step.call_one(10),
                                       paused.slice(gpus=1).step_sync.call_one(20))
        print(f"results {results}", flush=True)


async def heartbeats() -> None:
    loop = asyncio.get_running_loop()
    async with meshio.this_host().spawn_procs(per_host={"gpus": 2}, heartbeat_interval=0.2,
                                              heartbeat_timeout=TIMEOUT) as procs:
        paused = await procs.options(stall_after=STALL_AFTER).spawn("steppers", Paused)
        port, started = Channel[int].open()
        call = asyncio.ensure_future(paused.slice(gpus=0).step_announced.call_one(5, port))
        try:
            await started.recv()
            since, answered = loop.time(), 0
            # (the paused process is judged by heartbeats all along: time must pass)
            while loop.time() - since < 3 * TIMEOUT:
                assert await paused.slice(gpus=1).ping.call_one() == 1
                answered += 1
                await asyncio.sleep(0.05)  # (pacing, not waiting for something)
            print(f"other process answered {answered} calls", flush=True)
            print(f"result {await call}", flush=True)
        finally:
            call.cancel()


async def agents(cache: str) -> None:
    job = ProcessJob(meshes={"hosts": 1}, cache_dir=Path(cache))
    try:
        state = await job.state()
        async with state.hosts.spawn_procs(per_host={"gpus": 1}) as procs:
            paused = await procs.spawn("remote", Paused)
            print("spawned", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            try:
                print(f"result {await paused.step.call_one(7)}", flush=True)
            except meshio.ActorError as e:
                print(f"failed: {e.remote_type}", flush=True)
    finally:
        await job.kill()


if __name__ == "__main__":
    mode = sys.argv[1]
    meshio.run(pair() if mode == "pair" else terminal() if mode == "terminal"
               else heartbeats() if mode == "heartbeats" else agents(sys.argv[2]))
