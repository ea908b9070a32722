"""A worker's first ``import torch`` (the first value holding a tensor it
decodes) holds its event loop for seconds on a loaded host: the call that
brought the tensor failed with "not responding" (workloads probe).  The
worker now tells its controller first (``LoopHeld``), whose heartbeats do
not judge it meanwhile, as while a constructor runs.  Real processes, real
heartbeats, a heartbeat timeout well below what the import takes."""

from __future__ import annotations

import asyncio

import torch

import meshio
from torchless_actors import Sizer

#: generous bound on any single wait on a loaded machine
DEADLINE = 60.0


async def test_a_first_tensor_that_imports_torch_is_no_hang() -> None:
    async with meshio.this_host().spawn_procs(
            per_host={"procs": 1}, heartbeat_interval=0.05, heartbeat_timeout=0.3) as procs:
        sizer = await procs.spawn("sizer", Sizer)
        one = sizer.slice(procs=0)
        assert not await asyncio.wait_for(one.has_torch.call_one(), DEADLINE)  # (else moot)
        assert await asyncio.wait_for(one.length.call_one(torch.ones(5)), DEADLINE) == 5
        assert await asyncio.wait_for(one.has_torch.call_one(), DEADLINE)
        assert procs.holes == []
