"""Calls with a deadline (``.options(timeout=...)``): correctness only (no
timing assertions): silent calls expire in the order they fall due while
answered ones on the same timeout keep their answers, a cancelled caller is
not timed out, and a call answered in the turn its deadline passes keeps
its answer.  (A guard for any change to how deadlines are timed: one timer
per timeout instead of one per call was tried and measured, see
``benchmarks/README.md``.)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import meshio
from meshio import Actor, CallTimeout, endpoint

#: generous bound on any single wait on a loaded machine
GUARD = 20.0


class Echo(Actor):
    @endpoint
    async def echo(self, x: int) -> int:
        return x

    @endpoint(concurrent=True)
    async def forever(self) -> None:
        await asyncio.Event().wait()

    @endpoint(concurrent=True)
    async def fails_or_waits(self) -> None:
        await fail_or_wait()

    @endpoint(concurrent=True, retry=meshio.Retry(attempts=1, on=(KeyError,)))
    async def fails_or_waits_retried(self) -> None:
        """Through the retry path (a call per actor)."""
        await fail_or_wait()


    @endpoint(retry=meshio.Retry(attempts=10, on=(KeyError,), backoff=0.4))
    async def keeps_failing(self) -> None:
        raise KeyError("still missing")


    @endpoint
    async def wrong_or_raises(self) -> int:
        """Rank 0 answers what its annotation refuses, rank 1 raises."""
        if meshio.current_rank().rank == 0:
            return "not an int"  # type: ignore[return-value]
        raise ValueError("rank 1 failed")


async def fail_or_wait() -> None:
    """Rank 0 raises; the others never answer."""
    if meshio.current_rank().rank == 0:
        raise ValueError("rank 0 failed")
    await asyncio.Event().wait()


async def test_timed_calls_answered_and_silent_on_one_line(procs: meshio.ProcMesh) -> None:
    actors = await procs.slice(procs=0).spawn("echo", Echo)
    fast = actors.echo.options(timeout=GUARD)
    slow = actors.forever.options(timeout=0.2)
    order: list[str] = []
    futs: list[asyncio.Future[Any]] = []
    for i in range(50):  # answered ones between silent ones, on two lines
        f = fast.call_one(i)
        s = slow.call_one()
        f.add_done_callback(lambda _, i=i: order.append(f"echo {i}"))
        s.add_done_callback(lambda _, i=i: order.append(f"forever {i}"))
        futs += [f, s]
    results = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), GUARD)
    assert results[0::2] == list(range(50))
    for error in results[1::2]:
        assert isinstance(error, CallTimeout) and tuple(error.ranks) == (0,)
    silent = [name for name in order if name.startswith("forever")]
    assert silent == [f"forever {i}" for i in range(50)]  # (expired in order)
    # later calls find the lines working
    assert await fast.call_one(7) == 7


async def test_a_timed_out_call_keeps_the_failures_that_came_first(
        procs: meshio.ProcMesh) -> None:
    """A ``call()`` whose deadline passes after some actors failed raises
    its CallTimeout with those failures too (each rank with its own error,
    in the message and ``failures``), on both paths a call takes; before,
    they were dropped and only the silent rank was named."""
    actors = await procs.spawn("mixed", Echo)
    for name in ("fails_or_waits", "fails_or_waits_retried"):
        with pytest.raises(CallTimeout) as info:
            await asyncio.wait_for(getattr(actors, name).options(timeout=0.5).call(), GUARD)
        error = info.value
        assert tuple(error.ranks) == (1,), error
        assert [(p.rank, type(e).__name__) for p, e in error.failures] == [
            (0, "ActorError"), (1, "CallTimeout")], error.failures
        # (the first line says it timed out, as a lone timeout's does)
        first = str(error).splitlines()[0]
        assert first.startswith(f"Echo.{name} on 'mixed': no answer within 0.5s from "
                                "rank(s) [1]") and first.endswith("; 1 other actor failed:"), first
        assert "rank 0 failed" in str(error), error
    assert await asyncio.wait_for(actors.echo.call(3), GUARD)


async def test_a_retry_the_deadline_would_overtake_gives_the_failure(
        procs: meshio.ProcMesh) -> None:
    """With a backoff that would send the next attempt past the deadline,
    the caller gets the endpoint's last failure at once, on every adverb
    that retries (before, the deadline passed in the backoff: a CallTimeout
    saying "no answer", the failure nowhere)."""
    actors = await procs.slice(procs=0).spawn("flaky", Echo)
    for call in (actors.keeps_failing.options(timeout=1.0).call_one,
                 actors.keeps_failing.options(timeout=1.0).call,
                 meshio.Service(actors).keeps_failing.options(timeout=1.0).route):
        with pytest.raises(meshio.ActorError, match="still missing") as info:
            await asyncio.wait_for(call(), GUARD)
        assert not isinstance(info.value, CallTimeout)


async def test_an_actor_error_outranks_a_schema_error(procs: meshio.ProcMesh) -> None:
    """supervision > timeout > actor > schema, as meshio._exceptions says:
    a result the annotation refuses on one rank and an exception on
    another raise an ActorError (it was the SchemaError: ``except
    ActorError`` missed it), both ranks in ``failures``."""
    actors = await procs.spawn("mixed_kinds", Echo)
    with pytest.raises(meshio.ActorError) as info:
        await asyncio.wait_for(actors.wrong_or_raises.call(), GUARD)
    assert [(p.rank, type(e).__name__) for p, e in info.value.failures] == [
        (0, "SchemaError"), (1, "ActorError")]


async def test_a_cancelled_caller_is_not_timed_out(procs: meshio.ProcMesh) -> None:
    actors = await procs.slice(procs=0).spawn("echo", Echo)
    fut = actors.forever.options(timeout=0.1).call_one()
    task = asyncio.ensure_future(fut)
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait([task], timeout=GUARD)
    assert task.cancelled() and fut.cancelled()
    # the line's timer passes the cancelled call by; the next one still expires
    try:
        await actors.forever.options(timeout=0.1).call_one()
    except CallTimeout as e:
        assert tuple(e.ranks) == (0,)
    else:
        raise AssertionError("no CallTimeout")


async def test_a_call_answered_as_its_deadline_passes_keeps_its_answer() -> None:
    loop = asyncio.get_running_loop()
    from meshio.endpoints._endpoint import _Due  # (what an adverb with a deadline returns)

    class Ep:  # (expiring needs no more of it when the call is answered)
        _timeout = 0.5

    call: asyncio.Future[int] = loop.create_future()
    due = _Due(call, Ep(), time.monotonic() - 1.0, 0, None)  # type: ignore[arg-type]
    loop.call_soon(call.set_result, 7)  # answered in the turn its line's timer fires
    assert await asyncio.wait_for(due, GUARD) == 7
