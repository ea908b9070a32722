"""Large values between processes of one host (issue 16 items 1, 2): they
travel as descriptors and move by one cross-memory-attach copy into the
receiver's pool (``_transport/_bulk.py``, ``_transport/_pool.py``).  Correctness only, no timing."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch

import meshio
from fifo_gate import Gate, hold
from meshio import Actor, endpoint
from meshio._transport import _bulk, _pool
from meshio.jobs import ProcessJob
from script_run import run_script

MiB = 1 << 20
GUARD = 60.0


@dataclasses.dataclass
class Batch:
    name: str
    weights: torch.Tensor
    raw: bytes


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Store(Actor):
    def __init__(self) -> None:
        self.kept: Any = None
        self.log: list[int] = []

    @endpoint
    async def echo(self, value: Any) -> Any:
        return value

    @endpoint
    async def tensor(self, t: torch.Tensor) -> torch.Tensor:
        return t

    @endpoint
    async def raw(self, b: bytes) -> bytes:
        return b

    @endpoint
    async def batch(self, b: Batch) -> Batch:
        return b

    @endpoint
    async def keep(self, value: Any) -> None:
        self.kept = value

    @endpoint(retry=meshio.Retry())
    async def keep_again(self, value: Any) -> None:  # (may run twice: same result)
        self.kept = value

    @endpoint
    async def kept_sum(self) -> float:
        return float(torch.as_tensor(self.kept).double().sum())

    @endpoint
    async def weights(self) -> torch.Tensor:
        return self.kept  # type: ignore[no-any-return]

    @endpoint
    async def bump(self) -> None:
        self.kept += 1  # in place: the caller's copy must not change

    @endpoint
    async def bump_and_tell(self, fifo: str) -> None:
        """:meth:`bump`, then a byte into the named pipe ``fifo``."""
        self.kept += 1
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, b"b")
        finally:
            os.close(fd)

    @endpoint
    async def record(self, i: int, payload: Any = None) -> None:
        self.log.append(i)

    @endpoint
    async def recorded(self) -> list[int]:
        return self.log

    @endpoint
    async def pool(self) -> tuple[int, int]:
        """Idle bytes of this process's receive pool, after dropping what it kept."""
        self.kept = None
        with _pool._pool.lock:
            pass
        return _pool._pool.idle_bytes + sum(b.size for b in _pool._pool.returned), _fds()

    @endpoint
    async def usage(self) -> tuple[int, int]:
        return _rss(), _fds()


async def test_every_type_round_trips_by_descriptor(procs: meshio.ProcMesh) -> None:
    """Tensors, NumPy arrays, bytes, bytearray, memoryview, str, nested in
    containers and dataclasses, views at offsets and non-contiguous tensors
    come back equal and of their type, as arguments and as results; the
    receiver's pool served them."""
    s = (await procs.spawn("store", Store)).slice(procs=0)
    raw = os.urandom(3 * MiB)
    t = torch.randn(MiB)  # 4 MiB
    base = torch.arange(4 * MiB, dtype=torch.int32)
    values: list[Any] = [
        t, np.arange(MiB, dtype=np.float64), raw, bytearray(raw), "a" * (2 * MiB),
        "é" * MiB, [t, {"k": raw}], (raw, 1),
        base[MiB + 3:],  # a view at an offset
        base.reshape(1024, -1).t(),  # not contiguous
        np.arange(4 * MiB, dtype=np.int16)[::2],  # strided
    ]
    for v in values:
        back = await asyncio.wait_for(s.echo.call_one(v), GUARD)
        assert type(back) is type(v)
        if isinstance(v, torch.Tensor):
            assert torch.equal(back, v)
        elif isinstance(v, np.ndarray):
            arr, want = cast("tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]", (back, v))
            assert arr.tobytes() == want.tobytes() and arr.shape == want.shape
        elif isinstance(v, list):
            assert torch.equal(back[0], t) and back[1] == {"k": raw}
        else:
            assert back == v
    view = memoryview(raw)[5:2 * MiB + 5]
    got = await s.echo.call_one(view)
    assert type(got) is memoryview and got == view
    assert torch.equal(await s.tensor.call_one(t[1:]), t[1:])
    assert await s.raw.call_one(raw) == raw
    b = await s.batch.call_one(Batch("b", t, raw))
    assert b.name == "b" and torch.equal(b.weights, t) and b.raw == raw
    idle, _ = await s.pool.call_one()
    assert idle >= t.nbytes  # tensors landed in the pool and went back to it


async def test_values_are_copies(procs: meshio.ProcMesh) -> None:
    """The receiver keeps a value after the sender changed and freed its
    own; a result the actor changes in place afterwards is not the caller's."""
    s = (await procs.spawn("store", Store)).slice(procs=0)
    mine = torch.ones(2 * MiB)
    await s.keep.call_one(mine)
    mine.zero_()
    del mine
    assert await s.kept_sum.call_one() == 2 * MiB
    got = await s.weights.call_one()
    await s.bump.call_one()
    assert float(got.sum()) == 2 * MiB
    assert await s.kept_sum.call_one() == 2 * 2 * MiB


async def _result_outlives_next_call(store: Store, tmp_path: Path) -> None:
    """The actor's next call (which changes the tensor it returned, in
    place) runs only once the caller has its result.  The caller's loop is
    held up meanwhile, so an actor that went on at once would have bumped
    the tensor before it was read."""
    await store.keep.call_one(torch.zeros(4 * MiB))
    fifo = str(tmp_path / "bumped")
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        got = store.weights.call_one()  # both sent now, in this order
        bumped = store.bump_and_tell.call_one(fifo)
        # the loop is held here (the result cannot be read yet) until the
        # actor says it bumped, which it must not do before the caller has it
        assert select.select([fd], [], [], 3.0)[0] == []
        assert float((await asyncio.wait_for(got, GUARD)).abs().sum()) == 0.0
        await asyncio.wait_for(bumped, GUARD)
    finally:
        os.close(fd)
    assert await store.kept_sum.call_one() == 4 * MiB


async def test_a_large_result_outlives_the_actor_s_next_call(
        procs: meshio.ProcMesh, tmp_path: Path) -> None:
    """On this host the caller copies the result from the actor's memory."""
    store = (await procs.spawn("store", Store)).slice(procs=0)
    await _result_outlives_next_call(cast(Store, store), tmp_path)


async def test_a_large_result_over_tcp_outlives_the_actor_s_next_call(tmp_path: Path) -> None:
    """Across hosts the result is written in slices from the actor's memory
    as the connection drains."""
    job = ProcessJob(meshes={"hosts": 1}, cache_dir=tmp_path / ".meshio")
    try:
        state = await job.state()
        async with state.hosts.spawn_procs(per_host={"procs": 1}) as pm:
            store = (await pm.spawn("store", Store)).slice(procs=0)
            await _result_outlives_next_call(cast(Store, store), tmp_path)
    finally:
        await job.kill()


async def test_a_broadcast_value_changed_at_once_reaches_no_actor(
        procs: meshio.ProcMesh) -> None:
    """Nobody waits for a broadcast's delivery: changing a large argument in
    place right after it does not change what the actors get."""
    s = (await procs.spawn("store", Store)).slice(procs=0)
    mine = torch.zeros(2 * MiB)
    s.keep.broadcast(mine)
    mine += 1
    assert await s.kept_sum.call_one() == 0.0


class Rollouts(Actor):
    """Streams rollouts into a port, each made in the one buffer it reuses
    (filled with the rollout's number), and broadcasts one to a peer: what
    the receivers get must be what each held when it was sent."""

    @endpoint
    def stream(self, port: meshio.Port[torch.Tensor], n: int, count: int) -> None:
        buf = torch.empty(n)
        for i in range(count):
            buf.fill_(float(i))
            port.send(buf)  # (from the actor's thread: the loop writes it later)
        buf.fill_(-1.0)
        port.close()

    @endpoint
    async def stream_async(self, port: meshio.Port[torch.Tensor], n: int, count: int) -> None:
        buf = torch.empty(n)
        for i in range(count):
            buf.fill_(float(i))
            port.send(buf)
        buf.fill_(-1.0)
        port.close()

    @endpoint
    async def tell(self, peer: Store, n: int) -> float:
        """Broadcast a buffer to ``peer`` (a process this one has no
        connection to yet: the frame waits for it), change it, and ask the
        sum ``peer`` kept (after the broadcast: one connection, in order)."""
        buf = torch.zeros(n)
        peer.keep.broadcast(buf)
        buf += 1
        return await peer.kept_sum.call_one()


def rollout_numbers(values: list[torch.Tensor]) -> list[float | str]:
    return [float(t[0]) if bool((t == t[0]).all()) else "torn" for t in values]


@pytest.mark.parametrize("mib", [0, 2], ids=["4KiB", "2MiB"])
@pytest.mark.parametrize("ep", ["stream", "stream_async"])
async def test_a_port_sends_what_the_value_held_at_the_send(
        procs: meshio.ProcMesh, ep: str, mib: int) -> None:
    """A buffer reused for the next rollout right after ``port.send`` (fire
    and forget) reached the receiver with the later contents, or torn."""
    r = (await procs.spawn("r", Rollouts)).slice(procs=0)
    n = mib * MiB // 4 or 1024
    port, receiver = meshio.Channel[torch.Tensor].open()
    call = getattr(r, ep).call_one(port, n, 8)
    got = [t async for t in receiver]
    await asyncio.wait_for(call, GUARD)
    assert rollout_numbers(got) == [float(i) for i in range(8)]


@pytest.mark.parametrize("mib", [0, 2], ids=["4KiB", "2MiB"])
async def test_a_broadcast_waiting_for_its_connection_sends_what_it_held(
        procs: meshio.ProcMesh, mib: int) -> None:
    """A broadcast from an actor to a process it had no connection to yet:
    a small buffer changed right after it reached the peer changed."""
    r = (await procs.spawn("r", Rollouts)).slice(procs=0)
    s = (await procs.spawn("store", Store)).slice(procs=1)
    assert await asyncio.wait_for(r.tell.call_one(s, mib * MiB // 4 or 1024),
                                  GUARD) == 0.0


class Blocker(Actor):
    @endpoint
    async def block(self, ready: str, release: str) -> None:
        """Block this process's event loop (at a FIFO gate)."""
        hold(ready, release)


@pytest.mark.parametrize("how", ["cancel", "timeout", "cancel call", "timeout call",
                                 "cancel retried call", "timeout retried call",
                                 "cancel timed", "cancel timed call", "timeout stream"])
async def test_a_call_given_up_ends_once_its_arguments_are_read(
        procs: meshio.ProcMesh, tmp_path: Path, how: str) -> None:
    """A call given up (cancelled, or its timeout passed; ``call_one``,
    ``call``, ``call`` of a retried endpoint, ``stream``) while its large
    argument is still to be read from the caller's memory ends only once it
    is read: the caller may change the argument then, and the actor, if it
    runs the call, has the value as it was (before, the await ended at once
    and the actor could get the changed or a torn value).  The receiver's
    loop is held at a FIFO gate (by another actor there): it reads nothing
    until the gate opens."""
    store = cast(Store, (await procs.spawn("store", Store)).slice(procs=0))
    blocker = (await procs.spawn("blocker", Blocker)).slice(procs=0)
    await store.keep.call_one(torch.zeros(1))
    gate = Gate(tmp_path)
    blocking = asyncio.ensure_future(blocker.block.call_one(gate.ready, gate.release))
    await gate.wait_held(GUARD)
    mine = torch.ones(4 * MiB)
    ep = store.keep_again if "retried" in how else store.keep
    if how.startswith("timeout"):
        ep = ep.options(timeout=0.05)
    elif "timed" in how:  # (cancelled before its deadline)
        ep = ep.options(timeout=GUARD)
    if how.endswith("stream"):
        call = asyncio.ensure_future(_drain(ep.stream(mine)))
    else:
        call = asyncio.ensure_future(ep.call(mine) if how.endswith("call") else ep.call_one(mine))
    if how.startswith("cancel"):
        call.cancel()
    done, _ = await asyncio.wait([call], timeout=1.0)  # (its timeout is 0.05 s)
    assert not done, "the call ended while its argument was still to be read"
    await gate.open()
    await asyncio.wait_for(blocking, GUARD)
    with pytest.raises((asyncio.CancelledError, meshio.CallTimeout)):
        await asyncio.wait_for(call, GUARD)
    mine += 1
    assert await store.kept_sum.call_one() in (0.0, 4 * MiB)  # not run, or run on ones


async def _drain(stream: AsyncIterator[Any]) -> None:
    async for _ in stream:
        pass


async def test_fifo_after_a_large_value(procs: meshio.ProcMesh) -> None:
    """A small call sent after a large one to the same actor does not
    overtake it while the large one is copied off the loop."""
    s = (await procs.spawn("store", Store)).slice(procs=0)
    big = torch.ones(16 * MiB)
    calls = [s.record.call_one(i, big if i % 3 == 0 else None) for i in range(12)]
    await asyncio.wait_for(asyncio.gather(*calls), GUARD)
    assert await s.recorded.call_one() == list(range(12))


async def test_many_concurrent_large_calls(procs: meshio.ProcMesh) -> None:
    s = await procs.spawn("store", Store)
    tensors = [torch.full((MiB,), float(i)) for i in range(16)]
    results = await asyncio.wait_for(asyncio.gather(
        *(s.slice(procs=i % 2).tensor.call_one(t) for i, t in enumerate(tensors))), GUARD)
    for t, r in zip(tensors, results, strict=True):
        assert torch.equal(t, r)


async def test_no_growth_over_many_large_calls(procs: meshio.ProcMesh) -> None:
    """1,000 large calls leave memory and file descriptors as they were, on
    both sides, and nothing in /dev/shm."""
    s = (await procs.spawn("store", Store)).slice(procs=0)
    shm = set(os.listdir("/dev/shm"))
    t = torch.ones(2 * MiB)
    for _ in range(50):
        await s.tensor.call_one(t)
    rss, fds = await s.usage.call_one()
    my_rss, my_fds = _rss(), _fds()
    for _ in range(1000):
        await s.tensor.call_one(t)
    rss2, fds2 = await s.usage.call_one()
    assert fds2 == fds and _fds() == my_fds
    assert rss2 - rss < 16 * MiB, (rss, rss2)
    assert _rss() - my_rss < 16 * MiB
    assert set(os.listdir("/dev/shm")) <= shm


def test_the_pool_keeps_the_blocks_given_back_last() -> None:
    """Idle pool blocks are capped (``IDLE_CAP``): a block given back that
    does not fit beside the idle ones takes the place of the oldest, so
    values of a new size (a 1 GiB tensor after 256 MiB ones) land in mapped
    memory from the second on, instead of each mapping (and faulting in)
    new memory."""
    pool = _pool._Pool()
    quarter = pool.view(_pool.IDLE_CAP // 4)
    older = _pool._block_of(quarter)
    del quarter
    whole = pool.view(_pool.IDLE_CAP)  # (the quarter idle meanwhile)
    block = _pool._block_of(whole)
    del whole
    again = pool.view(_pool.IDLE_CAP)
    assert _pool._block_of(again) is block
    assert older is not None and older.map.closed  # (it made room)


def test_idle_blocks_are_unmapped_once_no_value_took_them() -> None:
    """A block given back waits ``IDLE_KEEP`` seconds for the next value,
    then is unmapped (``trim``): a burst of large values leaves nothing
    mapped (before, up to ``IDLE_CAP`` stayed for good)."""
    pool = _pool._Pool()
    view = pool.view(_pool.THRESHOLD)
    block = _pool._block_of(view)
    assert block is not None
    del view
    pool.trim()
    assert not block.map.closed and pool.idle_bytes == block.size  # kept for a while
    pool.trim(time.monotonic() + _pool.IDLE_KEEP)
    assert block.map.closed and pool.idle_bytes == 0 and not pool.idle


def test_a_runtime_trims_the_pool(tmp_path: Path) -> None:
    """The controller's runtime trims its receive pool as it runs: a 64
    MiB result, dropped, is unmapped without another value coming (here
    after 0.2 s, ``IDLE_KEEP`` set so before the runtime starts)."""
    out = run_script(tmp_path, """
        import asyncio
        import meshio
        from meshio import Actor, endpoint
        from meshio._transport import _pool

        class Big(Actor):
            @endpoint
            async def make(self) -> memoryview:
                return memoryview(bytearray(64 << 20))

        def pooled() -> int:
            with _pool._pool.lock:
                return _pool._pool.idle_bytes + sum(b.size for b in _pool._pool.returned)

        async def main() -> None:
            async with meshio.this_host().spawn_procs() as procs:
                big = await procs.spawn("big", Big)
                view = await big.make.call_one()  # (it aliases a block of the pool)
                print("received", view.nbytes, "pooled before the drop", pooled())
                del view
                await asyncio.sleep(0)  # (the step that took the result holds its future)
                print("pooled after it", pooled() >= 64 << 20)
                async with asyncio.timeout(30):
                    while pooled():
                        await asyncio.sleep(0.05)  # (the trim is timed: nothing to wait on)
                print("pooled at last", pooled())

        _pool.IDLE_KEEP = 0.2
        asyncio.run(main())
        """)
    assert out == [f"received {64 << 20} pooled before the drop 0", "pooled after it True",
                   "pooled at last 0"]


def test_a_write_into_a_killed_receiver_fails_cleanly() -> None:
    """The one copy into a process that died is an error (``ESRCH``), which
    the sender turns into a dropped connection, never a hang."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    src = bytearray(16)
    with pytest.raises(OSError) as e:
        _bulk.cma("write", child.pid, _bulk.address_of(memoryview(src)), 4096, 16)
    assert e.value.errno == errno.ESRCH


def stalled_writes() -> None:
    """A bootstrap: this process's writes of large values into another say
    they began and never end (held at the :class:`fifo_gate.Gate` in
    ``BULK_TEST_GATE``, which the test never opens: the process can only be
    killed)."""
    folder = os.environ["BULK_TEST_GATE"]

    def stalled(*args: Any) -> None:
        hold(os.path.join(folder, "ready"), os.path.join(folder, "release"))

    _bulk.cma = stalled


async def test_a_worker_killed_while_writing_a_result(tmp_path: Path) -> None:
    """A worker SIGKILLed while it writes a large result into the controller:
    the call fails with a SupervisionError naming the lost process (the
    controller drops the frame it held memory for), and the controller's
    other meshes are served as before."""
    gate = Gate(tmp_path)
    async with meshio.this_host().spawn_procs(
            per_host={"procs": 1}, env={"BULK_TEST_GATE": str(tmp_path)},
            bootstrap=stalled_writes) as writer, \
            meshio.this_host().spawn_procs(per_host={"procs": 1}) as healthy:
        s = (await writer.spawn("store", Store)).slice(procs=0)
        await s.keep.call_one(torch.ones(4 * MiB))
        call = asyncio.ensure_future(s.weights.call_one())
        await gate.wait_held(GUARD)  # the write is under way
        os.kill(writer.pids[0], signal.SIGKILL)
        with pytest.raises(meshio.SupervisionError, match=r"Store\.weights"):
            await asyncio.wait_for(call, GUARD)
        h = (await healthy.spawn("store", Store)).slice(procs=0)
        assert torch.equal(await h.echo.call_one(torch.ones(2 * MiB)), torch.ones(2 * MiB))


_KILL = r"""
import asyncio, os, signal, sys
import torch, meshio
from meshio import Actor, endpoint

class Slow(Actor):
    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def take(self, t: torch.Tensor) -> int:
        return t.numel()

async def main() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        s = await procs.spawn("slow", Slow)
        pid = await s.pid.call_one()
        print(pid, flush=True)
        os.kill(pid, signal.SIGSTOP)  # the receiver never reads
        call = asyncio.ensure_future(s.take.call_one(torch.ones(64 << 20)))
        await asyncio.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)  # the controller dies mid-transfer

asyncio.run(main())
"""


def test_controller_killed_mid_transfer_leaves_nothing(tmp_path: Any) -> None:
    """A controller SIGKILLed while a stopped worker has a 256 MiB value to
    copy: the worker dies with it and nothing is left in /dev/shm."""
    shm = set(os.listdir("/dev/shm"))
    script = tmp_path / "kill.py"
    script.write_text(_KILL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=GUARD, stdin=subprocess.DEVNULL)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    worker = int(proc.stdout.split()[0])
    try:
        fd = os.pidfd_open(worker)
    except ProcessLookupError:
        fd = -1  # gone already
    if fd >= 0:
        try:
            poll = select.poll()
            poll.register(fd, select.POLLIN)
            if not poll.poll(GUARD * 1000):  # readable once the worker exited
                os.kill(worker, signal.SIGKILL)
                pytest.fail(f"worker {worker} outlived its controller")
        finally:
            os.close(fd)
    assert set(os.listdir("/dev/shm")) <= shm
