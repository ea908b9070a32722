"""issue 10: SlurmJob against a real Slurm on this machine
(``../shared/slurm-local/slurm-local.sh``: slurmctld and two slurmd, each
node in its own network namespace with its own address when started here).

The cluster is used if it runs, started if it does not (root); the tests
skip, saying why, only when Slurm is not installed or cannot start, and
fail instead where ``MESHIO_REQUIRE_SLURM=1`` (CI)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trustme

from gone import wait_gone
from hop_actors import Hop
from meshio import Actor, SupervisionError, context, endpoint
from meshio.jobs import SlurmError, SlurmJob, TLSConfig, _slurm
from meshio.jobs._agent import host_address
from meshio.testing import job_record

DEADLINE = 30.0
SLURM_LOCAL = Path(os.environ.get(
    "SLURM_LOCAL_SH",
    Path(__file__).resolve().parents[2] / "shared" / "slurm-local" / "slurm-local.sh"))


class Where(Hop):
    @endpoint
    async def where(self) -> tuple[str, str]:
        """This proc's Slurm node name and host name."""
        return os.environ.get("SLURMD_NODENAME", ""), os.uname().nodename


def _unavailable(why: str) -> None:
    if os.environ.get("MESHIO_REQUIRE_SLURM") == "1":
        pytest.fail(f"MESHIO_REQUIRE_SLURM=1 but {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def slurm() -> Iterator[None]:
    """The local Slurm cluster, running, with ``SLURM_CONF`` pointing at it."""
    if shutil.which("sbatch") is None or shutil.which("slurmctld") is None:
        _unavailable(f"Slurm is not installed (bash {SLURM_LOCAL} install; .ci/run does)")
    if not SLURM_LOCAL.is_file():
        _unavailable(f"{SLURM_LOCAL} not found (set SLURM_LOCAL_SH)")
    script = ["bash", str(SLURM_LOCAL)]
    started = False
    if subprocess.run([*script, "status"], capture_output=True, timeout=DEADLINE).returncode:
        if os.getuid() != 0:
            _unavailable("the local Slurm is not running, and starting it needs root")
        env = {**os.environ, "SLURM_LOCAL_NETNS": os.environ.get("SLURM_LOCAL_NETNS", "1")}
        out = subprocess.run([*script, "start"], capture_output=True, text=True, env=env,
                             timeout=120)
        if out.returncode:
            _unavailable(f"the local Slurm did not start:\n{out.stderr[-3000:]}")
        started = True
    exports = subprocess.run([*script, "env"], capture_output=True, text=True, check=True,
                             timeout=DEADLINE).stdout
    saved: dict[str, str | None] = {}
    for line in exports.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        saved[key] = os.environ.get(key)
        os.environ[key] = value
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        if started:
            subprocess.run([*script, "stop"], capture_output=True, timeout=120)


def slurm_cmd(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True,
                          timeout=DEADLINE).stdout


def job_state(job_id: str) -> str:
    return slurm_cmd("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T").strip()


async def wait_job_ended(job_id: str, within: float) -> str:
    """Wait until Slurm ends job ``job_id``: a step of it that sleeps is
    ended with the job (or fails at once if it has already ended); its
    final state."""
    watcher = await asyncio.create_subprocess_exec(
        "srun", f"--jobid={job_id}", "--overlap", "--nodes=1", "--ntasks=1", "--quiet",
        "sleep", "600", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await asyncio.wait_for(watcher.wait(), within)
    finally:
        if watcher.returncode is None:
            watcher.kill()
            await watcher.wait()
    return job_state(job_id)


@pytest.fixture
async def job(slurm: None, tmp_path: Path) -> AsyncIterator[SlurmJob]:
    """Both nodes of the local cluster as two one-host meshes; cancelled
    after the test."""
    j = SlurmJob(meshes={"trainers": 1, "generators": 1}, partition="debug",
                 time_limit="00:10:00", cache_dir=tmp_path / ".meshio", idle_timeout=60)
    try:
        yield j
    finally:
        await j.kill()


async def test_allocates_spawns_calls_across_nodes_and_reattaches(job: SlurmJob,
                                                                   tmp_path: Path) -> None:
    """state() allocates both nodes (one agent each); procs spawned on each
    answer from their node; an actor calls a mesh on the other node
    directly; the script run again (a new SlurmJob of the same name)
    re-attaches to the same job and agents in well under a second."""
    state = await job.state()
    assert job.job_id is not None and job_state(job.job_id) == "RUNNING"
    # the job's log is the user's alone, as the cache is (Slurm wrote it 0644)
    log = tmp_path / ".meshio" / f"{job.name}.{job.job_id}.log"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600, oct(log.stat().st_mode)
    async with state.trainers.spawn_procs(per_host={"gpus": 2}) as tprocs, \
            state.generators.spawn_procs() as gprocs:
        trainers = await tprocs.spawn("trainers", Where)
        generators = await gprocs.spawn("generators", Where)
        t_nodes = {n for n, _ in (await asyncio.wait_for(trainers.where.call(), DEADLINE))
                   .values()}
        g_nodes = {n for n, _ in (await asyncio.wait_for(generators.where.call(), DEADLINE))
                   .values()}
        assert len(t_nodes) == 1 and len(g_nodes) == 1 and t_nodes != g_nodes
        assert t_nodes | g_nodes <= {"n1", "n2"}
        assert (await asyncio.wait_for(trainers.ask.call(generators, 7), DEADLINE)).values() \
            == [[7], [7]]
    again = SlurmJob(meshes={"trainers": 1, "generators": 1}, partition="debug",
                     time_limit="00:10:00", cache_dir=tmp_path / ".meshio", idle_timeout=60)
    t0 = time.perf_counter()
    state2 = await again.state()
    took = time.perf_counter() - t0
    assert again.job_id == job.job_id
    assert job_record(again) is not None and job_record(job) is not None
    assert job_record(again)["hosts"] == job_record(job)["hosts"]
    assert took < 1.0, f"re-attaching took {took:.3f} s"
    async with state2.generators.spawn_procs() as procs:
        w = await procs.spawn("w", Where)
        assert (await asyncio.wait_for(w.where.call_one(), DEADLINE))[0] in g_nodes


async def test_node_loss_fails_the_procs_on_it(slurm: None, tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """A node taken down in Slurm (``scontrol update state=down``) kills its
    agent and workers: a call in flight there fails with SupervisionError,
    the procs on the other node keep answering (the job runs ``--no-kill``),
    and the cached job is stale from then on (it lost a node)."""
    j = SlurmJob(meshes={"trainers": 2}, cache_dir=tmp_path / ".meshio", idle_timeout=60)
    lost = ""
    try:
        state = await j.state()
        assert job_record(j) is not None
        lost = job_record(j)["hosts"]["trainers"][1]["node"]
        async with state.trainers.spawn_procs() as procs:
            w = await procs.spawn("w", Where)
            nodes = (await asyncio.wait_for(w.where.call(), DEADLINE)).values()
            assert [n for n, _ in nodes][1] == lost
            stuck = asyncio.ensure_future(w.slice(hosts=1).hang.call_one())
            slurm_cmd("scontrol", "update", f"nodename={lost}", "state=down",
                      "reason=meshio-test")
            with pytest.raises(SupervisionError):
                await asyncio.wait_for(stuck, DEADLINE)
            assert await asyncio.wait_for(w.slice(hosts=0).echo.call_one(2), DEADLINE) == 2
        assert j.job_id is not None and job_state(j.job_id) == "RUNNING"
        again = SlurmJob(meshes={"trainers": 2}, cache_dir=tmp_path / ".meshio")
        assert job_record(again) is None
        entry = job_record(j)
        assert entry is not None
        assert "lost nodes" in (await _slurm._stale_job(entry) or "")
    finally:
        await j.kill()
        if lost:
            subprocess.run(["scontrol", "update", f"nodename={lost}", "state=resume"],
                           capture_output=True, timeout=DEADLINE)


CONTROLLER = """
import asyncio, sys
import meshio
from meshio import Actor, endpoint
from meshio.jobs import SlurmJob

class Echo(Actor):
    @endpoint
    async def echo(self, x: int) -> int:
        return x

async def main() -> None:
    job = SlurmJob(meshes={"hosts": 2}, cache_dir=sys.argv[1], idle_timeout=2)
    state = await job.state()
    print(job.job_id, flush=True)
    async with state.hosts.spawn_procs() as procs:
        e = await procs.spawn("e", Echo)
        assert (await e.echo.call(1)).values() == [1, 1]
        print("called", flush=True)
        if sys.argv[2] == "sigkill":
            await asyncio.Event().wait()

meshio.run(main())
"""


@pytest.mark.parametrize("end", ["normal exit", "sigkill"])
async def test_job_ends_after_its_controller(slurm: None, tmp_path: Path, end: str) -> None:
    """A controller script that allocates, spawns and calls, then exits
    normally (without kill()) or is SIGKILLed while holding procs, leaks no
    allocation: the agents exit idle_timeout (2 s) after it, and the job
    ends with them."""
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    with open(tmp_path / "controller.err", "wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(script), str(tmp_path / ".meshio"), end.split()[0],
            stdout=subprocess.PIPE, stderr=err)
    assert proc.stdout is not None
    job_id = ""
    try:
        job_id = (await asyncio.wait_for(proc.stdout.readline(), DEADLINE)).decode().strip()
        assert job_id.isdigit(), (tmp_path / "controller.err").read_text()
        assert await asyncio.wait_for(proc.stdout.readline(), DEADLINE) == b"called\n"
        assert job_state(job_id) == "RUNNING"
        if end == "sigkill":
            proc.kill()
        assert await asyncio.wait_for(proc.wait(), DEADLINE) == (-9 if end == "sigkill" else 0)
        final = await wait_job_ended(job_id, DEADLINE)
        assert final in ("COMPLETED", "COMPLETING"), final
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if job_id.isdigit() and job_state(job_id) in ("RUNNING", "PENDING"):
            slurm_cmd("scancel", job_id)


@pytest.mark.parametrize("how", ["ended", "id of another job"])
async def test_stale_cache_is_reported_and_replaced(slurm: None, tmp_path: Path, how: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A cached job that has ended (its agents stopped from outside), or
    whose id names another job, is reported stale and a new job is
    allocated; the other job is not cancelled."""
    cache = tmp_path / ".meshio"
    first = SlurmJob(meshes={"hosts": 1}, cache_dir=cache, idle_timeout=60)
    second = SlurmJob(meshes={"hosts": 1}, cache_dir=cache, idle_timeout=60)
    try:
        await first.apply()
        assert first.job_id is not None
        if how == "ended":
            slurm_cmd("scancel", "--signal=TERM", first.job_id)
            assert await wait_job_ended(first.job_id, DEADLINE) in ("COMPLETED", "COMPLETING")
        else:  # as if the cached id now named someone else's job
            entry = (cache / "job.json").read_text().replace('"meshio:', '"meshio:x')
            (cache / "job.json").write_text(entry)
        with caplog.at_level(logging.WARNING, logger="meshio"):
            await second.apply()
        assert second.job_id is not None and second.job_id != first.job_id
        assert "is stale" in caplog.text
        if how == "ended":
            assert re.search(f"job {first.job_id} is (COMPLETED|COMPLETING)", caplog.text)
        else:
            assert "is now another job" in caplog.text
            assert job_state(first.job_id) == "RUNNING"
        assert job_state(second.job_id) == "RUNNING"
    finally:
        await second.kill()
        await first.kill()


async def test_tls_job_calls_across_nodes(slurm: None, tmp_path: Path) -> None:
    """With ``tls=``, the agents on the nodes are started with the job's
    certificates (on the shared filesystem) and the calls across nodes go
    over mutual TLS."""
    node_addrs = re.findall(r"NodeAddr=(\S+)", slurm_cmd("scontrol", "-o", "show", "nodes"))
    names = {"127.0.0.1", host_address(), os.environ["SLURM_LOCAL_HEAD_ADDR"], *node_addrs}
    ca = trustme.CA()
    ca.issue_cert(*sorted(names)).private_key_and_cert_chain_pem.write_to_path(
        tmp_path / "job.pem")
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    tls = TLSConfig(tmp_path / "job.pem", tmp_path / "job.pem", tmp_path / "ca.pem")
    j = SlurmJob(meshes={"hosts": 2}, tls=tls, cache_dir=tmp_path / ".meshio", idle_timeout=60)
    try:
        state = await j.state()
        async with state.hosts.spawn_procs() as procs:
            w = await procs.spawn("w", Where)
            nodes = (await asyncio.wait_for(w.where.call(), DEADLINE)).values()
            assert sorted(n for n, _ in nodes) == ["n1", "n2"]
            assert (await asyncio.wait_for(w.echo.call(3), DEADLINE)).values() == [3, 3]
        # the agents speak TLS: a TLS handshake with the job's CA completes
        assert job_record(j) is not None
        for agent in job_record(j)["hosts"]["hosts"]:
            host, port = agent["addr"].removeprefix("tcp://").rsplit(":", 1)
            _, writer = await asyncio.wait_for(asyncio.open_connection(
                host, int(port), ssl=tls.client_context(), server_hostname=host), DEADLINE)
            assert writer.get_extra_info("peercert") is not None
            writer.close()
    finally:
        await j.kill()


async def test_sbatch_refusal_is_a_slurm_error(slurm: None, tmp_path: Path) -> None:
    """A request Slurm refuses (a partition it does not have) fails apply()
    with SlurmError carrying sbatch's reason, and caches nothing."""
    j = SlurmJob(meshes={"hosts": 1}, partition="no-such-partition",
                 cache_dir=tmp_path / ".meshio")
    with pytest.raises(SlurmError, match=r"sbatch refused the job.*partition"):
        await j.apply()
    assert not (tmp_path / ".meshio" / "job.json").exists()
    # nor the job secret, which no cache names (no kill() would remove it)
    assert not (tmp_path / ".meshio" / "job.secret").exists()


def test_doctor_reaches_the_cluster(slurm: None) -> None:
    """issue 19 item 4: ``meshio doctor --require slurm`` passes where Slurm
    answers, naming the cluster's partitions."""
    proc = subprocess.run([sys.executable, "-m", "meshio", "doctor", "--json", "--require",
                           "slurm"], capture_output=True, text=True, timeout=DEADLINE)
    assert proc.returncode == 0, proc.stderr
    slurm_check = json.loads(proc.stdout)["checks"]["slurm"]
    assert slurm_check["status"] == "ok"
    assert slurm_check["detail"].startswith("sinfo answered: partitions debug")


class Placed(Actor):
    @endpoint
    async def placed(self) -> tuple[int, str, dict[str, int]]:
        """(pid, Slurm node, the mesh's shape as this actor sees it)."""
        return (os.getpid(), os.environ.get("SLURMD_NODENAME", ""),
                dict(context().point.extent))


async def test_resize_adds_an_allocation_and_gives_it_back(slurm: None, tmp_path: Path) -> None:
    """issue 17 §3: job.resize("workers", hosts=2) on a one-node job submits
    one more Slurm job (the other node) with an agent; the host mesh and the
    elastic proc mesh grow onto it, its actor built there.  resize(hosts=1)
    stops those processes and cancels that job: its node is Slurm's again."""
    job = SlurmJob(meshes={"workers": 1}, partition="debug", time_limit="00:10:00",
                   cache_dir=tmp_path / ".meshio", idle_timeout=60)
    try:
        state = await job.state()
        async with state.workers.spawn_procs(per_host={"gpus": 2}, elastic=True) as procs:
            actors = await procs.spawn("placed", Placed)
            (first,) = {n for _, n, _ in  # (one node)
                        (await asyncio.wait_for(actors.placed.call(), DEADLINE)).values()}

            await asyncio.wait_for(job.resize("workers", hosts=2), 120)
            assert state.workers.sizes == {"hosts": 2}
            assert procs.sizes == actors.sizes == {"hosts": 2, "gpus": 2}
            assert job_record(job) is not None
            (extra,) = job_record(job)["extra"]
            assert extra["job_id"] != job.job_id and job_state(extra["job_id"]) == "RUNNING"
            found = await asyncio.wait_for(actors.placed.call(), DEADLINE)
            nodes = {point["hosts"]: node for point, (_, node, _) in found.items()}
            assert nodes[0] == first and nodes[1] == extra["nodes"] != first
            assert {str(s) for _, _, s in found.values()} == {str({"hosts": 2, "gpus": 2})}
            assert json.loads(job.cache.read_text())["meshes"] == {"workers": 2}

            removed = [pid for point, (pid, _, _) in found.items() if point["hosts"] == 1]
            await asyncio.wait_for(job.resize("workers", hosts=1), 120)
            assert procs.sizes == actors.sizes == {"hosts": 1, "gpus": 2}
            await wait_gone(removed)
            assert await wait_job_ended(extra["job_id"], DEADLINE) in ("COMPLETED", "")
            assert job_record(job)["extra"] == []
            assert [n for _, n, _ in (await actors.placed.call()).values()] == [first] * 2
            assert json.loads(job.cache.read_text())["meshes"] == {"workers": 1}
    finally:
        await job.kill()


async def test_shrink_ends_an_agent_of_the_first_allocation(slurm: None, tmp_path: Path) -> None:
    """A host of the job's own allocation removed by resize: the elastic
    proc mesh's processes there stop, then a job step on that node ends its
    agent; the other node keeps serving."""
    job = SlurmJob(meshes={"workers": 2}, partition="debug", time_limit="00:10:00",
                   cache_dir=tmp_path / ".meshio", idle_timeout=60)
    try:
        state = await job.state()
        assert job_record(job) is not None
        agent = job_record(job)["hosts"]["workers"][1]
        async with state.workers.spawn_procs(elastic=True) as procs:
            actors = await procs.spawn("placed", Placed)
            found = await asyncio.wait_for(actors.placed.call(), DEADLINE)
            (pid, node, _) = found.item(hosts=1, procs=0)
            assert node == agent["node"]
            await asyncio.wait_for(job.resize("workers", hosts=1), 120)
            assert procs.sizes == {"hosts": 1, "procs": 1}
            await wait_gone([pid, int(agent["pid"])])  # the process, then its agent
            assert job_state(job.job_id or "") == "RUNNING"
            ((_, kept, _),) = (await actors.placed.call()).values()
            assert kept != node
    finally:
        await job.kill()


async def test_a_run_with_the_original_shape_cancels_the_resized_job(
        slurm: None, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The resize flow of docs/cluster.md on Slurm: a job resized to two
    hosts (its allocation and one more), then the script run again with its
    original ``meshes=``.  The cache is of another shape: reported, both
    Slurm jobs cancelled (their nodes free), a new one allocated.  Before,
    both stayed RUNNING, forgotten, until their idle timeout."""
    cache = tmp_path / ".meshio"
    first = SlurmJob(meshes={"workers": 1}, partition="debug", time_limit="00:10:00",
                     cache_dir=cache, idle_timeout=60)
    again = SlurmJob(meshes={"workers": 1}, partition="debug", time_limit="00:10:00",
                     cache_dir=cache, idle_timeout=60, start_timeout=DEADLINE)
    try:
        await first.apply()
        await asyncio.wait_for(first.resize("workers", hosts=2), 120)
        record = job_record(first)
        assert record is not None
        old = [str(record["job_id"]), *(str(j["job_id"]) for j in record["extra"])]
        assert len(old) == 2
        with caplog.at_level(logging.WARNING, logger="meshio"):
            await again.apply()
        assert (f"is a SlurmJob with meshes {{'workers': 2}} (Slurm job {old[0]}, {old[1]}), "
                "not {'workers': 1}: cancelling it") in caplog.text
        for job_id in old:
            assert job_state(job_id) not in _slurm._ACTIVE
        assert again.job_id not in old and job_state(again.job_id or "") == "RUNNING"
    finally:
        await again.kill()
        await first.kill()


async def test_kill_cancels_what_the_cache_names_whatever_the_shape(
        slurm: None, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``kill()`` on a SlurmJob of another shape than the cached one cancels
    the cached Slurm job and removes the cache, its log and the secret,
    saying nothing of a new job.  Before, the job stayed RUNNING."""
    cache = tmp_path / ".meshio"
    running = SlurmJob(meshes={"hosts": 1}, cache_dir=cache, idle_timeout=60)
    try:
        await running.apply()
        assert running.job_id is not None
        with caplog.at_level(logging.INFO, logger="meshio"):
            await SlurmJob(meshes={"others": 2}, cache_dir=cache).kill()
        assert job_state(running.job_id) not in _slurm._ACTIVE
        assert "new" not in caplog.text
        assert sorted(p.name for p in cache.iterdir()) == ["job.lock"]  # (a job's lock is kept)
    finally:
        await running.kill()


PENDING_CONTROLLER = """
import logging, sys
import meshio
from meshio.jobs import SlurmJob

logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
job = SlurmJob(meshes={"hosts": 2}, name=sys.argv[2], cache_dir=sys.argv[1], idle_timeout=60)
meshio.run(job.apply())
"""


@contextlib.contextmanager
def held(nodes: int) -> Iterator[str]:
    """``nodes`` nodes held by another job (a ``salloc`` without a shell),
    whose name this is: a SlurmJob that needs them stays PENDING."""
    blocker = f"blocker-{os.getpid()}"
    slurm_cmd("salloc", "--no-shell", f"--nodes={nodes}", "--exclusive",
              f"--job-name={blocker}")
    try:
        yield blocker
    finally:
        slurm_cmd("scancel", f"--name={blocker}")


@pytest.fixture
def nodes_held(slurm: None) -> Iterator[str]:
    """Both nodes held by another job (:func:`held`)."""
    with held(2) as blocker:
        yield blocker


def queued(name: str) -> list[str]:
    """The ids of the Slurm jobs of SlurmJob ``name`` that are queued or running."""
    return slurm_cmd("squeue", "-h", f"--name=meshio-{name}", "-o", "%i").split()


async def submit_and_sigkill(tmp_path: Path, name: str) -> str:
    """A controller script's ``apply()`` of SlurmJob ``name``, SIGKILLed once
    it waits for the agents of a Slurm job (its nodes are held: the job is
    PENDING); that job's id."""
    script = tmp_path / "pending_controller.py"
    script.write_text(PENDING_CONTROLLER)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(tmp_path / ".meshio"), name, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        lines: list[str] = []
        while not lines or "waiting for its agents" not in lines[-1]:
            line = (await asyncio.wait_for(proc.stdout.readline(), DEADLINE)).decode()
            assert line, f"the controller exited: {lines}"
            lines.append(line)
        found = re.search(r"Slurm job (\d+)", lines[-1])
        assert found is not None, lines
        assert job_state(found[1]) == "PENDING"
    finally:
        proc.kill()
        await proc.wait()
    return found[1]


async def test_a_controller_killed_while_its_job_is_queued_leaks_nothing(
        nodes_held: str, tmp_path: Path) -> None:
    """A controller SIGKILLed while its Slurm job is still queued: the job
    is recorded in the cache from sbatch on, so the next run waits for that
    job instead of queueing a second one, and ``kill()`` cancels it.
    Before, the cache was written once the agents had started: a run
    killed in the queue left a job nobody knew of; each re-run queued one
    more."""
    name = f"pend{os.getpid()}"
    try:
        first = await submit_and_sigkill(tmp_path, name)
        again = await submit_and_sigkill(tmp_path, name)
        assert again == first and queued(name) == [first]
        await SlurmJob(meshes={"hosts": 2}, name=name, cache_dir=tmp_path / ".meshio").kill()
        assert queued(name) == []
        assert sorted(p.name for p in (tmp_path / ".meshio").iterdir()) == [f"{name}.lock"]
    finally:
        for job_id in queued(name):
            slurm_cmd("scancel", job_id)


async def test_the_next_run_reattaches_to_a_job_queued_by_a_killed_controller(
        nodes_held: str, tmp_path: Path) -> None:
    """The job a SIGKILLed controller left in the queue is the next run's:
    once the nodes are free, its agents start and the run attaches to them."""
    name = f"reatt{os.getpid()}"
    job = SlurmJob(meshes={"hosts": 2}, name=name, cache_dir=tmp_path / ".meshio",
                   idle_timeout=60)
    try:
        first = await submit_and_sigkill(tmp_path, name)
        slurm_cmd("scancel", f"--name={nodes_held}")
        state = await job.state()
        assert job.job_id == first and queued(name) == [first]
        async with state.hosts.spawn_procs() as procs:
            w = await procs.spawn("w", Where)
            nodes = (await asyncio.wait_for(w.where.call(), DEADLINE)).values()
            assert sorted(n for n, _ in nodes) == ["n1", "n2"]
    finally:
        await job.kill()
        for job_id in queued(name):
            slurm_cmd("scancel", job_id)


async def test_a_job_slurm_will_never_start_fails_at_once(slurm: None,
                                                          tmp_path: Path) -> None:
    """A job Slurm accepts but can never run (more nodes than the partition
    has: PENDING with reason ``PartitionNodeLimit``) fails ``apply()`` as
    soon as ``squeue`` gives that reason, with a SlurmError naming the job,
    the reason and what it means; it is cancelled, and nothing of it is
    kept.  Before, apply() waited for ``start_timeout`` (here longer than
    the test waits)."""
    name = f"big{os.getpid()}"
    job = SlurmJob(meshes={"hosts": 3}, name=name, partition="debug",
                   cache_dir=tmp_path / ".meshio", start_timeout=120)
    try:
        with pytest.raises(SlurmError, match=r"Slurm job \d+ can never start: .*PENDING with "
                           r"reason PartitionNodeLimit, it asks for more nodes than its "
                           r"partition has or allows \(3 node\(s\), partition debug.*"
                           r"cancelled") as caught:
            async with asyncio.timeout(DEADLINE):
                await job.apply()
        job_id = re.search(r"Slurm job (\d+)", str(caught.value))
        assert job_id is not None
        assert queued(name) == [] and job_state(job_id[1]) == "CANCELLED"
        assert sorted(p.name for p in (tmp_path / ".meshio").iterdir()) == [f"{name}.lock"]
    finally:
        await job.kill()


async def test_a_queued_job_times_out_with_slurms_reason(nodes_held: str,
                                                         tmp_path: Path) -> None:
    """A job that could start once other jobs end (its nodes are held)
    waits for its agents up to ``start_timeout``, then fails with Slurm's
    reason for keeping it queued; it is cancelled, and nothing of it is
    kept."""
    name = f"wait{os.getpid()}"
    job = SlurmJob(meshes={"hosts": 2}, name=name, cache_dir=tmp_path / ".meshio",
                   start_timeout=2)
    try:
        with pytest.raises(TimeoutError, match=r"PENDING \((Resources|Priority)\).*cancelled"):
            await job.apply()
        assert queued(name) == []
        assert sorted(p.name for p in (tmp_path / ".meshio").iterdir()) == [f"{name}.lock"]
    finally:
        await job.kill()


GROW_CONTROLLER = """
import sys
import meshio
from meshio.jobs import SlurmJob

job = SlurmJob(meshes={"workers": 1}, name=sys.argv[2], cache_dir=sys.argv[1], idle_timeout=60)

async def main() -> None:
    await job.state()
    await job.resize("workers", hosts=2)

meshio.run(main())
"""

SQUEUE_TAP = """#!/bin/sh
echo "$*" > {fifo}
exec {squeue} "$@"
"""


@contextlib.asynccontextmanager
async def squeue_tap(tmp_path: Path) -> AsyncIterator[tuple[dict[str, str],
                                                           asyncio.StreamReader]]:
    """An environment for a controller whose ``squeue`` is Slurm's, run
    after writing its arguments as a line to the stream yielded with it:
    what the controller asks Slurm, when it asks."""
    tap = tmp_path / "tap"
    tap.mkdir()
    fifo = tmp_path / "squeued"
    os.mkfifo(fifo)
    squeue = shutil.which("squeue")
    assert squeue is not None
    (tap / "squeue").write_text(SQUEUE_TAP.format(fifo=shlex.quote(str(fifo)),
                                                  squeue=shlex.quote(squeue)))
    (tap / "squeue").chmod(0o755)
    reading = open(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK), "rb", buffering=0)
    writer = os.open(fifo, os.O_WRONLY)  # (held: no end of stream between two squeues)
    reader = asyncio.StreamReader()
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), reading)
    try:
        yield {**os.environ, "PATH": f"{tap}:{os.environ['PATH']}"}, reader
    finally:
        transport.close()
        os.close(writer)


@pytest.mark.parametrize("then", ["re-run", "kill"])
async def test_a_controller_killed_while_its_grow_is_queued_leaks_nothing(
        slurm: None, tmp_path: Path, then: str, caplog: pytest.LogCaptureFixture) -> None:
    """A controller SIGKILLed while it waits for the Slurm job that a
    ``resize`` submitted to grow, still queued (the other node is held; the
    controller's first ``squeue`` of that job tells when): that job is
    recorded in the cache from sbatch on, so the next run cancels it (the
    resize did not finish) and re-attaches to the first job, and ``kill()``
    cancels both.  Before, it was recorded once its agent had started: it
    stayed queued, known to nobody."""
    name = f"grow{os.getpid()}"
    cache = tmp_path / ".meshio"
    script = tmp_path / "grow_controller.py"
    script.write_text(GROW_CONTROLLER)
    try:
        with held(1):
            async with squeue_tap(tmp_path) as (env, squeued):
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, str(script), str(cache), name, env=env)
                try:
                    asked: list[str] = []
                    while len(set(asked)) < 2:
                        line = (await asyncio.wait_for(squeued.readline(), DEADLINE)).decode()
                        asked += re.findall(r"--jobs=(\d+)", line)
                finally:
                    proc.kill()
                    await proc.wait()
            first, extra = asked[0], asked[-1]
            assert job_state(extra) == "PENDING" and job_state(first) == "RUNNING"
            if then == "re-run":
                again = SlurmJob(meshes={"workers": 1}, name=name, cache_dir=cache)
                with caplog.at_level(logging.WARNING, logger="meshio"):
                    await again.apply()
                assert f"Slurm job {extra} of {name} was submitted by a resize that did " \
                    "not finish" in caplog.text
                assert again.job_id == first and queued(name) == [first]
                assert job_record(again) is not None and job_record(again)["extra"] == []
            await SlurmJob(meshes={"workers": 1}, name=name, cache_dir=cache).kill()
            assert job_state(extra) not in _slurm._ACTIVE
            assert job_state(first) not in _slurm._ACTIVE
    finally:
        for job_id in queued(name):
            slurm_cmd("scancel", job_id)


async def test_a_shrink_cancelled_midway_leaves_a_true_cache(slurm: None,
                                                             tmp_path: Path) -> None:
    """A shrink by two hosts that ``resize`` added, cancelled once the
    agent of the first given back (the last host) has exited at its
    SIGTERM, as its Slurm job ends (the other agent is SIGSTOPped: given
    back too, it would take the SIGTERM wait): the cache names exactly the
    hosts and Slurm jobs left, each still RUNNING, and the host mesh and
    ``job.meshes`` have that many hosts.  Before, the cache was written
    once both were cancelled: cancelled between, it still named the one
    that had been cancelled (the next run found the whole job stale); and
    the host mesh had dropped both hosts before the first was given back,
    so it had one host where the cache named two."""
    job = SlurmJob(meshes={"workers": 1}, exclusive=False, partition="debug",
                   time_limit="00:10:00", cache_dir=tmp_path / ".meshio", idle_timeout=60)
    stopped: list[int] = []
    try:
        workers = (await job.state()).workers
        await asyncio.wait_for(job.resize("workers", hosts=3), 120)
        record = job_record(job)
        assert record is not None and len(record["extra"]) == 2
        middle, last = (int(a["pid"]) for a in record["hosts"]["workers"][1:])
        stopped = [middle]
        os.kill(middle, signal.SIGSTOP)
        shrink = asyncio.ensure_future(job.resize("workers", hosts=1))
        await wait_gone([last], DEADLINE)
        shrink.cancel()
        with pytest.raises(asyncio.CancelledError):
            await shrink
        cached = json.loads(job.cache.read_text())
        hosts = cached["hosts"]["workers"]
        assert cached["meshes"] == {"workers": len(hosts)} and len(hosts) < 3
        assert workers.sizes == {"hosts": len(hosts)} and job.meshes == cached["meshes"]
        assert [a["job_id"] for a in hosts] == [job.job_id, *(j["job_id"]
                                                              for j in cached["extra"])]
        for j in cached["extra"]:
            assert job_state(j["job_id"]) == "RUNNING"
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await job.kill()
