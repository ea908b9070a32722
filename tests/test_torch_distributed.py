"""torch.distributed (gloo, CPU) inside a proc mesh, set up by meshio."""

from __future__ import annotations

import asyncio

import pytest

import meshio
from meshio import Actor, endpoint

torch = pytest.importorskip("torch")


class Worker(Actor):
    @endpoint
    def env(self) -> dict[str, str]:
        import os

        return {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                            "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}

    @endpoint
    async def all_reduce(self, value: float) -> float:
        import torch.distributed as dist

        if not dist.is_initialized():
            # init blocks until every rank joined: run it off the actor's loop
            await asyncio.to_thread(dist.init_process_group, "gloo")
        t = torch.tensor([value])
        await asyncio.to_thread(dist.all_reduce, t)
        return float(t.item())


async def test_gloo_all_reduce_across_the_mesh() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 3}) as procs:
        await meshio.setup_torch_distributed(procs)
        workers = await procs.spawn("workers", Worker)
        envs = (await workers.env.call()).values()
        assert [e["RANK"] for e in envs] == ["0", "1", "2"]
        assert {e["WORLD_SIZE"] for e in envs} == {"3"}
        assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2"]
        assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
        result = await asyncio.wait_for(workers.all_reduce.call(1.5), 120)
        assert result.values() == [4.5, 4.5, 4.5]


async def test_explicit_master_port() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        await meshio.setup_torch_distributed(procs, master_port=29512)
        workers = await procs.spawn("workers", Worker)
        assert {e["MASTER_PORT"] for e in (await workers.env.call()).values()} == {"29512"}
