"""Flame graphs of small calls: where the controller and its worker spend
their CPU while 1,000 calls are in flight, sampled by ``py-spy``.

The controller keeps bursts of 1,000 ``call_one`` + ``asyncio.gather``
going to one worker while two ``py-spy record`` processes sample it and the
worker for ``--seconds``; the graphs land in ``benchmarks/`` (``--out``)
(``flame_small_calls_controller.svg``, ``flame_small_calls_worker.svg``),
titled with the commit and the loop.  ``py-spy`` must be able to
read both processes' memory (root, or Yama ``ptrace_scope`` 0).

Usage: python benchmarks/bench_flame.py [--loop uvloop|asyncio] [--seconds 10] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys

import meshio
from meshio import Actor, endpoint

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "peers"))
from run import src_revision  # noqa: E402

LOOPS = {"asyncio": asyncio.run, "uvloop": meshio.run}


class Bench(Actor):
    @endpoint
    async def ping(self, x: int) -> int:
        return x

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


def record(pid: int, graph: str, seconds: float) -> subprocess.Popen[bytes]:
    """A ``py-spy record`` of ``pid`` for ``seconds`` into ``graph``."""
    return subprocess.Popen([
        "py-spy", "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
        "--rate", "250", "--nonblocking", "--format", "flamegraph", "--output", graph])


def retitle(graph: str, title: str) -> None:
    """Give ``graph`` ``title`` (py-spy titles it with its command)."""
    with open(graph) as f:
        svg = f.read()
    with open(graph, "w") as f:
        f.write(re.sub(r'(<text id="title"[^>]*>)[^<]*', lambda m: m.group(1) + title, svg,
                       count=1))


async def profile(loop: str, seconds: float, out: str) -> None:
    graphs = {side: os.path.join(out, f"flame_small_calls_{side}.svg")
              for side in ("controller", "worker")}
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        actor = (await procs.spawn("bench", Bench)).slice(procs=0)
        worker = await actor.pid.call_one()
        for _ in range(20):  # warm up before sampling starts
            await asyncio.gather(*(actor.ping.call_one(i) for i in range(1000)))
        spies = [record(os.getpid(), graphs["controller"], seconds),
                 record(worker, graphs["worker"], seconds)]
        while any(spy.poll() is None for spy in spies):
            await asyncio.gather(*(actor.ping.call_one(i) for i in range(1000)))
        failed = [spy.args for spy in spies if spy.returncode]
        if failed:
            raise SystemExit(f"bench_flame: py-spy failed: {failed}")
    head = src_revision() or "an unknown commit"
    for side, graph in graphs.items():
        retitle(graph, f"meshio at {head}: the {side}, 1,000 calls in flight, {loop}")
        print(f"bench_flame: {graph}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--loop", choices=sorted(LOOPS), default="uvloop")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", default=HERE, help="folder of the graphs (benchmarks/)")
    args = parser.parse_args()
    if shutil.which("py-spy") is None:
        sys.exit("bench_flame: py-spy is not installed (pip install py-spy)")
    LOOPS[args.loop](profile(args.loop, args.seconds, args.out))


if __name__ == "__main__":
    main()
