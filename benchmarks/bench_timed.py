"""Calls with a deadline beside the same calls without: what
``.options(timeout=...)`` adds to a call.

Rows, each timed and untimed in interleaved repetitions on one worker
process (and on 4 for ``call``): the median latency of sequential
``call_one`` awaits, the time of 1,000 ``call_one`` in flight
(``asyncio.gather``), the median latency of a ``call`` on 4 actors; then
the ratio timed / untimed.  ``--loop asyncio`` is the standard loop
(``asyncio.run``), ``--loop uvloop`` is ``meshio.run``'s.  Long jobs put a
deadline on every call, so the ratios should stay close to 1.

An A/B of two source trees: run it alternately with each on ``PYTHONPATH``
(``git archive <commit> src | tar -x -C /tmp/old``, then
``PYTHONPATH=/tmp/old/src python benchmarks/bench_timed.py``).

Usage: python benchmarks/bench_timed.py [--loop asyncio|uvloop] [--reps 5]
       [--timeout 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import meshio
from meshio import Actor, endpoint


class Bench(Actor):
    @endpoint
    async def ping(self, x: int) -> int:
        return x


async def sequential(call: Callable[[int], Awaitable[Any]], n: int) -> float:
    """Median seconds of ``n`` calls (``ep.call_one``, ``ep.call``) awaited
    one after another."""
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        await call(i)
        lat.append(time.perf_counter() - t0)
    return statistics.median(lat)


async def in_flight(ep: Any, n: int) -> float:
    """Seconds of ``n`` ``call_one`` in flight at once."""
    t0 = time.perf_counter()
    await asyncio.gather(*[ep.call_one(i) for i in range(n)])
    return time.perf_counter() - t0


ROWS = (("call_one latency, median µs", 1e6), ("1,000 call_one in flight, ms", 1e3),
        ("call on 4 actors, median µs", 1e6))


async def main(reps: int, timeout: float) -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 4}) as procs:
        actors = await procs.spawn("bench", Bench)
        one = actors.slice(procs=0).ping
        sides = {"untimed": (one, actors.ping),
                 "timed": (one.options(timeout=timeout), actors.ping.options(timeout=timeout))}
        for single, every in sides.values():  # warm-up
            await sequential(single.call_one, 500)
            await sequential(every.call, 200)
        got: dict[str, list[list[float]]] = {side: [[], [], []] for side in sides}
        for _ in range(reps):
            for side, (single, every) in sides.items():
                got[side][0].append(await sequential(single.call_one, 2000))
                got[side][1].append(await in_flight(single, 1000))
                got[side][2].append(await sequential(every.call, 500))
    print(f"timeout={timeout} vs none, medians of {reps} interleaved repetitions")
    print("| | untimed | timed | timed / untimed |")
    print("|---|---|---|---|")
    for r, (row, scale) in enumerate(ROWS):
        untimed, timed = (statistics.median(got[side][r]) for side in sides)
        print(f"| {row} | {untimed * scale:,.1f} | {timed * scale:,.1f} | "
              f"{timed / untimed:.2f}x |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=5.0)
    args = ap.parse_args()
    if args.loop == "uvloop":
        meshio.run(main(args.reps, args.timeout))
    else:
        asyncio.run(main(args.reps, args.timeout))
