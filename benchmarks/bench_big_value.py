"""Peak memory moving one large ``str`` through a call (issue 7 item 3).

Sends a ``str`` of ``--gib`` GiB to one worker as an argument, then asks the
worker for one as a result, and prints each process's peak RSS (``ru_maxrss``)
above its baseline, in multiples of the value's size.

    python benchmarks/bench_big_value.py            # 1 GiB
    python benchmarks/bench_big_value.py --gib 0.25
"""

from __future__ import annotations

import argparse
import resource

import meshio
from meshio import Actor, endpoint


def peak_rss() -> int:
    """This process's peak resident set size in bytes (Linux: KiB units)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Sink(Actor):
    @endpoint
    async def length(self, data: str) -> int:
        return len(data)

    @endpoint
    async def text(self, n: int) -> str:
        return "y" * n

    @endpoint
    async def peak(self) -> int:
        return peak_rss()


async def main(n: int) -> None:
    gib = n / (1 << 30)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        sink = await procs.spawn("sink", Sink)
        await sink.length.call_one(data="warm")
        worker_base = await sink.peak.call_one()
        base = peak_rss()
        text = "x" * n
        try:
            got = await sink.length.call_one(data=text)
            outcome = "ok" if got == n else f"wrong length {got}"
        except meshio.MeshioError as e:
            outcome = f"{type(e).__name__}: {str(e)[:200]}"
        del text
        sent = peak_rss()
        print(f"argument {gib:.2f} GiB: {outcome}")
        print(f"  controller peak above baseline: {(sent - base) / n:.2f} x the value")
        try:
            worker = await sink.peak.call_one()
            print(f"  worker peak above baseline:     {(worker - worker_base) / n:.2f} x")
        except meshio.MeshioError as e:
            print(f"  worker: {type(e).__name__}: {str(e)[:200]}")
            return
        try:
            got_text = await sink.text.call_one(n=n)
            outcome = "ok" if len(got_text) == n else "wrong length"
            del got_text
        except meshio.MeshioError as e:
            outcome = f"{type(e).__name__}: {str(e)[:200]}"
        print(f"result {gib:.2f} GiB: {outcome}")
        print(f"  controller peak above baseline: {(peak_rss() - base) / n:.2f} x the value")
        worker = await sink.peak.call_one()
        print(f"  worker peak above baseline:     {(worker - worker_base) / n:.2f} x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    meshio.run(main(int(ap.parse_args().gib * (1 << 30))))
