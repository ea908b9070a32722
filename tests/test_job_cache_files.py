"""The files a job keeps in its cache directory (``<name>.json``,
``<name>.secret``, ``<name>.log``) are this user's and private, however
they are found or made: a re-attach reads the job secret only from a file
checked as the cache is (a link planted to a file others may read was used
silently), a secret path that cannot be written is a typed error naming it
(a directory there gave a raw ``IsADirectoryError``), and under ``umask
000`` neither the directories made above the cache nor the job's log are
left open to others (they were 0777 and 0666)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshio.jobs import JobCacheError, ProcessJob


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
    # nothing started, nothing left but the directory that was there
    assert [p.name for p in cache.iterdir()] == ["job.secret"]


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
                        "a/b/.meshio/job.log": 0o600}
    finally:
        await job.kill()
