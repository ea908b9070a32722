"""The arguments of ``ProcessJob`` and ``SlurmJob``, checked when the job is
made: a wrong type or value is a ``TypeError``/``ValueError`` naming the
argument, not an ``AttributeError`` later, an agent that exits at once
("cannot reach host agent") or one that never exits and spins a CPU
(``idle_timeout=nan``).  Nothing is started: no process, no Slurm."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from meshio.jobs import ProcessJob, SlurmJob

BAD_SECONDS: list[tuple[object, type[Exception]]] = [
    (float("nan"), ValueError), (0, ValueError), (-1, ValueError), (-math.inf, ValueError),
    (10**400, ValueError), (None, TypeError), ("30", TypeError), (True, TypeError)]


@pytest.mark.parametrize("kind", [ProcessJob, SlurmJob])
@pytest.mark.parametrize(("value", "error"), BAD_SECONDS)
def test_idle_timeout_must_be_seconds_above_zero(tmp_path: Path, kind: type[Any],
                                                 value: object,
                                                 error: type[Exception]) -> None:
    with pytest.raises(error, match=rf"{kind.__name__}\(idle_timeout=\.\.\.\) must be"):
        kind(meshes={"a": 1}, cache_dir=tmp_path, idle_timeout=value)
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("kind", [ProcessJob, SlurmJob])
def test_idle_timeout_may_be_a_number_or_never(tmp_path: Path, kind: type[Any]) -> None:
    for value in (0.5, 1, math.inf):
        assert kind(meshes={"a": 1}, cache_dir=tmp_path, idle_timeout=value).idle_timeout \
            == value


@pytest.mark.parametrize("kind", [ProcessJob, SlurmJob])
def test_name_and_tls_of_the_wrong_type_are_refused(tmp_path: Path, kind: type[Any]) -> None:
    """``name=5`` was an AttributeError (``5.replace``); ``tls="cert.pem"`` an
    AttributeError only at ``state()``."""
    with pytest.raises(TypeError, match=r"name must be a str.*got int 5"):
        kind(meshes={"a": 1}, cache_dir=tmp_path, name=5)
    with pytest.raises(ValueError, match=r"job name '\.\./x' must be letters"):
        kind(meshes={"a": 1}, cache_dir=tmp_path, name="../x")
    with pytest.raises(TypeError, match=r"tls must be a meshio.TLSConfig.*got str"):
        kind(meshes={"a": 1}, cache_dir=tmp_path, tls=str(tmp_path / "cert.pem"))


def test_process_job_host_must_be_a_str(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="host must be a str"):
        ProcessJob(meshes={"a": 1}, cache_dir=tmp_path, host=1234)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="host must be an address of this machine, got ''"):
        ProcessJob(meshes={"a": 1}, cache_dir=tmp_path, host="")


def test_slurm_job_options_of_the_wrong_type_are_refused(tmp_path: Path) -> None:
    """``sbatch_args`` as one str was split into one-letter options."""
    def make(**kw: Any) -> SlurmJob:
        return SlurmJob(meshes={"a": 1}, cache_dir=tmp_path, **kw)

    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
            ({"sbatch_args": "--mem=100"}, TypeError, "sbatch_args must be a list of str"),
            ({"sbatch_args": ["--mem", 100]}, TypeError, "sbatch_args must be a list of str"),
            ({"partition": 1}, TypeError, "partition must be a str"),
            ({"time_limit": 60}, TypeError, "time_limit must be a str"),
            ({"exclusive": "no"}, TypeError, "exclusive must be a bool"),
            ({"start_timeout": 0}, ValueError, r"start_timeout=\.\.\.\) must be seconds > 0"),
            ({"start_timeout": float("nan")}, ValueError,
             r"start_timeout=\.\.\.\) must be seconds > 0"),
            ({"start_timeout": 10**400}, ValueError, r"start_timeout=\.\.\.\) .* too large"),
            ({"start_timeout": None}, TypeError,
             r"start_timeout=\.\.\.\) must be a number of seconds")]
    for kw, error, match in cases:
        with pytest.raises(error, match=match):
            make(**kw)
    assert make(sbatch_args=("--mem=100",)).sbatch_args == ["--mem=100"]
