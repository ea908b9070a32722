"""What checkers infer for elastic meshes (holes, ``replace``, ``grow``,
``shrink``, ``job.resize``, ``spawn_procs(elastic=True)``); mypy --strict
and pyright (strict) check this file, nothing runs it.  ``assert_type``:
an inferred type; ``# type: ignore[code]``: an error the checker must
report.
"""

# pyright: reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from typing import assert_type

import meshio
from meshio import Actor, Point, ValueMesh, endpoint
from meshio.jobs import Job, KubernetesJob, LocalJob, ProcessJob, SlurmJob


class Trainer(Actor):
    @endpoint
    def step(self, n: int) -> float:
        return 0.1 * n


async def use(procs: meshio.ProcMesh) -> None:
    trainers = await procs.spawn("trainers", Trainer)
    losses = await trainers.step.call(n=1)
    assert_type(losses, ValueMesh[float])
    assert_type(losses.holes, list[Point])
    assert_type(losses.values(), list[float])
    assert_type(losses.item(gpus=0), float)
    assert_type(procs.holes, list[Point])

    assert_type(await procs.replace(1), None)
    assert_type(await procs.replace(losses.holes[0]), None)
    assert_type(await procs.replace({"gpus": 1}), None)
    assert_type(await procs.grow(gpus=2), None)
    assert_type(await procs.shrink(gpus=2), None)

    await procs.replace("1")  # type: ignore[arg-type]
    await procs.grow(gpus=1.5)  # type: ignore[arg-type]
    await procs.shrink(gpus="2")  # type: ignore[arg-type]
    losses.holes = []  # type: ignore[misc]


async def resize(job: ProcessJob, slurm: SlurmJob, k8s: KubernetesJob, local: LocalJob) -> None:
    state = await job.state()
    procs = state.workers.spawn_procs(per_host={"gpus": 2}, elastic=True)
    assert_type(procs, meshio.ProcMesh)
    assert_type(await job.resize("workers", hosts=4), None)
    assert_type(await slurm.resize("workers", hosts=4), None)
    assert_type(await k8s.resize("workers", hosts=4), None)
    assert_type(await local.resize("workers", hosts=1), None)
    jobs: list[Job] = [job, slurm, k8s, local]  # every kind is a Job, resize included
    assert_type(await jobs[0].resize("workers", hosts=2), None)
    assert_type(await meshio.setup_torch_distributed(procs), list[Point])

    await job.resize("workers", 4)  # type: ignore[call-arg]
    await job.resize("workers", hosts=2.0)  # type: ignore[arg-type]
    await job.resize(name="workers", hosts=2)  # type: ignore[call-arg]
    state.workers.spawn_procs(elastic="yes")  # type: ignore[arg-type]
