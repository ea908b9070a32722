"""Soak: a million calls, ten thousand cancellations and a hundred mesh
cycles in one run, with the controller's and the workers' memory sampled.

1. calls: ``--calls`` int->int calls to a two-process mesh, ``--inflight`` at
   a time (asyncio.gather), half of them to a failing endpoint every
   hundredth batch so error replies are soaked too.
2. cancellations: ``--cancels`` calls to a slow endpoint, each cancelled by
   its caller (a timeout or a task cancellation) while queued or running;
   then one call must come back at once. The slow endpoint reports how often
   it started (a call whose cancellation arrived after it started is
   cancelled in its task) and how often it ran to its end (never, ideally).
3. mesh cycles: ``--cycles`` times spawn a 4-process mesh, spawn an actor
   with a 1 MiB constructor argument, call it, stop the mesh.
4. chains: ``--chains`` calls a -> b -> c (each actor in its own process, c
   waiting forever), cancelled by the controller at once or a few
   milliseconds in (at every depth); then how long until no actor runs any
   of them (``stacks()``), and the next call.
5. poison: ``--good`` retryable calls in batches of 1,000 to a supervised
   actor (``poison_after=3``, ``max_restarts=1``), one of them a poison
   message that kills its process: it alone fails (``PoisonMessageError``),
   every good call completes, the supervisor does not give up.
6. broadcasts: ``--broadcasts`` small messages broadcast (each awaited:
   it waits for room in the mailbox) to a slow actor (``max_queued``
   default, 10,000): the controller's and the worker's RSS stay within
   64 MiB of their idle value (issue 18 item 4); both deltas are printed.
7. the same broadcasts not awaited: sent until the bound pushes back
   (``Overloaded`` once ``max_queued`` wait for room in the caller), then
   the last one sent is awaited; the same RSS bound.

RSS (``VmRSS``) of the controller and of the long-lived workers is sampled
throughout; the report gives start / peak / end for each phase.  A leak
shows as an end far above the start.

Usage: python benchmarks/bench_soak.py [--calls 1000000] [--cancels 10000] [--cycles 100]
                                      [--chains 10000] [--good 100000]
                                      [--broadcasts 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
from collections.abc import Awaitable

import meshio
from meshio import Actor, endpoint


def rss_mib(pid: int | None = None) -> float:
    with open(f"/proc/{pid or 'self'}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


class Samples:
    """RSS samples of one process during one phase."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.values = [rss_mib(pid)]

    def take(self) -> None:
        self.values.append(rss_mib(self.pid))

    def summary(self) -> str:
        v = self.values
        return f"start {v[0]:7.1f}  peak {max(v):7.1f}  end {v[-1]:7.1f} MiB"


class Soak(Actor):
    def __init__(self, blob: bytes = b"") -> None:
        self.blob = blob
        self.slow_started = 0
        self.slow_finished = 0

    @endpoint
    async def echo(self, x: int) -> int:
        return x

    @endpoint
    async def fail(self, x: int) -> int:
        raise ValueError(f"failing on purpose ({x})")

    @endpoint
    async def slow(self) -> None:
        self.slow_started += 1
        await asyncio.sleep(0.01)
        self.slow_finished += 1

    @endpoint
    async def counts(self) -> tuple[int, int]:
        return self.slow_started, self.slow_finished


class Link(Actor):
    @endpoint(concurrent=True)
    async def chain(self, rest: list[Link]) -> None:
        if rest:
            await rest[0].chain.call_one(rest[1:])
        else:
            await asyncio.Event().wait()


class Food(Actor):
    @endpoint(retryable=True)
    async def eat(self, x: int) -> int:
        if x < 0:
            os.kill(os.getpid(), 9)  # a poison message
        return x


class Sink(Actor):
    """Slower than a caller's broadcasts: each message costs a turn of its loop."""

    def __init__(self) -> None:
        self.taken = 0

    @endpoint
    async def take(self, x: int) -> None:
        await asyncio.sleep(0)
        self.taken += 1

    @endpoint
    async def count(self) -> int:
        return self.taken


def report(phase: str, seconds: float, samples: list[tuple[str, Samples]]) -> None:
    print(f"{phase} ({seconds:.1f} s)")
    for who, s in samples:
        print(f"  {who:<22} {s.summary()}")


async def calls_phase(mesh: Soak, pids: list[int], n: int, inflight: int) -> None:
    samples = [("controller", Samples(None))] + [(f"worker pid {p}", Samples(p)) for p in pids]
    t0 = time.perf_counter()
    done = 0
    batch_no = 0
    while done < n:
        k = min(inflight, n - done)
        if batch_no % 100 == 99:  # error replies soak too
            results = await asyncio.gather(*(mesh.fail.choose(i) for i in range(k)),
                                           return_exceptions=True)
            assert all(isinstance(r, meshio.ActorError) for r in results)
        else:
            results = await asyncio.gather(*(mesh.echo.choose(i) for i in range(k)))
            assert results[-1] == k - 1
        done += k
        batch_no += 1
        if batch_no % 50 == 0:
            for _, s in samples:
                s.take()
    dt = time.perf_counter() - t0
    for _, s in samples:
        s.take()
    report(f"1. {n:,} calls, {inflight} in flight: {n / dt:,.0f} calls/s", dt, samples)


async def cancels_phase(mesh: Soak, pids: list[int], n: int) -> None:
    samples = [("controller", Samples(None))] + [(f"worker pid {p}", Samples(p)) for p in pids]
    one = mesh.slice(procs=0)
    t0 = time.perf_counter()
    batch = 100
    for start in range(0, n, batch):
        if (start // batch) % 2:  # half by timeout, half by cancelling the task
            calls = [asyncio.ensure_future(one.slow.options(timeout=0.001).call_one())
                     for _ in range(batch)]
            results = await asyncio.gather(*calls, return_exceptions=True)
            assert all(isinstance(r, meshio.CallTimeout) for r in results), results[:3]
        else:
            tasks = [asyncio.ensure_future(one.slow.call_one()) for _ in range(batch)]
            await asyncio.sleep(0)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if (start // batch) % 10 == 0:
            for _, s in samples:
                s.take()
    t1 = time.perf_counter()
    await one.echo.call_one(1)
    after = time.perf_counter() - t1
    started, finished = await one.counts.call_one()
    dt = time.perf_counter() - t0
    for _, s in samples:
        s.take()
    report(f"2. {n:,} cancelled calls; next call answered in {after * 1e3:.1f} ms; "
           f"slow endpoint started {started:,} times (the rest dropped while queued), "
           f"ran to its end {finished:,} times", dt, samples)


async def cycles_phase(n: int) -> None:
    samples = [("controller", Samples(None))]
    blob = os.urandom(1 << 20)
    t0 = time.perf_counter()
    for i in range(n):
        async with meshio.this_host().spawn_procs(per_host={"procs": 4},
                                                  name=f"cycle{i}") as procs:
            mesh = await procs.spawn("soak", Soak, blob)
            assert (await mesh.echo.call(i)).values() == [i] * 4
        gc.collect()
        samples[0][1].take()
    dt = time.perf_counter() - t0
    report(f"3. {n} spawn/stop cycles of a 4-process mesh (1 MiB constructor argument)",
           dt, samples)


async def chains_phase(n: int) -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 3}, name="chains") as procs:
        a, b, c = [await procs.slice(procs=i).spawn(name, Link) for i, name in enumerate("abc")]
        samples = [("controller", Samples(None))] + [(f"worker pid {p}", Samples(p))
                                                     for p in procs.pids]
        t0 = time.perf_counter()
        batch = 100
        for start in range(0, n, batch):
            calls = [asyncio.ensure_future(a.chain.call_one([b, c])) for _ in range(batch)]
            await asyncio.sleep(0.002 * ((start // batch) % 3))  # cancelled at every depth
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            if (start // batch) % 10 == 0:
                for _, s in samples:
                    s.take()
        t1 = time.perf_counter()
        while not await idle(a, b, c):
            await asyncio.sleep(0.01)
        settled = time.perf_counter() - t1
        t2 = time.perf_counter()
        await asyncio.gather(*(m.stacks() for m in (a, b, c)))
        after = time.perf_counter() - t2
        dt = time.perf_counter() - t0
        for _, s in samples:
            s.take()
        report(f"4. {n:,} cancelled three-deep chains; every actor idle {settled * 1e3:.0f} ms "
               f"after the last cancel; next round trip to all three {after * 1e3:.1f} ms",
               dt, samples)


async def idle(*meshes: Link) -> bool:
    """Whether no actor of ``meshes`` runs any of its code."""
    stacks = await asyncio.gather(*(m.stacks() for m in meshes))
    return all(s.idle for st in stacks for s in st.actors)


async def poison_phase(n: int) -> None:
    sup = meshio.Supervisor(max_restarts=1, within=600.0, poison_after=3)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name="food",
                                              supervisor=sup) as procs:
        food = await procs.spawn("food", Food)
        samples = [("controller", Samples(None))]
        t0 = time.perf_counter()
        ok = poisoned = 0
        batch = 1000
        for start in range(0, n, batch):
            xs = list(range(start, min(start + batch, n)))
            if start == (n // batch // 2) * batch:
                xs[len(xs) // 2] = -1
            results = await asyncio.gather(*(food.eat.call_one(x) for x in xs),
                                           return_exceptions=True)
            for x, r in zip(xs, results):
                if isinstance(r, meshio.PoisonMessageError):
                    poisoned += 1
                else:
                    assert r == x, (x, r)
                    ok += 1
            samples[0][1].take()
        dt = time.perf_counter() - t0
        report(f"5. {n:,} calls, one a poison message: {ok:,} answered, {poisoned} "
               f"quarantined; supervisor gave up: {sup.failure is not None}", dt, samples)


#: how far above its idle RSS each side may go while broadcasting (issue 18)
BROADCAST_RSS_BOUND = 64.0


async def broadcasts_phase(n: int, awaited: bool) -> None:
    """``n`` broadcasts to a slow actor, each awaited, or (``awaited``
    False) sent without waiting until the bound pushes back (``Overloaded``):
    then the last one sent is awaited (it went once there is room) and the
    refused one sent again."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name="sink") as procs:
        sink = await procs.spawn("sink", Sink)
        (pid,) = procs.pids
        for i in range(10_000):  # warm up (every code path loaded), then idle
            await sink.take.broadcast(i)
        await sink.count.call_one()
        gc.collect()
        controller, worker = Samples(None), Samples(pid)
        t0 = time.perf_counter()
        pushed = 0
        last: Awaitable[None] | None = None
        for i in range(n):
            if awaited:
                await sink.take.broadcast(i)
            else:
                try:
                    last = sink.take.broadcast(i)
                except meshio.Overloaded:
                    pushed += 1
                    assert last is not None
                    await last  # it went: so did those before it
                    last = sink.take.broadcast(i)
            if i % 10_000 == 0:
                controller.take()
                worker.take()
        taken = await sink.count.call_one()  # (behind every broadcast)
        dt = time.perf_counter() - t0
        controller.take()
        worker.take()
        grew = {"controller": max(controller.values) - controller.values[0],
                "worker": max(worker.values) - worker.values[0]}
        how = ("6. awaited" if awaited else
               f"7. not awaited (pushed back {pushed:,} times: the last one sent awaited)")
        report(f"{how}: {n:,} broadcasts to a slow actor: {n / dt:,.0f} /s, all taken: "
               f"{taken == n + 10_000}", dt, [("controller", controller),
                                               (f"worker pid {pid}", worker)])
        print("  RSS above idle: " + ", ".join(f"{who} {d:+.1f} MiB" for who, d in grew.items())
              + f" (bound {BROADCAST_RSS_BOUND:g} MiB: "
              + ("kept" if max(grew.values()) <= BROADCAST_RSS_BOUND else "EXCEEDED") + ")")


async def main(args: argparse.Namespace) -> None:
    print(f"controller RSS at start: {rss_mib():.1f} MiB")
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        mesh = await procs.spawn("soak", Soak)
        await calls_phase(mesh, procs.pids, args.calls, args.inflight)
        await cancels_phase(mesh, procs.pids, args.cancels)
    await cycles_phase(args.cycles)
    await chains_phase(args.chains)
    await poison_phase(args.good)
    await broadcasts_phase(args.broadcasts, awaited=True)
    await broadcasts_phase(args.broadcasts, awaited=False)
    print(f"controller RSS at end: {rss_mib():.1f} MiB")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--inflight", type=int, default=1000)
    ap.add_argument("--cancels", type=int, default=10_000)
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--chains", type=int, default=10_000)
    ap.add_argument("--good", type=int, default=100_000)
    ap.add_argument("--broadcasts", type=int, default=1_000_000)
    meshio.run(main(ap.parse_args()))
