"""``SlurmJob``: hosts from Slurm, one ``meshio agent`` per allocated node.

``apply()`` submits one batch job (``sbatch``) of as many nodes as the
meshes have hosts; its script runs a single step (``srun``, one task per
node) that starts ``meshio agent`` on every node.  Each agent prints its
node name and ``tcp://`` address; srun labels the lines with the task
number and Slurm writes them to ``.meshio/<name>.<jobid>.log`` on the
shared filesystem, where the controller reads them.  Tasks go to meshes
in order: with ``{"trainers": 2, "generators": 1}`` tasks 0-1 are the
trainers, task 2 the generator.

**Lifetime.** The job outlives the controller script, so running the
script again re-attaches (the job id, its nodes, the agents' addresses and
the secret file are cached in ``.meshio/<name>.json``; the job id from
``sbatch`` on, so a run killed while the job is queued leaves it to the
next run, which waits for its agents, or to ``kill()``; so are the jobs a
``resize`` submits to grow, which the next run cancels if that resize did
not finish); it ends by itself
once nobody uses it: every agent exits when no controller has been
connected to it for ``idle_timeout`` seconds, the step ends when its agents
have, and the batch script (nothing but that step) ends with it, which
gives the allocation back.  A controller that exits normally or is
SIGKILLed leaks nothing for longer than ``idle_timeout``; ``kill()``
cancels at once (``scancel``).

**Node loss.** The job and its step are submitted with ``--no-kill``: when
Slurm loses a node, the agent there is killed with its workers (their
procs fail with :class:`~meshio.SupervisionError`, and the supervision
policy applies), and the agents on the other nodes keep serving.  A cached
job that lost a node is stale: the next run allocates anew.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from subprocess import DEVNULL, PIPE
from typing import Any

from .._checks import check_seconds
from .._proc_mesh import HostMesh
from .._transport._tasks import within
from .._transport._tls import TLSConfig
from ._agent import tls_flags
from ._job import (
    AgentsJob,
    check_cache_dir,
    check_job_name,
    check_meshes,
    check_tls,
    read_own_cache,
    resize_job,
    write_cache,
    write_secret,
)

__all__ = ("SlurmError", "SlurmJob")

log = logging.getLogger("meshio")

#: seconds between looks at the job's log while its agents start (Slurm
#: tells a client nothing by itself; its own ``srun`` polls too)
_POLL = 0.05
#: looks at the log between two ``squeue``\ s (is the job still alive?)
_SQUEUE_EVERY = 10

#: seconds the agents get to end the job after SIGTERM before it is cancelled
_KILL_WAIT = 5.0
#: the states of a Slurm job that still holds (or waits for) its nodes
_ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED", "RESIZING")
#: the reasons (``squeue``'s ``%r``, Slurm 22.05's names) for which Slurm keeps a job
#: PENDING that never clear by themselves (only the user changing the job or an admin
#: changing a limit does): what each means, completing "it asks for ..."
_NEVER_STARTS: Mapping[str, str] = {
    "PartitionNodeLimit": "more nodes than its partition has or allows",
    "PartitionTimeLimit": "a time limit above its partition's MaxTime",
    "BadConstraints": "constraints (features, GRES) that no node can satisfy",
    "DependencyNeverSatisfied": "a dependency on a job that can never satisfy it",
    "InvalidAccount": "an account that does not exist or that it may not use",
    "InvalidQOS": "a QOS that does not exist or that it may not use",
    "QOSMaxNodePerJobLimit": "more nodes than its QOS allows a job",
    "QOSMaxCpuPerJobLimit": "more CPUs than its QOS allows a job",
    "QOSMaxGRESPerJob": "more GRES (e.g. GPUs) than its QOS allows a job",
    "QOSMaxWallDurationPerJobLimit": "a time limit above its QOS's limit for a job",
    "AssocMaxNodePerJobLimit": "more nodes than its account allows a job",
    "AssocMaxCpuPerJobLimit": "more CPUs than its account allows a job",
    "AssocMaxGRESPerJob": "more GRES (e.g. GPUs) than its account allows a job",
    "AssocMaxWallDurationPerJobLimit": "a time limit above its account's limit for a job",
}

_LINE = re.compile(r"^\s*(\d+): meshio (node|pid|agent listening on) (\S+)\s*$", re.M)


class SlurmError(RuntimeError):
    """Raised by :class:`SlurmJob` when Slurm cannot give it its hosts:
    Slurm's commands are missing or refuse the request (``sbatch``'s error
    is in the message), Slurm keeps the job pending for a reason that never
    clears by itself (the message names it), or the job ended before its
    agents started (the message names the job's log)."""


async def _run(*argv: str, stdin: bytes | None = None, timeout: float | None = None,
               env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    """Run a Slurm command (with ``env`` added to this process's
    environment); its exit status, stdout and stderr.  Killed after
    ``timeout`` seconds (a :class:`SlurmError`) or when cancelled."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=PIPE if stdin is not None else DEVNULL, stdout=PIPE, stderr=PIPE,
            env=None if env is None else {**os.environ, **env})
    except FileNotFoundError:
        raise SlurmError(f"SlurmJob: {argv[0]!r} is not on PATH; is Slurm installed on this "
                         "host (a login node of the cluster)?") from None
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate(stdin)
    except BaseException as e:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if isinstance(e, TimeoutError):
            raise SlurmError(f"{argv[0]} did not answer within {timeout:g} s: is slurmctld "
                             "up and reachable from this host?") from None
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def _squeue(job_id: str) -> tuple[str, str, str, str] | None:
    """``(state, comment, nodelist, reason)`` of job ``job_id`` (the reason
    Slurm gives for its state, e.g. why it is pending); None if Slurm no
    longer knows it."""
    rc, out, err = await _run("squeue", "--noheader", "--states=all", f"--jobs={job_id}",
                              "--format=%T|%N|%r|%k")
    if rc != 0:
        if "Invalid job id" in err:
            return None
        raise SlurmError(f"SlurmJob: squeue failed for job {job_id}: {err.strip()}")
    line = out.strip()
    if not line:
        return None
    state, nodes, reason, comment = line.split("|", 3)  # (the comment, any text, last)
    return state, comment, nodes, reason


async def probe(timeout: float) -> str:
    """What :class:`SlurmJob` finds on this host: the partitions ``sinfo``
    lists within ``timeout`` seconds (``meshio doctor``).

    Raises:
        SlurmError: a command SlurmJob runs is not on PATH, or ``sinfo``
            fails or does not answer in time.
    """
    missing = [c for c in ("sinfo", "sbatch", "squeue", "scancel") if shutil.which(c) is None]
    if missing:
        raise SlurmError(f"{', '.join(missing)} not on PATH: SlurmJob runs Slurm's commands "
                         "on the controller's host (a login node of the cluster)")
    rc, out, err = await _run("sinfo", "--noheader", "--format=%R %D %a", timeout=timeout)
    if rc != 0:
        why = err.strip().splitlines()[-1:] or [f"exit status {rc}"]
        raise SlurmError(f"sinfo failed: {why[0]}")
    parts = [line.split() for line in out.splitlines() if line.strip()]
    listed = ", ".join(f"{p[0]} ({p[1]} nodes, {p[2]})" for p in parts if len(p) == 3)
    return f"sinfo answered: partitions {listed or 'none'}"


class SlurmJob(AgentsJob):
    """Hosts from Slurm: one batch job of ``sum(meshes.values())`` nodes,
    with ``meshio agent`` on each, as named host meshes.

    ``state()`` allocates once and is cached in ``cache_dir`` (a directory
    the nodes share with this host): running the script again re-attaches
    to the same live job in a few milliseconds (one ``squeue``).  A cached
    job that Slurm ended, that lost a node, or whose id now names another
    job is reported stale and replaced.  The job ends by itself
    ``idle_timeout`` seconds after the last controller left it (also when
    the controller was killed); ``kill()`` cancels it at once.

    Args:
        meshes: host count per mesh name, e.g. ``{"trainers": 2, "generators": 1}``.
        partition: ``sbatch --partition`` (the cluster's default if None).
        time_limit: ``sbatch --time``, e.g. ``"01:00:00"`` (the partition's if None).
        name: the job's name: the cache file ``<name>.json`` and the Slurm
            job name ``meshio-<name>``.
        exclusive: whole nodes (``--exclusive``); the agent's step gets every
            allocated CPU and GPU of its node (``srun --whole``).
        sbatch_args: more ``sbatch`` options, e.g. ``["--gpus-per-node=8",
            "--account=ml"]``.
        tls: certificates, valid for the nodes' addresses, on the shared
            filesystem.
        cache_dir: where the job is cached; on the filesystem the nodes share
            (the job secret and the job's log live there too).
        idle_timeout: seconds an agent waits for a controller before it exits
            (which ends the job).
        start_timeout: seconds to wait for the agents after submitting
            (queueing included); the job is cancelled after that.

    Raises:
        ValueError, TypeError: a bad argument (``meshes``, ``name``, a
            ``tls`` that is not a ``TLSConfig``, ``sbatch_args`` given as
            one str, ``idle_timeout`` or ``start_timeout`` not seconds > 0).
    """

    kind = "SlurmJob"

    def __init__(self, meshes: Mapping[str, int], *, partition: str | None = None,
                 time_limit: str | None = None, name: str = "job", exclusive: bool = True,
                 sbatch_args: Sequence[str] = (), tls: TLSConfig | None = None,
                 cache_dir: str | os.PathLike[str] = ".meshio", idle_timeout: float = 300.0,
                 start_timeout: float = 600.0) -> None:
        self.meshes: dict[str, int] = check_meshes(meshes)
        self.name: str = check_job_name("SlurmJob", name)
        what = f"SlurmJob {name!r}"
        for arg, value in (("partition", partition), ("time_limit", time_limit)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{what}: {arg} must be a str or None, got "
                                f"{type(value).__name__} {value!r}")
        if not isinstance(exclusive, bool):
            raise TypeError(f"{what}: exclusive must be a bool, got {exclusive!r}")
        if isinstance(sbatch_args, str) or not all(isinstance(a, str) for a in sbatch_args):
            raise TypeError(f"{what}: sbatch_args must be a list of str, one option each "
                            f"(e.g. ['--gpus-per-node=8']), got {sbatch_args!r}")
        start_timeout = check_seconds(start_timeout, "SlurmJob", "start_timeout")
        self.partition: str | None = partition
        self.time_limit: str | None = time_limit
        self.exclusive: bool = exclusive
        self.sbatch_args: list[str] = list(sbatch_args)
        self.tls: TLSConfig | None = check_tls(what, tls)
        self.idle_timeout: float = check_seconds(idle_timeout, "SlurmJob", "idle_timeout")
        self.start_timeout: float = start_timeout
        self.cache: Path = check_cache_dir("SlurmJob", cache_dir).absolute() / f"{name}.json"
        self._entry: dict[str, Any] | None = None
        self._state = None

    @property
    def job_id(self) -> str | None:
        """The Slurm job id, once applied."""
        return None if self._entry is None else str(self._entry["job_id"])

    async def apply(self) -> None:
        """Re-attach to the cached job if Slurm still runs it on all its
        nodes, or submit a new one and wait for its agents (cached from
        ``sbatch`` on: a cached job still queued, whose controller was
        killed, is waited for, not submitted again).  A cached job of
        another shape (other ``meshes``, or resized) is reported and
        cancelled first.  One ``apply()`` or ``kill()`` of a job name runs at
        a time (the job's lock): another waits for it, then re-attaches.

        Raises:
            JobCacheError: the cache file is unsafe, not a meshio cache, or
                holds a job of another kind.
            SlurmError: Slurm refused the job; or it keeps the job pending
                for a reason that never clears by itself, e.g.
                ``PartitionNodeLimit`` (more nodes than the partition has or
                allows), ``PartitionTimeLimit``, ``BadConstraints``: raised
                as soon as ``squeue`` gives that reason, naming it and what
                it means, and the job is cancelled; or the job ended before
                its agents started.
            TimeoutError: the agents did not all start within
                ``start_timeout`` (the job is cancelled; the message gives
                Slurm's reason if it was still pending).
        """
        await super().apply()

    async def _apply_locked(self) -> None:
        entry = read_own_cache(self.cache, self.kind)
        if entry is not None and entry.get("meshes") != self.meshes:
            log.warning("meshio: job cache %s is a SlurmJob with meshes %s (Slurm job %s), not "
                        "%s: cancelling it and allocating a new Slurm job", self.cache,
                        entry.get("meshes"), _job_ids(entry), self.meshes)
            await _release(entry)
        elif entry is not None:
            await self._cancel_unfinished(entry)
            stale = await self._stale(entry)
            if stale is None and "hosts" not in entry:
                log.info("meshio: Slurm job %s of %s was submitted by an earlier run (which "
                         "ended before its agents started); waiting for its agents",
                         entry["job_id"], self.name)
                await self._start(entry)
                return
            if stale is None:
                self._entry = entry
                return
            log.warning("meshio: job cache %s is stale (%s); allocating a new Slurm job",
                        self.cache, stale)
            await _release(entry, logs=False)
        secret_file = self.cache.with_suffix(".secret")
        write_secret(secret_file, secrets.token_bytes(32))
        try:
            submitted = await self._submit(self.meshes, secret_file)
        except BaseException:  # (no cache names the secret: nobody else would remove it)
            secret_file.unlink(missing_ok=True)
            raise
        # (cached before its agents start: a run killed meanwhile leaves the queued job
        # to the next run or to kill(), not to Slurm alone)
        queued: dict[str, Any] = {**submitted, "secret_file": str(secret_file), "extra": []}
        write_cache(self.cache, queued)
        log.info("meshio: Slurm job %s submitted for %s; waiting for its agents",
                 queued["job_id"], self.name)
        await self._start(queued)

    async def _start(self, entry: dict[str, Any]) -> None:
        """Wait for the agents of the submitted job the cache holds as
        ``entry`` and cache them; if they do not start, the job is
        cancelled and forgotten (its cache and secret removed)."""
        try:
            started = await self._started(entry)
        except BaseException:
            self.cache.unlink(missing_ok=True)
            Path(entry["secret_file"]).unlink(missing_ok=True)
            raise
        write_cache(self.cache, started)
        self._entry = started

    async def _cancel_unfinished(self, entry: dict[str, Any]) -> None:
        """Cancel and forget the Slurm jobs that a resize of the cached job
        ``entry`` submitted but never added to its meshes: its controller was
        killed while they were queued or starting (recorded from ``sbatch``
        on, see :meth:`_add`)."""
        used = {a["job_id"] for agents in entry.get("hosts", {}).values() for a in agents}
        extra: list[dict[str, Any]] = entry.get("extra", [])
        unfinished = [job for job in extra if job["job_id"] not in used]
        if not unfinished:
            return
        log.warning("meshio: Slurm job %s of %s was submitted by a resize that did not finish "
                    "(its controller ended first): cancelling it",
                    ", ".join(job["job_id"] for job in unfinished), self.name)
        for job in unfinished:
            await _cancel(job)
            Path(job["log"]).unlink(missing_ok=True)
            extra.remove(job)
            write_cache(self.cache, entry)

    async def _stale(self, entry: dict[str, Any]) -> str | None:
        """Why the cached job cannot be used, or None if it can."""
        for job in [entry, *entry.get("extra", [])]:
            why = await _stale_job(job)
            if why is not None:
                return why
        return None

    async def resize(self, name: str, /, *, hosts: int) -> None:
        """Grow: one more Slurm job (an allocation of one node, with its
        agent) per new host, submitted together.  Shrink: the last hosts
        go, one at a time, each once the elastic proc meshes' processes
        there are stopped: an allocation added by ``resize`` is cancelled
        (its node is Slurm's again at once); on a node of the first
        allocation, a job step ends the agent (the node stays in that job,
        idle, until it ends).  The
        cache records the new shape and allocations: a new allocation from
        ``sbatch`` on (a run killed while it is queued leaves it to the next
        run, which cancels it, or to :meth:`kill`), a host given back as soon
        as it is (cancelled midway, a shrink first finishes giving back the
        host it is at, which the host mesh then no longer has).  See
        :meth:`Job.resize`.

        Raises:
            SlurmError, TimeoutError: a new allocation failed (as for
                :meth:`apply`; the others of this call are cancelled,
                nothing changed).
            JobCacheError: another controller killed the job (or changed
                it): nothing is allocated or cancelled.
        """
        await resize_job(self, f"SlurmJob {self.name!r}", self.meshes, name, hosts,
                         partial(self._add, name), partial(self._remove, name))

    async def _add(self, name: str, n: int) -> HostMesh:
        entry = self._entry
        assert entry is not None
        extra: list[dict[str, Any]] = entry.setdefault("extra", [])
        added: list[dict[str, Any]] = []  # (this call's jobs, as the cache records them)

        async def allocate() -> dict[str, Any]:  # (a job of its own)
            submitted = await self._submit({name: 1}, Path(entry["secret_file"]))
            # (cached from sbatch on, as apply()'s job: a run killed while it is queued
            # leaves it to the next run, which cancels it, or to kill())
            job = {k: submitted[k] for k in ("job_id", "token", "log")}
            added.append(job)
            extra.append(job)
            write_cache(self.cache, entry)
            log.info("meshio: Slurm job %s submitted to grow %r of %s; waiting for its agent",
                     job["job_id"], name, self.name)
            started = await self._started(submitted)
            job["nodes"] = started["nodes"]
            return started

        try:
            results = await asyncio.gather(*(allocate() for _ in range(n)),
                                           return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise failed[0]
        except BaseException:  # (failed or cancelled: none of this call's jobs is kept)
            await asyncio.shield(asyncio.gather(*(_cancel(job) for job in added)))
            for job in added:
                extra.remove(job)
            write_cache(self.cache, entry)
            raise
        return self._added(name, [a for job in results
                                  if not isinstance(job, BaseException)
                                  for a in job["hosts"][name]])

    async def _remove(self, name: str, n: int) -> None:
        entry = self._entry
        assert entry is not None
        agents: list[dict[str, str]] = entry["hosts"][name]
        extra: list[dict[str, Any]] = entry.setdefault("extra", [])
        for _ in range(n):
            # (the last host first, each recorded in the cache once given back; resize_job
            # gives back one host at a time and finishes it once begun, even if cancelled)
            agent = agents[-1]
            job = next((j for j in extra if j["job_id"] == agent.get("job_id")), None)
            if job is not None:
                await _cancel(job)
                extra.remove(job)
            else:
                await _stop_agent(entry, agent)
            self._removed(name, 1)

    async def _submit(self, meshes: Mapping[str, int], secret_file: Path) -> dict[str, Any]:
        """Submit one Slurm job of a node per host of ``meshes``, its agents
        holding the secret in ``secret_file``: its cache entry, without
        agents yet (:meth:`_started` adds them)."""
        total = sum(meshes.values())
        token = f"meshio:{secrets.token_hex(8)}"
        log_pattern = self.cache.with_name(f"{self.name}.%j.log")
        argv = ["sbatch", "--parsable", f"--job-name=meshio-{self.name}", f"--comment={token}",
                f"--nodes={total}", "--ntasks-per-node=1", "--no-kill",
                f"--output={log_pattern}", f"--chdir={os.getcwd()}"]
        if self.partition is not None:
            argv.append(f"--partition={self.partition}")
        if self.time_limit is not None:
            argv.append(f"--time={self.time_limit}")
        if self.exclusive:
            argv.append("--exclusive")
        argv += self.sbatch_args
        # (the job's umask, which Slurm creates its log with: readable by this user only)
        rc, out, err = await _run(*argv, stdin=self._script(secret_file).encode(),
                                  env={"SLURM_UMASK": "0077"})
        if rc != 0:
            raise SlurmError(f"SlurmJob {self.name!r}: sbatch refused the job: {err.strip()}")
        job_id = out.strip().split(";")[0]
        log_path = Path(str(log_pattern).replace("%j", job_id))
        return {"kind": self.kind, "meshes": dict(meshes), "job_id": job_id, "token": token,
                "log": str(log_path)}

    async def _started(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Wait for the agents of the submitted job ``entry``: its cache
        entry, with its nodes and its agents by mesh (``"nodes"``,
        ``"hosts"``).  The job is
        cancelled if they do not all start within ``start_timeout`` (or the
        wait is cancelled)."""
        meshes: dict[str, int] = entry["meshes"]
        job_id, total = entry["job_id"], sum(meshes.values())
        try:
            agents, nodes = await within(self._agents(entry, total), self.start_timeout)
        except TimeoutError:
            found = await _squeue(job_id)
            if found is None:
                why = "Slurm no longer knows it"
            elif found[0] == "PENDING":  # (the reason, e.g. Resources, PartitionNodeLimit)
                why = f"Slurm keeps it PENDING ({found[3]})"
            else:
                why = f"Slurm has it {found[0]}"
            await _cancel(entry)
            raise TimeoutError(
                f"SlurmJob {self.name!r}: the agents of Slurm job {job_id} did not all start "
                f"within {self.start_timeout:g} s ({why}; or see {entry['log']}); "
                "it is cancelled") from None
        except BaseException:
            await asyncio.shield(_cancel(entry))
            raise
        hosts: dict[str, list[dict[str, str]]] = {}
        first = 0
        for mesh, n in meshes.items():
            hosts[mesh] = [{**a, "job_id": job_id} for a in agents[first:first + n]]
            first += n
        return {**entry, "nodes": nodes, "hosts": hosts}

    def _script(self, secret_file: Path) -> str:
        """The batch script: one step, an agent per node, nothing after it."""
        agent = [sys.executable, "-m", "meshio", "agent", "--listen", "0.0.0.0:0",
                 "--secret-file", str(secret_file), "--idle-timeout", str(self.idle_timeout)]
        tls = self.tls
        if tls is not None:
            agent += tls_flags(os.fspath(tls.cert), os.fspath(tls.key), os.fspath(tls.ca),
                               mutual=tls.mutual, check_hostname=tls.check_hostname)
        step = ["srun", "--no-kill", "--kill-on-bad-exit=0", "--label", "--ntasks-per-node=1",
                *(["--whole"] if self.exclusive else []),
                "sh", "-c", 'echo "meshio node $SLURMD_NODENAME"; echo "meshio pid $$"; '
                'exec "$@"', "sh", *agent]
        return ("#!/bin/sh\n"
                f"# meshio SlurmJob {self.name}: one host agent per node; the job ends when\n"
                "# they do (each exits after --idle-timeout seconds without a controller)\n"
                f"exec {shlex.join(step)}\n")

    async def _agents(self, entry: dict[str, Any],
                      total: int) -> tuple[list[dict[str, str]], str]:
        """Wait until every task has printed its node and address; the
        agents in task order, and the job's node list.  A :class:`SlurmError`
        if the job ends first, or Slurm keeps it pending for a reason of
        :data:`_NEVER_STARTS`."""
        log_path = Path(entry["log"])
        looks = 0
        while True:
            try:
                text = log_path.read_text(errors="replace")
            except FileNotFoundError:  # the job has not started
                text = ""
            seen: dict[int, dict[str, str]] = {}
            for task, what, value in _LINE.findall(text):
                seen.setdefault(int(task), {})[what if what in ("node", "pid") else "addr"] = value
            if len(seen) == total and all(len(a) == 3 for a in seen.values()):
                found = await _squeue(entry["job_id"])
                return [seen[t] for t in range(total)], found[2] if found else ""
            if looks % _SQUEUE_EVERY == 0:
                found = await _squeue(entry["job_id"])
                if found is None or found[0] not in _ACTIVE:
                    tail = "\n".join(text.splitlines()[-15:])
                    raise SlurmError(
                        f"SlurmJob {self.name!r}: Slurm job {entry['job_id']} ended "
                        f"({found[0] if found else 'gone'}) before its agents started; "
                        f"{log_path} ends with:\n{tail}")
                if found[0] == "PENDING" and found[3] in _NEVER_STARTS:
                    time_limit = self.time_limit or "the partition's"
                    raise SlurmError(
                        f"SlurmJob {self.name!r}: Slurm job {entry['job_id']} can never "
                        f"start: Slurm keeps it PENDING with reason {found[3]}, it asks for "
                        f"{_NEVER_STARTS[found[3]]} ({total} node(s), partition "
                        f"{self.partition or 'the default'}, time limit {time_limit}); it is "
                        "cancelled. Change the request (meshes, partition, time_limit, "
                        "sbatch_args) or ask the cluster's admins")
            looks += 1
            await asyncio.sleep(_POLL)

    async def kill(self) -> None:
        """End the Slurm jobs the cache names, queued ones too, whatever
        its shape (their nodes are free when this returns), and forget the
        cached job.  It holds the job's lock, as :meth:`apply` does: a kill
        while another controller applies the job waits for it, then
        cancels what it allocated.

        Raises:
            JobCacheError: the cache file or directory is unsafe, or the
                cache is not a meshio cache or holds a job of another kind
                (nothing is cancelled).
        """
        await super().kill()

    async def _kill_locked(self) -> None:
        entry = self._entry or read_own_cache(self.cache, self.kind)
        if entry is not None:
            await _release(entry)
            Path(entry["secret_file"]).unlink(missing_ok=True)
        self.cache.unlink(missing_ok=True)
        self._entry = None
        self._state = None


def _job_ids(entry: dict[str, Any]) -> str:
    """The Slurm job ids of a cached job: its first allocation, then those
    ``resize`` added."""
    return ", ".join(str(job["job_id"]) for job in [entry, *entry.get("extra", [])])


async def _release(entry: dict[str, Any], *, logs: bool = True) -> None:
    """Cancel every Slurm job of a cached job (those ``resize`` added too);
    with ``logs``, remove their logs."""
    for job in [*entry.get("extra", []), entry]:
        await _cancel(job)
        if logs:
            Path(job["log"]).unlink(missing_ok=True)


async def _stale_job(entry: dict[str, Any]) -> str | None:
    """Why the cached Slurm job ``entry`` cannot be used, or None if it can."""
    job_id = entry["job_id"]
    found = await _squeue(job_id)
    if found is None:
        return f"Slurm no longer knows job {job_id}"
    state, comment, nodes, _ = found
    if comment != entry["token"]:
        return f"Slurm job {job_id} is now another job"
    if "nodes" not in entry and state in _ACTIVE:  # (submitted: its agents may start yet)
        return None
    if state != "RUNNING":
        return f"Slurm job {job_id} is {state}"
    if nodes != entry["nodes"]:
        return f"Slurm job {job_id} lost nodes: it has {nodes}, it had {entry['nodes']}"
    return None


async def _stop_agent(entry: dict[str, Any], agent: dict[str, str]) -> None:
    """End ``agent`` (on a node of job ``entry``, which keeps its other
    nodes) with a job step on its node that sends it SIGTERM."""
    node, job_id = agent["node"], str(entry["job_id"])
    rc, _, err = await _run("srun", f"--jobid={job_id}", "--overlap", f"--nodelist={node}",
                            "--nodes=1", "--ntasks=1", "--quiet", "kill", "-TERM", agent["pid"],
                            timeout=60.0)
    if rc != 0:
        log.warning("meshio: could not end the agent on node %s of Slurm job %s: %s", node,
                    job_id, err.strip())


async def _cancel(entry: dict[str, Any]) -> None:
    """End the cached job if Slurm still has it as ours (its id may name
    another job after the controller daemon's state was reset).

    A running job's agents get SIGTERM (``scancel --signal=TERM``): they
    exit, the step and the batch script end, and the job completes, which
    frees its nodes for the next job at once.  (A plain ``scancel`` of an
    ``--exclusive`` job with a live step leaves its nodes to the next
    backfill pass, up to 30 s later, in Slurm 22.05.)  Only a job still
    there after :data:`_KILL_WAIT` seconds, or one not yet running, is
    cancelled outright.
    """
    job_id = str(entry["job_id"])
    found = await _squeue(job_id)
    if found is None or found[1] != entry["token"] or found[0] not in _ACTIVE:
        return
    if found[0] == "RUNNING":
        await _run("scancel", "--signal=TERM", job_id)
        deadline = asyncio.get_running_loop().time() + _KILL_WAIT
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(_POLL)
            found = await _squeue(job_id)
            if found is None or found[0] not in _ACTIVE:
                return
    rc, _, err = await _run("scancel", job_id)
    if rc != 0:
        log.warning("meshio: scancel %s failed: %s", job_id, err.strip())
