"""Instructions per small call, counted rather than timed: meshio and the
plain-asyncio baseline (the shared peer harness's ``bench_rawasyncio.py``)
under valgrind's callgrind, the controller and the worker each on their own.

Wall-clock rows (``bench_small.py``) move by 20-50% between runs on a shared
VM; an instruction count moves by well under 1%, so a change of a few
percent to the hot path shows here, on any machine, and not there.  What it
does not see: system calls' kernel time (the baseline makes two ``write``
calls per call in each direction, meshio batches its frames) and stalls
(cache misses, a loaded machine).  It is the CPU cost of the Python and C
code per call, which decides the small-call rows where CPU is scarce.

The run: one actor, 1,000 calls in flight (``asyncio.gather``) on uvloop,
``K`` batches after warm-up, busy polling off (its spinning would count).
``--pattern lone`` makes the 1,000 calls of a batch one after another
instead (each awaited before the next is made): what a lone call costs,
every turn of the loop and system call paid by one call, which decides the
latency.  ``--pattern cast`` makes them calls on 4 actors + gather (the
harness's broadcast row: ``actors.ping.call(x)``, the baseline's
``ping_all``), one after another; the worker counted is one of the four.
A process's count includes its start-up, so each side runs twice, with 1 and
with ``1 + K`` batches: the difference over ``K * 1000`` calls is the cost
per call.  The controller runs under callgrind directly; the worker under it
by being started through a wrapper (``sys.executable`` in the controller).

Needs ``valgrind`` (Debian: ``apt-get install valgrind``).  Each run takes
~20-40 s (callgrind runs ~50x slower than native).

Usage: python benchmarks/bench_instructions.py [--batches 5] [--sides meshio plain]
       [--pattern inflight|lone|cast] [--src PATH] [--timeout SECONDS]
       (PATH: another meshio ``src`` to count, e.g. an old commit's; SECONDS:
       meshio's calls made with ``options(timeout=SECONDS)``, a deadline each)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "peers"))
from run import UVLOOP_SITE, pythonpath  # noqa: E402

PEERS = os.environ.get("MESHIO_BENCH_PEERS",
                       os.path.join(HERE, "..", "..", "shared", "bench-peers"))

#: the driver: warm up, then ``batches`` rounds of 1,000 calls in flight;
#: ``worker`` (a wrapper running callgrind) is what actors are started with
DRIVER = """
import asyncio, sys
side, batches, pattern, worker = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
timeout = float(sys.argv[5]) if sys.argv[5] else None
n = 4 if pattern == "cast" else 1
if worker:
    sys.executable = worker
if side == "meshio":
    import meshio
    import meshio._proc_state
    from bench_small import Bench  # (the actor bench_small.py times)

    # a worker under callgrind starts ~50x slower: more than the 60 s a
    # worker gets to say hello on a busy machine
    meshio._proc_state.START_TIMEOUT = 900.0

    async def main() -> None:
        procs = await meshio.this_host().spawn_procs(per_host={"procs": n})
        actors = await procs.spawn("bench", Bench)
        every = actors.ping.options(timeout=timeout)
        one = actors.slice(procs=0).ping.options(timeout=timeout)
        for _ in range(3 + batches):
            if pattern == "cast":
                for i in range(1000):
                    await every.call(i)
            elif pattern == "lone":
                for i in range(1000):
                    await one.call_one(i)
            else:
                await asyncio.gather(*[one.call_one(i) for i in range(1000)])
        await procs.stop()

    meshio.run(main())
else:
    import uvloop
    import bench_rawasyncio

    async def main() -> None:
        group = await bench_rawasyncio.RawBackend().spawn(n)
        for _ in range(3 + batches):
            if pattern == "cast":
                for i in range(1000):
                    await group.ping_all(i)
            elif pattern == "lone":
                for i in range(1000):
                    await group.ping_nowait(0, i)
            else:
                await asyncio.gather(*[group.ping_nowait(0, i) for i in range(1000)])
        await group.stop()

    uvloop.run(main())
"""

WRAPPER = """#!/bin/sh
exec valgrind --tool=callgrind --cache-sim=no --callgrind-out-file={out}.%p {python} "$@" \
    2>>{log}
"""


def count(work: str, side: str, batches: int, pattern: str, where: str,
          src: str | None, timeout: float | None = None) -> int:
    """Instructions of the ``where`` process ("controller", or a worker: their
    mean) in a run of ``side`` with ``batches`` batches of calls made as
    ``pattern`` (meshio's with ``options(timeout=timeout)``)."""
    out = os.path.join(work, f"{side}.{where}.{batches}.out")
    log = os.path.join(work, "valgrind.log")
    env = dict(os.environ, MESHIO_BUSY_POLL="0")
    # the driver, the harness's scripts, bench_small's actor; a plain worker on uvloop too
    env["PYTHONPATH"] = pythonpath(work, HERE, src, UVLOOP_SITE if side == "plain" else None)
    driver = [sys.executable, os.path.join(work, "driver.py"), side, str(batches), pattern,
              "" if timeout is None else str(timeout)]
    if where == "worker":
        wrapper = os.path.join(work, "worker.sh")
        with open(wrapper, "w") as f:
            f.write(WRAPPER.format(out=out, python=sys.executable, log=log))
        os.chmod(wrapper, 0o755)
        driver.insert(5, wrapper)
        cmd = driver
    else:
        driver.insert(5, "")
        cmd = ["valgrind", "--tool=callgrind", "--cache-sim=no",
               f"--callgrind-out-file={out}", *driver]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=900)
    outs = [os.path.join(work, name) for name in os.listdir(work)
            if name == os.path.basename(out) or name.startswith(os.path.basename(out) + ".")]
    counts = []
    for path in outs:
        with open(path) as f:
            totals = re.search(r"^totals: (\d+)", f.read(), re.M)
        assert totals is not None, f"no totals in {path}"
        counts.append(int(totals.group(1)))
    assert counts, f"no callgrind output for {out}"
    return sum(counts) // len(counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=5,
                    help="batches of 1,000 calls counted (default 5)")
    ap.add_argument("--sides", nargs="+", choices=("meshio", "plain"),
                    default=["meshio", "plain"])
    ap.add_argument("--where", nargs="+", choices=("controller", "worker"),
                    default=["controller", "worker"])
    ap.add_argument("--pattern", choices=("inflight", "lone", "cast"), default="inflight",
                    help="1,000 calls in flight (default), one after another, or calls "
                    "on 4 actors + gather one after another")
    ap.add_argument("--src", help="a meshio source tree to count instead of the installed one")
    ap.add_argument("--timeout", type=float,
                    help="meshio's calls made with options(timeout=TIMEOUT): what a "
                    "deadline adds (the plain side has none)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("bench_instructions: needs valgrind (apt-get install valgrind)")
    work = tempfile.mkdtemp(prefix="bench-instructions-")
    try:
        for name in os.listdir(PEERS):
            if name.endswith(".py"):
                shutil.copy(os.path.join(PEERS, name), work)
        with open(os.path.join(work, "driver.py"), "w") as f:
            f.write(DRIVER)
        calls = args.batches * 1000
        per_call: dict[tuple[str, str], float] = {}
        for side in args.sides:
            for where in args.where:
                first = count(work, side, 1, args.pattern, where, args.src, args.timeout)
                last = count(work, side, 1 + args.batches, args.pattern, where, args.src,
                             args.timeout)
                per_call[side, where] = (last - first) / calls
    finally:
        shutil.rmtree(work, ignore_errors=True)
    made = {"inflight": "1,000 in flight", "lone": "one after another",
            "cast": "calls on 4 actors + gather, one after another"}[args.pattern]
    timed = "" if args.timeout is None else f", meshio's with timeout={args.timeout}"
    print(f"instructions per call (callgrind; {made}, uvloop, {calls:,} calls counted{timed})")
    print("| process | " + " | ".join(args.sides) + (" | meshio / plain |" if len(
        args.sides) == 2 else " |"))
    print("|---" * (len(args.sides) + 1 + (len(args.sides) == 2)) + "|")
    for where in args.where:
        cells = [f"{per_call[side, where]:,.0f}" for side in args.sides]
        ratio = (f" | {per_call['meshio', where] / per_call['plain', where]:.2f}x"
                 if len(args.sides) == 2 else "")
        print(f"| {where} | " + " | ".join(cells) + ratio + " |")


if __name__ == "__main__":
    main()
