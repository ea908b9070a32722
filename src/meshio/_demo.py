"""``meshio demo``: a tour of the core runtime with timings."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import meshio
from meshio import Actor, endpoint

T = TypeVar("T")
#: the width of the table's first column: its longest label's, "send a list
#: of floats (install torch for tensors)" (without torch)
_LABEL = 49


class Learner(Actor):
    """Holds a weight; ``step`` nudges it."""

    def __init__(self, weight: float) -> None:
        self.weight = weight

    @endpoint
    async def step(self, grad: float) -> float:
        self.weight -= 0.1 * grad
        return self.weight

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def norm(self, data: Any) -> float:
        """Sum of squares of a tensor (or of a list of floats without torch)."""
        if hasattr(data, "pow"):
            return float(data.pow(2).sum())
        return float(sum(x * x for x in data))

    @endpoint
    async def fail(self, why: str) -> None:
        raise RuntimeError(why)


class Generator(Actor):
    """Calls the learners directly (not through the controller)."""

    def __init__(self, learners: Learner) -> None:
        self.learners = learners

    @endpoint
    async def rollout(self, grad: float) -> list[float]:
        weights = await self.learners.step.call(grad=grad)
        return weights.values()


async def _timed(label: str, fn: Callable[[], Awaitable[T]]) -> T:
    t0 = time.perf_counter()
    result = await fn()
    print(f"  {label:<{_LABEL}} {(time.perf_counter() - t0) * 1e3:8.2f} ms   -> {result!r}")
    return result


#: torch installed without numpy warns when imported, in the controller and
#: in each worker (which imports torch to receive a tensor): nothing the demo's
#: reader did or can act on, and it would land in the middle of the table
_TORCH_NUMPY_WARNING = "Failed to initialize NumPy"


def _import_torch() -> Any:
    """torch, or None; imported before the table starts, its NumPy warning
    silenced here and (through ``PYTHONWARNINGS``, which workers inherit) in
    the workers."""
    quiet = f"ignore:{_TORCH_NUMPY_WARNING}:UserWarning"
    os.environ["PYTHONWARNINGS"] = ",".join(  # the last filter wins
        w for w in (os.environ.get("PYTHONWARNINGS"), quiet) if w)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TORCH_NUMPY_WARNING, category=UserWarning)
        try:
            import torch
        except ImportError:
            return None
    return torch


async def demo(procs_per_host: int = 2) -> None:
    torch = _import_torch()
    print(f"meshio demo: controller pid {os.getpid()}, {procs_per_host} worker processes")
    t0 = time.perf_counter()
    async with meshio.this_host().spawn_procs(per_host={"gpus": procs_per_host}) as procs:
        print(f"  {'spawn_procs (start workers)':<{_LABEL}} "
              f"{(time.perf_counter() - t0) * 1e3:8.2f} ms")
        learners = await _timed("spawn learners", lambda: procs.spawn("learners", Learner, 1.0))
        await _timed("call: pid on every learner", lambda: learners.pid.call())
        await _timed("call: step on every learner", lambda: learners.step.call(grad=0.5))
        await _timed("call_one: slice(gpus=0).step",
                     lambda: learners.slice(gpus=0).step.call_one(grad=1.0))
        await _timed("choose: one learner, load-balanced", lambda: learners.step.choose(grad=0.0))

        async def streamed() -> list[tuple[dict[str, int], float]]:
            return [(dict(p), v) async for p, v in learners.step.stream(grad=0.0)]

        await _timed("stream: (point, value) as they arrive", streamed)
        learners.step.broadcast(grad=0.0)
        print(f"  {'broadcast: step, fire and forget':<{_LABEL}} {'':>8}      (no reply)")
        gens = await _timed("spawn generators holding a learner mesh",
                            lambda: procs.spawn("generators", Generator, learners))
        await _timed("generator -> learners (actor to actor)",
                     lambda: gens.slice(gpus=0).rollout.call_one(grad=0.0))
        if torch is not None:
            payload: Any = torch.ones(1 << 20)
            what = "tensor (4 MiB, out of band)"
        else:
            payload = [1.0] * 1000
            what = "list of floats (install torch for tensors)"
        first = learners.slice(gpus=0)
        await _timed("send it once (the worker imports torch)" if torch is not None
                     else "send it once", lambda: first.norm.call_one(payload))
        await _timed(f"send a {what}", lambda: first.norm.call_one(payload))
        t1 = time.perf_counter()
        try:
            await learners.fail.call(why="demo failure")
        except meshio.ActorError as e:
            err = e.failures[0][1] if e.failures else e
            assert isinstance(err, meshio.ActorError)
            print(f"  {'remote error arrives as ActorError':<{_LABEL}} "
                  f"{(time.perf_counter() - t1) * 1e3:8.2f} ms   -> {err.remote_type}: "
                  f"{err.remote_message} (ranks {[p.rank for p, _ in e.failures]})")
        one = learners.slice(gpus=0)
        n = 2000
        t1 = time.perf_counter()
        for _ in range(n):
            await one.pid.call_one()
        per_call = (time.perf_counter() - t1) / n * 1e6
        print(f"  {'round trip, one call at a time':<{_LABEL}} {per_call:8.1f} us/call")
    print(f"  {'total (procs stopped)':<{_LABEL}} {(time.perf_counter() - t0) * 1e3:8.2f} ms")
