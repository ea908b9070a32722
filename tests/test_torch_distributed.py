"""torch.distributed (gloo, CPU) inside a proc mesh, set up by meshio."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from supervision_helpers import DEADLINE, Events, manual_sup

import meshio
from meshio import Actor, endpoint

torch = pytest.importorskip("torch")


class Worker(Actor):
    @endpoint
    def env(self) -> dict[str, str]:
        return {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                            "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}

    @endpoint
    async def all_reduce(self, value: float) -> float:
        return await _all_reduce(value)

    @endpoint
    async def regroup(self, value: float) -> float:
        """all_reduce in a new process group, of the world set up last."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        return await _all_reduce(value)


async def _all_reduce(value: float) -> float:
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


async def test_one_for_all_replacements_keep_the_world_on_a_fresh_port() -> None:
    """After SIGKILL and a one_for_all restart, every replacement has its
    predecessor's torch.distributed settings (a fresh MASTER_PORT for the new
    rank 0), and the new processes form a process group."""
    sup, _ = manual_sup("one_for_all")
    async with Events(sup) as events, meshio.this_host().spawn_procs(
            per_host={"procs": 2}, supervisor=sup) as procs:
        await meshio.setup_torch_distributed(procs)
        workers = await procs.spawn("workers", Worker)
        before = (await workers.env.call()).values()
        assert (await asyncio.wait_for(workers.all_reduce.call(1.0), 120)).values() == [2.0] * 2
        old = procs.pids
        os.kill(old[1], signal.SIGKILL)
        await events.next("failure", rank=1)
        await asyncio.wait_for(procs.ready(), DEADLINE)
        assert not set(procs.pids) & set(old)
        after = (await workers.env.call()).values()
        ports = {e["MASTER_PORT"] for e in after}
        assert len(ports) == 1 and ports != {before[0]["MASTER_PORT"]}
        assert [{**e, "MASTER_PORT": ""} for e in after] == [
            {**e, "MASTER_PORT": ""} for e in before]
        result = await asyncio.wait_for(workers.all_reduce.call(2.5), 120)
        assert result.values() == [5.0, 5.0]


async def test_one_for_one_replacement_meets_the_surviving_rank_0() -> None:
    """A replacement restarted without rank 0 gets exactly its predecessor's
    settings: the rendezvous of the rank 0 that still runs."""
    sup, _ = manual_sup("one_for_one")
    async with Events(sup) as events, meshio.this_host().spawn_procs(
            per_host={"procs": 2}, supervisor=sup) as procs:
        await meshio.setup_torch_distributed(procs)
        workers = await procs.spawn("workers", Worker)
        before = (await workers.env.call()).values()
        os.kill(procs.pids[1], signal.SIGKILL)
        await events.next("restart", rank=1)
        assert (await workers.env.call()).values() == before


async def test_a_hole_is_left_out_of_the_world_and_its_replacement_joins_the_next() -> None:
    """issue 17 §3/§4: with rank 1 SIGKILLed and no supervisor (a hole),
    setup_torch_distributed makes a world of the live processes (ranks
    compacted, a fresh port) whose gloo all_reduce works without the
    survivors being restarted; after procs.replace(1) the next call makes a
    world of all three again."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 3}) as procs:
        world = await meshio.setup_torch_distributed(procs)
        assert [p.rank for p in world] == [0, 1, 2]
        workers = await procs.spawn("workers", Worker)
        first = (await workers.env.call()).values()
        survivors = [procs.pids[0], procs.pids[2]]
        os.kill(procs.pids[1], signal.SIGKILL)
        await procs.wait_failed()

        world = await meshio.setup_torch_distributed(procs)
        assert [dict(p) for p in world] == [{"procs": 0}, {"procs": 2}]
        envs = await workers.env.call()
        assert [dict(p) for p in envs.holes] == [{"procs": 1}]
        assert [(e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"])
                for e in envs.values()] == [("0", "2", "0", "2"), ("1", "2", "1", "2")]
        port = envs.values()[0]["MASTER_PORT"]
        assert {e["MASTER_PORT"] for e in envs.values()} == {port} != {first[0]["MASTER_PORT"]}
        assert (await asyncio.wait_for(workers.regroup.call(1.5), 120)).values() == [3.0, 3.0]
        assert [procs.pids[0], procs.pids[2]] == survivors

        await procs.replace(1)
        world = await meshio.setup_torch_distributed(procs)
        assert [p.rank for p in world] == [0, 1, 2]
        envs = await workers.env.call()
        assert [e["RANK"] for e in envs.values()] == ["0", "1", "2"]
        assert {e["WORLD_SIZE"] for e in envs.values()} == {"3"}
        assert (await asyncio.wait_for(workers.regroup.call(1.0), 120)).values() == [3.0] * 3
        assert [procs.pids[0], procs.pids[2]] == survivors


async def test_every_process_a_hole_is_a_supervision_error() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        os.kill(procs.pids[0], signal.SIGKILL)
        await procs.wait_failed()
        with pytest.raises(meshio.SupervisionError, match="every process of proc mesh 'procs' "
                                                          "is a hole; replace one first"):
            await meshio.setup_torch_distributed(procs)
