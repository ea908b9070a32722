"""Type inference of meshes, values, context, channels and ``meshio.run``.

Checked by ``mypy --strict tests/typing/`` and ``pyright`` (strict), never
run (pytest does not collect ``check_*.py``); see ``check_endpoints.py``.
"""

# pyright: reportUnnecessaryTypeIgnoreComment=error
# (each expected-error line below must be an error for pyright too)

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, assert_type

import meshio
from meshio import (
    Actor,
    ActorMesh,
    Channel,
    Context,
    Extent,
    HostMesh,
    Point,
    Port,
    PortReceiver,
    ProcInfo,
    ProcMesh,
    ValueMesh,
    context,
    current_rank,
    endpoint,
    this_host,
)


class Trainer(Actor):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr

    @endpoint
    async def train(self, step: int) -> float:
        return self.lr * step

    @endpoint
    async def peers(self) -> int:
        # Inside an actor: where am I, and the whole mesh to call peers with.
        ctx = context()
        assert_type(ctx, Context[ActorMesh[Any]])
        assert_type(ctx.point, Point)
        assert_type(ctx.actor_name, str)
        assert_type(ctx.proc, ProcInfo)
        assert_type(ctx.proc.pid, int)
        assert_type(ctx.mesh, ActorMesh[Any])
        # Typed by the actor's own class: its peers' endpoints type-check.
        mine = context(Trainer)
        assert_type(mine, Context[Trainer])
        assert_type(mine.mesh, Trainer)
        assert_type(await mine.mesh.train.call_one(step=1), float)
        assert_type(mine.mesh.slice(gpus=0), Trainer)
        context(int)  # type: ignore[type-var]
        assert_type(current_rank(), Point)
        assert_type(current_rank().rank, int)
        assert_type(current_rank()["gpus"], int)
        # An actor's own endpoint, read on ``self``, is its one-actor endpoint.
        assert_type(await self.train.call_one(step=0), float)
        return len(ctx.mesh)


class Learner(Actor):
    @endpoint
    async def learn(self, trainers: Trainer) -> float:
        # A mesh passed as an argument is typed as its actor class.
        values = await trainers.train.call(step=1)
        return sum(values.values())


# ------------------------------------------------------------------ procs


async def procs_and_hosts() -> None:
    host = this_host()
    assert_type(host, HostMesh)
    pending = host.spawn_procs(per_host={"gpus": 4})
    assert_type(pending, ProcMesh)
    procs = await pending
    assert_type(procs, ProcMesh)
    async with this_host().spawn_procs(per_host={"gpus": 2}, name="workers") as procs2:
        assert_type(procs2, ProcMesh)
        assert_type(procs2.slice(gpus=0), ProcMesh)
    assert_type(procs.pids, list[int])
    assert_type(procs.extent, Extent)
    assert_type(procs.sizes, dict[str, int])
    assert_type(procs.size("gpus"), int)
    host.spawn_procs(per_host=4)  # type: ignore[arg-type]
    await procs.stop()


def set_up() -> None: ...


async def set_up_async() -> None: ...


def set_up_rank(rank: int) -> None: ...


def env_and_bootstrap() -> None:
    host = this_host()
    # any function of no arguments, plain or coroutine; its result is ignored
    assert_type(host.spawn_procs(env={"NCCL_DEBUG": "INFO"}, bootstrap=set_up), ProcMesh)
    assert_type(host.spawn_procs(bootstrap=set_up_async), ProcMesh)
    assert_type(host.spawn_procs(bootstrap=lambda: 42), ProcMesh)
    host.spawn_procs(env={"NCCL_DEBUG": 1})  # type: ignore[dict-item]
    host.spawn_procs(env=["NCCL_DEBUG=INFO"])  # type: ignore[arg-type]
    host.spawn_procs(bootstrap=set_up_rank)  # type: ignore[arg-type]
    host.spawn_procs(bootstrap="set_up")  # type: ignore[arg-type]


# ------------------------------------------------------------------ mesh operations


async def mesh_operations(procs: ProcMesh, mesh: ActorMesh[Trainer]) -> None:
    trainers = await procs.spawn("t", Trainer, lr=1e-3)

    # Mesh operations keep the actor type, so endpoints stay typed.
    assert_type(trainers.slice(gpus=0), Trainer)
    assert_type(trainers.slice(gpus=slice(0, 2), hosts=1), Trainer)
    assert_type(trainers.flatten("x"), Trainer)
    assert_type(trainers.rename(gpus="g"), Trainer)
    assert_type(trainers.split("gpus", nodes=2, local=-1), Trainer)
    assert_type(trainers.slice(gpus=0).rename(gpus="g").flatten("x"), Trainer)
    assert_type(await trainers.slice(gpus=0).train.call_one(step=1), float)
    assert_type(trainers.extent, Extent)
    assert_type(trainers.sizes, dict[str, int])
    assert_type(trainers.size(), int)
    assert_type(trainers.size("gpus"), int)
    assert_type(len(trainers), int)
    assert_type(iter(trainers), Iterator[Point])
    for point in trainers:
        assert_type(point, Point)
    assert_type(await trainers.stop(), None)

    trainers.slice(gpus="0")  # type: ignore[arg-type]
    trainers.flatten()  # type: ignore[call-arg]
    trainers.rename(gpus=0)  # type: ignore[arg-type]
    trainers.split("gpus", nodes="2")  # type: ignore[arg-type]
    trainers.size(0)  # type: ignore[arg-type]

    # Passing a mesh where its actor class is expected.
    learners = await procs.spawn("l", Learner)
    assert_type(await learners.learn.call(trainers=trainers), ValueMesh[float])
    learners.learn.call(trainers=learners)  # type: ignore[arg-type]

    # The runtime class is generic in the actor class.
    assert_type(mesh.slice(gpus=0), ActorMesh[Trainer])
    assert_type(mesh.flatten("x"), ActorMesh[Trainer])
    assert_type(mesh.rename(gpus="g"), ActorMesh[Trainer])


# ------------------------------------------------------------------ values


async def value_meshes(procs: ProcMesh) -> None:
    trainers = await procs.spawn("t", Trainer, lr=1e-3)
    losses = await trainers.train.call(step=0)
    assert_type(losses, ValueMesh[float])
    assert_type(losses.item(gpus=0), float)
    assert_type(losses.item(), float)
    assert_type(losses.values(), list[float])
    assert_type(losses.items(), list[tuple[Point, float]])
    for point, loss in losses.items():
        assert_type(point, Point)
        assert_type(loss, float)
    assert_type(losses.slice(gpus=0), ValueMesh[float])
    assert_type(losses.flatten("x"), ValueMesh[float])
    assert_type(losses.rename(gpus="g"), ValueMesh[float])
    assert_type(losses.split("gpus", a=2, b=-1), ValueMesh[float])
    assert_type(losses.extent, Extent)
    assert_type(list(losses), list[Point])
    assert_type(losses == losses, bool)

    losses.item(gpus="0")  # type: ignore[arg-type]
    as_str: list[str] = losses.values()  # type: ignore[assignment]
    del as_str


# ------------------------------------------------------------------ channels


async def channels(procs: ProcMesh) -> None:
    opened = Channel[int].open()
    assert_type(opened, tuple[Port[int], PortReceiver[int]])
    port, recv = opened
    assert_type(await recv.recv(), int)
    async for value in recv:
        assert_type(value, int)
    assert_type(port.send(1), None)
    assert_type(port.close(), None)
    assert_type(recv.close(), None)
    port.send("one")  # type: ignore[arg-type]

    texts, text_recv = Channel[str].open()
    assert_type(await text_recv.recv(), str)
    wrong: Port[int] = texts  # type: ignore[assignment]
    del wrong


# ------------------------------------------------------------------ run


async def main() -> int:
    procs = await this_host().spawn_procs()
    await procs.stop()
    return 0


async def nothing() -> None:
    pass


def running() -> None:
    assert_type(meshio.run(main()), int)
    assert_type(meshio.run(main(), debug=True), int)
    meshio.run(nothing())
    meshio.run(main)  # type: ignore[arg-type]
