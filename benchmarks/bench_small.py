"""Small calls side by side: meshio and the plain-asyncio baseline (the
shared peer harness's ``bench_rawasyncio.py``: pickle frames over a Unix
socket, one process per actor) driven from one controller, on one event
loop, measured the same way in interleaved repetitions.

Rows, as in the harness: int->int latency (median and p99 of sequential
``await``s), 1,000 calls in flight (``asyncio.gather``), a call on 4 actors
+ gather.  Then the ratios meshio / baseline.  ``--loop asyncio`` is the
standard loop (``asyncio.run``, what Jupyter and pytest-asyncio users get),
``--loop uvloop`` is ``meshio.run``'s; the baseline's controller shares the
loop, its workers run the same loop (with ``--loop uvloop`` this puts
``benchmarks/peers/uvloop_site`` on their ``PYTHONPATH``, as in the peer
run's uvloop column; the header line says which loop they ran).

A third side, the floor, is what no framework on these loops can beat: a
bare ``asyncio.Protocol`` that writes 8 bytes to each of as many worker
processes (uvloop, as meshio's) whose protocols echo them back, no framing,
no encoding, no work, with both ends busy polling as meshio's do (the
window of ``MESHIO_BUSY_POLL``, default 200 µs: the loop keeps turning
after data that came back to back and yields the core on a turn that heard
nothing).  ``MESHIO_BUSY_POLL=0`` measures meshio and the floor with every
process sleeping between messages, woken by the kernel for each.

Usage: python benchmarks/bench_small.py [--loop asyncio|uvloop] [--reps 7]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import uvloop

import meshio
from meshio import Actor, endpoint

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "peers"))
from run import UVLOOP_SITE, pythonpath  # noqa: E402

PEERS = os.environ.get("MESHIO_BENCH_PEERS",
                       os.path.join(HERE, "..", "..", "shared", "bench-peers"))


class Bench(Actor):
    @endpoint
    async def ping(self, x: int) -> int:
        return x


class MeshioSide:
    """The harness's three small-call operations on meshio."""

    def __init__(self, procs: meshio.ProcMesh, actors: Bench) -> None:
        self.procs, self.actors = procs, actors
        self.one = actors.slice(procs=0)

    def ping_nowait(self, x: int) -> Awaitable[int]:
        return self.one.ping.call_one(x)

    async def ping_all(self, x: int) -> list[int]:
        return (await self.actors.ping.call(x)).values()


class RawSide:
    def __init__(self, group: Any) -> None:
        self.group = group

    def ping_nowait(self, x: int) -> Awaitable[int]:
        result: Awaitable[int] = self.group.ping_nowait(0, x)
        return result

    async def ping_all(self, x: int) -> list[int]:
        result: list[int] = await self.group.ping_all(x)
        return result


#: the floor's polling window: meshio's (``MESHIO_BUSY_POLL``, default 200 µs)
POLL = float(os.environ.get("MESHIO_BUSY_POLL") or 200e-6)


class Poller:
    """meshio's busy polling without meshio, for the floor: after data
    that came within ``POLL`` of the data before, the loop keeps polling
    (a callback each turn) until ``POLL`` after the last data, and yields
    the core on a turn that heard nothing."""

    def __init__(self) -> None:
        self.heard_at = self.polled_at = -math.inf
        self.polling = False

    def heard(self) -> None:
        now = time.perf_counter()
        recent, self.heard_at = now - self.heard_at < POLL, now
        if recent and not self.polling:
            self.polling = True
            asyncio.get_running_loop().call_soon(self.poll)

    def poll(self) -> None:
        now = time.perf_counter()
        if now - self.heard_at >= POLL:
            self.polling = False
            return
        if self.heard_at < self.polled_at:
            os.sched_yield()
        self.polled_at = now
        asyncio.get_running_loop().call_soon(self.poll)


class _Echo(asyncio.Protocol):
    """One end of the floor: a worker's writes back what it reads; the
    controller's settles the future of each 8-byte number it reads back."""

    def __init__(self, poller: Poller, worker: bool) -> None:
        self.poller, self.worker = poller, worker
        self.waiting: dict[int, asyncio.Future[int]] = {}
        self.rest = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.worker:
            self.transport.write(data)
        else:
            data = self.rest + data
            end = len(data) - len(data) % 8
            for i in range(0, end, 8):
                x = int.from_bytes(data[i:i + 8], "little")
                self.waiting.pop(x).set_result(x)
            self.rest = data[end:]
        self.poller.heard()


async def floor_worker(path: str) -> None:
    """A floor worker (``--floor-worker PATH``): echoes on a Unix socket."""
    poller = Poller()
    server = await asyncio.get_running_loop().create_unix_server(
        lambda: _Echo(poller, True), path)
    print("READY", flush=True)
    await server.serve_forever()


class FloorSide:
    """Bare transport round trips to uvloop processes (see the module's doc)."""

    @classmethod
    async def start(cls, work: str, n: int) -> FloorSide:
        loop, poller = asyncio.get_running_loop(), Poller()
        procs, echoes = [], []
        for i in range(n):
            path = os.path.join(work, f"floor{i}.sock")
            proc = await asyncio.create_subprocess_exec(
                sys.executable, os.path.abspath(__file__), "--floor-worker", path,
                stdout=asyncio.subprocess.PIPE)
            procs.append(proc)
            assert proc.stdout is not None and await proc.stdout.readline() == b"READY\n"
            _, echo = await loop.create_unix_connection(lambda: _Echo(poller, False), path)
            echoes.append(echo)
        return cls(procs, echoes)

    def __init__(self, procs: list[asyncio.subprocess.Process], echoes: list[_Echo]) -> None:
        self.procs, self.echoes = procs, echoes

    def ping_nowait(self, x: int, echo: int = 0) -> Awaitable[int]:
        e = self.echoes[echo]
        fut = e.waiting[x] = asyncio.get_running_loop().create_future()
        e.transport.write(x.to_bytes(8, "little"))
        return fut

    async def ping_all(self, x: int) -> list[int]:
        return list(await asyncio.gather(*(self.ping_nowait(x, i)
                                           for i in range(len(self.echoes)))))

    async def stop(self) -> None:
        for echo, proc in zip(self.echoes, self.procs):
            echo.transport.close()
            proc.kill()
            await proc.wait()


Side = MeshioSide | RawSide | FloorSide


async def latency(side: Side, calls: int) -> list[float]:
    samples: list[float] = []
    for i in range(calls):
        t0 = time.perf_counter()
        r = await side.ping_nowait(i)
        samples.append(time.perf_counter() - t0)
        assert r == i
    return samples


async def throughput(side: Side, inflight: int, batches: int) -> float:
    total = 0.0
    for _ in range(batches):
        t0 = time.perf_counter()
        res = await asyncio.gather(*[side.ping_nowait(i) for i in range(inflight)])
        total += time.perf_counter() - t0
        assert res[-1] == inflight - 1
    return inflight * batches / total


async def gather4(side: Side, calls: int) -> list[float]:
    samples: list[float] = []
    for i in range(calls):
        t0 = time.perf_counter()
        r = await side.ping_all(i)
        samples.append(time.perf_counter() - t0)
        assert r == [i] * 4
    return samples


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


Row = dict[str, list[float]]


async def interleave(sides: dict[str, Side], reps: int,
                     measure: Callable[[Side], Awaitable[dict[str, float]]]) -> dict[str, Row]:
    out: dict[str, Row] = {name: {} for name in sides}
    for _ in range(reps):
        for name, side in sides.items():
            for k, v in (await measure(side)).items():
                out[name].setdefault(k, []).append(v)
    return out


def baseline_pythonpath(loop: str) -> str:
    """The ``PYTHONPATH`` the baseline's workers start with: with ``--loop
    uvloop``, ``peers/uvloop_site`` first, so that they run uvloop as in the
    peer run's uvloop column."""
    return pythonpath(UVLOOP_SITE if loop == "uvloop" else None)


async def spawn_baseline(backend: Any, n: int, path: str) -> Any:
    """``n`` of the baseline's workers, ``path`` their ``PYTHONPATH`` (the
    harness starts them with this process's environment)."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = path
    try:
        return await backend.spawn(n)
    finally:
        del os.environ["PYTHONPATH"]
        if before is not None:
            os.environ["PYTHONPATH"] = before


async def main(args: argparse.Namespace) -> None:
    work = tempfile.mkdtemp(prefix="bench-small-")
    for f in os.listdir(PEERS):
        if f.endswith(".py"):
            shutil.copy(os.path.join(PEERS, f), work)
    sys.path.insert(0, work)
    # the harness writes beside its scripts: a copy
    raw_backend = importlib.import_module("bench_rawasyncio").RawBackend()
    raw_path = baseline_pythonpath(args.loop)
    results: dict[str, Row] = {}
    for n in (2, 4):
        procs = await meshio.this_host().spawn_procs(per_host={"procs": n})
        actors = await procs.spawn("bench", Bench)
        await actors.ping.call(0)
        raw = await spawn_baseline(raw_backend, n, raw_path)
        floor = await FloorSide.start(work, n)
        sides: dict[str, Side] = {"meshio": MeshioSide(procs, actors), "raw": RawSide(raw),
                                  "floor": floor}
        try:
            for side in sides.values():  # warm up
                await latency(side, args.warmup)
                await throughput(side, args.inflight, 1)
                if n == 4:
                    await gather4(side, args.warmup)
            if n == 2:
                async def small(side: Side) -> dict[str, float]:
                    lat = await latency(side, args.calls)
                    tput = await throughput(side, args.inflight, args.batches)
                    return {"latency median us": statistics.median(lat) * 1e6,
                            "latency p99 us": pct(lat, 99) * 1e6,
                            f"{args.inflight} in flight calls/s": tput}
                results.update(await interleave(sides, args.reps, small))
            else:
                async def casting(side: Side) -> dict[str, float]:
                    lat = await gather4(side, args.bcast_calls)
                    return {"call on 4 + gather median us": statistics.median(lat) * 1e6,
                            "call on 4 + gather p99 us": pct(lat, 99) * 1e6}
                for name, row in (await interleave(sides, args.reps, casting)).items():
                    results.setdefault(name, {}).update(row)
        finally:
            await floor.stop()
            await raw.stop()
            await procs.stop()
    shutil.rmtree(work, ignore_errors=True)

    raw_loop = "uvloop" if UVLOOP_SITE in raw_path.split(os.pathsep) else "asyncio"
    print(f"loop: {args.loop}, the baseline's workers {raw_loop}; "
          f"medians of {args.reps} interleaved reps [min-max]")
    print("| measurement | meshio | plain asyncio | meshio / plain | floor | floor / plain |")
    print("|---|---|---|---|---|---|")

    def cell(xs: list[float]) -> str:
        return f"{statistics.median(xs):,.0f} [{min(xs):,.0f}-{max(xs):,.0f}]"

    for key in results["meshio"]:
        m, r = results["meshio"][key], results["raw"][key]
        rm = statistics.median(r)
        fl = results["floor"][key]
        print(f"| {key} | {cell(m)} | {cell(r)} | {statistics.median(m) / rm:.2f}x "
              f"| {cell(fl)} | {statistics.median(fl) / rm:.2f}x |")
    lat = results["meshio"]
    p99, med = (statistics.median(lat[f"latency {k} us"]) for k in ("p99", "median"))
    print(f"meshio p99 / median latency: {p99 / med:.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--inflight", type=int, default=1000)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--bcast-calls", type=int, default=500)
    ap.add_argument("--floor-worker", metavar="PATH", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.floor_worker:
        uvloop.run(floor_worker(a.floor_worker))
    elif a.loop == "uvloop":
        meshio.run(main(a))
    else:
        asyncio.run(main(a))
