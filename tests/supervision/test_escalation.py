"""Escalation: failures beyond ``max_restarts`` within ``within`` (also
rebuilds that fail) make a supervisor give up and stop its children; a
parent supervisor restarts a child supervisor that gave up; an actor owning
a supervisor handles its escalation in ``__supervise__``."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
from pathlib import Path

import pytest
from supervision_helpers import DEADLINE, HOST, Events, W, check_event, manual_sup, supervised

import meshio
from meshio import Actor, endpoint
from meshio.jobs import ProcessJob
from meshio.supervision import ManualClock
from meshio.testing import child_pids, job_record


class Fragile(Actor):
    """Fails to construct while ``flag`` exists (e.g. only when rebuilt)."""

    def __init__(self, flag: str) -> None:
        if os.path.exists(flag):
            raise RuntimeError(f"refusing to start: {flag} exists")

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Doomed(Actor):
    """Its process exits while being rebuilt once ``flag`` exists."""

    def __init__(self, flag: str) -> None:
        if os.path.exists(flag):
            os._exit(1)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def refuse_replacements(flag: str, once: bool) -> None:
    """A bootstrap (pickled by reference) that raises in every process
    started while ``flag`` exists (with ``once``: removes it, so only the
    first such process fails)."""
    if os.path.exists(flag):
        if once:
            os.unlink(flag)
        raise RuntimeError(f"replacement refused: {flag} exists")


class Tidy(Actor):
    """Appends ``tag`` to the file ``log`` when stopped (``__cleanup__``):
    the lines say in which order its proc meshes were stopped."""

    def __init__(self, log: str, tag: str) -> None:
        self.log = log
        self.tag = tag

    def __cleanup__(self, exc: BaseException | None) -> None:
        with open(self.log, "a") as f:
            f.write(f"{self.tag}\n")


class Boss(Actor):
    """Owns a supervisor (created in an endpoint) over its own proc mesh;
    ``__supervise__`` handles the escalation on rank 0 only."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.hook_calls = 0
        self.seen: asyncio.Future[str] | None = None
        self.procs: meshio.ProcMesh | None = None

    def __supervise__(self, error: meshio.SupervisionError) -> bool:
        assert isinstance(error, meshio.SupervisionError)
        self.errors.append(str(error))
        if self.seen is not None and not self.seen.done():
            self.seen.set_result(str(error))
        return self.rank == 0

    @endpoint
    async def start(self) -> int:
        self.rank = meshio.current_rank().rank
        self.seen = asyncio.get_running_loop().create_future()

        def hook(error: meshio.SupervisionError) -> None:
            self.hook_calls += 1

        sup = meshio.Supervisor("one_for_one", max_restarts=0, within=60.0, name="inner",
                                clock=ManualClock(), on_escalate=hook)
        self.sup = sup
        self.procs = await meshio.this_host().spawn_procs(
            per_host={"procs": 1}, supervisor=sup, name="inner")
        self.w = await self.procs.spawn("w", W, 5)
        return await self.w.pid.call_one()

    @endpoint
    async def supervised(self) -> tuple[str, int, str]:
        assert self.seen is not None
        error = await asyncio.wait_for(asyncio.shield(self.seen), DEADLINE)
        failed = await asyncio.wait_for(self.sup.wait_failed(), DEADLINE)
        return (error, self.hook_calls, str(failed))

    @endpoint
    async def stop_inner(self) -> None:
        if self.procs is not None:
            await self.procs.stop()


async def test_constructor_failing_on_rebuild_counts_as_failure_and_escalates(
        tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    with pytest.raises(meshio.SupervisionError) as ei:
        async with supervised(max_restarts=2) as s:
            f = await s.procs.spawn("f", Fragile, str(flag))
            flag.touch()  # from now on every rebuild of Fragile fails
            os.kill(s.old[1], signal.SIGKILL)
            escalation = await s.events.next("escalation")
            failures = [e for e in s.events.seen if e.kind == "failure"]
            assert [e.rank for e in failures] == [1, 1, 1]
            assert "SIGKILL" in failures[0].cause
            for e in failures[1:]:
                assert e.cause.startswith("restart failed")
                assert f"refusing to start: {flag} exists" in e.cause
                # the constructor as spawn names it: the class's, not the mesh's ("f")
                assert "constructor Fragile.__init__" in e.cause, e.cause
            # each names the replacement it failed in (was pid -1)
            replacements = [e.pid for e in failures[1:]]
            assert all(pid > 0 for pid in replacements), failures
            assert len({s.old[1], *replacements}) == 3 and all(e.host for e in failures)
            assert not [e for e in s.events.seen if e.kind == "restart"]
            assert escalation.rank == -1 and escalation.cause.endswith(
                "after 2 restarts in the last 60.0s; max_restarts=2 within 60.0s allows no more")
            assert await asyncio.wait_for(s.sup.wait_failed(), DEADLINE) is s.sup.failure
            # the children were stopped: no live process, calls fail
            assert not set(s.procs.pids) & child_pids()
            with pytest.raises(meshio.SupervisionError):
                await asyncio.wait_for(f.pid.call(), DEADLINE)
    assert ei.value is s.sup.failure


async def test_an_owner_leaving_as_its_supervisor_gives_up_waits_for_every_exit() -> None:
    """The call that saw a process die fails as its supervisor gives up, and
    the owner's ``async with`` exits on that error while the supervisor's
    stop of its children is under way: the owner's stop waits for that one,
    so no process is left running (CI found rank 0 left, with its pidfd,
    pipes and socket, once a stop returned because another had begun)."""
    with pytest.raises(meshio.SupervisionError, match="SIGKILL"):
        async with supervised(max_restarts=0) as s:
            w = await s.procs.spawn("w", W, 0)
            pids = list(s.procs.pids)
            hung = asyncio.ensure_future(w.slice(procs=0).hang_on.call_one(0))
            os.kill(s.old[0], signal.SIGKILL)
            await asyncio.wait_for(hung, DEADLINE)
    assert s.sup.failure is not None
    assert not set(pids) & child_pids()


async def test_process_dying_during_its_rebuild_counts_once(tmp_path: Path) -> None:
    flag = tmp_path / "die"
    with pytest.raises(meshio.SupervisionError):
        async with supervised(max_restarts=2, within=60.0) as s:
            await s.procs.spawn("d", Doomed, str(flag))
            flag.touch()  # every rebuild now kills its own process
            os.kill(s.old[1], signal.SIGKILL)
            await s.events.next("escalation")
            failures = [e for e in s.events.seen if e.kind == "failure"]
            # one failure per dead process: the kill, then two rebuilds that died
            assert [e.cause for e in failures] == [
                "killed by signal SIGKILL", "exited with code 1", "exited with code 1"]
            assert len({e.pid for e in failures}) == 3


async def test_restarts_spread_beyond_within_do_not_escalate_but_a_storm_does(
        tmp_path: Path) -> None:
    escalated: list[meshio.SupervisionError] = []
    # a heartbeat interval longer than any advance: only the window moves
    sup, clock = manual_sup(max_restarts=2, within=10.0, heartbeat_interval=1000.0,
                            on_escalate=escalated.append)
    host = meshio.this_host()
    stops = tmp_path / "stops"
    async with Events(sup) as events:
        with pytest.raises(meshio.SupervisionError) as ei:
            async with host.spawn_procs(per_host={"procs": 2}, supervisor=sup, name="a") as a, \
                    host.spawn_procs(per_host={"procs": 1}, supervisor=sup, name="b") as b:
                w = await a.spawn("w", W, 1)
                await b.spawn("w", W, 2)
                await a.spawn("t", Tidy, str(stops), "a")
                await b.spawn("t", Tidy, str(stops), "b")

                # five restarts, each more than `within` after the previous: no escalation
                for _ in range(5):
                    pid = a.pids[0]
                    os.kill(pid, signal.SIGKILL)
                    ev = await events.next("restart", rank=0)
                    assert ev.pid != pid
                    clock.advance(11.0)
                assert sup.failure is None and not escalated
                assert len([e for e in events.seen if e.kind == "restart"]) == 5

                # three failures within the window: the third would need a third restart
                del events.seen[:]
                for n in range(3):
                    pids = a.pids
                    os.kill(pids[n % 2], signal.SIGKILL)
                    ev = await events.until(lambda e: e.kind in ("restart", "escalation"))
                    assert ev.kind == ("escalation" if n == 2 else "restart")
                    clock.advance(1.0)
                check_event(ev, "escalation", "supervisor", -1)
                assert ev.cause == (
                    "proc mesh 'a' rank 0 failed (killed by signal SIGKILL) after 2 restarts "
                    "in the last 10.0s; max_restarts=2 within 10.0s allows no more")
                failed = await asyncio.wait_for(sup.wait_failed(), DEADLINE)
                assert failed is sup.failure and escalated == [failed]
                assert isinstance(failed, meshio.SupervisionError)
                assert failed.host == HOST  # where the last failure happened
                # children stopped in reverse declaration order (a's rank 0 is
                # dead: one line each), every process gone
                assert stops.read_text().split() == ["b", "a"]
                assert not set(a.pids + b.pids) & child_pids()
                with pytest.raises(meshio.SupervisionError):
                    await asyncio.wait_for(w.pid.call(), DEADLINE)
        assert ei.value is sup.failure  # the `async with` block raised it on exit


async def test_giving_up_stops_children_in_reverse_declaration_order_with_events(
        tmp_path: Path) -> None:
    """Children start in declaration order (a one_for_all restart) and, when
    the supervisor gives up, stop in reverse order: one ``"stopped"`` event
    per process it takes down, as its mesh is down, then the escalation."""
    sup, _ = manual_sup("one_for_all", max_restarts=1)
    host = meshio.this_host()
    stops = tmp_path / "stops"
    async with Events(sup) as events:
        with pytest.raises(meshio.SupervisionError) as ei:
            async with host.spawn_procs(per_host={"procs": 2}, supervisor=sup, name="a") as a, \
                    host.spawn_procs(per_host={"procs": 1}, supervisor=sup, name="b") as b, \
                    host.spawn_procs(per_host={"procs": 1}, supervisor=sup, name="c") as c:
                for mesh, tag in ((a, "a"), (b, "b"), (c, "c")):
                    await mesh.spawn("t", Tidy, str(stops), tag)
                os.kill(a.pids[0], signal.SIGKILL)
                await events.next("restart", mesh="c")
                assert events.kinds() == [
                    ("failure", "a", 0), ("stopped", "c", 0), ("stopped", "b", 0),
                    ("stopped", "a", 1), ("restart", "a", 0), ("restart", "a", 1),
                    ("restart", "b", 0), ("restart", "c", 0)]
                stops.unlink()

                # the second failure exceeds the intensity: b's rank 0 is dead,
                # the others are stopped (c, then a), then the escalation
                del events.seen[:]
                up = {"a": a.pids, "c": c.pids}
                os.kill(b.pids[0], signal.SIGKILL)
                await events.next("escalation")
                assert events.kinds() == [
                    ("failure", "b", 0), ("stopped", "c", 0), ("stopped", "a", 1),
                    ("stopped", "a", 0), ("escalation", "supervisor", -1)]
                for ev in events.seen[1:-1]:
                    check_event(ev, "stopped", ev.mesh, ev.rank)
                    assert ev.cause == "supervisor 'supervisor' gave up"
                    assert (ev.pid, ev.host) == (up[ev.mesh][ev.rank], HOST)
                # really stopped in that order: c was down before a's stop began
                assert stops.read_text().split() == ["c", "a", "a"]
                assert not set(a.pids + b.pids + c.pids) & child_pids()
        assert ei.value is sup.failure


async def test_nested_supervisor_escalates_to_parent_which_restarts_it() -> None:
    clock = ManualClock()
    root = meshio.Supervisor("one_for_one", max_restarts=1, within=60.0, name="root",
                             clock=clock)
    child = meshio.Supervisor("one_for_one", max_restarts=0, within=60.0, name="child",
                              parent=root, clock=clock)
    async with Events(root) as root_events, Events(child) as child_events:
        with pytest.raises(meshio.SupervisionError) as ei:
            async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=child,
                                                      name="inner") as procs:
                w = await procs.spawn("w", W, 3)
                old = procs.pids
                os.kill(old[0], signal.SIGKILL)
                esc = await child_events.next("escalation")
                assert esc.cause.endswith("after 0 restarts in the last 60.0s; max_restarts=0 "
                                          "within 60.0s allows no more")
                failure = await root_events.next("failure")
                check_event(failure, "failure", "child", -1)
                restart = await root_events.next("restart")
                check_event(restart, "restart", "child", -1)
                new = procs.pids
                assert not set(new) & set(old)
                assert child.failure is None and root.failure is None
                assert [i[:5] for i in (await w.info.call()).values()] == [
                    (3, "", 0, 0, 1), (3, "", 1, 1, 1)]

                # the restarted child still detects failures; a second escalation
                # exceeds the root's intensity: the root gives up
                os.kill(new[1], signal.SIGKILL)
                await child_events.next("escalation")
                root_esc = await root_events.next("escalation")
                assert root_esc.cause.startswith("child supervisor 'child' failed (")
                assert root_esc.cause.endswith("after 1 restart in the last 60.0s; "
                                               "max_restarts=1 within 60.0s allows no more")
                assert await asyncio.wait_for(root.wait_failed(), DEADLINE) is root.failure
                assert not set(procs.pids) & child_pids()
        assert ei.value is root.failure


async def test_supervise_hook_of_owning_actor_handles_escalation() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, name="bosses") as procs:
        boss = await procs.spawn("boss", Boss)
        inner = (await asyncio.wait_for(boss.start.call(), DEADLINE)).values()
        assert len(set(inner)) == 2 and not set(inner) & set(procs.pids)
        for pid in inner:
            os.kill(pid, signal.SIGKILL)
        results = (await asyncio.wait_for(boss.supervised.call(), DEADLINE)).values()
        for rank, (error, hook_calls, failed) in enumerate(results):
            assert "supervisor 'inner' gave up" in error and "SIGKILL" in error
            assert error == failed
            # __supervise__ returning True (rank 0) stops the escalation there
            assert hook_calls == (0 if rank == 0 else 1)
        await boss.stop_inner.call()


async def test_replacement_failing_to_start_counts_is_retried_and_escalates(
        tmp_path: Path) -> None:
    """A replacement whose bootstrap raises is one more failure: retried while
    the intensity allows, then the supervisor gives up; nothing waits forever,
    and ``procs.ready()`` says the supervisor gave up."""
    flag = tmp_path / "flag"
    sup, _ = manual_sup(max_restarts=2)
    with pytest.raises(meshio.SupervisionError) as ei:
        async with Events(sup) as events, meshio.this_host().spawn_procs(
                per_host={"procs": 2}, supervisor=sup,
                bootstrap=functools.partial(refuse_replacements, str(flag), False)) as procs:
            w = await procs.spawn("w", W, 1)
            old = procs.pids
            flag.touch()  # from now on no new process starts
            os.kill(old[1], signal.SIGKILL)
            await events.next("failure", rank=1)
            # a retryable call waits for the restart: it fails once there is none
            retried = asyncio.ensure_future(w.slice(procs=1).ident.call_one(5))
            try:
                escalation = await events.next("escalation")
                with pytest.raises(meshio.SupervisionError):
                    await asyncio.wait_for(retried, DEADLINE)
            finally:
                retried.cancel()
                await asyncio.gather(retried, return_exceptions=True)
            failures = [e for e in events.seen if e.kind == "failure"]
            assert [e.rank for e in failures] == [1, 1, 1]
            assert failures[0].cause == "killed by signal SIGKILL" and failures[0].pid == old[1]
            for e in failures[1:]:  # each names the replacement that did not start
                assert e.cause.startswith("restart failed: ProcessStartError: proc mesh 'procs'"
                                          f": worker rank 1 (pid {e.pid} on {HOST}) failed to "
                                          "start: ")
                assert "replacement refused" in e.cause and e.host == HOST
            assert len({e.pid for e in failures}) == 3
            assert not [e for e in events.seen if e.kind == "restart"]
            assert escalation.cause.endswith(
                "after 2 restarts in the last 60.0s; max_restarts=2 within 60.0s allows no more")
            assert await asyncio.wait_for(sup.wait_failed(), DEADLINE) is sup.failure
            assert not set(procs.pids) & child_pids()
            with pytest.raises(meshio.SupervisionError):
                await asyncio.wait_for(procs.ready(), DEADLINE)
            # rank 1, whose replacement never started (it said only "proc mesh
            # 'procs' was stopped")
            with pytest.raises(meshio.SupervisionError, match=r"^proc mesh 'procs' was stopped "
                               r"after its supervisor gave up \(proc mesh 'procs' rank 1 "
                               r"failed \(restart failed: ") as ready:
                await asyncio.wait_for(procs.slice(procs=1).ready(), DEADLINE)
            assert ready.value.cause == "supervisor gave up"
    assert ei.value is sup.failure


async def test_replacement_failing_to_start_once_is_retried(tmp_path: Path) -> None:
    """The first replacement does not start, the second does: two failures,
    one restart, and the mesh serves again."""
    flag = tmp_path / "flag"
    sup, _ = manual_sup(max_restarts=2)
    async with Events(sup) as events, meshio.this_host().spawn_procs(
            per_host={"procs": 2}, supervisor=sup,
            bootstrap=functools.partial(refuse_replacements, str(flag), True)) as procs:
        w = await procs.spawn("w", W, 1)
        old = procs.pids
        flag.touch()
        os.kill(old[1], signal.SIGKILL)
        restart = await events.next("restart", rank=1)
        assert [(e.kind, e.rank) for e in events.seen] == [
            ("failure", 1), ("failure", 1), ("restart", 1)]
        assert events.seen[1].cause.startswith("restart failed: ProcessStartError: ")
        assert len({old[1], events.seen[1].pid, restart.pid}) == 3
        await asyncio.wait_for(procs.ready(), DEADLINE)
        assert procs.pids == [old[0], restart.pid]
        assert (await w.pid.call()).values() == [old[0], restart.pid]
        assert sup.failure is None


async def test_replacement_its_host_agent_never_comes_back_fails_once_and_escalates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host agent SIGKILLed takes its worker with it, and no agent comes
    back: the restart waits for one (dialling it again, no failure counted
    meanwhile) up to the start timeout, then fails once, naming the agent's
    address and how long it waited; that is one more failure, and the
    supervisor gives up instead of waiting forever."""
    monkeypatch.setattr(meshio._proc_state, "START_TIMEOUT", 3.0)
    job = ProcessJob(meshes={"trainers": 1}, cache_dir=tmp_path / ".meshio")
    try:
        state = await job.state()
        assert job_record(job) is not None
        [(agent, addr)] = [(a["pid"], a["addr"]) for agents in job_record(job)["hosts"].values()
                           for a in agents]
        sup, _ = manual_sup(max_restarts=1)
        with pytest.raises(meshio.SupervisionError) as ei:
            async with Events(sup) as events, \
                    state.trainers.spawn_procs(supervisor=sup) as procs:
                await procs.spawn("w", W, 1)
                os.kill(agent, signal.SIGKILL)
                await events.next("escalation")
                failures = [e for e in events.seen if e.kind == "failure"]
                assert len(failures) == 2
                cause = failures[1].cause
                assert cause.startswith("restart failed: ProcessStartError: proc mesh 'procs': "
                                        "worker rank 0 on 127.0.0.1 failed to start: its host "
                                        "agent could not be reached for ")
                assert f"(a restart waits up to 3 s for it): cannot reach host agent {addr} " \
                    in cause
                waited = failures[1].timestamp - failures[0].timestamp
                assert 3.0 - 2 * meshio._proc_state.AGENT_RETRY <= waited < 3.0 + 5.0
                with pytest.raises(meshio.SupervisionError):
                    await asyncio.wait_for(procs.ready(), DEADLINE)
        assert ei.value is sup.failure
    finally:
        await job.kill()
