"""meshio backend for the peer benchmark harness (``../shared/bench-peers``).

Same actor contract as the Monarch/Ray/raw-asyncio backends: ``ping``,
``length``, ``pid``, one actor per worker process.  Run through
``benchmarks/side_by_side.sh`` to compare with Monarch in one run.
"""

import time

_t0 = time.perf_counter()
import meshio  # noqa: E402
from meshio import Actor, endpoint  # noqa: E402

_import_s = time.perf_counter() - _t0

import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any, ClassVar  # noqa: E402

PEERS = os.environ.get(
    "MESHIO_BENCH_PEERS",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "bench-peers"))
sys.path.insert(0, PEERS)
import harness  # noqa: E402


class Bench(Actor):
    @endpoint
    async def ping(self, x: int) -> int:
        return x

    @endpoint
    async def length(self, obj: Any) -> int:
        return obj.numel() * obj.element_size() if hasattr(obj, "numel") else len(obj)

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
        return await self.ranks[rank].length.call_one(obj)

    async def pids(self) -> list[int]:
        return (await self.actors.pid.call()).values()

    async def stop(self) -> None:
        await self.procs.stop()


def _tensor_payload(nbytes: int) -> Any:
    import torch

    return torch.ones(nbytes, dtype=torch.uint8)


class MeshioBackend(harness.Backend):
    name = "meshio"
    import_s = _import_s
    extra_payloads: ClassVar[dict[str, Callable[[int], Any]]] = {
        "torch.Tensor": _tensor_payload}

    def versions(self) -> dict[str, str]:
        return harness.pkg_versions(["meshio", "msgspec", "uvloop", "cloudpickle", "torch"])

    async def spawn(self, n: int) -> MeshioGroup:
        procs = await meshio.this_host().spawn_procs(per_host={"procs": n})
        actors = await procs.spawn("bench", Bench)
        await actors.pid.call()
        return MeshioGroup(procs, actors, n)

    def notes(self) -> list[str]:
        return ["this_host().spawn_procs(per_host={'procs': n}); procs.spawn('bench', Bench)",
                "single-actor calls via actors.slice(procs=r).ping.call_one(x)",
                "broadcast via actors.ping.call(x) -> ValueMesh",
                "controller on uvloop (meshio.run); workers on uvloop"]


def main() -> None:
    # The harness calls asyncio.run; give it uvloop like meshio.run does.
    import asyncio

    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    harness.main(MeshioBackend(), __file__)


if __name__ == "__main__":
    main()
