"""Busy actors for ``tests/test_stacks.py``, and, run as a script, a
controller for ``meshio stacks`` and ``meshio dashboard`` to look at
(:func:`running`): four actors kept busy (ranks 0-1 in a ``def`` endpoint,
2-3 in an ``async`` one) until stdin closes; it prints ``ready`` once they
all are."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import meshio
from meshio import Actor, Channel, Port, Stacks, endpoint


def line_of(marker: str) -> int:
    """The line of this file that ends with the comment ``marker``."""
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.endswith(f"# {marker}"))


class Busy(Actor):
    """Kept busy on purpose: ``block`` and ``spin`` in the actor's thread,
    ``hang`` on the loop; ``release`` (concurrent: it runs while they do)
    ends them all."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.forever = asyncio.Event()

    @endpoint
    def block(self, started: Port[int]) -> str:
        started.send(meshio.current_rank().rank)
        self.released.wait()  # def endpoint blocks here
        return "unblocked"

    @endpoint
    def spin(self, started: Port[int]) -> int:
        started.send(meshio.current_rank().rank)
        turns = 0
        while not self.released.is_set():  # def endpoint spins here
            turns += 1
        return turns

    @endpoint
    async def hang(self, started: Port[int]) -> str:
        started.send(meshio.current_rank().rank)
        await self.forever.wait()  # async endpoint awaits here
        return "woken"

    @endpoint(concurrent=True)
    async def release(self) -> None:
        self.released.set()
        self.forever.set()


BLOCK_LINE = line_of("def endpoint blocks here")
HANG_LINE = line_of("async endpoint awaits here")
SPIN_LINE = line_of("def endpoint spins here")


async def until_blocked(mesh: Busy) -> Stacks:
    """The stacks of a mesh of four busy actors, once ranks 0-1 sit in
    their blocking line: they told us they started, and are there a moment
    later (ranks 2-3 are at theirs as soon as they tell: their loop runs
    nothing else before they await)."""
    while True:
        stacks = await mesh.stacks()
        if all(any(f.line == BLOCK_LINE for f in a.thread) for a in stacks.actors[:2]):
            return stacks


async def main() -> None:
    async with meshio.this_host().spawn_procs(per_host={"gpus": 4}) as procs:
        busy = await procs.spawn("busy", Busy)
        port, started = Channel[int].open()
        calls = asyncio.gather(busy.slice(gpus=slice(0, 2)).block.call(port),
                               busy.slice(gpus=slice(2, 4)).hang.call(port))
        for _ in range(4):
            await started.recv()
        await until_blocked(busy)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await busy.release.call()
        await calls


def meshio_cli(*args: str, env: dict[str, str],
               timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """``meshio ARGS`` run to its end, its output captured."""
    return subprocess.run([sys.executable, "-m", "meshio", *args], env=env, text=True,
                          capture_output=True, timeout=timeout)


@contextmanager
def running(env: dict[str, str], timeout: float = 30.0) -> Iterator[subprocess.Popen[str]]:
    """This script running as a controller (its actors busy: it printed
    ``ready``); on exit its stdin is closed and it must end well."""
    with subprocess.Popen([sys.executable, __file__], env=env, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as controller:
        assert controller.stdin is not None and controller.stdout is not None
        try:
            assert controller.stdout.readline() == "ready\n"
            yield controller
        finally:
            controller.stdin.close()
        assert controller.wait(timeout) == 0


if __name__ == "__main__":
    meshio.run(main())
