"""Payload sweep, 4 KiB -> 1 GiB, through one backend of the peer harness.

Runs in the backend's own interpreter (``run.py`` starts it), with the
harness folder on ``PYTHONPATH``: one actor in its own process, each payload
kind at each size timed by the harness's ``measure_payload`` (median of a
few calls).  A size that needs more memory than is free, times out or
raises is recorded with the reason, never fails the sweep; the results file
is rewritten after every size, so a sweep stopped from outside keeps what
it measured.

    python sweep.py bench_ray:RayBackend --kinds bytes numpy.ndarray --out ray.json
"""

import argparse
import asyncio
import importlib
import json
import os
from typing import Any

import harness

KiB, MiB = 1 << 10, 1 << 20
SIZES = [4 * KiB, 64 * KiB, MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB]


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * KiB
    return 1 << 62


def calls_for(nbytes: int) -> tuple[int, int]:
    """(timed calls, warm-up calls): about 128 MiB moved per size, 3..20 calls;
    2 from 256 MiB on, where one call takes seconds on the slower systems."""
    if nbytes >= 256 * MiB:
        return 2, 1
    return max(3, min(20, 128 * MiB // nbytes)), (2 if nbytes <= 16 * MiB else 1)


async def sweep(backend: Any, kinds: list[str], sizes: list[int], timeout: float,
                out: str) -> None:
    makers = {"bytes": lambda n: b"\x01" * n, **backend.extra_payloads}
    res: dict[str, Any] = {"backend": backend.name, "points": {k: {} for k in kinds}}

    def save() -> None:
        with open(out, "w") as f:
            json.dump(res, f, indent=1)

    await backend.start_runtime()
    try:
        for kind in kinds:
            points = res["points"][kind]
            group = await backend.spawn(1)
            failed = ""
            for nbytes in sizes:
                if failed:
                    points[str(nbytes)] = {"error": f"not run: {failed}"}
                    continue
                if mem_available() < 4 * nbytes:
                    points[str(nbytes)] = {"error": "not run: less than 4x its size of memory free"}
                    continue
                calls, warmup = calls_for(nbytes)
                harness.log(f"sweep {backend.name} {kind} {nbytes} B x {calls}")
                obj = makers[kind](nbytes)
                try:
                    s = await asyncio.wait_for(
                        harness.measure_payload(group, obj, nbytes, calls, warmup), timeout)
                except Exception as e:  # recorded in the table and the plot
                    why = "timed out" if isinstance(e, TimeoutError) else type(e).__name__
                    points[str(nbytes)] = {"error": f"{why} ({str(e)[:120]})" if str(e) else why}
                    failed = f"{why} at {nbytes // MiB or nbytes // KiB} " \
                             f"{'MiB' if nbytes >= MiB else 'KiB'}"
                    harness.log(f"  {points[str(nbytes)]['error']}")
                else:
                    points[str(nbytes)] = {"s": s, "MiB_per_s": nbytes / MiB / s}
                del obj
                save()
            try:
                await asyncio.wait_for(group.stop(), 30)
            except Exception as e:  # a group broken by a failed size
                harness.log(f"  stop after {kind}: {type(e).__name__} {e}")
    finally:
        await backend.stop_runtime()
    save()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("backend", help="module:Backend class, e.g. bench_ray:RayBackend")
    ap.add_argument("--kinds", nargs="+", default=["bytes"])
    ap.add_argument("--max-bytes", type=int, default=SIZES[-1])
    ap.add_argument("--timeout", type=float, default=120, help="seconds per size")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    module, cls = args.backend.split(":")
    backend = getattr(importlib.import_module(module), cls)()
    run = getattr(backend, "run", asyncio.run)  # meshio: the loop it was asked for
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    sizes = [n for n in SIZES if n <= args.max_bytes]
    run(sweep(backend, args.kinds, sizes, args.timeout, args.out))


if __name__ == "__main__":
    main()
