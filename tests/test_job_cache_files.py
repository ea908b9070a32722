"""The files a job keeps in its cache directory (``<name>.json``,
``<name>.secret``, ``<name>.log``) are this user's and private, however
they are found or made: a re-attach reads the job secret only from a file
checked as the cache is (a link planted to a file others may read was used
silently), a secret path that cannot be written is a typed error naming it
(a directory there gave a raw ``IsADirectoryError``), and under ``umask
000`` neither the directories made above the cache nor the job's log are
left open to others (they were 0777 and 0666).

Two ``apply()`` of one job name at once (two controller processes) start
one set of agents: the job's lock (``<name>.lock``, beside its cache) is
held while one applies, and the other then re-attaches to its agents (each
started its own, and one cache overwrote the other, leaving agents no cache
named).  A ``kill()`` holds that lock too: one while another controller
applies the job waits for it (it removed the cache and stopped the agents
meanwhile, and the apply then wrote a cache of a job that was gone, or
started agents after the kill).  A re-attach checks the cache directory as
a first apply does (it used a cache in a directory others may write to)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gone import wait_gone
from lock_holder import lock_held
from meshio.jobs import JobCacheError, ProcessJob
from meshio.testing import job_record

#: a controller that applies ``ProcessJob(meshes={"a": 2}, cache_dir=argv[1])``
#: once told to (a line on stdin, after it printed ``ready``), then prints
#: the agents' pids
CONTROLLER = """
import asyncio, json, sys
from meshio.jobs import ProcessJob
from meshio.testing import job_record

async def main() -> None:
    job = ProcessJob(meshes={"a": 2}, cache_dir=sys.argv[1], idle_timeout=120)
    print("ready", flush=True)
    sys.stdin.readline()
    await job.apply()
    record = job_record(job)
    assert record is not None
    print(json.dumps(sorted(a["pid"] for a in record["hosts"]["a"])), flush=True)

asyncio.run(main())
"""


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_reattach_reads_the_secret_only_from_a_private_file_of_yours(
        tmp_path: Path) -> None:
    cache = tmp_path / ".meshio"
    first = ProcessJob(meshes={"a": 1}, cache_dir=cache)
    await first.apply()
    secret = cache / "job.secret"
    try:
        readable = tmp_path / "readable"  # the same secret, but others may read it
        readable.write_bytes(secret.read_bytes())
        readable.chmod(0o644)
        secret.unlink()
        secret.symlink_to(readable)
        with pytest.raises(JobCacheError, match=r"job secret .* is readable or writable by "
                                                r"others \(mode 644\)") as refused:
            await ProcessJob(meshes={"a": 1}, cache_dir=cache).state()
        assert str(secret) in str(refused.value)
        secret.unlink()
        secret.write_bytes(readable.read_bytes())
        secret.chmod(0o600)
        if os.getuid() == 0:  # another user's file, private to them
            os.chown(secret, 65534, 65534)
            with pytest.raises(JobCacheError, match=r"job secret .* belongs to uid 65534"):
                await ProcessJob(meshes={"a": 1}, cache_dir=cache).state()
            os.chown(secret, 0, 0)
        again = await ProcessJob(meshes={"a": 1}, cache_dir=cache).state()  # private: used
        assert list(again.meshes) == ["a"]
    finally:
        await first.kill()


async def test_a_secret_path_that_cannot_be_written_is_a_job_cache_error(
        tmp_path: Path) -> None:
    cache = tmp_path / ".meshio"
    (cache / "job.secret").mkdir(parents=True, mode=0o700)
    with pytest.raises(JobCacheError, match="cannot be written") as refused:
        await ProcessJob(meshes={"a": 1}, cache_dir=cache).apply()
    assert str(cache / "job.secret") in str(refused.value)
    # nothing started, nothing left but the directory that was there (and the job's lock)
    assert sorted(p.name for p in cache.iterdir()) == ["job.lock", "job.secret"]


@pytest.fixture
def umask_000() -> Iterator[None]:
    was = os.umask(0)
    try:
        yield
    finally:
        os.umask(was)


@pytest.mark.usefixtures("umask_000")
async def test_under_umask_000_the_cache_directories_and_log_are_private(
        tmp_path: Path) -> None:
    cache = tmp_path / "a" / "b" / ".meshio"
    job = ProcessJob(meshes={"a": 1}, cache_dir=cache)
    await job.apply()
    try:
        made = {str(p.relative_to(tmp_path)): mode(p) for p in tmp_path.rglob("*")}
        assert made == {"a": 0o700, "a/b": 0o700, "a/b/.meshio": 0o700,
                        "a/b/.meshio/job.json": 0o600, "a/b/.meshio/job.secret": 0o600,
                        "a/b/.meshio/job.log": 0o600, "a/b/.meshio/job.lock": 0o600}
    finally:
        await job.kill()


def agents_of(cache: Path) -> set[int]:
    """The live agent processes started for the job cached in ``cache``
    (their command line names its secret file)."""
    secret = os.fsencode(cache / "job.secret")
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if secret in argv:
            found.add(int(entry))
    return found


async def stop(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    await wait_gone(pids, 30)


async def test_two_controllers_applying_one_job_at_once_start_one_set_of_agents(
        tmp_path: Path) -> None:
    cache = tmp_path / ".meshio"
    controllers = [subprocess.Popen([sys.executable, "-c", CONTROLLER, str(cache)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                   for _ in range(2)]
    try:
        for c in controllers:  # both are ready to apply ...
            assert c.stdout is not None and c.stdout.readline() == "ready\n"
        for c in controllers:  # ... and are told to at once
            assert c.stdin is not None
            c.stdin.write("go\n")
            c.stdin.close()
        seen = [json.loads(c.stdout.read()) for c in controllers if c.stdout is not None]
        assert [c.wait(timeout=60) for c in controllers] == [0, 0]
        assert seen[0] == seen[1], seen  # one set of agents, which both use
        assert agents_of(cache) == set(seen[0])  # and no other
        again = ProcessJob(meshes={"a": 2}, cache_dir=cache)
        await again.apply()  # the cache names them
        record = job_record(again)
        assert record is not None
        assert sorted(a["pid"] for a in record["hosts"]["a"]) == seen[0]
    finally:
        for c in controllers:
            if c.poll() is None:
                c.kill()
                c.wait()
            if c.stdout is not None:
                c.stdout.close()
        await ProcessJob(meshes={"a": 2}, cache_dir=cache).kill()
        await stop(agents_of(cache))  # (any a second set left running)


async def test_a_reattach_refuses_a_cache_directory_others_may_write_to(
        tmp_path: Path) -> None:
    cache = tmp_path / ".meshio"
    first = ProcessJob(meshes={"a": 1}, cache_dir=cache)
    await first.apply()
    try:
        cache.chmod(0o777)  # others could swap the job's secret now
        with pytest.raises(JobCacheError, match=r"job cache directory .* with mode 777") as refused:
            await ProcessJob(meshes={"a": 1}, cache_dir=cache).state()
        assert str(cache) in str(refused.value)
        cache.chmod(0o700)
        assert list((await ProcessJob(meshes={"a": 1}, cache_dir=cache).state()).meshes) == ["a"]
    finally:
        cache.chmod(0o700)
        await first.kill()


async def test_a_kill_while_another_controller_holds_the_jobs_lock_waits_for_it(
        tmp_path: Path) -> None:
    cache = tmp_path / ".meshio"
    job = ProcessJob(meshes={"a": 2}, cache_dir=cache, idle_timeout=120)
    await job.apply()
    agents = agents_of(cache)
    assert len(agents) == 2
    try:
        async with lock_held(job.cache) as holder:  # (as another controller's apply())
            async with holder.waiting(ProcessJob(meshes={"a": 2}, cache_dir=cache).kill()):
                assert job.cache.exists() and agents_of(cache) == agents  # nothing given back yet
        await wait_gone(agents, 30)  # then the agents the cache named are stopped
        assert sorted(p.name for p in cache.iterdir()) == ["job.lock", "job.log"]
    finally:
        await stop(agents_of(cache))
