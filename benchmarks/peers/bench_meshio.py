"""meshio backend for the shared peer harness (``../shared/bench-peers``).

Written as a new user writes it: one ``Actor`` with ``@endpoint`` methods
whose arguments carry plain annotations (``object``, ``bytes``,
``torch.Tensor``), one actor per worker process.  The controller runs on
the standard loop (``asyncio.run``) or on uvloop (``meshio.run``), chosen
with ``--loop`` (or ``MESHIO_BENCH_LOOP``, which the harness's cold-start
children inherit); results go under the name ``meshio-<loop>``.

Run every system through the harness with ``python benchmarks/peers/run.py``;
this one alone::

    MESHIO_BENCH_PEERS=../shared/bench-peers python benchmarks/peers/bench_meshio.py \
        --loop uvloop --reps 1 --out /tmp/m.json
"""

import time

_t0 = time.perf_counter()
import meshio  # noqa: E402
from meshio import Actor, endpoint  # noqa: E402

_import_s = time.perf_counter() - _t0

import asyncio  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Coroutine  # noqa: E402
from typing import Any, ClassVar  # noqa: E402
from unittest import mock  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

if "MESHIO_BENCH_PEERS" in os.environ:  # run.py sets it; else harness.py is on sys.path
    sys.path.insert(0, os.environ["MESHIO_BENCH_PEERS"])
import harness  # noqa: E402

#: how the controller's coroutine is run, by ``--loop``
LOOPS: dict[str, Callable[[Coroutine[Any, Any, Any]], Any]] = {
    "asyncio": asyncio.run, "uvloop": meshio.run}


class Bench(Actor):
    @endpoint
    async def ping(self, x: int) -> int:
        return x

    @endpoint
    async def length(self, obj: object) -> int:
        return len(obj)  # type: ignore[arg-type]  # an ndarray or a sequence

    @endpoint
    async def length_bytes(self, data: bytes) -> int:
        return len(data)

    @endpoint
    async def length_tensor(self, t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


class MeshioGroup(harness.Group):
    def __init__(self, procs: meshio.ProcMesh, actors: Bench, n: int) -> None:
        self.procs, self.actors, self.size = procs, actors, n
        self.ranks = [actors.slice(procs=r) for r in range(n)]  # one-actor views

    def ping_nowait(self, rank: int, x: int) -> Any:
        return self.ranks[rank].ping.call_one(x)

    async def ping_all(self, x: int) -> list[int]:
        return (await self.actors.ping.call(x)).values()

    async def length(self, rank: int, obj: Any) -> int:
        # each payload through the endpoint a user would annotate for it
        actor = self.ranks[rank]
        if isinstance(obj, bytes):
            return await actor.length_bytes.call_one(obj)
        if isinstance(obj, torch.Tensor):
            return await actor.length_tensor.call_one(obj)
        return await actor.length.call_one(obj)

    async def pids(self) -> list[int]:
        return (await self.actors.pid.call()).values()

    async def stop(self) -> None:
        await self.procs.stop()


def _tensor_payload(nbytes: int) -> torch.Tensor:
    return torch.ones(nbytes, dtype=torch.uint8)


def _numpy_payload(nbytes: int) -> Any:
    return np.ones(nbytes, dtype=np.uint8)


class MeshioBackend(harness.Backend):
    import_s = _import_s
    extra_payloads: ClassVar[dict[str, Callable[[int], Any]]] = {
        "torch.Tensor": _tensor_payload, "numpy.ndarray": _numpy_payload}

    def __init__(self, loop: str | None = None) -> None:
        self.loop = loop or os.environ.get("MESHIO_BENCH_LOOP", "asyncio")
        if self.loop not in LOOPS:
            raise SystemExit(f"bench_meshio: --loop must be one of {sorted(LOOPS)}, "
                             f"not {self.loop!r}")
        self.name = f"meshio-{self.loop}"
        self.run = LOOPS[self.loop]

    def versions(self) -> dict[str, str]:
        return harness.pkg_versions(["meshio", "msgspec", "uvloop", "cloudpickle", "torch"])

    async def spawn(self, n: int) -> MeshioGroup:
        procs = await meshio.this_host().spawn_procs(per_host={"procs": n})
        actors = await procs.spawn("bench", Bench)
        await actors.pid.call()
        return MeshioGroup(procs, actors, n)

    def notes(self) -> list[str]:
        loop = {"asyncio": "asyncio.run (standard loop)", "uvloop": "meshio.run (uvloop)"}
        return [f"controller: {loop[self.loop]}; workers: meshio's own (uvloop)",
                "this_host().spawn_procs(per_host={'procs': n}); procs.spawn('bench', Bench)",
                "payloads by annotation: bytes -> length_bytes(data: bytes), "
                "torch.Tensor -> length_tensor(t: torch.Tensor), "
                "numpy.ndarray -> length(obj: object)",
                "workers import torch (the actor's annotations name it): in the cold start",
                "single-actor calls via actors.slice(procs=r).ping.call_one(x); "
                "broadcast via actors.ping.call(x) -> ValueMesh"]


def main() -> None:
    if "--loop" in sys.argv:  # ours, not the harness's; its cold-start children inherit it
        i = sys.argv.index("--loop")
        os.environ["MESHIO_BENCH_LOOP"] = sys.argv[i + 1]
        del sys.argv[i:i + 2]
    backend = MeshioBackend()
    # the harness runs its coroutines with asyncio.run: give it this loop's runner
    with mock.patch.object(asyncio, "run", backend.run):
        harness.main(backend, __file__)


if __name__ == "__main__":
    main()
