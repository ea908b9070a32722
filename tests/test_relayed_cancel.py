"""A process that stops answering heartbeats (SIGSTOP) behind a relay of the
fan-out tree: the calls the relay carried to it fail as not responding, and
the relay cancels them there, as a direct caller does, so once the process
runs again they neither keep its actor busy nor hold the calls queued
behind them.  Hosts are agents on loopback (ProcessJob): real processes and
TCP connections."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from supervision_helpers import next_pong

import meshio
from busy_actor import Busy
from meshio.jobs import ProcessJob

GUARD = 30.0
#: short heartbeats: a stopped process is found not responding within seconds
BEATS = {"heartbeat_interval": 0.2, "heartbeat_timeout": 2.0}
#: calls queued behind the running one on each stopped process
QUEUED = 200


@dataclass(frozen=True)
class Case:
    hosts: int
    per_host: int
    view: dict[str, Any]  # the processes called, each behind a relay
    stopped: tuple[int, int]  # their ranks


CASES = {
    # a relay passes each call on to its host's other process (a Call)
    "host-relay": Case(2, 2, {"procs": 1}, (1, 3)),
    # the relay of hosts 0-1 passes the call of host 1 on to its process
    # (a Fanout, width 2); host 2's comes from the controller
    "tree-relay": Case(3, 1, {"hosts": slice(1, 3)}, (1, 2)),
}


@pytest.fixture(params=list(CASES.values()), ids=list(CASES))
async def case(request: pytest.FixtureRequest, tmp_path: Path,
               width: int) -> AsyncIterator[tuple[Case, Any]]:
    c: Case = request.param
    job = ProcessJob(meshes={"hosts": c.hosts}, cache_dir=tmp_path / ".meshio")
    try:
        state = await job.state()
        async with state.hosts.spawn_procs(per_host={"procs": c.per_host}, **BEATS) as procs:
            yield c, procs
    finally:
        await job.kill()


async def test_relayed_calls_failed_as_not_responding_are_cancelled_once_it_runs_again(
        case: tuple[Case, Any]) -> None:
    c, procs = case
    busy = await procs.spawn("busy", Busy)
    leaves = busy.slice(**c.view)
    pids = [procs.pids[rank] for rank in c.stopped]
    addrs = list((await leaves.addr.call()).values())
    running = asyncio.ensure_future(leaves.wait_long.call())
    await asyncio.wait_for(leaves.started.call(), GUARD)
    queued = [asyncio.ensure_future(leaves.record.call("queued")) for _ in range(QUEUED)]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        failed = await asyncio.wait_for(
            asyncio.gather(running, *queued, return_exceptions=True), GUARD)
        assert all(isinstance(e, meshio.SupervisionError) and "not responding for" in str(e)
                   for e in failed), {str(e) for e in failed}
        answered = [next_pong(addr) for addr in addrs]
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    await asyncio.wait_for(asyncio.gather(*answered), GUARD)
    # the call running on each actor was cancelled there, the queued ones
    # dropped (none ran) ...
    await asyncio.wait_for(leaves.was_cancelled.call(), GUARD)
    seen = await asyncio.wait_for(leaves.seen.call(), GUARD)
    assert list(seen.values()) == [["wait_long cancelled"]] * 2
    # ... and the actors serve new calls at once
    await asyncio.wait_for(leaves.record.call("next"), GUARD)
    seen = await asyncio.wait_for(leaves.seen.call(), GUARD)
    assert list(seen.values()) == [["wait_long cancelled", "next"]] * 2
