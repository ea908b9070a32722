"""Large values against heartbeats (issue 15 item 5): a value accepted under
the message size limit must not make its receiver look hung.

The heavy test runs a controller script under ``meshio.run`` (uvloop, as a
user's program runs) in a process of its own, so its memory is given back
when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import meshio
from meshio import Actor, endpoint
from meshio.jobs import ProcessJob
from test_large_frames import _tls

#: the script's own bound on the call; the test's bound on the script
DEADLINE = 240
#: bound on a call in the tests that are not heavy
GUARD = 60.0

_SCRIPT = r"""
import asyncio, json, os, resource, sys, time
from typing import Any
import meshio
from meshio import Actor, endpoint

class Text(Actor):
    @endpoint
    async def length(self, data: str) -> int:
        return len(data)

    @endpoint
    async def peak(self) -> int:  # this process's peak RSS, bytes
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

class Other(Actor):
    @endpoint
    async def pid(self) -> int:
        return os.getpid()

class Prober(Actor):  # calls another actor back to back, over a connection of its own

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.task: asyncio.Task[None] | None = None

    @endpoint
    async def start(self, target: Any) -> None:
        await target.pid.call_one()
        self.task = asyncio.ensure_future(self._probe(target))

    async def _probe(self, target: Any) -> None:
        while True:
            t0 = time.monotonic()
            await target.pid.call_one()
            self.waits.append(time.monotonic() - t0)

    @endpoint
    async def finish(self) -> tuple[int, float]:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        return len(self.waits), max(self.waits, default=-1.0)

async def main(n: int, deadline: float) -> None:
    data = "x" * n  # built before any process runs: it blocks this loop for seconds
    sup = meshio.Supervisor("one_for_one")  # real clock: heartbeats every 1 s, 3 s timeout
    seen = []

    async def watch() -> None:
        async for ev in sup.events():
            seen.append(f"{ev.kind} rank {ev.rank}: {ev.cause}")

    watcher = asyncio.ensure_future(watch())
    try:
        async with meshio.this_host().spawn_procs(per_host={"procs": 2},
                                                  supervisor=sup) as procs:
            pids = procs.pids
            text = (await procs.spawn("text", Text)).slice(procs=0)
            other = (await procs.spawn("other", Other)).slice(procs=0)
            prober = (await procs.spawn("prober", Prober)).slice(procs=1)
            # rank 1 calls rank 0's other actor while rank 0 takes the value in
            await prober.start.call_one(other)
            length = await asyncio.wait_for(text.length.call_one(data), deadline)
            answers, slowest = await prober.finish.call_one()
            del data
            after = await text.length.call_one("abc")  # the actor serves on
            peak = await text.peak.call_one()
            print(json.dumps({"length": length, "after": after, "peak": peak,
                              "answers": answers,
                              "slowest": slowest, "events": seen,
                              "pids": [pids, procs.pids]}))
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)

meshio.run(main(int(sys.argv[1]), float(sys.argv[2])))
"""


@pytest.mark.heavy
@pytest.mark.timeout(2 * DEADLINE)
def test_2gib_str_argument_under_a_supervisor(tmp_path: Path) -> None:
    """issue 15 item 5: a 2 GiB ``str`` argument reaches an actor under a
    supervisor (real heartbeats: 1 s interval, 3 s timeout): the call
    succeeds, no heartbeat failure or restart happens, and another actor of
    the same process answers calls from another process while the value
    arrives and is decoded.  The receiver holds one copy of the value (it is
    received into the str itself): two copies in all, the caller's included."""
    script = tmp_path / "big_str.py"
    script.write_text(_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    n = 2 << 30
    proc = subprocess.run([sys.executable, str(script), str(n), str(DEADLINE)], env=env,
                          capture_output=True, text=True, timeout=DEADLINE + 60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["length"] == n and got["after"] == 3
    assert got["events"] == [], got["events"]  # nothing failed, nothing was restarted
    assert got["pids"][0] == got["pids"][1]  # the same processes throughout
    # the receiver's loop answered the other caller all along: never as slow
    # as a missed heartbeat
    assert got["answers"] >= 1 and got["slowest"] < 3.0, got
    assert got["peak"] < n + n // 2, got  # one copy, and the process's own few MiB


# ------------------------------------------------ a slow copy, deterministic

#: how long a copy of a large value takes in the tests below: many heartbeat
#: timeouts (a slow machine, or a copy of GiBs into fresh memory)
SLOW_COPY = 1.5
#: heartbeats every 0.1 s, judged after 0.3 s of silence
FAST_BEATS = {"heartbeat_interval": 0.1, "heartbeat_timeout": 0.3}


def slow_copies() -> None:
    """A bootstrap (pickled by reference), also called in the test's own
    process: every large value this process writes into another takes
    :data:`SLOW_COPY` seconds more (in the copy thread, as a slow copy does)."""
    import time

    from meshio._transport import _bulk

    copy = _bulk.cma

    def slow(*args: Any) -> None:
        time.sleep(SLOW_COPY)
        copy(*args)

    _bulk.cma = slow


def slow_reads() -> None:
    """A bootstrap (pickled by reference): this process reads what comes in
    at 16 MiB/s, 64 KiB at a time, as a worker on a crowded core, or behind
    a slow link, does.  Its sockets' receive buffers are bounded: the
    sender sees data move only as its kernel takes it, and what the
    kernel already holds for us (loopback grows a receive buffer up to
    ``tcp_rmem``'s 32 MiB here, two seconds at this speed) is invisible to
    it; a real slow link holds far less."""
    import socket
    import time

    from meshio._transport import _connection

    made = _connection.Connection.connection_made
    get_buffer = _connection.Connection.get_buffer
    update = _connection.Connection.buffer_updated

    def bounded(self: Any, transport: Any) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 << 10)
        made(self, transport)

    def small(self: Any, sizehint: int) -> memoryview:
        return get_buffer(self, sizehint)[:64 << 10]

    def slow(self: Any, nbytes: int) -> None:
        time.sleep(nbytes / (16 << 20))
        update(self, nbytes)

    _connection.Connection.connection_made = bounded  # type: ignore[method-assign]
    _connection.Connection.get_buffer = small  # type: ignore[method-assign]
    _connection.Connection.buffer_updated = slow  # type: ignore[method-assign]


class Keeper(Actor):
    @endpoint
    async def length(self, data: bytes) -> int:
        return len(data)

    @endpoint
    async def make(self, n: int) -> bytes:
        return b"r" * n

    @endpoint
    async def text(self, data: str) -> int:
        return len(data)


async def test_heartbeats_pass_while_an_argument_is_copied(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller writing a large argument into a worker (sending it
    nothing else meanwhile, so that frames keep their order) still pings it,
    and the worker answers: the supervisor does not take the slow copy for
    a hang."""
    from meshio._transport import _bulk

    monkeypatch.setattr(_bulk, "cma", _bulk.cma)  # undone after the test
    slow_copies()
    sup = meshio.Supervisor("one_for_one", **FAST_BEATS)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, supervisor=sup) as procs:
        keeper = (await procs.spawn("keeper", Keeper)).slice(procs=0)
        pids = procs.pids
        n = 16 << 20
        assert await asyncio.wait_for(keeper.length.call_one(b"a" * n), GUARD) == n
        assert procs.pids == pids  # not killed and replaced


async def test_heartbeats_pass_while_a_result_is_copied() -> None:
    """A worker writing a large result into the controller (sending it
    nothing else meanwhile) answers its heartbeats all the same: the
    controller does not judge it hung."""
    sup = meshio.Supervisor("one_for_one", **FAST_BEATS)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, supervisor=sup,
                                              bootstrap=slow_copies) as procs:
        keeper = (await procs.spawn("keeper", Keeper)).slice(procs=0)
        pids = procs.pids
        n = 16 << 20
        assert len(await asyncio.wait_for(keeper.make.call_one(n), GUARD)) == n
        assert procs.pids == pids


@pytest.mark.parametrize("path", ["unix", "tcp", "tls"])
async def test_heartbeats_pass_while_a_long_frame_streams(path: str, tmp_path: Path) -> None:
    """A large value that travels in the stream (a ``str`` on this host;
    any value to another host, here over loopback TCP, plain or TLS) to a
    worker that reads slowly takes many heartbeat timeouts; our ping waits
    behind it, but the data moving proves the worker alive: no restart."""
    sup = meshio.Supervisor("one_for_one", **FAST_BEATS)
    n = 40 << 20  # 2.5 s: 8 heartbeat timeouts
    async with contextlib.AsyncExitStack() as stack:
        if path == "unix":
            host = meshio.this_host()
        else:
            job = ProcessJob(meshes={"hosts": 1}, cache_dir=tmp_path / ".meshio",
                             tls=_tls(tmp_path) if path == "tls" else None)
            stack.push_async_callback(job.kill)
            host = (await job.state()).hosts
        procs = await stack.enter_async_context(host.spawn_procs(
            per_host={"procs": 1}, supervisor=sup, bootstrap=slow_reads))
        keeper = (await procs.spawn("keeper", Keeper)).slice(procs=0)
        pids = procs.pids
        call = keeper.text.call_one("t" * n) if path == "unix" else keeper.length.call_one(
            b"t" * n)
        assert await asyncio.wait_for(call, GUARD) == n
        assert procs.pids == pids


@pytest.mark.parametrize("how", ["deadline", "cancel"])
async def test_a_call_given_up_on_a_receiver_that_never_reads_ends(
        how: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A call with a large argument given up (its deadline passed, or
    cancelled) while the worker it calls is stopped (SIGSTOP, no
    supervisor: nothing declares it dead) and so never reads the argument
    ends once ``LEND_TIMEOUT`` has passed, with a warning, instead of
    waiting for the read for ever; the worker, continued, serves on."""
    from meshio._transport import _tasks
    monkeypatch.setattr(_tasks, "LEND_TIMEOUT", 1.0)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        keeper = (await procs.spawn("keeper", Keeper)).slice(procs=0)
        n = 4 << 20
        assert await keeper.length.call_one(b"a" * n) == n
        os.kill(procs.pids[0], signal.SIGSTOP)
        try:
            if how == "deadline":
                with pytest.raises(meshio.CallTimeout):
                    await asyncio.wait_for(
                        keeper.length.options(timeout=0.5).call_one(b"b" * n), GUARD)
            else:
                call = asyncio.ensure_future(keeper.length.call_one(b"c" * n))
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await asyncio.wait_for(call, GUARD)
        finally:
            os.kill(procs.pids[0], signal.SIGCONT)
        assert "still being read by the process it called after 1 s" in caplog.text
        assert await asyncio.wait_for(keeper.length.call_one(b"d" * n), GUARD) == n


@pytest.mark.parametrize("kind", ["bytes", "str"])
async def test_a_receiver_that_never_reads(kind: str) -> None:
    """A worker stopped (SIGSTOP) before a large argument reaches it never
    reads it (a ``bytes`` value: never asks for it; a ``str``, in the
    stream: fills the socket): the call fails with a typed error once the
    worker misses its heartbeats, instead of waiting forever; the other
    worker takes large values all along; the stopped one's replacement
    takes them too."""
    # (beats less fast than FAST_BEATS: the replacement must start and
    # answer in time on a crowded core, or the supervisor gives up on it)
    sup = meshio.Supervisor("one_for_one", heartbeat_interval=0.2, heartbeat_timeout=1.0)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        keepers = await procs.spawn("keeper", Keeper)
        stopped, other = keepers.slice(procs=0), keepers.slice(procs=1)
        n = 16 << 20

        def send(to: Any) -> Any:
            return to.length.call_one(b"a" * n) if kind == "bytes" else to.text.call_one("a" * n)

        assert await send(stopped) == n
        old = procs.pids[0]
        os.kill(old, signal.SIGSTOP)
        call = asyncio.ensure_future(send(stopped))
        assert await asyncio.wait_for(send(other), GUARD) == n
        with pytest.raises(meshio.SupervisionError, match=r"hung.*Keeper\.(length|text)"):
            await asyncio.wait_for(call, GUARD)

        async def restarted() -> None:
            async for event in sup.events():
                assert event.kind in ("failure", "restart"), event
                if event.kind == "restart":
                    return

        await asyncio.wait_for(restarted(), GUARD)
        assert procs.pids[0] != old
        assert await asyncio.wait_for(send(stopped), GUARD) == n
