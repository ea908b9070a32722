"""Monarch 0.7.0 side of bench_rdma.py (run in Monarch's virtualenv).

An actor in another process owns a tensor and hands out an RDMABuffer; the
controller times ``read_into`` (Monarch's TCP fallback on this hardware).
Prints one JSON line: {"64 MiB": [seconds, ...], ...}.
"""

import asyncio
import json
import sys
import time
import warnings

import torch
from monarch.actor import Actor, endpoint, this_host
from monarch.rdma import RDMABuffer

warnings.simplefilter("ignore")


class Owner(Actor):
    @endpoint
    async def make(self, nbytes: int) -> RDMABuffer:
        self.data = torch.ones(nbytes, dtype=torch.uint8)
        return RDMABuffer(self.data)


async def main(sizes: list[int], reps: int) -> None:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    owner = procs.spawn("owner", Owner)
    out: dict[str, list[float]] = {}
    for mib in sizes:
        n = mib << 20
        buf = await owner.make.call_one(n)
        dst = torch.zeros(n, dtype=torch.uint8)
        await buf.read_into(dst, timeout=600)  # warm-up
        times = []
        for _ in range(reps if mib < 1024 else max(1, reps // 2)):
            t0 = time.perf_counter()
            await buf.read_into(dst, timeout=600)
            times.append(time.perf_counter() - t0)
        assert int(dst[n - 1]) == 1
        out[f"{mib} MiB"] = times
        del buf, dst
    await procs.stop()
    print("MONARCH_RDMA_JSON:" + json.dumps(out), flush=True)


if __name__ == "__main__":
    asyncio.run(main([int(x) for x in sys.argv[1].split(",")], int(sys.argv[2])))
