"""Metrics scrape: ``GET /metrics`` of ``meshio.serve_metrics`` with many
actor meshes (200 -> 1,600 by default) on one proc mesh of 2 processes.

For each size, the median of ``--reps`` of:

- ``stats``: ``await meshio.stats()``, the numbers gathered from the workers;
- ``text``: ``prometheus_text`` of that snapshot, on its own;
- ``scrape``: one ``GET /metrics`` over HTTP (gather, text, send), read by
  a thread;
- ``stall``: the longest the controller's loop went without a turn during
  that scrape (what a scrape costs everything else on the loop).

and the exponent of each over the sizes (1.0: linear).  For an A/B on one
machine run it also against another source tree (``git archive HEAD src |
tar -x -C /tmp/base``; ``prometheus_text`` and ``serve_metrics`` are in
both) with ``PYTHONPATH=/tmp/base/src``, which the workers inherit.

Usage: python benchmarks/bench_metrics.py [--meshes 200 800 1600] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import time
import urllib.request

import meshio
from meshio import Actor, endpoint
from meshio._prometheus import prometheus_text


class Small(Actor):
    @endpoint
    async def ping(self, k: int) -> int:
        return k

    @endpoint
    async def echo(self, xs: list[int]) -> int:
        return len(xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--meshes", type=int, nargs="+", default=[200, 800, 1600])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    print(f"meshio from {meshio.__file__}")
    results = meshio.run(measure(args.meshes, args.reps))
    print(f"{'meshes':>7} {'stats s':>9} {'text s':>9} {'scrape s':>9} {'stall s':>9} {'MiB':>6}")
    for n in args.meshes:
        r = results[n]
        print(f"{n:7d} {r['stats']:9.4f} {r['text']:9.4f} {r['scrape']:9.4f} "
              f"{r['stall']:9.4f} {r['mib']:6.1f}")
    first, last = args.meshes[0], args.meshes[-1]
    print("exponent", "  ".join(
        f"{k} {math.log(results[last][k] / results[first][k]) / math.log(last / first):.2f}"
        for k in ("stats", "text", "scrape", "stall")))


def fetch(url: str) -> int:
    with urllib.request.urlopen(url, timeout=120) as r:
        return len(r.read())


async def scrape(url: str) -> tuple[float, float, int]:
    """One ``GET``: its time, the loop's longest stall meanwhile, its size."""
    loop = asyncio.get_running_loop()
    stall = 0.0
    last = time.perf_counter()
    going = True

    def turn() -> None:
        nonlocal stall, last
        now = time.perf_counter()
        stall = max(stall, now - last)
        last = now
        if going:
            loop.call_soon(turn)

    loop.call_soon(turn)
    t0 = time.perf_counter()
    size = await asyncio.to_thread(fetch, url)
    took = time.perf_counter() - t0
    going = False
    return took, stall, size


async def measure(sizes: list[int], reps: int) -> dict[int, dict[str, float]]:
    results: dict[int, dict[str, float]] = {}
    for n in sizes:
        async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
            meshes = await asyncio.gather(*(procs.spawn(f"m{i}", Small) for i in range(n)))
            await asyncio.gather(*(m.ping.call(k=1) for m in meshes))
            times: dict[str, list[float]] = {"stats": [], "text": [], "scrape": [], "stall": []}
            size = 0
            async with meshio.serve_metrics(port=0) as server:
                for _ in range(reps):
                    t0 = time.perf_counter()
                    snapshot = await meshio.stats()
                    times["stats"].append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    prometheus_text(snapshot)
                    times["text"].append(time.perf_counter() - t0)
                    took, stall, size = await scrape(server.url)
                    times["scrape"].append(took)
                    times["stall"].append(stall)
            results[n] = {k: statistics.median(v) for k, v in times.items()}
            results[n]["mib"] = size / 2**20
            print(n, {k: round(v, 4) for k, v in results[n].items()}, flush=True)
    return results


if __name__ == "__main__":
    main()
