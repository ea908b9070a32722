"""More of the jobs' arguments, checked when the job is made, and an agent
that does not start.

``cache_dir=3`` was ``TypeError: expected str, bytes or os.PathLike object,
not int`` from ``Path()``, naming neither the job nor the argument; a mesh
named ``meshes`` was taken (``state.meshes`` is then the dict of all the
meshes), as was a keyword (``state.class`` is a syntax error); a mesh name
that is no str was a ``ValueError``.  An agent that did not start was a
bare ``RuntimeError`` whose reason was only in the job's log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from meshio.jobs import ClusterError, Job, KubernetesJob, LocalJob, ProcessJob, SlurmJob


def _process(tmp_path: Path, **kw: Any) -> ProcessJob:
    return ProcessJob(**{"meshes": {"a": 1}, "cache_dir": tmp_path, **kw})


def _slurm(tmp_path: Path, **kw: Any) -> SlurmJob:
    return SlurmJob(**{"meshes": {"a": 1}, "cache_dir": tmp_path, **kw})


def _kubernetes(tmp_path: Path, **kw: Any) -> KubernetesJob:
    return KubernetesJob(**{"meshes": {"a": 1}, "image": "meshio:dev", "cache_dir": tmp_path,
                            **kw})


MAKERS = {"ProcessJob": _process, "SlurmJob": _slurm, "KubernetesJob": _kubernetes}


@pytest.mark.parametrize("kind", sorted(MAKERS))
@pytest.mark.parametrize(("cache_dir", "got"), [
    (3, "int 3"), (None, "NoneType None"), (b".meshio", "bytes b'.meshio'")])
def test_a_cache_dir_that_is_no_path_is_a_type_error_naming_it(
        tmp_path: Path, kind: str, cache_dir: object, got: str) -> None:
    with pytest.raises(TypeError, match=rf"^{kind}\(cache_dir=\.\.\.\) must be a path "
                                        rf"\(a str or os\.PathLike\), got {got}$"):
        MAKERS[kind](tmp_path, cache_dir=cache_dir)


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_cache_dir_with_nul_is_refused_when_the_job_is_made(tmp_path: Path,
                                                              kind: str) -> None:
    with pytest.raises(ValueError, match=rf"^{kind}\(cache_dir=\.\.\.\) must be a path "
                                         "without NUL"):
        MAKERS[kind](tmp_path, cache_dir=f"{tmp_path}/a\0b")


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_cache_dir_may_be_a_str_or_a_path(tmp_path: Path, kind: str) -> None:
    assert MAKERS[kind](tmp_path, cache_dir=str(tmp_path)).cache.parent \
        == MAKERS[kind](tmp_path).cache.parent


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_mesh_name_that_is_no_str_is_a_type_error(tmp_path: Path, kind: str) -> None:
    with pytest.raises(TypeError, match=r"^mesh name 1 must be a str .*got int$"):
        MAKERS[kind](tmp_path, meshes={1: 1})


@pytest.mark.parametrize(("name", "why"), [
    ("meshes", r"is an attribute of the job's state \(state\.meshes is not a host mesh\)"),
    ("__iter__", r"is an attribute of the job's state"),
    ("class", r"is a Python keyword: state\.<name> must name the mesh"),
    ("None", r"is a Python keyword"),
    ("a-b", r"is not an identifier: state\.<name> must name the mesh"),
])
@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_mesh_name_state_cannot_give_is_refused(tmp_path: Path, kind: str, name: str,
                                                  why: str) -> None:
    with pytest.raises(ValueError, match=rf"^mesh name '{name}' {why}"):
        MAKERS[kind](tmp_path, meshes={"ok": 1, name: 1})
    with pytest.raises(ValueError, match=rf"^mesh name '{name}' {why}"):
        LocalJob({name: 1})


async def test_every_allowed_mesh_name_is_an_attribute_of_the_state() -> None:
    state = await LocalJob({"trainers": 1, "kind": 1, "apply": 1}).state()
    assert [getattr(state, name) for name in state] == list(state.meshes.values())


def test_a_host_of_blanks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^ProcessJob 'job': host must be an address of this "
                                         r"machine, got ' '$"):
        _process(tmp_path, host=" ")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("host", "reason"), [
    ("no-such-host.invalid", "cannot resolve 'no-such-host.invalid'"),
    # (TEST-NET-1: documentation only, an address of no machine)
    ("192.0.2.1", "cannot listen on 192.0.2.1:0"),
])
async def test_an_agent_that_does_not_start_is_a_cluster_error_saying_why(
        tmp_path: Path, host: str, reason: str) -> None:
    """The error names the host and gives the agent's own reason: the last
    line it wrote to the job's log (a real agent process, which fails)."""
    job = _process(tmp_path, host=host)
    try:
        with pytest.raises(ClusterError) as info:
            await job.apply()
    finally:
        await job.kill()
    message = str(info.value)
    assert message.startswith(f"ProcessJob 'job': an agent did not start on host {host!r}: "
                              "meshio agent: "), message
    assert reason in message and message.endswith(f"(see {tmp_path / 'job.log'})"), message
    assert isinstance(info.value, RuntimeError)  # (as before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.lock", "job.log"]



def test_every_job_kind_is_a_job_to_isinstance(tmp_path: Path) -> None:
    """``meshio.jobs.Job`` is the protocol every job kind shares:
    ``isinstance(job, Job)`` holds for each (it raised TypeError, the
    protocol not being runtime-checkable), and not for what is no job."""
    jobs = [LocalJob(meshes={"a": 1}), *(make(tmp_path) for make in MAKERS.values())]
    assert [type(job).__name__ for job in jobs if isinstance(job, Job)] == [
        "LocalJob", "ProcessJob", "SlurmJob", "KubernetesJob"]
    assert not isinstance(tmp_path, Job)
