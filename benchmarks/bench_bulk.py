"""Large values on one host (issue 16 item 1): a tensor argument of
``--mib`` MiB to one worker, on the standard loop (``asyncio.run``) and on
uvloop (``meshio.run``), beside a memcpy floor (``Tensor.copy_`` into
memory already mapped, and ``clone()``, into fresh memory), interleaved in
one run; prints min and median GiB/s and the ratios to memcpy.

    python benchmarks/bench_bulk.py            # 64 MiB
    python benchmarks/bench_bulk.py --mib 1024 --reps 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

import torch

import meshio
from meshio import Actor, endpoint


class Sink(Actor):
    def __init__(self) -> None:
        self.t = torch.ones(0)

    @endpoint
    async def numel(self, t: torch.Tensor) -> int:
        return t.numel()

    @endpoint
    async def make(self, n: int) -> torch.Tensor:
        """A tensor of ``n`` bytes, made once: the result measures the move."""
        if self.t.nbytes != n:
            self.t = torch.ones(n // 4)
        return self.t


async def one_loop(n: int, reps: int) -> dict[str, list[float]]:
    t = torch.ones(n // 4)
    dst = torch.empty_like(t)
    times: dict[str, list[float]] = {"memcpy": [], "clone": [], "argument": [], "result": []}
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        s = await procs.spawn("sink", Sink)
        await s.numel.call_one(t)
        await s.make.call_one(n)
        for _ in range(reps):
            t0 = time.perf_counter()
            dst.copy_(t)
            times["memcpy"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            c = t.clone()
            times["clone"].append(time.perf_counter() - t0)
            del c
            t0 = time.perf_counter()
            await s.numel.call_one(t)
            times["argument"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            r = await s.make.call_one(n)
            times["result"].append(time.perf_counter() - t0)
            del r
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--loop", choices=["std", "uvloop"])
    args = ap.parse_args()
    n = args.mib << 20
    if args.loop is None:  # each loop in a process of its own, one after the other
        for loop in ("std", "uvloop"):
            subprocess.run([sys.executable, __file__, "--mib", str(args.mib), "--reps",
                            str(args.reps), "--loop", loop], check=True)
        return
    torch.set_num_threads(1)  # memcpy on one core, as a process copies
    run = asyncio.run if args.loop == "std" else meshio.run
    times = run(one_loop(n, args.reps))
    floor = statistics.median(times["memcpy"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{args.loop:6s} {args.mib:5d} MiB {name:8s} min {n / min(ts) / 2**30:5.2f} "
              f"median {n / med / 2**30:5.2f} GiB/s  ({floor / med:.2f}x memcpy)")


if __name__ == "__main__":
    main()
