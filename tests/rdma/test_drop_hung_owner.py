"""``RDMABuffer.drop()`` while the owner's process is stopped (SIGSTOP).

``drop()`` returns only once the owner released the buffer or its process
is gone (a supervisor kills a hung one); an owner alive but not answering
is an error — ``CallTimeout`` within ``options(timeout=...)``, or the
``SupervisionError`` "not responding" heartbeats give first — never a
silent success while the buffer stays registered."""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import time

import pytest
from supervision_helpers import supervised, until

import meshio
import meshio._transport._runtime
from meshio import RDMABuffer
from meshio.rdma import RDMAError
from meshio.testing import child_pids, wait_exited
from rdma_actors import Owner, Peer
from test_procs_lifecycle import next_pong

#: guard on a wait that should end long before it (a regression fails, not hangs)
GUARD = 45.0
#: a timeout longer than the heartbeats' verdict (3 s, the default), which comes first
LONG = 30.0

pytestmark = pytest.mark.filterwarnings("ignore::meshio.RDMAFallbackWarning")


async def _drop(buf: RDMABuffer, timeout: float | None) -> None:
    await asyncio.wait_for(buf.drop() if timeout is None else buf.options(timeout=timeout).drop(),
                           GUARD)


@pytest.mark.parametrize("timeout", [None, LONG], ids=["no-timeout", "timeout-30s"])
async def test_drop_on_a_stopped_owner_raises_and_takes_effect_when_it_resumes(
        pair: tuple[Owner, Peer], backend: str, timeout: float | None) -> None:
    owner, _ = pair
    buf = await owner.register.call_one(backend)
    assert buf.backend == backend
    pid = await owner.pid.call_one()
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(meshio.SupervisionError) as ei:
            await _drop(buf, timeout)
        took = time.monotonic() - t0
        err = ei.value
        assert err.cause.startswith("not responding for "), err
        assert err.pid == pid and not isinstance(err, TimeoutError)
        assert f"drop() of buffer {buf.handle.buf}" in str(err)
        assert f"pid {pid}" in str(err) and "stays registered" in str(err)
        assert "while RDMA drop was in flight" in str(err)
        assert timeout is None or took < timeout  # the verdict, not the timeout
        assert pid in child_pids()  # alive: nothing killed it (no supervisor)
        # Found not responding: a drop now is not sent, and fails at once (no hang).
        with pytest.raises(meshio.SupervisionError, match="was not sent") as again:
            await _drop(buf, timeout)
        assert again.value.cause.startswith("not responding for ")
        answered = next_pong(buf.handle.owner)
    finally:
        os.kill(pid, signal.SIGCONT)
    # Its pong follows the drop on the one connection: the drop was served.
    await asyncio.wait_for(answered, GUARD)
    with pytest.raises(RDMAError, match="dropped"):
        await asyncio.wait_for(buf.read_into(bytearray(8), length=8), GUARD)
    await _drop(buf, timeout)  # answered now: released already, so nothing to do


async def test_drop_on_a_stopped_owner_times_out_before_the_verdict(
        pair: tuple[Owner, Peer], backend: str) -> None:
    owner, _ = pair
    buf = (await owner.register.call_one(backend)).options(timeout=0.5)
    pid = await owner.pid.call_one()
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(meshio.CallTimeout, match=r"drop on buffer \d+: .* within 0\.5s"):
            await asyncio.wait_for(buf.drop(), GUARD)
        answered = next_pong(buf.handle.owner)
    finally:
        os.kill(pid, signal.SIGCONT)
    await asyncio.wait_for(answered, GUARD)
    with pytest.raises(RDMAError, match="dropped"):  # the request took effect on resuming
        await asyncio.wait_for(buf.read_into(bytearray(8), length=8), GUARD)


async def test_drop_from_an_actor_on_a_stopped_owner_raises(pair: tuple[Owner, Peer]) -> None:
    """A holder in another worker is told the owner is not responding (by
    the controller) and fails the same way."""
    owner, peer = pair
    buf = await owner.register.call_one("same_host")
    pid = await owner.pid.call_one()
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(meshio.ActorError) as ei:
            await asyncio.wait_for(peer.drop.call_one(buf), GUARD)
        assert ei.value.remote_type.endswith("SupervisionError"), ei.value
        assert "not responding for" in ei.value.remote_message
        assert "stays registered" in ei.value.remote_message
        answered = next_pong(buf.handle.owner)
    finally:
        os.kill(pid, signal.SIGCONT)
    await asyncio.wait_for(answered, GUARD)
    await asyncio.wait_for(peer.drop.call_one(buf), GUARD)  # it answers: released
    with pytest.raises(RDMAError, match="dropped"):
        await asyncio.wait_for(buf.read_into(bytearray(8), length=8), GUARD)


async def test_drop_returns_once_a_supervisor_killed_the_hung_owner(backend: str) -> None:
    """With a supervisor a hung owner is killed (and replaced): its
    registrations went with it, so ``drop()`` returns normally — after the
    kill, not before."""
    async with supervised(n=1, heartbeat_interval=1.0) as s:  # manual clock; 3 s hang limit
        owner = await s.procs.spawn("owner", Owner)
        buf = await owner.register.call_one(backend)
        pid = s.old[0]
        clock = s.clock
        await until(lambda: clock.sleepers == 1)  # the heartbeat loop waits on the clock
        fd = os.pidfd_open(pid)
        os.kill(pid, signal.SIGSTOP)
        dropping = asyncio.ensure_future(buf.drop())
        # whether the owner had exited when drop() ended (its pidfd readable)
        exited_then: list[bool] = []
        dropping.add_done_callback(
            lambda _: exited_then.append(bool(select.select([fd], [], [], 0)[0])))
        killed = asyncio.ensure_future(wait_exited(fd, GUARD))
        try:
            for _ in range(10):  # a heartbeat round per tick: the verdict comes at the 4th
                if killed.done():
                    break
                clock.advance(1.0)
                await until(lambda: clock.sleepers == 1 or killed.done())
            await asyncio.wait_for(killed, GUARD)  # gone for good, not only signalled
            await asyncio.wait_for(dropping, GUARD)  # normally: it took the buffer along
            assert exited_then == [True], "drop() returned while its owner was alive"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            for task in (dropping, killed):
                task.cancel()
            await asyncio.gather(dropping, killed, return_exceptions=True)
            os.close(fd)
        failure, _ = await s.restarted(0)
        assert "hung" in failure.cause
        with pytest.raises(RDMAError):
            await asyncio.wait_for(buf.read_into(bytearray(8), length=8), GUARD)
