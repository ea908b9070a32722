"""issue 17 §3: ``await job.resize("workers", hosts=n)`` on a running job.
The named host mesh grows or shrinks in place and the proc meshes spawned
on it with ``elastic=True`` follow it (new hosts get their processes and
actors; removed hosts' processes are stopped first); other proc meshes keep
their shape.  ProcessJob: host agents as real processes on loopback."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from supervision_helpers import Events

import meshio
from fifo_gate import Gate
from gone import wait_gone
from lock_holder import lock_held
from meshio import Actor, context, endpoint
from meshio.jobs import JobCacheError, LocalJob, ProcessJob
from meshio.testing import job_record

DEADLINE = 60.0


class Where(Actor):
    def __init__(self, tag: str) -> None:
        self.tag = tag

    @endpoint
    async def where(self) -> tuple[int, int, str, dict[str, int]]:
        """(pid, the agent that started this process, the tag, the mesh's
        shape as this actor sees it)."""
        return os.getpid(), os.getppid(), self.tag, dict(context().point.extent)


@pytest.fixture
async def job(tmp_path: Path) -> AsyncIterator[ProcessJob]:
    """Two host meshes of one agent each; the agents end after the test
    (pytest runs the rest of a fixture after its test, pass or fail)."""
    j = ProcessJob(meshes={"workers": 1, "learner": 1}, cache_dir=tmp_path / ".meshio")
    yield j
    await j.kill()


def agents(j: ProcessJob, name: str) -> list[int]:
    assert job_record(j) is not None
    return [a["pid"] for a in job_record(j)["hosts"][name]]


async def test_process_job_resize_grows_and_shrinks_elastic_proc_meshes(
        job: ProcessJob, tmp_path: Path) -> None:
    state = await job.state()
    workers = state.workers
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0)
    async with Events(sup) as events, \
            workers.spawn_procs(per_host={"gpus": 2}, elastic=True, supervisor=sup) as procs, \
            workers.spawn_procs(per_host={"gpus": 1}, name="fixed") as fixed:
        actors = await procs.spawn("where", Where, tag="built by spawn")
        pinned = await fixed.spawn("pinned", Where, tag="fixed")
        first = agents(job, "workers")

        await asyncio.wait_for(job.resize("workers", hosts=3), DEADLINE)
        assert workers.sizes == {"hosts": 3} and (await job.state()).workers is workers
        assert procs.sizes == actors.sizes == {"hosts": 3, "gpus": 2}
        hosts = agents(job, "workers")
        assert hosts[0] == first[0] and len(set(hosts)) == 3
        found = await asyncio.wait_for(actors.where.call(), DEADLINE)
        assert len({pid for pid, _, _, _ in found.values()}) == 6
        for point, (_, agent, tag, shape) in found.items():
            assert agent == hosts[point["hosts"]], (point, agent, hosts)  # its host's agent
            assert tag == "built by spawn" and shape == {"hosts": 3, "gpus": 2}
        # the new processes are supervised: one killed comes back on its host
        os.kill(procs.pids[5], signal.SIGKILL)
        await events.next("restart", rank=5)
        _, agent, _, _ = await actors.slice(hosts=2, gpus=1).where.call_one()
        assert agent == hosts[2]
        assert fixed.sizes == {"hosts": 1, "gpus": 1}  # not elastic: stays
        assert [a for _, a, _, _ in (await pinned.where.call()).values()] == [hosts[0]]
        cached = json.loads(job.cache.read_text())
        assert cached["meshes"] == {"workers": 3, "learner": 1}
        assert [a["pid"] for a in cached["hosts"]["workers"]] == hosts
        # a proc mesh spawned now is on every host
        async with workers.spawn_procs(name="later") as later:
            assert later.sizes == {"hosts": 3, "procs": 1}

        last = workers.slice(hosts=2)  # (taken before the shrink)
        removed = [pid for pid, agent, _, _ in (await actors.where.call()).values()
                   if agent != hosts[0]]
        assert len(removed) == 4
        await asyncio.wait_for(job.resize("workers", hosts=1), DEADLINE)
        assert workers.sizes == {"hosts": 1}
        assert procs.sizes == actors.sizes == {"hosts": 1, "gpus": 2}
        await wait_gone(removed + hosts[1:])  # their processes stopped, then their agents
        for rank in (5, 4, 3, 2):  # a stop, not a failure: nothing restarted
            assert (await events.next("stopped", rank=rank)).cause == "shrink"
        assert [k for k, _, _ in events.kinds()] == ["failure", "restart"] + ["stopped"] * 4
        kept = await asyncio.wait_for(actors.where.call(), DEADLINE)
        assert [(a, shape) for _, a, _, shape in kept.values()] == [
            (hosts[0], {"hosts": 1, "gpus": 2})] * 2
        assert json.loads(job.cache.read_text())["meshes"] == {"workers": 1, "learner": 1}
        assert [a for _, a, _, _ in (await pinned.where.call()).values()] == [hosts[0]]
        with pytest.raises(ValueError, match="names hosts that the job's resize removed"):
            last.spawn_procs()


async def test_a_resize_adds_and_gives_back_hosts_under_the_jobs_lock(job: ProcessJob) -> None:
    """A resize's hosts are added (and recorded) or given back under the
    job's lock, as apply() and kill() hold it: while another controller
    holds it (another process here), the resize waits with nothing
    started or stopped, so that a kill there never misses hosts added."""
    await job.apply()
    before = agents(job, "workers")
    async with lock_held(job.cache) as holder, holder.waiting(job.resize("workers", hosts=2)):
        assert agents(job, "workers") == before  # no agent started while another holds it
    grown = agents(job, "workers")
    assert len(grown) == 2 and grown[0] == before[0]
    async with lock_held(job.cache) as holder, holder.waiting(job.resize("workers", hosts=1)):
        assert agents(job, "workers") == grown  # none given back yet
    assert agents(job, "workers") == before
    await wait_gone(grown[1:], DEADLINE)


async def test_a_shrink_cancelled_midway_leaves_the_host_mesh_as_the_cache(
        job: ProcessJob) -> None:
    """A shrink from 3 hosts to 1, cancelled while the last host's processes
    are being stopped (its agent is SIGSTOPped: its worker has exited, but
    the agent does not report it): that host is still given back, then the
    resize raises CancelledError; the host mesh, the elastic proc mesh, the
    cache and the agents running agree on 2 hosts, and a later resize to 1
    finds them so.  Before, the elastic proc mesh had dropped both hosts,
    the host mesh none (nor the cache), and the later resize shrank the
    proc mesh below one host."""
    workers = (await job.state()).workers
    async with workers.spawn_procs(per_host={"gpus": 1}, elastic=True) as procs:
        await asyncio.wait_for(job.resize("workers", hosts=3), DEADLINE)
        hosts = agents(job, "workers")
        os.kill(hosts[2], signal.SIGSTOP)
        try:
            shrink = asyncio.ensure_future(job.resize("workers", hosts=1))
            # (the worker exits on its Shutdown; its stopped agent never reports it)
            await wait_gone([procs.pids[2]], DEADLINE)
            shrink.cancel()
        finally:
            os.kill(hosts[2], signal.SIGCONT)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(shrink, DEADLINE)
        cached = json.loads(job.cache.read_text())
        n = cached["meshes"]["workers"]
        assert workers.sizes == {"hosts": n} and procs.sizes == {"hosts": n, "gpus": 1}
        assert n == 2 and [a["pid"] for a in cached["hosts"]["workers"]] == hosts[:2]
        await wait_gone(hosts[2:], DEADLINE)
        await asyncio.wait_for(job.resize("workers", hosts=1), DEADLINE)
        assert workers.sizes == {"hosts": 1} and procs.sizes == {"hosts": 1, "gpus": 1}
        assert agents(job, "workers") == hosts[:1]
        await wait_gone(hosts[1:], DEADLINE)


@pytest.mark.parametrize(("start", "asked"), [(1, (2, 3)), (2, (3, 1))])
async def test_concurrent_resizes_take_turns(tmp_path: Path, start: int,
                                             asked: tuple[int, int]) -> None:
    """Two resizes of one job at once take turns, each changing the size it
    finds to the size it asks for: the job ends at one of the sizes asked
    (the one that ran last), and its host mesh, its cache, its running
    agents and an elastic proc mesh all agree.  Before, each computed its
    change from the size before either ran: from 1 host, resizes to 2 and
    3 added 1 and 2 hosts, ending at 4."""
    job = ProcessJob(meshes={"workers": start}, cache_dir=tmp_path / ".meshio")
    try:
        workers = (await job.state()).workers
        async with workers.spawn_procs(per_host={"gpus": 1}, elastic=True) as procs:
            actors = await procs.spawn("where", Where, tag="elastic")
            await asyncio.wait_for(asyncio.gather(
                *(job.resize("workers", hosts=n) for n in asked)), DEADLINE)
            n = workers.sizes["hosts"]
            assert n in asked
            hosts = agents(job, "workers")
            assert len(hosts) == n
            cached = json.loads(job.cache.read_text())
            assert cached["meshes"] == {"workers": n}
            assert [a["pid"] for a in cached["hosts"]["workers"]] == hosts
            assert procs.sizes == actors.sizes == {"hosts": n, "gpus": 1}
            found = await asyncio.wait_for(actors.where.call(), DEADLINE)
            assert [agent for _, agent, _, _ in found.values()] == hosts  # one per agent
            # (the agents given back are on their way out; no other runs)
            running = agents_with(tmp_path / ".meshio" / "job.secret")
            await wait_gone(running - set(hosts), DEADLINE)
            assert set(hosts) <= running
    finally:
        await job.kill()


#: another controller: the job of that cache directory (named ``killed``),
#: killed (``kill``), or killed and applied again (``kill-apply``)
OTHER = """
import asyncio, sys
from meshio.jobs import ProcessJob

async def main() -> None:
    job = ProcessJob(meshes={"workers": 2}, name="killed", cache_dir=sys.argv[1])
    await job.kill()
    if sys.argv[2] == "kill-apply":
        await job.apply()

asyncio.run(main())
"""


def agents_with(secret_file: Path) -> set[int]:
    """The agents running with ``secret_file`` (a job's secret), found in
    every process's command line."""
    found: set[int] = set()
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0") if d.name.isdigit() else []
        except OSError:  # (gone meanwhile)
            continue
        if os.fsencode(secret_file) in argv:
            found.add(int(d.name))
    return found


@pytest.mark.parametrize("other", ["kill", "kill-apply"])
@pytest.mark.parametrize("hosts", [3, 1])
async def test_a_resize_after_another_controllers_kill_changes_nothing(
        tmp_path: Path, other: str, hosts: int) -> None:
    """Another controller (another process) kills the job, and perhaps
    applies a new one of that name; then this controller resizes the job
    it applied.  Under the job's lock the resize finds the cache gone (or
    naming other agents): it raises JobCacheError saying so, starts and
    stops no agent and writes no cache; this job object forgets the job, so
    its next state() applies it anew.  Before, the grow started an agent
    for the killed job and both wrote its cache again (over the new job's)."""
    cache = tmp_path / ".meshio"
    job = ProcessJob(meshes={"workers": 2}, name="killed", cache_dir=cache)
    try:
        workers = (await job.state()).workers
        first = agents(job, "workers")
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", OTHER, str(cache),
                                                    other)
        assert await asyncio.wait_for(proc.wait(), DEADLINE) == 0
        await wait_gone(first, DEADLINE)
        secret = cache / "killed.secret"
        cached = job.cache.read_bytes() if other == "kill-apply" else None
        running = agents_with(secret)
        assert len(running) == (2 if other == "kill-apply" else 0)
        said = (r"was killed by another controller \(its cache .*killed.json is gone\)"
                if other == "kill" else r"was killed or changed by another controller since "
                r"this one applied it \(its cache .*killed.json names other hosts")
        with pytest.raises(JobCacheError, match=rf"ProcessJob 'killed' {said}.*nothing was "
                                                r"resized"):
            await asyncio.wait_for(job.resize("workers", hosts=hosts), DEADLINE)
        assert agents_with(secret) == running  # none started, none stopped
        assert workers.sizes == {"hosts": 2}
        assert (job.cache.read_bytes() if job.cache.exists() else None) == cached
        assert job_record(job) is None  # forgotten: state() applies it anew
        assert (await job.state()).workers.sizes == {"hosts": 2}
        if other == "kill-apply":  # (the other's job, re-attached)
            assert set(agents(job, "workers")) == running
    finally:
        await job.kill()


async def test_resize_arguments_are_checked(job: ProcessJob) -> None:
    state = await job.state()
    with pytest.raises(KeyError, match="has no host mesh 'trainers'"):
        await job.resize("trainers", hosts=2)
    with pytest.raises(TypeError, match="expected an int, got str '2'"):
        await job.resize("workers", hosts="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keeps at least 1 host"):
        await job.resize("workers", hosts=0)
    with pytest.raises(ValueError, match="only a proc mesh on a whole host mesh"):
        state.workers.slice(hosts=slice(0, 1)).spawn_procs(elastic=True)
    with pytest.raises(TypeError, match="elastic must be True or False"):
        state.workers.spawn_procs(elastic=1)  # type: ignore[arg-type]
    await job.resize("workers", hosts=1)  # the size it has: nothing to do
    assert state.workers.sizes == {"hosts": 1} and len(agents(job, "workers")) == 1


async def test_local_job_has_one_host() -> None:
    job = LocalJob(meshes={"workers": 1})
    state = await job.state()
    async with state.workers.spawn_procs(elastic=True) as procs:  # the same code as on a cluster
        await job.resize("workers", hosts=1)
        assert procs.sizes == {"hosts": 1, "procs": 1}
        assert (await job.state()).workers is state.workers
    with pytest.raises(ValueError, match="a LocalJob has one host"):
        await job.resize("workers", hosts=2)


async def test_a_local_job_mesh_has_the_hosts_dim_of_a_one_host_process_job(
        job: ProcessJob) -> None:
    """Code written for a cluster runs on a LocalJob, and the other way round:
    its host meshes have ``hosts`` of size 1, as a one-host ProcessJob's do
    (before, a LocalJob gave ``this_host()``, with no dimension)."""
    local = await LocalJob(meshes={"workers": 1}).state()
    assert local.workers.sizes == {"hosts": 1} and meshio.this_host().sizes == {}
    async with local.workers.spawn_procs(per_host={"gpus": 2}) as procs, \
            (await job.state()).workers.spawn_procs(per_host={"gpus": 2}) as remote:
        assert procs.sizes == {"hosts": 1, "gpus": 2} and procs.extent == remote.extent
        actors = await procs.spawn("where", Where, tag="local")
        found = await asyncio.wait_for(actors.slice(hosts=0).where.call(), DEADLINE)
        assert found.sizes == {"gpus": 2}
        for _, parent, _, shape in found.values():  # children of this controller
            assert parent == os.getpid() and shape == {"hosts": 1, "gpus": 2}


@pytest.mark.parametrize("pid_read", ["done", "held"])
async def test_a_process_job_start_given_up_leaves_no_agent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pid_read: str) -> None:
    """``ProcessJob.apply()`` cancelled while an agent starts (it has not
    printed its address yet): that agent, which nobody else knows of, is
    killed. Before, it ran on until its idle timeout (600 s).  The agent's
    interpreter is held at a FIFO gate by a wrapper put in place of
    ``sys.executable``.  ``held``: cancelled before meshio read the agent's
    pid, which the launching shell prints (the read waits behind the only
    thread of the loop's executor, busy until after the cancel)."""
    gate = Gate(tmp_path)
    wrapper, pid_file = tmp_path / "held-python", tmp_path / "agent.pid"
    wrapper.write_text(f'#!/bin/sh\necho $$ > "{pid_file}"\n: > "{gate.ready}"\n'
                       f'read x < "{gate.release}"\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(wrapper))
    loop, busy = asyncio.get_running_loop(), threading.Event()
    held = loop.create_future()
    if pid_read == "held":  # the executor's thread waits at the gate, then stays busy
        def wait_held() -> None:
            os.close(os.open(gate.ready, os.O_RDONLY))
            loop.call_soon_threadsafe(held.set_result, None)
            busy.wait()

        loop.set_default_executor(ThreadPoolExecutor(1))
        waiting = loop.run_in_executor(None, wait_held)
    else:
        waiting = asyncio.ensure_future(gate.wait_held(DEADLINE))
        waiting.add_done_callback(lambda _: held.set_result(None))
    job = ProcessJob(meshes={"hosts": 1}, name="given-up", cache_dir=tmp_path / ".meshio")
    applying = asyncio.ensure_future(job.apply())
    await asyncio.wait_for(held, DEADLINE)  # the agent's process runs; nothing printed yet
    agent = int(pid_file.read_text())
    applying.cancel()
    busy.set()
    await waiting
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(applying, DEADLINE)
    await wait_gone([agent], DEADLINE)


async def test_a_run_with_the_original_shape_gives_the_resized_job_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The resize flow of docs/cluster.md: the script resized its job, then
    runs again with its original ``meshes=``; the cache is of another shape,
    so that run reports it, stops the cached agents and starts new ones.
    Before, it forgot them: they served nobody until their idle timeout
    (600 s), and no ``kill()`` could reach them."""
    cache = tmp_path / ".meshio"
    first = ProcessJob(meshes={"workers": 1}, cache_dir=cache)
    again = ProcessJob(meshes={"workers": 1}, cache_dir=cache)
    try:
        await first.state()
        await asyncio.wait_for(first.resize("workers", hosts=2), DEADLINE)
        old = agents(first, "workers")
        with caplog.at_level(logging.WARNING, logger="meshio"):
            await again.apply()
        assert "is a ProcessJob with meshes {'workers': 2}, not {'workers': 1}: stopping its " \
            "agents and starting a new job" in caplog.text
        await wait_gone(old, DEADLINE)
        new = agents(again, "workers")
        assert len(new) == 1 and not set(new) & set(old)
        assert json.loads(again.cache.read_text())["meshes"] == {"workers": 1}
    finally:
        await again.kill()
        await first.kill()


async def test_kill_gives_back_what_the_cache_names_whatever_the_shape(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``kill()`` on a job of another shape than the cached one (the script
    edited since, or a cleanup script) stops the cached agents and removes
    the cache and the secret; it starts nothing and says nothing of a new
    job.  Before, it deleted the cache and left the agents and the secret."""
    cache = tmp_path / ".meshio"
    running = ProcessJob(meshes={"workers": 2}, name="shaped", cache_dir=cache)
    try:
        await running.apply()
        pids = agents(running, "workers")
        with caplog.at_level(logging.INFO, logger="meshio"):
            await ProcessJob(meshes={"other": 3}, name="shaped", cache_dir=cache).kill()
        assert not (cache / "shaped.secret").exists()
        assert not (cache / "shaped.json").exists()
        assert "new job" not in caplog.text
        await wait_gone(pids, DEADLINE)
    finally:
        await running.kill()


async def test_a_cache_of_another_job_kind_is_refused_not_forgotten(tmp_path: Path) -> None:
    """A cache holding a SlurmJob of this name: a ProcessJob can neither
    use it nor give it back, so apply() and kill() refuse it with
    JobCacheError naming both kinds, and leave it for a SlurmJob's kill()."""
    cache = tmp_path / ".meshio"
    cache.mkdir(mode=0o700)
    entry = {"meshio_job": 1, "kind": "SlurmJob", "meshes": {"workers": 1}, "job_id": "7",
             "token": "meshio:x", "log": str(cache / "job.7.log"), "nodes": "n1",
             "hosts": {"workers": [{"node": "n1", "pid": "1", "addr": "tcp://10.0.0.1:1"}]},
             "secret_file": str(cache / "job.secret"), "extra": []}
    fd = os.open(cache / "job.json", os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(entry, f)
    job = ProcessJob(meshes={"workers": 1}, cache_dir=cache)
    for op in (job.apply, job.kill):
        with pytest.raises(JobCacheError, match=r"holds a SlurmJob .* not a ProcessJob"):
            await op()
    assert json.loads((cache / "job.json").read_text()) == entry
