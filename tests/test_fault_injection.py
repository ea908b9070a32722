"""Fault injection: SIGKILL random workers of a supervised mesh while the
controller keeps calling it.

Every call either returns the right value or raises SupervisionError (none
hangs: each is guarded by ``asyncio.wait_for``; none returns a wrong value),
retryable calls always complete, the mesh recovers after every kill (the
restart event comes, then a call to every rank succeeds) and no process is
left behind.  Bounded in kills and in time; the seed is printed and can be
set with ``MESHIO_FAULT_SEED``.
"""

from __future__ import annotations

import asyncio
import os
import random
import select
import signal
from collections import Counter

import pytest

import meshio
from meshio import Actor, endpoint
from meshio.supervision import ManualClock, SupervisionEvent

KILLS = 15
TIME_BUDGET = 90.0
#: no single call may take longer than this, even across a restart
PROMPT = 30.0
N = 4


class Echo(Actor):
    @endpoint
    async def echo(self, x: int) -> tuple[int, int]:
        return (meshio.current_rank().rank, x)

    @endpoint(retryable=True)
    async def ident(self, x: int) -> tuple[int, int]:
        return (meshio.current_rank().rank, x)


@pytest.mark.timeout(TIME_BUDGET + 4 * PROMPT)
async def test_random_sigkills_while_calling() -> None:
    seed = int(os.environ.get("MESHIO_FAULT_SEED", "20240611"))
    rng = random.Random(seed)
    # heartbeats on a manual clock: only the kills below cause failures
    sup = meshio.Supervisor("one_for_one", max_restarts=1000, within=60.0, clock=ManualClock())
    events = sup.events()
    stats: Counter[str] = Counter()
    progress = asyncio.Event()
    done = False
    pidfds: dict[int, int] = {}

    def watch(pid: int) -> None:  # opened while the process is ours and alive
        pidfds.setdefault(pid, os.pidfd_open(pid))

    async def next_restart(rank: int) -> SupervisionEvent:
        async def scan() -> SupervisionEvent:
            async for ev in events:
                assert ev.kind in ("failure", "restart"), ev
                if ev.kind == "restart" and ev.rank == rank:
                    return ev
            raise AssertionError("event stream ended")

        return await asyncio.wait_for(scan(), PROMPT)

    async def one_rank_caller(w: Echo) -> None:
        i = 0
        while not done:
            i += 1
            rank = i % N
            try:
                got = await asyncio.wait_for(w.slice(gpus=rank).echo.call_one(i), PROMPT)
            except meshio.SupervisionError:
                stats["one_rank_supervision_error"] += 1
                continue
            assert got == (rank, i), f"wrong answer {got} for call {i} to rank {rank}"
            stats["one_rank_ok"] += 1
            progress.set()

    async def full_mesh_caller(w: Echo) -> None:
        i = 0
        while not done:
            i -= 1
            try:
                got = await asyncio.wait_for(w.echo.call(i), PROMPT)
            except meshio.SupervisionError:
                stats["full_supervision_error"] += 1
                continue
            assert got.values() == [(r, i) for r in range(N)], f"wrong answers {got}"
            stats["full_ok"] += 1

    async def retryable_caller(w: Echo) -> None:
        i = 0
        while not done:
            i += 1
            # never raises: a call cut by a kill is sent again to the new process
            got = await asyncio.wait_for(w.ident.call(i), PROMPT)
            assert got.values() == [(r, i) for r in range(N)], f"wrong answers {got}"
            stats["retryable_ok"] += 1

    loop = asyncio.get_running_loop()
    start = loop.time()
    kills = 0
    async with meshio.this_host().spawn_procs(per_host={"gpus": N}, supervisor=sup) as procs:
        w = await procs.spawn("echo", Echo)
        for pid in procs.pids:
            watch(pid)
        callers = [asyncio.ensure_future(c(w)) for c in
                   (one_rank_caller, full_mesh_caller, retryable_caller)]
        try:
            while kills < KILLS and loop.time() - start < TIME_BUDGET:
                # let the callers make progress between kills
                progress.clear()
                await asyncio.wait_for(progress.wait(), PROMPT)
                rank = rng.randrange(N)
                victim = procs.pids[rank]
                os.kill(victim, signal.SIGKILL)
                restart = await next_restart(rank)
                watch(restart.pid)
                assert restart.pid != victim and procs.pids[rank] == restart.pid
                # recovered: every rank answers, with the right value
                got = await asyncio.wait_for(w.echo.call(10_000 + kills), PROMPT)
                assert got.values() == [(r, 10_000 + kills) for r in range(N)]
                kills += 1
                for c in callers:  # a failed assertion in a caller stops the test
                    if c.done():
                        c.result()
        finally:
            done = True
            results = await asyncio.wait_for(
                asyncio.gather(*callers, return_exceptions=True), PROMPT)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        assert sup.failure is None
    elapsed = loop.time() - start
    await events.aclose()

    # every process that ever ran has exited (and was reaped by the controller)
    ready, _, _ = select.select(list(pidfds.values()), [], [], 0)
    assert len(ready) == len(pidfds) == N + kills
    for fd in pidfds.values():
        os.close(fd)

    calls = sum(stats.values())
    ok = stats["one_rank_ok"] + stats["full_ok"] + stats["retryable_ok"]
    errors = stats["one_rank_supervision_error"] + stats["full_supervision_error"]
    print(f"\nfault injection (seed {seed}): {kills} SIGKILLs survived in {elapsed:.1f}s; "
          f"{calls} calls made: {ok} ok, {errors} SupervisionError; {dict(stats)}")
    assert kills == KILLS or elapsed >= TIME_BUDGET
    assert kills >= 5, f"only {kills} kills within {TIME_BUDGET}s"
    assert calls == ok + errors
    assert stats["one_rank_ok"] >= kills and stats["full_ok"] > 0
    assert stats["retryable_ok"] > 0
