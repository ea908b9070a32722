"""Deadlines travel with calls, and cancelling a call cancels the calls made
on its behalf (issue 18 items 1 and 2), with real worker processes.

Nothing here sleeps to wait for something: tests wait on call futures and
ports, each under a generous guard.
"""

from __future__ import annotations

import asyncio
import math
import os
import select
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import meshio
from fifo_gate import Gate, hold
from meshio import Actor, CallTimeout, Channel, Port, endpoint
from meshio._cell import _deadline
from meshio.jobs import ProcessJob

#: generous bound on any single wait on a loaded machine
GUARD = 20.0


class Probe(Actor):
    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.runs = 0
        self.in_chain = asyncio.Event()
        self.chain_ended = asyncio.Event()

    @endpoint
    async def budget(self) -> tuple[float | None, float | None]:
        """What this call sees of its deadline: (deadline, remaining)."""
        ctx = meshio.context()
        return ctx.deadline, ctx.remaining()

    @endpoint
    def budget_in_thread(self) -> float | None:
        return meshio.context().remaining()

    @endpoint
    async def ask(self, other: Probe, timeout: float | None
                  ) -> tuple[float | None, float | None]:
        """Our remaining budget, and the one ``other`` sees when we call it
        (with ``timeout`` of our own, if any)."""
        mine = meshio.context().remaining()
        ep = other.budget if timeout is None else other.budget.options(timeout=timeout)
        _, theirs = await ep.call_one()
        return mine, theirs

    @endpoint
    async def ask_or_fall_back(self, other: Probe, timeout: float) -> str:
        """Ask ``other`` with a timeout of our own; fall back when it runs out."""
        try:
            await other.forever.options(timeout=timeout).call_one()
        except CallTimeout:
            return "fallback"
        return "answered"

    @endpoint
    async def hold(self) -> None:
        await self.gate.wait()

    @endpoint(concurrent=True)
    async def open_gate(self) -> None:
        self.gate.set()

    @endpoint
    async def work(self) -> None:
        self.runs += 1

    @endpoint(concurrent=True)
    async def count(self) -> int:
        return self.runs

    @endpoint
    async def send_work(self, other: Probe) -> None:
        """Broadcast to ``other`` (no answer wanted): it carries our deadline."""
        other.work.broadcast()

    @endpoint
    async def chain(self, rest: list[Probe]) -> None:
        """Call the next actor of ``rest`` down the chain; the last one waits
        forever."""
        self.in_chain.set()
        try:
            if rest:
                await rest[0].chain.call_one(rest[1:])
            else:
                await asyncio.Event().wait()
        except (asyncio.CancelledError, CallTimeout):  # (the deadline may pass here first)
            self.chain_ended.set()
            raise

    @endpoint
    async def block(self, ready: str, release: str) -> None:
        """Block this process's event loop (at a FIFO gate)."""
        hold(ready, release)

    @endpoint(concurrent=True)
    async def forever(self) -> None:
        await asyncio.Event().wait()

    @endpoint(concurrent=True)
    async def wait_in_chain(self) -> None:
        await self.in_chain.wait()

    @endpoint(concurrent=True)
    async def wait_chain_ended(self) -> None:
        await self.chain_ended.wait()

    @endpoint(concurrent=True)
    async def chain_began(self) -> bool:
        return self.in_chain.is_set()

    @endpoint
    def poll_until_given_up(self, started: Port[str], cancels: Port[str]) -> None:
        """A def endpoint that stops early once its caller gave up."""
        started.send("polling")
        t0 = time.monotonic()
        while not meshio.context().cancelled():
            if time.monotonic() - t0 > GUARD:
                return
            time.sleep(0.005)
        cancels.send("polling")


class Relay(Actor):
    """Calls on down a chain on the deadline it inherited alone, and tries to
    fall back when that runs out (docs/howto/deadlines.md: it cannot)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.began = asyncio.Event()
        self.done = asyncio.Event()
        self.ended = ""

    @endpoint
    async def relay(self, rest: list[Relay], adverb: str, tell: str = "") -> str:
        """Call ``rest[0].relay(rest[1:])`` with ``adverb`` (the last actor
        waits forever), falling back on its CallTimeout.  How it ended is
        what :meth:`how_it_ended` answers (and what this writes to the FIFO
        ``tell``, if given, the test's loop blocked reading it)."""
        return await self.pass_on(rest, adverb, tell)

    @endpoint(retry=meshio.Retry(attempts=2, on=(ConnectionError,)))
    async def retried(self, rest: list[Relay], adverb: str, tell: str = "") -> str:
        """:meth:`relay`, with a retry policy (``call()`` waits otherwise)."""
        return await self.pass_on(rest, adverb, tell)

    async def pass_on(self, rest: list[Relay], adverb: str, tell: str) -> str:
        self.began.set()
        try:
            if not rest:
                await asyncio.Event().wait()
            ep = rest[0].retried if adverb == "call retried" else rest[0].relay
            if adverb == "call_one":
                await ep.call_one(rest[1:], adverb)
            elif adverb in ("call", "call retried"):
                await ep.call(rest[1:], adverb)
            else:
                async for _ in ep.stream(rest[1:], adverb):
                    pass
        except CallTimeout:
            self.end("CallTimeout", tell)
            return "fallback"
        except asyncio.CancelledError:
            self.end("CancelledError", tell)
            raise
        return "answered"

    def end(self, how: str, tell: str) -> None:
        self.ended = how
        self.done.set()
        if tell:
            fd = os.open(tell, os.O_WRONLY)
            os.write(fd, how.encode())
            os.close(fd)

    @endpoint(concurrent=True)
    async def wait_began(self) -> None:
        await self.began.wait()

    @endpoint(concurrent=True)
    async def how_it_ended(self) -> str:
        await self.done.wait()
        return self.ended

    @endpoint
    async def hold(self) -> None:
        await self.gate.wait()

    @endpoint(concurrent=True)
    async def open_gate(self) -> None:
        self.gate.set()

    @endpoint
    async def ping(self) -> str:
        return "pong"

    @endpoint
    async def block(self, ready: str, release: str) -> None:
        """Block this process's loop (at a FIFO gate) in a task's step, not
        in the read that brought this call: once it lets go, the loop reads
        what came meanwhile before it runs its timers."""
        await asyncio.sleep(0)
        hold(ready, release)


async def relays(procs: meshio.ProcMesh, *names: str) -> list[Relay]:
    """One Relay per name, each on its own process (round the proc mesh)."""
    n = len(procs)
    return [await procs.slice(procs=i % n).spawn(name, Relay) for i, name in enumerate(names)]


async def probes(procs: meshio.ProcMesh, *names: str) -> list[Probe]:
    """One Probe per name, each on its own process (round the proc mesh)."""
    n = len(procs)
    return [await procs.slice(procs=i % n).spawn(name, Probe) for i, name in enumerate(names)]


async def test_the_deadline_travels_with_the_call(procs: meshio.ProcMesh) -> None:
    """issue 18 item 1: ``options(timeout=s)`` reaches the callee as
    ``context().deadline`` (its own monotonic clock) and ``remaining()``, in
    an async endpoint and in a def endpoint's thread; without a timeout there
    is none."""
    (p,) = await probes(procs, "p")
    before = time.monotonic()
    deadline, remaining = await asyncio.wait_for(p.budget.options(timeout=5.0).call_one(), GUARD)
    assert deadline is not None and remaining is not None
    assert before < deadline <= time.monotonic() + 5.0  # (one host: one monotonic clock)
    assert 0.0 < remaining <= 5.0
    in_thread = await asyncio.wait_for(p.budget_in_thread.options(timeout=5.0).call_one(), GUARD)
    assert in_thread is not None and 0.0 < in_thread <= 5.0
    assert await asyncio.wait_for(p.budget.call_one(), GUARD) == (None, None)
    assert await asyncio.wait_for(p.budget_in_thread.call_one(), GUARD) is None


@pytest.mark.parametrize(("outer", "own", "bound"), [
    (10.0, None, "outer"), (10.0, 0.5, "own"), (2.0, 100.0, "outer")])
async def test_calls_made_inside_inherit_the_remaining_budget(
        procs: meshio.ProcMesh, outer: float, own: float | None, bound: str) -> None:
    """issue 18 item 1: a call made from an endpoint inherits what is left of
    the served call's deadline: the tighter of that and its own timeout."""
    a, b = await probes(procs, "a", "b")
    mine, theirs = await asyncio.wait_for(a.ask.options(timeout=outer).call_one(b, own), GUARD)
    assert mine is not None and theirs is not None
    assert 0.0 < theirs <= mine <= outer
    if bound == "own":
        assert own is not None and theirs <= own < mine
    else:
        assert own is None or theirs < own


async def test_an_endpoint_falls_back_when_its_own_timeout_runs_out(
        procs: meshio.ProcMesh) -> None:
    """A sub-call given a timeout shorter than what is left of the served
    call's deadline fails alone, with a CallTimeout the endpoint can catch
    (docs/howto/deadlines.md: the way to fall back; the inherited deadline
    cancels the whole tree at once)."""
    a, b = await probes(procs, "a", "b")
    fallback = a.ask_or_fall_back.options(timeout=GUARD).call_one(b, 0.3)
    assert await asyncio.wait_for(fallback, GUARD) == "fallback"


@pytest.mark.meshio_procs(per_host={"procs": 3})
@pytest.mark.parametrize("adverb", ["call_one", "call", "stream", "call retried"])
async def test_an_endpoint_cannot_catch_the_inherited_deadline(
        procs: meshio.ProcMesh, adverb: str) -> None:
    """When the deadline a call inherited passes, the endpoint that made it
    is cancelled with it, at every level of the chain: none gets the
    CallTimeout of the call it made, which it could catch and answer
    something else (docs/howto/deadlines.md).  Sent as a broadcast, which
    no caller cancels: only the deadline can, and the sub-call's timer
    always fires first in the endpoint (before, it raised CallTimeout
    there: caught, "fallback")."""
    chain = await relays(procs, "a", "b", "c")
    await chain[0].relay.options(timeout=0.2).broadcast(chain[1:], adverb)
    ends = await asyncio.wait_for(
        asyncio.gather(*(p.how_it_ended.call_one() for p in chain)), GUARD)
    assert ends == ["CancelledError"] * 3
    assert await asyncio.wait_for(chain[0].ping.call_one(), GUARD) == "pong"  # serving on


@pytest.mark.meshio_procs(per_host={"procs": 3})
async def test_a_call_s_deadline_cancels_its_endpoint_before_its_caller_says_so(
        procs: meshio.ProcMesh, tmp_path: Path) -> None:
    """The same for a call: its caller's Cancel (sent when the deadline
    passes there) and the timer of the call its endpoint made race; this
    process's loop is held until the endpoint ended, so the timer always
    wins (before, the endpoint caught the CallTimeout ~15% of the time,
    and here every time).  Its caller gets CallTimeout, and the actor
    serves on."""
    a, b, c = await relays(procs, "a", "b", "c")
    tell = str(tmp_path / "tell")
    os.mkfifo(tell)
    fd = os.open(tell, os.O_RDONLY | os.O_NONBLOCK)  # (no writer yet: nothing to read)
    try:
        call = asyncio.ensure_future(a.relay.options(timeout=1.0).call_one([b, c], "call_one",
                                                                            tell))
        await asyncio.wait_for(c.wait_began.call_one(), GUARD)  # (the chain is under way)
        ready, _, _ = select.select([fd], [], [], GUARD)  # (this loop held: no Cancel goes)
        assert ready, "a's endpoint did not end"
        assert os.read(fd, 64) == b"CancelledError"
    finally:
        os.close(fd)
    with pytest.raises(CallTimeout, match=r"no answer within 1\.0s"):
        await asyncio.wait_for(call, GUARD)
    ends = await asyncio.wait_for(
        asyncio.gather(*(p.how_it_ended.call_one() for p in (b, c))), GUARD)
    assert ends == ["CancelledError"] * 2
    assert await asyncio.wait_for(a.ping.call_one(), GUARD) == "pong"


@pytest.mark.parametrize("adverb", ["call_one", "stream", "call retried"])
async def test_an_endpoint_cannot_catch_a_callee_s_timeout_either(
        procs: meshio.ProcMesh, tmp_path: Path, adverb: str) -> None:
    """The callee may tell of the inherited deadline first: a's call to b
    waits in b's busy mailbox past it, and is dropped there (CallTimeout to
    a) while a's loop is held, so a reads that answer before its own timer
    runs.  a is cancelled all the same (before, it caught that
    CallTimeout)."""
    a, b = await relays(procs, "a", "b")
    blocker = await procs.slice(procs=0).spawn("blocker", Relay)  # (a's process)
    held = asyncio.ensure_future(b.hold.call_one())
    sent = time.monotonic()
    await a.relay.options(timeout=1.0).broadcast([b], adverb)
    async with asyncio.timeout(GUARD):  # a's call waits in b's mailbox
        while (await b.stacks()).actors[0].queued < 1:
            pass
    gate = Gate(tmp_path)
    blocking = asyncio.ensure_future(blocker.block.call_one(gate.ready, gate.release))
    await gate.wait_held(GUARD)
    # let the deadline pass (the condition under test is a duration, not an
    # event to wait for), then let b drop a's call: it answers CallTimeout
    await asyncio.sleep(max(0.0, sent + 1.1 - time.monotonic()))
    await asyncio.wait_for(b.open_gate.call_one(), GUARD)
    await asyncio.wait_for(held, GUARD)
    async with asyncio.timeout(GUARD):
        while (await b.stacks()).actors[0].expired < 1:
            pass
    await gate.open()
    await asyncio.wait_for(blocking, GUARD)
    assert await asyncio.wait_for(a.how_it_ended.call_one(), GUARD) == "CancelledError"
    assert await asyncio.wait_for(a.ping.call_one(), GUARD) == "pong"


async def test_a_call_whose_deadline_passes_in_the_mailbox_never_runs(
        procs: meshio.ProcMesh) -> None:
    """issue 18 item 1: a call still queued behind a busy call when its
    deadline passes is dropped without running; its caller gets CallTimeout."""
    (p,) = await probes(procs, "p")
    held = asyncio.ensure_future(p.hold.call_one())
    late = asyncio.ensure_future(p.work.options(timeout=0.3).call_one())
    (before,) = (await asyncio.wait_for(p.stacks(), GUARD)).actors  # (sent after both)
    assert before.endpoint == "Probe.hold"
    # queued, unless a loaded machine took longer than its 0.3 s to answer this
    assert (before.queued, before.expired) in ((1, 0), (0, 1))
    with pytest.raises(CallTimeout, match=r"^Probe\.work on 'p': no answer within 0\.3s "
                       r"from rank\(s\) \[\d\] of the mesh as spawned$"):  # (a point: no "at")
        await asyncio.wait_for(late, GUARD)
    (after,) = (await asyncio.wait_for(p.stacks(), GUARD)).actors  # (after the Cancel)
    assert (after.queued, after.expired) == (0, 1)
    await asyncio.wait_for(p.open_gate.call_one(), GUARD)
    await asyncio.wait_for(held, GUARD)
    await asyncio.wait_for(p.work.call_one(), GUARD)  # (behind the dropped one)
    assert await asyncio.wait_for(p.count.call_one(), GUARD) == 1


async def test_a_broadcast_carries_the_deadline_it_was_sent_under(
        procs: meshio.ProcMesh) -> None:
    """issue 18 item 1: a broadcast from an endpoint carries that call's
    deadline; queued past it, the callee drops it without running (nobody
    waits for it: nothing else happens)."""
    a, b = await probes(procs, "a", "b")
    held = asyncio.ensure_future(b.hold.call_one())
    sent = time.monotonic()
    await asyncio.wait_for(a.send_work.options(timeout=0.2).call_one(b), GUARD)
    # the broadcast is in b's mailbox behind hold: let its deadline pass (the
    # condition under test is a duration, not an event to wait for)
    await asyncio.sleep(max(0.0, sent + 0.25 - time.monotonic()))
    await asyncio.wait_for(b.open_gate.call_one(), GUARD)
    await asyncio.wait_for(held, GUARD)
    await asyncio.wait_for(b.work.call_one(), GUARD)
    assert await asyncio.wait_for(b.count.call_one(), GUARD) == 1
    assert [s.expired for s in (await asyncio.wait_for(b.stacks(), GUARD)).actors] == [1]


@pytest.mark.parametrize("how", ["cancel", "timeout"])
async def test_cancelling_a_call_cancels_its_chain(procs: meshio.ProcMesh, how: str) -> None:
    """issue 18 item 2: cancelling a call (or its deadline passing) cancels
    the calls its endpoint made, transitively: a -> b -> c, each in another
    process; nothing keeps running."""
    chain = await probes(procs, "a", "b", "c")
    ep = chain[0].chain.options(timeout=1.0) if how == "timeout" else chain[0].chain
    call = asyncio.ensure_future(ep.call_one(chain[1:]))
    await asyncio.wait_for(asyncio.gather(*(p.wait_in_chain.call_one() for p in chain)), GUARD)
    if how == "cancel":
        call.cancel()
    with pytest.raises((asyncio.CancelledError, CallTimeout)):
        await asyncio.wait_for(call, GUARD)
    await asyncio.wait_for(asyncio.gather(*(p.wait_chain_ended.call_one() for p in chain)),
                           GUARD)


@pytest.mark.parametrize("deadline", [None, 10 * GUARD])
async def test_a_call_cancelled_in_the_read_that_brings_it_cancels_its_chain(
        procs: meshio.ProcMesh, tmp_path: Path, deadline: float | None) -> None:
    """A call and its Cancel reach an idle actor in one read: every message
    of a read is in before a call of it runs, so the Cancel drops the call
    before it starts, and nothing of its chain runs (before, the call
    started in that read and the Cancel then had to cancel its inner call).
    The process's loop is held at a FIFO gate (by another actor there)
    while both frames arrive.  With a deadline too."""
    a, b = await probes(procs, "a", "b")
    blocker = await procs.slice(procs=0).spawn("blocker", Probe)
    gate = Gate(tmp_path)
    blocking = asyncio.ensure_future(blocker.block.call_one(gate.ready, gate.release))
    await gate.wait_held(GUARD)
    call = asyncio.ensure_future(a.chain.options(timeout=deadline).call_one([b]))
    await asyncio.wait_for(b.count.call_one(), GUARD)  # (a round trip: the call is written)
    call.cancel()
    await asyncio.wait_for(b.count.call_one(), GUARD)  # (and its Cancel)
    await gate.open()
    await asyncio.wait_for(blocking, GUARD)
    with pytest.raises(asyncio.CancelledError):
        await call
    # (a's mailbox call behind the dropped one: it ran nothing of the chain)
    await asyncio.wait_for(a.work.call_one(), GUARD)
    assert await asyncio.wait_for(a.chain_began.call_one(), GUARD) is False
    assert await asyncio.wait_for(b.chain_began.call_one(), GUARD) is False


async def test_concurrent_calls_cancelled_as_they_arrive_do_not_run_on(
        procs: meshio.ProcMesh) -> None:
    """issue 18 item 2: a concurrent call whose Cancel arrives with it
    (before its task has started) is cancelled too: nothing keeps running."""
    (p,) = await probes(procs, "p")
    calls = [asyncio.ensure_future(p.forever.call_one()) for _ in range(100)]
    await asyncio.sleep(0)  # (sent: each Cancel follows its call in the same frames)
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    async with asyncio.timeout(GUARD):  # cancelled tasks end at their next turn
        while not all(s.idle for s in (await p.stacks()).actors):
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("how", ["cancel", "timeout"])
async def test_a_def_endpoint_sees_that_its_caller_gave_up(
        procs: meshio.ProcMesh, how: str) -> None:
    """issue 18 item 2: a def endpoint, which cannot be interrupted in its
    thread, polls ``context().cancelled()`` and stops early once its caller
    cancelled the call or the deadline passed."""
    (p,) = await probes(procs, "p")
    port, started = Channel[str].open()
    cport, cancels = Channel[str].open()
    ep = p.poll_until_given_up.options(timeout=0.5) if how == "timeout" else p.poll_until_given_up
    call = asyncio.ensure_future(ep.call_one(port, cport))
    assert await asyncio.wait_for(started.recv(), GUARD) == "polling"
    if how == "cancel":
        call.cancel()
    with pytest.raises((asyncio.CancelledError, CallTimeout)):
        await asyncio.wait_for(call, GUARD)
    assert await asyncio.wait_for(cancels.recv(), GUARD) == "polling"


@given(st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)))
def test_any_budget_decodes_to_no_deadline_or_a_finite_one(budget: float | None) -> None:
    """issue 18 item 1: (evidence) whatever a peer puts in a call's deadline
    field (negative, NaN, infinite, huge) is no deadline or a finite time no
    earlier than now."""
    before = time.monotonic()
    deadline = _deadline(budget)
    if budget is None or not math.isfinite(budget):
        assert deadline is None
    else:
        assert deadline is not None and math.isfinite(deadline) and deadline >= before


async def test_deadline_and_cancellation_cross_hosts(tmp_path: Path) -> None:
    """issue 18 items 1 and 2: a -> b -> c, each on a host of its own (host
    agents reached over TCP): the deadline arrives as a remaining duration,
    and cancelling the call at a cancels b and c too."""
    job = ProcessJob(meshes={"three": 3}, cache_dir=tmp_path / ".meshio")
    try:
        state = await job.state()
        async with state.three.spawn_procs() as hosts:
            chain = [await hosts.slice(hosts=i).spawn(name, Probe)
                     for i, name in enumerate("abc")]
            mine, theirs = await asyncio.wait_for(
                chain[0].ask.options(timeout=10.0).call_one(chain[1], None), GUARD)
            assert mine is not None and theirs is not None and 0.0 < theirs <= mine <= 10.0
            call = asyncio.ensure_future(chain[0].chain.call_one(chain[1:]))
            await asyncio.wait_for(
                asyncio.gather(*(p.wait_in_chain.call_one() for p in chain)), GUARD)
            call.cancel()
            await asyncio.wait_for(
                asyncio.gather(*(p.wait_chain_ended.call_one() for p in chain)), GUARD)
    finally:
        await job.kill()
