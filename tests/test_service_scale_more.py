"""``meshio.Service.scale``: every call a shrink's drain timeout cuts off
says so, whichever adverb made it, and ``scale`` aims at replicas that
serve: replicas gone for good (a SIGKILLed process with no supervisor)
are replaced, not counted, and a shrink removes the replicas that do not
serve first.

Nothing sleeps to wait: calls in flight are seen through a port, deaths
through ``wait_failed`` and the supervisor's events, a restart held in a
FIFO gate, processes gone through their pidfd; every wait is under a
generous guard.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from supervision_helpers import DEADLINE, Events, manual_sup

import meshio
from fifo_gate import Gate, hold
from gone import wait_gone
from meshio import Actor, Channel, Port, endpoint


class Hung(Actor):
    @endpoint
    async def whoami(self) -> int:
        return os.getpid()

    @endpoint(concurrent=True)
    async def hang(self, started: Port[int]) -> int:
        """Says it started (its pid), then never answers."""
        started.send(os.getpid())
        await asyncio.Event().wait()
        return 0


async def alive_pids(svc: Hung) -> list[int]:
    return (await asyncio.wait_for(svc.whoami.call(), DEADLINE)).values()


# ------------------------------------------------------------ drain timeout


@pytest.mark.parametrize("timeout", [None, DEADLINE])
async def test_a_chosen_call_cut_off_by_the_drain_timeout_says_so(
        procs: meshio.ProcMesh, timeout: float | None) -> None:
    """A call made with ``choose`` (with or without a timeout of its own)
    to the replica a shrink removes, still in flight when its drain
    timeout passes, fails with the same SupervisionError as a routed one:
    it names the replica, ``scale()`` and the drain timeout, with
    ``cause="drain timeout"``.  (Before, only ``route`` said so; ``choose``
    raised the bare "stopped while handling" error.)"""
    gens = await procs.spawn("gens", Hung)
    svc = meshio.Service(gens.slice(procs=0))
    await asyncio.wait_for(svc.scale(replicas=2), DEADLINE)
    port, started = Channel[int].open()
    hang = svc.hang.options(timeout=timeout)
    calls = [hang.choose(port), hang.choose(port)]  # least loaded: one on each replica
    pids = {await asyncio.wait_for(started.recv(), DEADLINE) for _ in calls}
    (added,) = pids - {procs.pids[0]}

    await asyncio.wait_for(svc.scale(replicas=1, drain_timeout=0.2), DEADLINE)
    with pytest.raises(meshio.SupervisionError,
                       match=r"to replica 1 had no answer when scale\(\) removed that replica "
                             r"and its drain_timeout=0\.2s passed") as ei:
        await asyncio.wait_for(calls[1], DEADLINE)
    assert ei.value.cause == "drain timeout"
    assert ei.value.actor == "gens"
    await wait_gone([added], DEADLINE)
    assert not calls[0].done()  # (replica 0 serves on)
    calls[0].cancel()


# ------------------------------------------------------ replicas gone for good


async def killed_for_good(procs: meshio.ProcMesh, rank: int) -> None:
    """SIGKILL rank ``rank`` of ``procs`` (no supervisor): return once the
    controller knows nothing restarts it."""
    os.kill(procs.pids[rank], signal.SIGKILL)
    failure = await asyncio.wait_for(procs.slice(procs=rank).wait_failed(), DEADLINE)
    assert failure.rank == rank


async def test_scale_replaces_replicas_gone_for_good(procs: meshio.ProcMesh) -> None:
    """With no supervisor, a replica whose process was SIGKILLed never
    serves again; ``scale(replicas=2)`` counts only the one that serves,
    starts a new replica, and drops the dead one.  (Before, it counted the
    dead replica and did nothing: one replica served.)"""
    svc = meshio.Service(await procs.spawn("gens", Hung))
    p0, _ = procs.pids
    await killed_for_good(procs, 1)
    assert [(s.replica, s.alive) for s in svc.stats()] == [(0, True), (1, False)]

    await asyncio.wait_for(svc.scale(replicas=2), DEADLINE)
    assert [(s.replica, s.alive) for s in svc.stats()] == [(0, True), (2, True)]
    p0_again, new = await alive_pids(svc)
    assert p0_again == p0 and new not in procs.pids
    await asyncio.wait_for(svc.stop(), DEADLINE)
    await wait_gone([new], DEADLINE)


async def test_a_shrink_keeps_the_replicas_that_serve(procs: meshio.ProcMesh) -> None:
    """``scale(replicas=1)`` with replica 0 dead for good removes it and
    keeps replica 1, which serves.  (Before, it removed replica 1, the
    last, and left the service with only the dead one: every call failed.)"""
    svc = meshio.Service(await procs.spawn("gens", Hung))
    _, p1 = procs.pids
    await killed_for_good(procs, 0)

    await asyncio.wait_for(svc.scale(replicas=1), DEADLINE)
    assert [(s.replica, s.alive) for s in svc.stats()] == [(1, True)]
    assert await asyncio.wait_for(svc.whoami.route(), DEADLINE) == p1


# ------------------------------------------------- a replica being restarted


def restart_gate() -> None:
    """Every process runs this first: one started while the test holds the
    gate (a supervisor's replacement) waits here, so its replica stays down."""
    gate = Path(os.environ["SVC_GATE"])
    if (gate / "armed").exists():
        hold(str(gate / "ready"), str(gate / "release"))


async def test_a_replica_being_restarted_counts_and_leaves_first(tmp_path: Path) -> None:
    """A replica whose supervisor is restarting it will serve again: scale
    counts it (``scale(replicas=2)`` starts nothing), and a shrink removes
    it before a replica that serves.  (Before, the shrink removed the last
    replica, which served, and kept the one down.)"""
    sup, _ = manual_sup()
    gate = Gate(tmp_path)
    async with meshio.this_host().spawn_procs(
            per_host={"procs": 2}, supervisor=sup, env={"SVC_GATE": str(tmp_path)},
            bootstrap=restart_gate) as procs, Events(sup) as events:
        svc = meshio.Service(await procs.spawn("gens", Hung))
        p0, p1 = procs.pids
        (tmp_path / "armed").touch()
        os.kill(p0, signal.SIGKILL)
        await events.next("failure", rank=0)
        await gate.wait_held(DEADLINE)
        assert [(s.replica, s.alive) for s in svc.stats()] == [(0, False), (1, True)]

        await asyncio.wait_for(svc.scale(replicas=2), DEADLINE)
        assert [(s.replica, s.alive) for s in svc.stats()] == [(0, False), (1, True)]

        await asyncio.wait_for(svc.scale(replicas=1), DEADLINE)
        assert [(s.replica, s.alive) for s in svc.stats()] == [(1, True)]
        (tmp_path / "armed").unlink()
        await gate.open()
        await events.next("restart", rank=0)  # (its actor stopped: not rebuilt, not back)
        assert [(s.replica, s.alive) for s in svc.stats()] == [(1, True)]
        assert await asyncio.wait_for(svc.whoami.route(), DEADLINE) == p1
