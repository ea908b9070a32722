"""Type inference of ``@endpoint``, its adverbs and ``procs.spawn``.

Checked by ``mypy --strict tests/typing/`` and ``pyright`` (strict), never
run (pytest does not collect ``check_*.py``).  Each ``assert_type`` line is a claim about what
mypy infers; each ``# type: ignore[code]`` line is an error mypy must report
(``warn_unused_ignores`` turns a missing error into a failure).
"""

# pyright: reportUnnecessaryTypeIgnoreComment=error
# (each expected-error line below must be an error for pyright too)

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, assert_type

from meshio import (
    Actor,
    ActorMesh,
    Endpoint,
    EndpointDescriptor,
    Point,
    ProcMesh,
    ValueMesh,
    endpoint,
)


class Trainer(Actor):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr

    @endpoint
    async def train(self, step: int) -> float:
        return self.lr * step

    @endpoint
    def sync_ep(self, x: str) -> list[int]:
        return [len(x)]

    @endpoint(concurrent=True)
    async def conc(self, n: int) -> str:
        return str(n)

    @endpoint
    async def nothing(self) -> None:
        pass

    @endpoint
    async def two(self, a: int, b: str = "", *, c: bool = False) -> tuple[int, str, bool]:
        return a, b, c


class Other(Actor):
    @endpoint
    async def ping(self) -> str:
        return "pong"


# ------------------------------------------------------------------ the descriptor


def descriptors() -> None:
    # On the class an endpoint is its descriptor: the honest form's argument.
    train: EndpointDescriptor[Trainer, [int], float] = Trainer.train
    sync_ep: EndpointDescriptor[Trainer, [str], list[int]] = Trainer.sync_ep
    conc: EndpointDescriptor[Trainer, [int], str] = Trainer.conc
    nothing: EndpointDescriptor[Trainer, [], None] = Trainer.nothing
    assert_type(Trainer.train.name, str)
    assert_type(Trainer.conc.concurrent, bool)
    # The result type is the awaited one for ``async def``, not a coroutine.
    wrong: EndpointDescriptor[Trainer, [int], int] = Trainer.train  # type: ignore[assignment]
    del train, sync_ep, conc, nothing, wrong


# ------------------------------------------------------------------ spawn


async def spawning(procs: ProcMesh) -> None:
    trainers = await procs.spawn("t", Trainer, lr=1e-3)
    assert_type(trainers, Trainer)
    assert_type(await procs.spawn("t2", Trainer, 0.1), Trainer)
    assert_type(await procs.spawn("o", Other), Other)

    # Constructor arguments are checked against ``Trainer.__init__``.
    await procs.spawn("t3", Trainer, lr="x")  # type: ignore[arg-type]
    await procs.spawn("t4", Trainer)  # type: ignore[call-arg]
    await procs.spawn("t5", Trainer, lr=1.0, momentum=0.9)  # type: ignore[call-arg]
    await procs.spawn("t6", Trainer, 1.0, 2.0)  # type: ignore[call-arg]
    await procs.spawn("o2", Other, 1)  # type: ignore[call-arg]
    # Only a name and the class are positional-only.
    await procs.spawn(name="t7", cls=Trainer, lr=1.0)  # type: ignore[call-arg]


# ------------------------------------------------------------------ adverbs


async def adverbs(procs: ProcMesh) -> None:
    trainers = await procs.spawn("t", Trainer, lr=1e-3)

    ep: Endpoint[[int], float] = trainers.train
    assert_type(await trainers.train.call(step=0), ValueMesh[float])
    assert_type(await trainers.train.call(0), ValueMesh[float])
    assert_type(trainers.train.call(step=0), asyncio.Future[ValueMesh[float]])
    assert_type(await trainers.train.call_one(step=1), float)
    assert_type(await trainers.train.choose(step=1), float)
    async for item in trainers.train.stream(step=2):
        assert_type(item, tuple[Point, float])
    async for point, value in trainers.train.stream(step=2):
        assert_type(point, Point)
        assert_type(value, float)
    results = trainers.train.stream(step=2)
    assert_type(await anext(results), tuple[Point, float])
    await results.aclose()  # an async generator: closing it cancels the calls left
    assert_type(trainers.train.broadcast(step=3), Awaitable[None])

    # options() keeps the signature, and the adverbs of the result are typed.
    fast: Endpoint[[int], float] = trainers.train.options(timeout=1.0)
    assert_type(await trainers.train.options(timeout=1.0).call(step=0), ValueMesh[float])
    assert_type(await trainers.train.options().call_one(step=0), float)
    assert_type(await fast.choose(0), float)
    trainers.train.options(timeout=1.0).call(step="x")  # type: ignore[arg-type]
    trainers.train.options(timeout="soon")  # type: ignore[arg-type]
    trainers.train.options(1.0)  # type: ignore[call-arg]

    # A plain ``def`` endpoint and a concurrent one are typed the same way.
    assert_type(await trainers.sync_ep.call_one(x="a"), list[int])
    assert_type(await trainers.sync_ep.call("a"), ValueMesh[list[int]])
    assert_type(await trainers.conc.call_one(n=1), str)
    assert_type(await trainers.conc.call(n=1), ValueMesh[str])
    assert_type(await trainers.conc.choose(1), str)
    assert_type(await trainers.nothing.call(), ValueMesh[None])
    assert_type(await trainers.two.call_one(1, "b", c=True), tuple[int, str, bool])
    assert_type(await trainers.two.call_one(a=1), tuple[int, str, bool])
    del ep


async def wrong_arguments(procs: ProcMesh) -> None:
    trainers = await procs.spawn("t", Trainer, lr=1e-3)

    trainers.train.call(step="x")  # type: ignore[arg-type]
    trainers.train.call(stepp=1)  # type: ignore[call-arg]
    trainers.train.call()  # type: ignore[call-arg]
    trainers.train.call(0, 1)  # type: ignore[call-arg]
    trainers.train.call_one(step="x")  # type: ignore[arg-type]
    trainers.train.call_one(stepp=1)  # type: ignore[call-arg]
    trainers.train.choose(step=None)  # type: ignore[arg-type]
    trainers.train.stream(stepp=2)  # type: ignore[call-arg]
    trainers.train.broadcast(step=1.5)  # type: ignore[arg-type]
    trainers.sync_ep.call_one(x=1)  # type: ignore[arg-type]
    trainers.conc.call(n="1")  # type: ignore[arg-type]
    trainers.nothing.call(1)  # type: ignore[call-arg]
    trainers.two.call_one(1, "b", True)  # type: ignore[call-arg]
    # Results are typed too.
    bad: ValueMesh[str] = await trainers.train.call(step=0)  # type: ignore[assignment]
    worse: int = await trainers.sync_ep.call_one(x="")  # type: ignore[assignment]
    # No such endpoint.
    trainers.tain.call(step=0)  # type: ignore[attr-defined]
    del bad, worse


# ------------------------------------------------------------------ signatures


class Signatures(Actor):
    """``*args``, ``**kwargs`` and positional-only parameters keep their types
    (mypy once refused ``@endpoint`` on a method taking ``**kwargs``)."""

    @endpoint
    async def var(self, *a: int, **k: int) -> str:
        return f"{a} {k}"

    @endpoint
    async def kw(self, **k: float) -> list[str]:
        return list(k)

    @endpoint
    def dvar(self, x: int, *rest: int) -> str:
        return f"{x} {rest}"

    @endpoint(concurrent=True)
    async def ckw(self, n: int, **k: str) -> int:
        return n + len(k)

    @endpoint
    async def po(self, x: int, /) -> int:
        return x


async def signatures(procs: ProcMesh) -> None:
    s = await procs.spawn("s", Signatures)
    assert_type(await s.var.call_one(), str)
    assert_type(await s.var.call_one(1, 2, z=3), str)
    assert_type(await s.kw.call(z=1.5), ValueMesh[list[str]])
    assert_type(await s.dvar.call_one(1, 2, 3), str)
    assert_type(await s.dvar.choose(x=1), str)
    assert_type(await s.ckw.call_one(1, a="b"), int)
    assert_type(await s.po.call_one(1), int)
    assert_type(await s.call(Signatures.var, 1, z=2), ValueMesh[str])
    s.var.call_one(1, "two")  # type: ignore[arg-type]
    s.var.call_one(z="three")  # type: ignore[arg-type]
    s.kw.call_one(1.5)  # type: ignore[call-arg]
    s.dvar.call_one()  # type: ignore[call-arg]
    s.ckw.call_one(1, a=2)  # type: ignore[arg-type]
    s.po.call_one(x=1)  # type: ignore[call-arg]
    bad: int = await s.kw.call_one()  # type: ignore[assignment]
    del bad


# ------------------------------------------------------------------ the honest form


async def honest_form(procs: ProcMesh, mesh: ActorMesh[Trainer]) -> None:
    trainers = await procs.spawn("t", Trainer, lr=1e-3)
    assert_type(await trainers.call(Trainer.train, step=0), ValueMesh[float])
    assert_type(trainers.call(Trainer.sync_ep, "a"), asyncio.Future[ValueMesh[list[int]]])
    assert_type(await trainers.call(Trainer.conc, n=2), ValueMesh[str])
    trainers.call(Trainer.train, step="x")  # type: ignore[arg-type]
    trainers.call(Trainer.train, stepp=0)  # type: ignore[call-arg]
    trainers.call(Trainer.train)  # type: ignore[call-arg]
    trainers.call(trainers.train, step=0)  # type: ignore[arg-type]

    # The same on the runtime class, ``ActorMesh[Trainer]``.
    assert_type(await mesh.call(Trainer.train, step=0), ValueMesh[float])
    assert_type(await mesh.call(Trainer.sync_ep, x="a"), ValueMesh[list[int]])
    mesh.call(Trainer.train, step="x")  # type: ignore[arg-type]
    mesh.call(Trainer.train, stepp=0)  # type: ignore[call-arg]
    # Attribute access on the runtime class is dynamic (``__getattr__``).
    assert_type(mesh.train, Endpoint[Any, Any])
