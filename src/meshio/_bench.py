"""``meshio bench``: per-call cost on this host, in one minute or less."""

from __future__ import annotations

import asyncio
import statistics
import time

import meshio
from meshio import Actor, endpoint


class Ping(Actor):
    @endpoint
    async def ping(self, x: int) -> int:
        return x


async def round_trips(one: Ping, calls: int, warmup: int = 200) -> list[float]:
    """Seconds of ``calls`` sequential ``ping`` round trips to a one-actor
    mesh, after ``warmup`` untimed ones."""
    for i in range(warmup):
        await one.ping.call_one(i)
    samples: list[float] = []
    for i in range(calls):
        t0 = time.perf_counter()
        await one.ping.call_one(i)
        samples.append(time.perf_counter() - t0)
    return samples


async def bench(calls: int = 2000, inflight: int = 1000, procs_n: int = 4) -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": procs_n}) as procs:
        mesh = await procs.spawn("ping", Ping)
        one = mesh.slice(procs=0)
        samples = sorted(await round_trips(one, calls))
        print(f"round trip, one call at a time    median {statistics.median(samples) * 1e6:7.1f} us"
              f"   p99 {samples[int(len(samples) * 0.99) - 1] * 1e6:7.1f} us  ({calls} calls)")
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one.ping.call_one(i) for i in range(inflight)))
        dt = time.perf_counter() - t0
        assert results[-1] == inflight - 1
        print(f"throughput, {inflight} calls in flight   {inflight / dt:9.0f} calls/s")
        gathers: list[float] = []
        for i in range(max(50, calls // 10)):
            t0 = time.perf_counter()
            await mesh.ping.call(i)
            gathers.append(time.perf_counter() - t0)
        print(f"call on {procs_n} actors + gather       median "
              f"{statistics.median(gathers) * 1e6:7.1f} us")
