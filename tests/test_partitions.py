"""issue 18 item 9: partitions have a policy.  A host cut off (its veth
down, tests/netns_hosts.py) longer than ``partition_timeout`` is downed:
its processes count as failed (cause ``"partitioned"``) and its agent,
which has not heard the controller as long, kills them itself; after the
heal exactly one incarnation of the rank answers.  A shorter partition
downs nothing.

Real processes in network namespaces, real host agents.  Nothing sleeps
to wait for an event: tests wait on supervision events, monitors, pidfds
and replies, each under a guard; the one sleep holds a partition open for
a chosen time.
"""

from __future__ import annotations

import asyncio
import math
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

import meshio
from meshio import Supervisor
from meshio.jobs._job import write_secret
from netns_hosts import Host, netns_hosts, requires_netns
from test_netns import (
    DEADLINE,
    INTERVAL,
    TIMEOUT,
    Watch,
    Where,
    attach,
    fails_promptly,
    wait_pid_gone,
)

pytestmark = pytest.mark.filterwarnings("ignore::meshio.RDMAFallbackWarning")

#: the partition_timeout of the tests that cut a host for good
PARTITION = 2.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[list[Host], Path]]:
    """Two namespace hosts, an agent on each, and the job secret's file."""
    secret = tmp_path / "job.secret"
    write_secret(secret, secrets.token_bytes(32))
    with netns_hosts(2, secret) as hosts:
        yield hosts, secret


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@requires_netns
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("heartbeat_timeout", "partition_timeout", "cause"), [
    (10 * DEADLINE, PARTITION, "partitioned"),  # heartbeats too slow to judge: the downing
    (TIMEOUT, 3 * PARTITION, "hung"),  # the usual setting: heartbeats first
], ids=["downed", "hung-then-downed"])
async def test_a_cut_off_process_is_fenced_and_its_supervisor_restarts_the_rank_once(
        cluster: tuple[list[Host], Path], heartbeat_timeout: float, partition_timeout: float,
        cause: str) -> None:
    """The cut-off process fails (downed: cause "partitioned"; or hung,
    heartbeats being faster), and so does its call in flight; its own agent
    kills it at partition_timeout while the host is still cut off (the
    supervisor's kill cannot reach it, and its replacement waits until the
    old process is known dead); after the heal the replacement is the one
    process answering for the rank."""
    hosts, secret_file = cluster
    sup = Supervisor(heartbeat_interval=INTERVAL, heartbeat_timeout=heartbeat_timeout,
                     max_restarts=1)
    watch = Watch(sup)
    try:
        async with attach(hosts, secret_file).spawn_procs(
                supervisor=sup, shutdown="brutal_kill",
                partition_timeout=partition_timeout) as procs:
            w = await procs.spawn("w", Where)
            (pid0, addr0), (pid1, addr1) = (await w.where.call()).values()
            hosts[1].partition()
            try:
                stuck = asyncio.ensure_future(w.slice(hosts=1).where.call_one())
                failure = await watch.next("failure")
                assert failure.cause.startswith(cause)
                assert failure.pid == pid1 and failure.host == hosts[1].addr
                error, _ = await fails_promptly(stuck)
                assert error.cause == failure.cause and error.host == hosts[1].addr
                assert error.pid == pid1
                if cause == "partitioned":
                    assert f"partition_timeout={partition_timeout:g} s" in str(error)
                await wait_pid_gone(pid1)  # its agent fenced it: the host is still cut off
            finally:
                hosts[1].heal()
            restart = await watch.next("restart")
            assert restart.host == hosts[1].addr and restart.pid != pid1
            found = (await asyncio.wait_for(w.where.call(), DEADLINE)).values()
            assert found == [(pid0, addr0), (restart.pid, addr1)]
            assert not alive(pid1)
            assert [e.kind for e in watch.seen] == ["failure", "restart"]
    finally:
        await watch.aclose()


@requires_netns
@pytest.mark.timeout(120)
async def test_a_downed_host_without_a_supervisor_leaves_a_hole(
        cluster: tuple[list[Host], Path]) -> None:
    hosts, secret_file = cluster
    """No supervisor: not responding after the heartbeat timeout, downed
    after partition_timeout (a monitor and wait_failed say "partitioned",
    calls fail naming the host), its process killed by its agent before the
    heal; after the heal procs.replace fills the hole with one new process."""
    async with attach(hosts, secret_file).spawn_procs(
            heartbeat_interval=INTERVAL, heartbeat_timeout=TIMEOUT,
            partition_timeout=PARTITION) as procs:
        w = await procs.spawn("w", Where)
        (pid0, addr0), (pid1, addr1) = (await w.where.call()).values()
        async with meshio.monitor(w) as m:
            hosts[1].partition()
            try:
                down = await asyncio.wait_for(anext(m), DEADLINE)
                assert (down.rank, down.cause, down.pid, down.host) \
                    == (1, "partitioned", pid1, hosts[1].addr)
                failure = await asyncio.wait_for(procs.wait_failed(), DEADLINE)
                assert failure.cause == "partitioned" and failure.rank == 1
                error, took = await fails_promptly(w.slice(hosts=1).echo.call_one(1))
                assert error.cause == "partitioned" and error.host == hosts[1].addr
                assert "procs.replace(1)" in str(error) and took < 5.0
                await wait_pid_gone(pid1)  # fenced by its agent while cut off
                assert await w.slice(hosts=0).echo.call_one(2) == 2  # the other host serves
            finally:
                hosts[1].heal()
        assert [p.rank for p in procs.holes] == [1]
        await asyncio.wait_for(procs.replace(1), DEADLINE)
        found = (await asyncio.wait_for(w.where.call(), DEADLINE)).values()
        assert found[0] == (pid0, addr0)
        assert found[1][0] != pid1 and found[1][1] == addr1 and not alive(pid1)


@requires_netns
@pytest.mark.timeout(120)
async def test_actors_calling_a_downed_host_are_told(cluster: tuple[list[Host], Path]) -> None:
    """An actor's call in flight to a process on a host that is then downed
    fails (its connection there would never close: the host is cut off),
    and its next calls there fail at once, naming the partition; once
    procs.replace fills the hole after the heal, they go through again.
    (Heartbeats too slow to judge: the downing is what it learns.)"""
    hosts, secret_file = cluster
    async with attach(hosts, secret_file).spawn_procs(
            heartbeat_interval=INTERVAL, heartbeat_timeout=10 * DEADLINE,
            partition_timeout=PARTITION) as procs:
        w = await procs.spawn("w", Where)
        here, there = w.slice(hosts=0), w.slice(hosts=1)
        (_, addr1), = (await there.where.call()).values()
        assert await here.ask.call_one(there, 1) == [(1, addr1)]  # connected to it
        hosts[1].partition()
        try:
            stuck = asyncio.ensure_future(here.ask_hang.call_one(there))
            failure = await asyncio.wait_for(procs.wait_failed(), DEADLINE)
            assert failure.cause == "partitioned" and failure.rank == 1
            for call in (stuck, here.ask.call_one(there, 2)):
                with pytest.raises(meshio.ActorError) as ei:
                    await asyncio.wait_for(call, DEADLINE)
                assert ei.value.remote_type == "meshio.SupervisionError"
                assert f"is down (partitioned: its host {hosts[1].addr} was unreachable" \
                    in str(ei.value)
        finally:
            hosts[1].heal()
        await asyncio.wait_for(procs.replace(1), DEADLINE)
        assert await asyncio.wait_for(here.ask.call_one(there, 3), DEADLINE) == [(3, addr1)]


@requires_netns
@pytest.mark.timeout(120)
async def test_a_partition_healed_before_partition_timeout_downs_nothing(
        cluster: tuple[list[Host], Path]) -> None:
    hosts, secret_file = cluster
    """A cut of a few beats, well under partition_timeout: nothing is downed
    or fenced, the call made during the cut is answered after the heal by
    the same process, and every pid is the same."""
    async with attach(hosts, secret_file).spawn_procs(
            heartbeat_interval=INTERVAL, heartbeat_timeout=10 * DEADLINE,
            partition_timeout=20.0) as procs:
        w = await procs.spawn("w", Where)
        before = (await w.where.call()).values()
        hosts[1].partition()
        try:
            during = asyncio.ensure_future(w.slice(hosts=1).where.call_one())
            await asyncio.sleep(2.0)  # how long the cut lasts (two agent beats missed)
            assert not during.done()  # it is cut off indeed
        finally:
            hosts[1].heal()
        assert await asyncio.wait_for(during, DEADLINE) == before[1]
        assert (await asyncio.wait_for(w.where.call(), DEADLINE)).values() == before
        assert all(alive(pid) for pid, _ in before)


@requires_netns
@pytest.mark.timeout(120)
async def test_a_cut_off_relay_holds_the_calls_behind_it_until_found_silent(
        tmp_path: Path, restore_limits: None) -> None:
    """Three hosts, fan-out width 2: host 0's first process relays the calls
    for host 1 (the tree is the proc mesh's: a slice without host 0 too).
    Cut host 0 off: a call to hosts 1-2 made before heartbeats find the
    relay silent times out, naming the late actors by their ranks and by
    their points in the slice called (not mixing the two).  Once found (a
    call in flight to host 0 fails, saying so), the calls in flight through
    it fail as lost with it (their own processes did not fail), and the
    tree goes round it: hosts 1-2 answer."""
    meshio.set_limits(fanout_width=2)
    secret_file = tmp_path / "job.secret"
    write_secret(secret_file, secrets.token_bytes(32))
    with netns_hosts(3, secret_file) as hosts:
        async with attach(hosts, secret_file).spawn_procs(
                per_host={"procs": 2}, heartbeat_interval=INTERVAL,
                heartbeat_timeout=4 * TIMEOUT, partition_timeout=DEADLINE) as procs:
            w = await procs.spawn("w", Where)
            assert (await w.echo.call(1)).values() == [1] * 6
            rest = w.slice(hosts=slice(1, 3))
            hosts[0].partition()
            try:
                stuck = asyncio.ensure_future(w.slice(hosts=0).echo.call(0))
                with pytest.raises(meshio.CallTimeout) as ei:
                    await rest.echo.options(timeout=TIMEOUT).call(2)
                assert ei.value.ranks == (2, 3)
                assert ("from rank(s) [2, 3] of the mesh as spawned, at {'hosts': 0, "
                        "'procs': 0}, {'hosts': 0, 'procs': 1} in the view called") \
                    in str(ei.value)
                through = asyncio.ensure_future(rest.echo.call(4))  # (no timeout)
                error, _ = await fails_promptly(stuck)
                assert error.cause.startswith("not responding") and error.host == hosts[0].addr
                lost, _ = await fails_promptly(through)  # with the relay, as theirs was not
                assert sorted(getattr(e, "rank", -1) for _, e in lost.failures) == [2, 3]
                assert lost.cause == "lost with its fan-out relay"
                assert f"on {hosts[0].addr}: not responding" in str(lost)
                assert (await asyncio.wait_for(rest.echo.call(3), DEADLINE)).values() == [3] * 4
            finally:
                hosts[0].heal()


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, True, "60"])
async def test_partition_timeout_is_checked(bad: object) -> None:
    """A partition_timeout that is not seconds > 0 is refused before anything
    starts: one that is no number with a TypeError, one out of range with a
    ValueError."""
    error = TypeError if isinstance(bad, (bool, str)) else ValueError
    with pytest.raises(error, match=r"spawn_procs\(partition_timeout=\.\.\.\) must be"):
        meshio.this_host().spawn_procs(partition_timeout=bad)  # type: ignore[arg-type]
