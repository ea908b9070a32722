"""CUDA tensors through calls, against the copies they cannot avoid.

A CUDA tensor in a message is copied to host memory, moved as any large
value (one copy between the processes of a host), and copied back to the
GPU where it arrives. This times a round trip (argument there, result back)
of a CUDA tensor through one worker on the same GPU, per size, against the
floor of what it copies: in one process, the tensor to pinned host memory,
copied once in host memory (the move between processes) into pinned memory
and back to the GPU, once each way. Medians of ``--reps``
after a warm-up; MiB/s counts the tensor's bytes once per round trip.

    python benchmarks/bench_cuda_values.py                   # uvloop (meshio.run)
    python benchmarks/bench_cuda_values.py --loop asyncio    # the standard loop
    python benchmarks/bench_cuda_values.py --mib 4 64 1024
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch

import meshio
from meshio import Actor, endpoint

MiB = 1 << 20


class Echo(Actor):
    @endpoint
    async def echo(self, t: torch.Tensor) -> torch.Tensor:
        assert t.is_cuda
        return t


def floor_s(t: torch.Tensor, reps: int) -> float:
    """Median seconds of the copies a round trip makes, in one process: to
    pinned host memory, a host copy (between the processes) into pinned
    memory, back to the GPU, twice."""
    pinned = torch.empty_like(t, device="cpu", pin_memory=True)
    other = torch.empty_like(t, device="cpu", pin_memory=True)
    times = []
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(2):
            pinned.copy_(t)
            other.copy_(pinned)
            t.copy_(other)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


async def main(sizes: list[int], reps: int) -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = await procs.spawn("echo", Echo)
        print(f"{'MiB':>6} {'meshio ms':>10} {'MiB/s':>8} {'floor ms':>9} {'floor MiB/s':>12} "
              f"{'÷ floor':>8}")
        for mib in sizes:
            t = torch.randn(mib * MiB // 4, device="cuda")
            times = []
            for _ in range(reps + 1):
                torch.cuda.synchronize()
                start = time.perf_counter()
                back = await echo.echo.call_one(t)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            assert back.is_cuda and torch.equal(back, t)
            del back
            ours, floor = statistics.median(times[1:]), floor_s(t, reps)
            print(f"{mib:>6} {ours * 1e3:>10.2f} {mib / ours:>8.0f} {floor * 1e3:>9.2f} "
                  f"{mib / floor:>12.0f} {floor / ours:>7.2f}x", flush=True)
            del t


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, nargs="+", default=[1, 16, 64, 256, 1024])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args()
    (meshio.run if args.loop == "uvloop" else asyncio.run)(main(args.mib, args.reps))
