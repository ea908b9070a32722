"""Actor lifecycle with real processes: endpoints raising what ``except
Exception`` misses, reentrant calls, cancellation, ``@endpoint`` misuse,
``__cleanup__`` and graceful exit, and blocking ``def`` endpoints under
heartbeats (issue 7 items 2, 6, 7, 13, 15, 18).

Nothing here sleeps to wait for something: tests wait on call futures,
ports, supervision events and process exit, each under a generous guard.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from supervision_helpers import Events

import meshio
from fifo_gate import Gate, hold
from meshio import (
    Actor,
    ActorError,
    CallTimeout,
    Channel,
    DeadlockError,
    Port,
    SupervisionError,
    context,
    endpoint,
)
from meshio.supervision import ManualClock

#: generous bound on any single wait on a loaded machine
GUARD = 20.0


# ------------------------------------------------------------ item 2: errors


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


class ExitsWhenPickled:
    def __reduce__(self) -> Any:
        raise SystemExit("not picklable")


class Surrogate(Exception):
    def __str__(self) -> str:
        return "bad bytes \udcff here"


RAISES: dict[str, Any] = {
    "cancelled": lambda: asyncio.CancelledError("user cancelled"),
    "unprintable": Unprintable,
    "surrogate": Surrogate,
    "generator_exit": lambda: GeneratorExit("closing time"),
}
EXPECT = {  # kind: (remote_type suffix, text in the message)
    "cancelled": ("CancelledError", "user cancelled"),
    "unprintable": ("Unprintable", "str() raised RuntimeError"),
    "surrogate": ("Surrogate", "bad bytes \\xff here"),
    "generator_exit": ("GeneratorExit", "closing time"),
}


def _raise(kind: str) -> None:
    raise RAISES[kind]()


class Raiser(Actor):
    def __init__(self, cleanups: Port[str] | None = None, fail_init: str = "") -> None:
        if fail_init == "exit":
            raise SystemExit(4)
        if fail_init:
            raise RAISES[fail_init]()
        self.cleanups = cleanups

    def __cleanup__(self, exc: BaseException | None) -> None:
        if self.cleanups is not None:
            self.cleanups.send(repr(exc))

    @endpoint
    async def raise_async(self, kind: str) -> None:
        raise RAISES[kind]()

    @endpoint
    def raise_sync(self, kind: str) -> None:
        raise RAISES[kind]()

    @endpoint(concurrent=True)
    async def raise_concurrent(self, kind: str) -> None:
        raise RAISES[kind]()

    @endpoint
    async def raise_in_a_thread(self, kind: str) -> None:
        await asyncio.to_thread(_raise, kind)

    @endpoint(concurrent=True)
    async def raise_in_a_thread_concurrent(self, kind: str) -> None:
        await asyncio.to_thread(_raise, kind)

    @endpoint
    async def exit_async(self, code: int) -> None:
        raise SystemExit(code)

    @endpoint
    def interrupt_sync(self) -> None:
        raise KeyboardInterrupt

    @endpoint
    async def unpicklable_result(self) -> Any:
        return ExitsWhenPickled()

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


@pytest.mark.parametrize("kind", sorted(RAISES))
@pytest.mark.parametrize("method", ["raise_async", "raise_sync", "raise_concurrent"])
async def test_endpoint_raising_the_unusual_reaches_the_caller(
        procs: meshio.ProcMesh, kind: str, method: str) -> None:
    """issue 7 item 2: CancelledError raised by user code, an exception whose
    str/repr raise, one whose text cannot be encoded: the caller gets
    ActorError and the actor keeps serving (mailbox, def thread and
    concurrent paths)."""
    r = await procs.slice(procs=0).spawn("r", Raiser)
    with pytest.raises(ActorError) as ei:
        await asyncio.wait_for(getattr(r, method).call_one(kind), GUARD)
    remote_type, text = EXPECT[kind]
    assert ei.value.remote_type.endswith(remote_type)
    assert text in ei.value.remote_message
    assert ei.value.actor == "r" and ei.value.rank == 0
    assert method in ei.value.remote_traceback
    # from the endpoint's frame: not meshio's mailbox, task or thread that ran it
    assert ei.value.remote_traceback.startswith(
        f'Traceback (most recent call last):\n  File "{__file__}", line ')
    assert await asyncio.wait_for(r.pid.call_one(), GUARD) == procs.pids[0]


@pytest.mark.parametrize("method", ["raise_in_a_thread", "raise_in_a_thread_concurrent"])
async def test_generator_exit_from_an_awaited_thread_is_the_call_s_error(
        procs: meshio.ProcMesh, method: str) -> None:
    """A GeneratorExit that an async endpoint gets from a future it awaits
    (here ``asyncio.to_thread``) fails that call only: the actor serves the
    next ones.  (Before, the mailbox task died with it: every later call
    hung.  Its message is lost: thrown into a coroutine, GeneratorExit
    closes it.)"""
    r = await procs.slice(procs=0).spawn("r", Raiser)
    for _ in range(2):  # (the first finds the actor idle, the second behind nothing)
        with pytest.raises(ActorError) as ei:
            await asyncio.wait_for(getattr(r, method).call_one("generator_exit"), GUARD)
        assert ei.value.remote_type == "GeneratorExit"
        assert await asyncio.wait_for(r.pid.call_one(), GUARD) == procs.pids[0]


async def test_result_whose_pickling_raises_system_exit(procs: meshio.ProcMesh) -> None:
    """issue 7 item 2: a result that cannot be pickled (its __reduce__ raises
    SystemExit) fails the call with SchemaError; the worker keeps serving."""
    r = await procs.slice(procs=0).spawn("r", Raiser)
    with pytest.raises(meshio.SchemaError, match="could not be encoded: SystemExit: not picklable"):
        await asyncio.wait_for(r.unpicklable_result.call_one(), GUARD)
    assert await asyncio.wait_for(r.pid.call_one(), GUARD) == procs.pids[0]


async def test_system_exit_stops_the_actor_and_runs_its_cleanup(
        procs: meshio.ProcMesh) -> None:
    """issue 7 item 2: SystemExit from an endpoint reaches the caller and ends
    the actor (later calls: SupervisionError naming why; __cleanup__ gets the
    exception); the process and its other actors go on."""
    port, cleanups = Channel[str].open()
    r = await procs.slice(procs=0).spawn("r", Raiser, port)
    other = await procs.slice(procs=0).spawn("other", Raiser)
    with pytest.raises(ActorError) as ei:
        await asyncio.wait_for(r.exit_async.call_one(3), GUARD)
    assert ei.value.remote_type == "SystemExit"
    with pytest.raises(SupervisionError, match=r"\(rank 0\) was stopped by the SystemExit an "
                       r"endpoint raised: 3"):
        await asyncio.wait_for(r.pid.call_one(), GUARD)
    with pytest.raises(SupervisionError, match=r"\(rank 0\) was stopped by the SystemExit an "
                       r"endpoint raised: 3"):  # (choose: why, as a call's)
        await asyncio.wait_for(r.pid.choose(), GUARD)
    assert await asyncio.wait_for(other.pid.call_one(), GUARD) == procs.pids[0]
    assert await asyncio.wait_for(cleanups.recv(), GUARD) == "SystemExit(3)"
    await asyncio.wait_for(r.stop(), GUARD)  # the name is free: spawned again, it serves
    again = await procs.slice(procs=0).spawn("r", Raiser)
    assert await asyncio.wait_for(again.pid.call_one(), GUARD) == procs.pids[0]


@pytest.mark.parametrize("how", ["exit_call", "interrupt_call", "exit_broadcast",
                                 "unprintable_broadcast"])
async def test_fatal_or_unprintable_errors_are_supervision_events(
        how: str, capsys: pytest.CaptureFixture[str]) -> None:
    """issue 7 item 2: SystemExit/KeyboardInterrupt in a call, and SystemExit
    or an unprintable exception in a broadcast (no caller), are failures the
    supervisor sees: the process is replaced, and the controller's stderr says
    so (not "unhandled")."""
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0, clock=ManualClock())
    events = Events(sup, GUARD)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, supervisor=sup) as procs:
        r = await procs.spawn("r", Raiser)
        old = procs.pids[0]
        if how == "exit_call":
            with pytest.raises(ActorError, match="SystemExit"):
                await asyncio.wait_for(r.exit_async.call_one(0), GUARD)
        elif how == "interrupt_call":
            with pytest.raises(ActorError, match="KeyboardInterrupt"):
                await asyncio.wait_for(r.interrupt_sync.call_one(), GUARD)
        elif how == "exit_broadcast":
            r.exit_async.broadcast(0)
        else:
            r.raise_async.broadcast("unprintable")
        failure = await events.next("failure")
        assert failure.pid == old
        expected = "Unprintable" if how == "unprintable_broadcast" else (
            "KeyboardInterrupt" if how == "interrupt_call" else "SystemExit")
        assert expected in failure.cause and "no caller" not in failure.cause
        restart = await events.next("restart")
        assert procs.pids == [restart.pid] != [old]
        assert await asyncio.wait_for(r.pid.call_one(), GUARD) == restart.pid
    await events.aclose()
    err = capsys.readouterr().err
    assert "failure in r rank 0" in err and "the process is killed; supervisor" in err
    assert "unhandled" not in err


async def test_a_broadcast_with_bad_arguments_is_no_failure(
        caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    """A broadcast whose arguments do not fit the endpoint (the sender's
    mistake, found where they are decoded) is not run and is logged; it is
    no failure of the actor: a supervised process is not replaced (it was,
    losing every actor's state, and Supervisor() gave up on a mesh of 2)."""
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0, clock=ManualClock())
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        r = await procs.spawn("r", Raiser)
        old = procs.pids
        r.raise_async.broadcast(cast(str, 42))
        for _ in range(2):  # (the first's answers could overtake a kill a fault caused)
            assert (await asyncio.wait_for(r.pid.call(), GUARD)).values() == old
    assert "failure in r rank" not in capsys.readouterr().err
    logged = [rec.getMessage() for rec in caplog.records]
    assert any("a broadcast to" in m and "was not run" in m and "bad arguments" in m
               for m in logged), logged


@pytest.mark.parametrize("fail_init", ["exit", "unprintable", "cancelled"])
async def test_constructor_raising_the_unusual_fails_the_spawn(
        procs: meshio.ProcMesh, fail_init: str) -> None:
    """issue 7 item 2: a constructor raising SystemExit, an unprintable
    exception or CancelledError fails the spawn with ActorError (no hang)."""
    with pytest.raises(ActorError) as ei:
        await asyncio.wait_for(procs.spawn("r", Raiser, None, fail_init), GUARD)
    assert ei.value.remote_type.endswith(
        {"exit": "SystemExit", "unprintable": "Unprintable",
         "cancelled": "CancelledError"}[fail_init])
    ok = await procs.spawn("ok", Raiser)  # the workers go on
    assert (await asyncio.wait_for(ok.pid.call(), GUARD)).values() == procs.pids


# ------------------------------------------------- item 6: reentrant calls


class Learner(Actor):
    @endpoint
    async def update(self, gen: Generator, concurrent: bool) -> str:
        try:
            if concurrent:
                return f"version {await gen.version_concurrent.call_one()}"
            return f"version {await gen.version.call_one()}"
        except DeadlockError as e:
            return f"DeadlockError: {e}"


class Generator(Actor):
    def __init__(self, learner: Learner) -> None:
        self.learner = learner

    @endpoint
    async def step(self, concurrent: bool) -> str:
        me = cast(Generator, context().mesh.slice(**dict(context().point)))
        return await self.learner.update.call_one(me, concurrent)

    @endpoint
    async def version(self) -> int:
        return 7

    @endpoint(concurrent=True)
    async def version_concurrent(self) -> int:
        return 8


async def test_reentrant_call_fails_fast_naming_the_chain(procs: meshio.ProcMesh) -> None:
    """issue 7 item 6: gen -> learner -> back into the busy gen fails at once
    with DeadlockError naming the chain and suggesting concurrent=True; into
    a concurrent=True endpoint the same shape works."""
    learner = await procs.slice(procs=1).spawn("learner", Learner)
    gen = await procs.slice(procs=0).spawn("gen", Generator, learner)
    assert await asyncio.wait_for(gen.step.call_one(True), GUARD) == "version 8"
    got = await asyncio.wait_for(gen.step.call_one(False), GUARD)
    assert got.startswith("DeadlockError: ")
    assert "gen[0] -> learner[0] -> gen[0]" in got
    assert "Generator.step" in got and "Generator.version" in got
    assert "@endpoint(concurrent=True)" in got
    # the generator is not stuck: it serves the next call
    assert await asyncio.wait_for(gen.version.call_one(), GUARD) == 7


class Selfish(Actor):
    @endpoint
    async def outer(self) -> str:
        me = context().mesh.slice(**dict(context().point))
        try:
            await me.inner.call_one()
        except DeadlockError as e:
            assert isinstance(e, RuntimeError)
            return str(e)
        return "no deadlock detected"

    @endpoint
    async def inner(self) -> None:
        pass


async def test_deadlock_error_is_typed_for_the_caller_in_the_chain(
        procs: meshio.ProcMesh) -> None:
    """issue 7 item 6: an actor calling itself from a normal endpoint (the
    shortest cycle) gets meshio.DeadlockError, a RuntimeError."""
    s = await procs.slice(procs=0).spawn("s", Selfish)
    got = await asyncio.wait_for(s.outer.call_one(), GUARD)
    assert got.startswith("reentrant call would deadlock: s[0] -> s[0]")


# --------------------------------------------------- item 7: cancellation


class Worker(Actor):
    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.runs = 0
        self.saw_cancel = False

    @endpoint
    async def hold(self) -> None:
        await self.gate.wait()

    @endpoint(concurrent=True)
    async def open_gate(self) -> None:
        self.gate.set()

    @endpoint
    async def slow(self, i: int) -> int:
        self.runs += 1
        await asyncio.sleep(0.01)
        return i

    @endpoint
    async def count(self) -> int:
        return self.runs

    @endpoint
    async def wait_forever(self, started: Port[int]) -> None:
        started.send(meshio.current_rank().rank)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.saw_cancel = True
            raise

    @endpoint
    async def cancelled(self) -> bool:
        return self.saw_cancel

    @endpoint
    async def fail(self) -> None:
        raise ValueError("fails")


class Busy(Actor):
    def __init__(self) -> None:
        self.busy = asyncio.Event()

    @endpoint
    async def forever(self) -> None:
        self.busy.set()
        await asyncio.Event().wait()

    @endpoint(concurrent=True)
    async def wait_busy(self) -> None:
        await self.busy.wait()

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


async def test_stopping_a_mesh_spawned_on_a_slice_frees_its_name(
        procs: meshio.ProcMesh) -> None:
    """An actor mesh spawned on a slice of the proc mesh and stopped whole
    frees its name (it stayed taken: stopping freed it only for a mesh on
    every process); stopping a slice of it does not."""
    one = procs.slice(procs=1)
    s = await one.spawn("s", Busy)
    await asyncio.wait_for(s.stop(), GUARD)
    again = await one.spawn("s", Busy)
    assert await asyncio.wait_for(again.pid.call_one(), GUARD) == procs.pids[1]
    both = await procs.spawn("both", Busy)
    await asyncio.wait_for(both.slice(procs=0).stop(), GUARD)
    with pytest.raises(ValueError, match="already has actors named 'both'"):
        await procs.spawn("both", Busy)


async def test_calls_under_way_and_queued_fail_with_supervision_error_on_stop(
        procs: meshio.ProcMesh) -> None:
    """An actor stopped while it handles a call with another queued behind
    it: both callers get SupervisionError (the queued one got
    UnknownActorError, "never spawned here", before); so does a later call
    (it was UnknownActorError: "actor mesh 'b' was stopped" now)."""
    b = await procs.slice(procs=0).spawn("b", Busy)
    running = asyncio.ensure_future(b.forever.call_one())
    await asyncio.wait_for(b.wait_busy.call_one(), GUARD)
    queued = asyncio.ensure_future(b.pid.call_one())
    await asyncio.wait_for(b.wait_busy.call_one(), GUARD)  # (after it on the connection)
    await asyncio.wait_for(b.stop(), GUARD)
    with pytest.raises(SupervisionError, match="was stopped while handling this call"):
        await asyncio.wait_for(running, GUARD)
    with pytest.raises(SupervisionError, match="was stopped before handling this call"):
        await asyncio.wait_for(queued, GUARD)
    with pytest.raises(SupervisionError, match="actor mesh 'b' was stopped"):
        await asyncio.wait_for(b.pid.call_one(), GUARD)


async def test_cancelled_queued_calls_are_dropped(procs: meshio.ProcMesh) -> None:
    """issue 7 item 7: 200 cancelled calls queued behind a busy call are
    dropped, not run, and the next call is served at once."""
    w = await procs.slice(procs=0).spawn("w", Worker)
    held = w.hold.call_one()
    futs = [w.slow.call_one(i) for i in range(200)]
    for f in futs:
        f.cancel()
    await asyncio.gather(*futs, return_exceptions=True)  # (the Cancel messages are out)
    await asyncio.wait_for(w.open_gate.call_one(), GUARD)
    await asyncio.wait_for(held, GUARD)
    t0 = time.perf_counter()
    assert await asyncio.wait_for(w.count.call_one(), GUARD) == 0
    print(f"next call after 200 cancelled 10 ms calls: {1e3 * (time.perf_counter() - t0):.1f} ms")


@pytest.mark.parametrize("how", ["cancel", "timeout", "wait_for", "stream", "call",
                                 "call timeout"])
async def test_cancelling_a_running_call_cancels_its_task(procs: meshio.ProcMesh,
                                                         how: str) -> None:
    """issue 7 item 7: a running async endpoint gets CancelledError in its
    task when its caller cancels, times out or abandons a stream (or a
    ``call`` to the whole mesh, whose answers are gathered together)."""
    w = await procs.spawn("w", Worker)
    one = w.slice(procs=1)
    port, started = Channel[int].open()
    if how == "stream":
        stream = w.wait_forever.stream(port)
        task = asyncio.ensure_future(stream.__anext__())
        assert {await started.recv(), await started.recv()} == {0, 1}
        task.cancel()
        with pytest.raises(asyncio.CancelledError):  # (the stream's calls are cancelled)
            await task
    elif how.startswith("call"):
        ep = w.wait_forever.options(timeout=2.0) if how == "call timeout" else w.wait_forever
        call = ep.call(port)
        assert {await started.recv(), await started.recv()} == {0, 1}
        if how == "call":
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
        else:
            with pytest.raises(CallTimeout) as info:
                await call
            assert info.value.ranks == (0, 1)
    else:
        opts = one.wait_forever.options(timeout=2.0) if how == "timeout" else one.wait_forever
        fut = asyncio.ensure_future(opts.call_one(port))
        assert await asyncio.wait_for(started.recv(), GUARD) == 1
        if how == "cancel":
            fut.cancel()
        elif how == "wait_for":
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(fut, 0.1)
        with pytest.raises((asyncio.CancelledError, CallTimeout)):
            await fut
    # queued behind the cancelled call on the same connection: answered only
    # once the cancelled call has ended
    assert (await asyncio.wait_for(w.cancelled.call(), GUARD)).values() == (
        [False, True] if how in ("cancel", "timeout", "wait_for") else [True, True])


async def test_cancelled_failing_calls_leave_no_unretrieved_exceptions(
        procs: meshio.ProcMesh, caplog: pytest.LogCaptureFixture) -> None:
    """issue 7 item 7: 1,000 cancelled calls of a failing endpoint log no
    'Future exception was never retrieved'."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    w = await procs.spawn("w", Worker)
    futs = [w.fail.call() for _ in range(1000)]
    for f in futs:
        f.cancel()
    await asyncio.gather(*futs, return_exceptions=True)
    # every reply to those calls has arrived once this one has
    await asyncio.wait_for(w.count.call(), GUARD)
    del futs
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


class Held(Actor):
    """Its constructor holds at the gate in the folder ``gate`` (if given);
    its cleanup says so through the FIFO ``cleaned`` (if given)."""

    def __init__(self, gate: str, cleaned: str) -> None:
        if gate:
            hold(os.path.join(gate, "ready"), os.path.join(gate, "release"))
        self.cleaned = cleaned

    def __cleanup__(self, exc: BaseException | None) -> None:
        if self.cleaned:
            os.close(os.open(self.cleaned, os.O_WRONLY))  # (until the test reads)

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


async def test_a_cancelled_spawn_frees_its_name_and_stops_what_it_built(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A spawn given up while its constructor runs (a timeout around it, a
    cancelled task): the name is free at once for a new spawn, and the actor
    it was building is stopped once built (its cleanup runs) instead of
    replacing the new one; nothing is logged as never retrieved."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    (tmp_path / "gate").mkdir()
    (tmp_path / "cleaned").mkdir()
    gate, cleaned = Gate(tmp_path / "gate"), Gate(tmp_path / "cleaned")
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        spawning = asyncio.ensure_future(
            procs.spawn("held", Held, str(tmp_path / "gate"), cleaned.ready))
        await gate.wait_held(GUARD)  # its constructor runs
        spawning.cancel()
        with pytest.raises(asyncio.CancelledError):
            await spawning
        again = await asyncio.wait_for(procs.spawn("held", Held, "", ""), GUARD)
        pid = await asyncio.wait_for(again.pid.call_one(), GUARD)
        await gate.open()  # the first constructor returns...
        await cleaned.wait_held(GUARD)  # ...and that actor is stopped: its cleanup ran
        assert await asyncio.wait_for(again.pid.call_one(), GUARD) == pid  # the new one serves
        await asyncio.wait_for(again.stop(), GUARD)
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


# -------------------------------------------------- item 13: @endpoint misuse


def test_endpoint_applied_twice_is_a_type_error() -> None:
    """issue 7 item 13: @endpoint(concurrent=True) stacked on @endpoint."""
    with pytest.raises(TypeError, match="applied twice"):
        class Twice(Actor):
            @endpoint(concurrent=True)  # type: ignore[call-overload]
            @endpoint
            async def f(self) -> None: ...


def test_concurrent_plain_def_is_a_type_error() -> None:
    """issue 7 item 13: concurrent=True on a plain def."""
    with pytest.raises(TypeError, match="only 'async def' endpoints can run concurrently"):
        class Plain(Actor):
            @endpoint(concurrent=True)
            def f(self) -> None: ...


@pytest.mark.parametrize("concurrent", [False, True])
def test_generator_endpoint_is_a_type_error(concurrent: bool) -> None:
    """issue 7 item 13: a generator (sync or async) cannot be an endpoint: a
    clear TypeError at class creation pointing to Port, not a failure per call."""
    with pytest.raises(TypeError, match=r"an endpoint returns one value.*Port"):
        class Agen(Actor):
            @endpoint(concurrent=concurrent)
            async def f(self) -> AsyncIterator[int]:
                yield 1
    with pytest.raises(TypeError, match=r"an endpoint returns one value.*Port"):
        class Gen(Actor):
            @endpoint
            def g(self) -> Iterator[int]:
                yield 1


# ------------------------------------- item 15: __cleanup__ and graceful exit


class Tidy(Actor):
    def __init__(self, log: str, tag: str, atexit_marker: str = "") -> None:
        self.log = log
        self.tag = tag
        if atexit_marker:
            atexit.register(Path(atexit_marker).write_text, "atexit ran")

    def _note(self, text: str) -> None:
        with open(self.log, "a") as f:
            f.write(text + "\n")

    @endpoint
    async def ping(self) -> int:
        return os.getpid()


class AsyncTidy(Tidy):
    async def __cleanup__(self, exc: BaseException | None) -> None:
        await asyncio.sleep(0)
        self._note(f"{self.tag} {context().actor_name} {exc!r}")


class SyncTidy(Tidy):
    def __cleanup__(self, exc: BaseException | None) -> None:
        self._note(f"{self.tag} {context().actor_name} {exc!r} "
                   f"{threading.current_thread() is threading.main_thread()}")


class BadTidy(Tidy):
    def __init__(self, log: str, tag: str) -> None:
        super().__init__(log, tag)
        logging.getLogger("meshio").addHandler(logging.FileHandler(log))

    async def __cleanup__(self, exc: BaseException | None) -> None:
        if self.tag == "raise":
            raise RuntimeError("cleanup failed")
        await asyncio.Event().wait()  # never ends


async def test_cleanup_runs_on_actor_mesh_stop(procs: meshio.ProcMesh, tmp_path: Path) -> None:
    """issue 7 item 15: ActorMesh.stop runs __cleanup__(None) (async on the
    loop, sync in the actor's thread) in every actor before it returns."""
    log = tmp_path / "log"
    a = await procs.spawn("a", AsyncTidy, str(log), "async")
    s = await procs.spawn("s", SyncTidy, str(log), "sync")
    await asyncio.wait_for(a.stop(), GUARD)
    await asyncio.wait_for(s.stop(), GUARD)
    assert sorted(log.read_text().splitlines()) == [
        "async a None", "async a None", "sync s None False", "sync s None False"]
    with pytest.raises(SupervisionError, match="actor mesh 'a' was stopped"):
        await asyncio.wait_for(a.ping.call(), GUARD)


async def test_cleanup_on_proc_mesh_stop_in_reverse_spawn_order_then_atexit(
        tmp_path: Path) -> None:
    """issue 7 item 15: a graceful proc mesh stop runs every actor's
    __cleanup__ in reverse spawn order, then the worker exits normally, so an
    atexit handler registered in an actor's __init__ runs."""
    log, marker = tmp_path / "log", tmp_path / "atexit"
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        await procs.spawn("first", AsyncTidy, str(log), "1", str(marker))
        await procs.spawn("second", SyncTidy, str(log), "2")
    # the async with block waited for the worker to exit
    assert log.read_text().splitlines() == ["2 second None False", "1 first None"]
    assert marker.read_text() == "atexit ran"


async def test_failing_or_hanging_cleanup_does_not_hang_the_stop(
        procs: meshio.ProcMesh, tmp_path: Path) -> None:
    """issue 7 item 15: a __cleanup__ that raises is logged, one that never
    ends is abandoned after the time bound; the stop completes either way."""
    logs = [tmp_path / "log0", tmp_path / "log1"]
    raising = await procs.slice(procs=0).spawn("raising", BadTidy, str(logs[0]), "raise")
    hanging = await procs.slice(procs=1).spawn("hanging", BadTidy, str(logs[1]), "hang")
    await asyncio.wait_for(raising.stop(), GUARD)
    await asyncio.wait_for(hanging.stop(), GUARD)
    raised = logs[0].read_text()
    assert "BadTidy.__cleanup__ of raising[0] raised" in raised and "cleanup failed" in raised
    # its traceback from the hook's frame: not meshio's that ran it
    assert raised.split('\n  File "')[1].startswith(f'{__file__}", line ')
    assert "BadTidy.__cleanup__ of hanging[0] did not finish within" in logs[1].read_text()


class ExitingTidy(Tidy):
    """A __cleanup__ that raises what ends interpreters: sync (in the actor's
    thread) for "exit", async (on the loop) for "interrupt"."""

    def __cleanup__(self, exc: BaseException | None) -> None:
        raise SystemExit(3)


class InterruptedTidy(Tidy):
    async def __cleanup__(self, exc: BaseException | None) -> None:
        raise KeyboardInterrupt


@pytest.mark.parametrize("cls", [ExitingTidy, InterruptedTidy])
async def test_cleanup_raising_system_exit_does_not_end_the_worker(
        procs: meshio.ProcMesh, tmp_path: Path, cls: type[Tidy]) -> None:
    """issue 7 item 15: a __cleanup__ raising SystemExit or KeyboardInterrupt
    is logged like any failing hook; the worker and its other actors go on."""
    other = await procs.spawn("other", AsyncTidy, str(tmp_path / "log"), "other")
    pids = (await asyncio.wait_for(other.ping.call(), GUARD)).values()
    leaving = await procs.spawn("leaving", cls, str(tmp_path / "log"), "leaving")
    await asyncio.wait_for(leaving.stop(), GUARD)
    assert (await asyncio.wait_for(other.ping.call(), GUARD)).values() == pids


# ------------------------------------ item 18: blocking def endpoints and hangs


class Sleeper(Actor):
    @endpoint
    def block_thread(self, seconds: float) -> int:
        time.sleep(seconds)
        return os.getpid()

    @endpoint
    async def block_loop(self, seconds: float) -> int:
        time.sleep(seconds)  # wrong on purpose: blocks the worker's loop
        return os.getpid()

    @endpoint
    def where(self) -> tuple[bool, str]:
        return (threading.current_thread() is threading.main_thread(),
                context().actor_name)


class Relay(Actor):
    @endpoint
    async def forward(self, x: int, port: Port[int]) -> None:
        port.send(x)
        port.close()

    @endpoint
    def send_all(self, port: Port[int], peer: Relay, peer_port: Port[int]) -> str:
        port.send(1)
        peer.forward.broadcast(2, peer_port)
        port.send(3)
        port.close()
        return threading.current_thread().name

    @endpoint
    def call_from_thread(self, peer: Relay, port: Port[int]) -> None:
        peer.forward.call(0, port)


async def test_def_endpoint_sends_from_its_thread(procs: meshio.ProcMesh) -> None:
    """issue 7 item 18: a def endpoint runs in its actor's thread and can
    still port.send and broadcast (in order); awaiting calls needs async def,
    and trying from a def says so."""
    a = await procs.slice(procs=0).spawn("a", Relay)
    b = await procs.slice(procs=1).spawn("b", Relay)
    port, values = Channel[int].open()
    peer_port, peer_values = Channel[int].open()
    thread = await asyncio.wait_for(a.send_all.call_one(port, b, peer_port), GUARD)
    assert thread == "meshio-actor a[0]"

    async def read(receiver: meshio.PortReceiver[int]) -> list[int]:
        return [v async for v in receiver]

    assert await asyncio.wait_for(read(values), GUARD) == [1, 3]
    assert await asyncio.wait_for(read(peer_values), GUARD) == [2]
    with pytest.raises(ActorError, match="from a plain 'def' endpoint") as ei:
        await asyncio.wait_for(a.call_from_thread.call_one(b, peer_port), GUARD)
    assert ei.value.remote_type == "RuntimeError"


async def test_blocking_def_endpoint_is_not_hung_but_a_blocked_loop_is() -> None:
    """issue 7 item 18: a plain def endpoint blocking for longer than the
    heartbeat timeout runs off the loop: the call returns normally and the
    process is not restarted; an async endpoint blocking the loop
    (time.sleep) is a hung process: killed and replaced."""
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0,
                            heartbeat_interval=0.2, heartbeat_timeout=1.0)
    events = Events(sup, GUARD)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, supervisor=sup) as procs:
        s = await procs.spawn("s", Sleeper)
        old = procs.pids[0]
        assert await asyncio.wait_for(s.where.call_one(), GUARD) == (False, "s")
        assert await asyncio.wait_for(s.block_thread.call_one(2.5), GUARD) == old
        assert procs.pids == [old] and sup.failure is None
        with pytest.raises(SupervisionError) as ei:
            await asyncio.wait_for(s.block_loop.call_one(60.0), GUARD)
        assert "hung" in ei.value.cause
        failure = await events.next("failure")
        assert "hung" in failure.cause and failure.pid == old
        await events.next("restart")
        assert procs.pids != [old]
    await events.aclose()


# ------------------------------- issue 15 item 13: __init__ in the actor's thread


class ThreadState(Actor):
    """Monarch's ``TLSActorFullSync``, and an inference actor that turns
    torch's (per-thread) gradient mode off in its constructor."""

    def __init__(self) -> None:
        import torch  # deferred: only these tests need torch

        torch.set_grad_enabled(False)
        self.local = threading.local()
        self.local.value = 0
        self.built_in = threading.current_thread().name

    @endpoint
    def increment(self) -> int:
        self.local.value += 1
        return cast(int, self.local.value)

    @endpoint
    def infer(self) -> tuple[str, str, bool, bool]:
        """(constructor's thread, this endpoint's, grad mode, whether a result
        of a computation on a tensor that requires grad requires grad)"""
        import torch

        y = torch.ones(2, requires_grad=True) * 2
        return (self.built_in, threading.current_thread().name, torch.is_grad_enabled(),
                y.requires_grad)

    @endpoint
    async def on_loop(self) -> bool:
        return threading.current_thread() is threading.main_thread()


async def test_constructor_runs_where_def_endpoints_run(procs: meshio.ProcMesh) -> None:
    """issue 15 item 13: ``__init__`` runs in the actor's thread, where its
    plain ``def`` endpoints run: a ``threading.local`` it sets is there, and
    ``torch.set_grad_enabled(False)`` applies to them; ``async def``
    endpoints run on the worker's loop (its main thread)."""
    pytest.importorskip("torch")
    actor = await asyncio.wait_for(procs.slice(procs=1).spawn("tls", ThreadState), GUARD)
    for expected in range(1, 5):
        assert await asyncio.wait_for(actor.increment.call_one(), GUARD) == expected
    assert await asyncio.wait_for(actor.infer.call_one(), GUARD) == (
        "meshio-actor tls[0]", "meshio-actor tls[0]", False, False)
    assert await asyncio.wait_for(actor.on_loop.call_one(), GUARD)


class HeldOnRestart(Actor):
    """Rebuilt after a restart, it holds at the gate in the folder ``gate``
    (its ``on_restart``); its cleanup says so through the FIFO ``cleaned``."""

    def __init__(self, gate: str, cleaned: str) -> None:
        self.gate, self.cleaned = gate, cleaned

    def on_restart(self) -> None:
        hold(os.path.join(self.gate, "ready"), os.path.join(self.gate, "release"))

    def __cleanup__(self, exc: BaseException | None) -> None:
        os.close(os.open(self.cleaned, os.O_WRONLY))  # (until the test reads)

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


async def test_an_actor_mesh_stopped_while_a_restart_rebuilds_it_stays_stopped(
        tmp_path: Path) -> None:
    """A supervisor rebuilds an actor in a restarted process; its mesh is
    stopped while the constructor runs.  The stop is answered within its
    bound (a constructor cannot be interrupted), and the actor, once built,
    is stopped (its cleanup runs) rather than taking calls: before, it came
    back serving after its mesh's stop had returned."""
    (tmp_path / "gate").mkdir()
    (tmp_path / "cleaned").mkdir()
    gate, cleaned = Gate(tmp_path / "gate"), Gate(tmp_path / "cleaned")
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, supervisor=sup) as procs:
        held = await procs.spawn("held", HeldOnRestart, str(tmp_path / "gate"), cleaned.ready)
        events = sup.events()
        os.kill(await asyncio.wait_for(held.pid.call_one(), GUARD), signal.SIGKILL)
        await gate.wait_held(GUARD)  # the replacement rebuilds it: its on_restart holds
        await asyncio.wait_for(held.stop(), GUARD)  # answered though the constructor runs
        await gate.open()
        await cleaned.wait_held(GUARD)  # built, then stopped: its cleanup ran
        with pytest.raises(SupervisionError, match="actor mesh 'held' was stopped"):
            await asyncio.wait_for(held.pid.call_one(), GUARD)
        kinds = []
        async for event in events:  # the restart counts as one; nothing failed after it
            kinds.append(event.kind)
            if event.kind == "restart":
                break
        assert kinds == ["failure", "restart"], kinds
        assert sup.failure is None
