"""Time from ``await job.state()`` to the first answered call with
``SlurmJob`` on a real Slurm: cold (a new allocation: ``sbatch``, the
agents start on every node) and warm (the script run again: re-attach
from ``.meshio/`` to the live job).

Each measurement is a fresh controller process (what a user re-running
the script gets); it times ``job.state()`` and then the first call
(``spawn_procs`` of one proc per host, ``spawn``, one ``call`` to every
actor).  One repetition: a cold run, ``--warm`` warm runs, then
``job.kill()``.  Reported: median [min-max] over the repetitions.

Needs a running Slurm (``SLURM_CONF``); on one machine:

    bash ../shared/slurm-local/slurm-local.sh install
    SLURM_LOCAL_NETNS=1 bash ../shared/slurm-local/slurm-local.sh start
    eval "$(bash ../shared/slurm-local/slurm-local.sh env)"
    python benchmarks/bench_slurm_start.py [--hosts 2] [--reps 5] [--warm 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import meshio
from meshio import Actor, endpoint
from meshio.jobs import SlurmJob


class Hello(Actor):
    @endpoint
    async def hello(self) -> str:
        return os.environ.get("SLURMD_NODENAME", "")


def make_job(cache_dir: str, hosts: int) -> SlurmJob:
    return SlurmJob(meshes={"hosts": hosts}, name="bench", cache_dir=cache_dir,
                    idle_timeout=120)


async def one(cache_dir: str, hosts: int) -> None:
    """One controller run: print the times as JSON."""
    job = make_job(cache_dir, hosts)
    t0 = time.perf_counter()
    state = await job.state()
    t1 = time.perf_counter()
    async with state.hosts.spawn_procs() as procs:
        actors = await procs.spawn("hello", Hello)
        nodes = (await actors.hello.call()).values()
        t2 = time.perf_counter()
    assert len(set(nodes)) == hosts, nodes
    print(json.dumps({"state": t1 - t0, "first_call": t2 - t1, "total": t2 - t0,
                      "job": job.job_id}))


def run_one(cache_dir: str, hosts: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--one", cache_dir, "--hosts", str(hosts)],
                         capture_output=True, text=True, check=True, timeout=300)
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def fmt(xs: list[float]) -> str:
    ms = [x * 1e3 for x in xs]
    return f"{statistics.median(ms):7.0f} [{min(ms):.0f}-{max(ms):.0f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description="SlurmJob: job.state() to first call, cold "
                                             "and warm")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warm", type=int, default=2, help="warm runs per repetition")
    ap.add_argument("--one", metavar="CACHE_DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        meshio.run(one(args.one, args.hosts))
        return
    if not os.environ.get("SLURM_CONF") or shutil.which("sbatch") is None:
        sys.exit("needs a running Slurm and SLURM_CONF (see this script's docstring)")
    cache_dir = tempfile.mkdtemp(prefix="meshio-bench-slurm-")
    cold: list[dict[str, float]] = []
    warm: list[dict[str, float]] = []
    try:
        for _ in range(args.reps):
            cold.append(run_one(cache_dir, args.hosts))
            for _ in range(args.warm):
                w = run_one(cache_dir, args.hosts)
                assert w["job"] == cold[-1]["job"], "a warm run allocated anew"
                warm.append(w)
            asyncio.run(make_job(cache_dir, args.hosts).kill())
    finally:
        asyncio.run(make_job(cache_dir, args.hosts).kill())
        shutil.rmtree(cache_dir, ignore_errors=True)
    print(f"SlurmJob(meshes={{'hosts': {args.hosts}}}), {args.reps} cold and "
          f"{len(warm)} warm runs, each a fresh controller process")
    print("ms, median [min-max]     job.state()    first call       total")
    for label, runs in (("cold (new allocation)", cold), ("warm (cached re-attach)", warm)):
        print(f"{label:24} {fmt([r['state'] for r in runs])} {fmt([r['first_call'] for r in runs])}"
              f" {fmt([r['total'] for r in runs])}")


if __name__ == "__main__":
    main()
