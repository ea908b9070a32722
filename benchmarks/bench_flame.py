"""Flame graphs of small calls: where the controller and its worker spend
their CPU while 1,000 calls are in flight, sampled by ``py-spy``.

The controller keeps bursts of 1,000 ``call_one`` + ``asyncio.gather``
going to one worker while two ``py-spy record`` processes sample it and the
worker for ``--seconds``; the graphs land in ``benchmarks/``
(``flame_small_calls_controller.svg``, ``flame_small_calls_worker.svg``);
the commit and loop they show are printed.  ``py-spy`` must be able to
read both processes' memory (root, or Yama ``ptrace_scope`` 0).

Usage: python benchmarks/bench_flame.py [--loop uvloop|asyncio] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys

import meshio
from meshio import Actor, endpoint

HERE = os.path.dirname(os.path.abspath(__file__))
LOOPS = {"asyncio": asyncio.run, "uvloop": meshio.run}


class Bench(Actor):
    @endpoint
    async def ping(self, x: int) -> int:
        return x

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


def record(pid: int, side: str, seconds: float) -> subprocess.Popen[bytes]:
    """A ``py-spy record`` of ``pid`` for ``seconds`` into this folder."""
    return subprocess.Popen([
        "py-spy", "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
        "--rate", "250", "--nonblocking", "--format", "flamegraph",
        "--output", os.path.join(HERE, f"flame_small_calls_{side}.svg")])


async def profile(loop: str, seconds: float) -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        actor = (await procs.spawn("bench", Bench)).slice(procs=0)
        worker = await actor.pid.call_one()
        for _ in range(20):  # warm up before sampling starts
            await asyncio.gather(*(actor.ping.call_one(i) for i in range(1000)))
        spies = [record(os.getpid(), "controller", seconds), record(worker, "worker", seconds)]
        while any(spy.poll() is None for spy in spies):
            await asyncio.gather(*(actor.ping.call_one(i) for i in range(1000)))
        failed = [spy.args for spy in spies if spy.returncode]
        if failed:
            raise SystemExit(f"bench_flame: py-spy failed: {failed}")
    head = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    print(f"bench_flame: meshio at {head or 'an unknown commit'}, {loop}: "
          f"{HERE}/flame_small_calls_{{controller,worker}}.svg")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--loop", choices=sorted(LOOPS), default="uvloop")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    if shutil.which("py-spy") is None:
        sys.exit("bench_flame: py-spy is not installed (pip install py-spy)")
    LOOPS[args.loop](profile(args.loop, args.seconds))


if __name__ == "__main__":
    main()
