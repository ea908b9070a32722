"""Supervision benchmarks, one run:

1. restart time: SIGKILL a worker, then time until the first successful call
   on its replacement (a retryable endpoint waits for the restart, then
   answers from the new pid); median of ``--kills`` kills.
2. overhead: int->int round-trip latency on a supervised vs an unsupervised
   one-process mesh, measured in alternating blocks in the same run.
3. gang restart: a ``one_for_all`` mesh of ``--gang`` processes loses one to
   SIGKILL; time until every replacement is up (the gang's last ``restart``
   event), against starting the same mesh fresh; median of ``--gang-kills``.

Usage: python benchmarks/bench_supervision.py [--kills 20] [--calls 2000] [--reps 7]
       [--gang 4] [--gang-kills 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import time

import meshio
from meshio import endpoint
from meshio._bench import Ping, round_trips


class Bench(Ping):
    @endpoint(retryable=True)
    async def pid(self) -> int:
        return os.getpid()


async def latency(mesh: Bench, calls: int) -> float:
    return statistics.median(await round_trips(mesh.slice(procs=0), calls)) * 1e6


async def main(args: argparse.Namespace) -> None:
    sup = meshio.Supervisor("one_for_one", max_restarts=args.kills + 1, within=3600.0)
    host = meshio.this_host()
    async with host.spawn_procs(per_host={"procs": 1}, name="plain") as plain_procs, \
            host.spawn_procs(per_host={"procs": 2}, name="supervised",
                             supervisor=sup) as sup_procs:
        plain = await plain_procs.spawn("plain", Bench)
        supervised = await sup_procs.spawn("supervised", Bench)

        plain_us, sup_us = [], []
        for _ in range(args.reps):
            plain_us.append(await latency(plain, args.calls))
            sup_us.append(await latency(supervised, args.calls))
        p, s = statistics.median(plain_us), statistics.median(sup_us)
        print(f"latency unsupervised: median {p:.1f} us  (reps {[round(x) for x in plain_us]})")
        print(f"latency supervised:   median {s:.1f} us  (reps {[round(x) for x in sup_us]})")
        print(f"supervision overhead: {100 * (s / p - 1):+.1f}%")

        victim = supervised.slice(procs=1)
        restarts = []
        for _ in range(args.kills):
            old = await victim.pid.call_one()
            t0 = time.perf_counter()
            os.kill(old, signal.SIGKILL)
            new = await victim.pid.call_one()  # retryable: answered by the replacement
            restarts.append(time.perf_counter() - t0)
            assert new != old, (new, old)
        ms = sorted(x * 1e3 for x in restarts)
        print(f"SIGKILL -> first successful call on the replacement, {args.kills} kills: "
              f"median {statistics.median(ms):.0f} ms, min {ms[0]:.0f} ms, max {ms[-1]:.0f} ms")
    await gang_restart(args.gang, args.gang_kills)


async def gang_restart(n: int, kills: int) -> None:
    host = meshio.this_host()
    fresh = []
    for _ in range(kills):
        t0 = time.perf_counter()
        async with host.spawn_procs(per_host={"procs": n}, name="fresh") as procs:
            await procs.spawn("b", Bench)
            fresh.append(time.perf_counter() - t0)
    sup = meshio.Supervisor("one_for_all", max_restarts=kills + 1, within=3600.0,
                            name="gang")
    restarts = []
    async with host.spawn_procs(per_host={"procs": n}, supervisor=sup, name="gang",
                                shutdown="brutal_kill") as procs:
        await procs.spawn("b", Bench)
        events = sup.events()
        for _ in range(kills):
            t0 = time.perf_counter()
            os.kill(procs.pids[n - 1], signal.SIGKILL)
            up: set[int] = set()
            while len(up) < n:  # the events of this restart (earlier ones were read)
                event = await events.__anext__()
                if event.kind == "restart":
                    up.add(event.rank)
            restarts.append(time.perf_counter() - t0)
        await events.aclose()
    f, r = sorted(x * 1e3 for x in fresh), sorted(x * 1e3 for x in restarts)
    print(f"one_for_all gang of {n}: SIGKILL one -> all {n} replacements up, {kills} kills: "
          f"median {statistics.median(r):.0f} ms, min {r[0]:.0f} ms (starting {n} fresh: "
          f"median {statistics.median(f):.0f} ms, min {f[0]:.0f} ms)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--gang", type=int, default=4)
    ap.add_argument("--gang-kills", type=int, default=5)
    meshio.run(main(ap.parse_args()))
