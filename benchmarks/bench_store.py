"""The weight store on one host (issue 17 section 1): a 256 MiB state dict
published, then read by 3 readers in other processes at once, against a
memcpy of the same size measured in the same run.

Rows: memcpy of 256 MiB (one thread, into mapped memory); publish (the time
the publisher's ``await store.publish(...)`` takes: its one copy); the three
readers' aggregate bandwidth with ``read_into`` (in place) and with ``read``
(new tensors), as ratios to memcpy.  Medians of ``--reps``.

Usage: python benchmarks/bench_store.py [--mib 256] [--readers 3] [--reps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch

import meshio
from meshio import Actor, endpoint
from meshio.store import WeightStore

MiB = 1 << 20


def state_dict(mib: int) -> dict[str, torch.Tensor]:
    """``mib`` MiB of float32 in 16 tensors, as a model's would be."""
    per = mib * MiB // 16 // 4
    return {f"layer{i}.weight": torch.rand(per) for i in range(16)}


class Reader(Actor):
    def __init__(self, mib: int) -> None:
        per = mib * MiB // 16 // 4
        self.dst = {f"layer{i}.weight": torch.zeros(per) for i in range(16)}

    @endpoint
    async def read_into(self, store: WeightStore) -> float:
        t0 = time.perf_counter()
        await store.read_into(self.dst)
        return time.perf_counter() - t0

    @endpoint
    async def read(self, store: WeightStore) -> float:
        t0 = time.perf_counter()
        sd = await store.read()
        took = time.perf_counter() - t0
        del sd
        return took


def memcpy_s(mib: int) -> float:
    src = torch.rand(mib * MiB // 4)
    dst = torch.zeros_like(src)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def main(mib: int, readers: int, reps: int) -> None:
    copy = memcpy_s(mib)
    store = WeightStore("bench")
    sd = state_dict(mib)
    publish: list[float] = []
    into: list[float] = []
    fresh: list[float] = []
    async with meshio.this_host().spawn_procs(per_host={"procs": readers}) as procs:
        mesh = await procs.spawn("readers", Reader, mib)
        # the first keep + 1 versions go to fresh memory (page faults); later
        # ones to the blocks of versions dropped (what a training loop sees)
        t0 = time.perf_counter()
        await store.publish(sd, version=0)
        first = time.perf_counter() - t0
        for version in (1, 2):
            await store.publish(sd, version=version)
        for version in range(3, 3 + reps):
            t0 = time.perf_counter()
            await store.publish(sd, version=version)
            publish.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await mesh.read_into.call(store)
            into.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await mesh.read.call(store)
            fresh.append(time.perf_counter() - t0)
    size = mib * MiB
    bw = size / copy / MiB
    print(f"| measurement ({mib} MiB, {readers} readers, median of {reps}) | value | x memcpy |")
    print("|---|---|---|")
    print(f"| memcpy, one thread | {copy * 1e3:.1f} ms ({bw:,.0f} MiB/s) | 1.00x |")
    print(f"| first publish (fresh memory) | {first * 1e3:.1f} ms "
          f"| {first / copy:.2f}x the time |")
    p = statistics.median(publish)
    print(f"| publish, steady (the publisher's await) | {p * 1e3:.1f} ms "
          f"| {p / copy:.2f}x the time |")
    for name, times in (("read_into, aggregate", into), ("read, aggregate", fresh)):
        agg = readers * size / statistics.median(times) / MiB
        print(f"| {name} | {agg:,.0f} MiB/s | {agg / bw:.2f}x |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--readers", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    asyncio.run(main(args.mib, args.readers, args.reps))
