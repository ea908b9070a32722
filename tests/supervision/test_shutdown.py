"""Shutdown policies: how a supervisor's restarts and a proc mesh's stop
end healthy and stopped (SIGSTOP) workers.

The exit statuses come from ``meshio.testing.worker_processes``: the
runtime reaps its workers, and no public API reports how one exited.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from supervision_helpers import DEADLINE, Events, W, manual_sup

import meshio
from meshio.supervision import ShutdownPolicy
from meshio.testing import worker_processes


@pytest.mark.parametrize("policy", ["brutal_kill", 30.0])
async def test_shutdown_policy_of_strategy_restarts(policy: ShutdownPolicy) -> None:
    sup, _ = manual_sup("one_for_all")
    async with Events(sup) as events, \
            meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup,
                                           shutdown=policy) as procs:
        await procs.spawn("w", W, 1)
        old = worker_processes(procs)
        os.kill(old[1].pid, signal.SIGKILL)
        await events.next("restart", rank=1)
        # the healthy sibling: asked to exit (code 0) with a grace, killed if brutal
        expected = -signal.SIGKILL if policy == "brutal_kill" else 0
        assert old[0].returncode == expected
        assert old[1].returncode == -signal.SIGKILL


@pytest.mark.parametrize("policy", ["brutal_kill", 3.0])
async def test_shutdown_grace_then_kill_for_a_stopped_worker(policy: ShutdownPolicy) -> None:
    sup, _ = manual_sup()
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup,
                                                 shutdown=policy)
    try:
        await procs.spawn("w", W, 1)
        handles = worker_processes(procs)
        os.kill(handles[1].pid, signal.SIGSTOP)  # cannot honour a shutdown request
    finally:
        await asyncio.wait_for(procs.stop(), DEADLINE)
    assert handles[1].returncode == -signal.SIGKILL  # killed (after the grace, if any)
    assert handles[0].returncode == (-signal.SIGKILL if policy == "brutal_kill" else 0)
    assert sup.failure is None
