"""RDMA buffer transfers on one host, all in one run:

- memcpy: ``ctypes.memmove`` between two buffers of one process (the ceiling);
- meshio same_host: ``RDMABuffer.read_into`` from a buffer owned by a worker
  process (cross-memory attach, one-sided);
- meshio bytes call: an endpoint returning the same bytes (out of band);
- Monarch 0.7.0 ``RDMABuffer.read_into`` (its TCP fallback here), run in
  Monarch's virtualenv when ``MONARCH_VENV`` is set.

Usage: MONARCH_VENV=/path/to/venv python benchmarks/bench_rdma.py [--sizes 64,1024] [--reps 5]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import time

import meshio
from meshio import Actor, RDMABuffer, endpoint


class Owner(Actor):
    @endpoint
    async def make(self, nbytes: int) -> RDMABuffer:
        self.data = bytearray(b"\x01") * nbytes
        return RDMABuffer(self.data)

    @endpoint
    async def fetch(self) -> bytes:
        return self.payload

    @endpoint
    async def prepare_bytes(self) -> None:
        self.payload = bytes(self.data)


def median_rate(times: list[float], nbytes: int) -> tuple[float, float]:
    t = statistics.median(times)
    return t * 1e3, nbytes / t / 2**30


async def run(sizes: list[int], reps: int) -> dict[str, dict[str, list[float]]]:
    results: dict[str, dict[str, list[float]]] = {}
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        owner = await procs.spawn("owner", Owner)
        for mib in sizes:
            n = mib << 20
            key = f"{mib} MiB"
            r = reps if mib < 1024 else max(3, reps // 2)
            src = bytearray(b"\x02") * n
            dst = bytearray(n)  # touched below, so page faults are not timed
            ctypes.memmove((ctypes.c_char * n).from_buffer(dst),
                           (ctypes.c_char * n).from_buffer(src), n)
            times = []
            for _ in range(r):
                t0 = time.perf_counter()
                ctypes.memmove((ctypes.c_char * n).from_buffer(dst),
                               (ctypes.c_char * n).from_buffer(src), n)
                times.append(time.perf_counter() - t0)
            results.setdefault(key, {})["memcpy (one process)"] = times
            del src

            buf = await owner.make.call_one(n)
            assert buf.backend == "same_host"
            await buf.read_into(dst)
            times = []
            for _ in range(r):
                t0 = time.perf_counter()
                await buf.read_into(dst)
                times.append(time.perf_counter() - t0)
            assert dst[0] == 1 and dst[n - 1] == 1
            results[key]["meshio RDMABuffer same_host"] = times
            await buf.drop()
            del dst

            await owner.prepare_bytes.call_one()
            await owner.fetch.call_one()
            times = []
            for _ in range(r):
                t0 = time.perf_counter()
                data = await owner.fetch.call_one()
                times.append(time.perf_counter() - t0)
                assert len(data) == n
                del data
            results[key]["meshio bytes call"] = times
    return results


def monarch(sizes: list[int], reps: int) -> dict[str, list[float]] | None:
    venv = os.environ.get("MONARCH_VENV")
    if not venv:
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run([os.path.join(venv, "bin", "python"),
                        os.path.join(here, "bench_rdma_monarch.py"),
                        ",".join(map(str, sizes)), str(reps)],
                       capture_output=True, text=True, timeout=3600)
    lines = [x for x in p.stdout.splitlines() if x.startswith("MONARCH_RDMA_JSON:")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"monarch run failed rc={p.returncode}\n{p.stderr[-3000:]}")
    result: dict[str, list[float]] = json.loads(lines[-1].split(":", 1)[1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64,1024", help="MiB, comma separated")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    results = meshio.run(run(sizes, args.reps))
    mon = monarch(sizes, args.reps)
    if mon is not None:
        for key, times in mon.items():
            results[key]["Monarch 0.7.0 RDMABuffer (tcp fallback)"] = times
    print("| size | method | median ms | GiB/s | vs memcpy | vs Monarch |")
    print("|---|---|---|---|---|---|")
    for key, rows in results.items():
        n = int(key.split()[0]) << 20
        base = median_rate(rows["memcpy (one process)"], n)[1]
        mon_rate = (median_rate(rows["Monarch 0.7.0 RDMABuffer (tcp fallback)"], n)[1]
                    if "Monarch 0.7.0 RDMABuffer (tcp fallback)" in rows else None)
        for name, times in rows.items():
            ms, rate = median_rate(times, n)
            vs_mon = f"{rate / mon_rate:.1f}x" if mon_rate else "n/a"
            print(f"| {key} | {name} | {ms:.1f} | {rate:.2f} | {rate / base:.0%} | {vs_mon} |")


if __name__ == "__main__":
    main()
