"""Type inference of supervision, RDMA buffers and the torch helper.

Checked by ``mypy --strict tests/typing/`` and ``pyright`` (strict), never
run (pytest does not collect ``check_*.py``).
"""

# pyright: reportUnnecessaryTypeIgnoreComment=error
# (each expected-error line below must be an error for pyright too)

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Literal, assert_type

import torch

import meshio
from meshio import Actor, RDMABuffer, SupervisionError, SupervisionEvent, Supervisor, endpoint
from meshio.rdma import Backend, Handle, available_backends, backend_for
from meshio.supervision import ManualClock


class Worker(Actor):
    def __init__(self, n: int) -> None:
        self.n = n

    @endpoint
    async def buffer(self) -> RDMABuffer:
        return RDMABuffer(bytearray(self.n))


async def supervision() -> None:
    sup = Supervisor(strategy="one_for_all", max_restarts=3, within=60.0)
    child = Supervisor("rest_for_one", parent=sup, clock=ManualClock())
    assert_type(child.parent, Supervisor | None)
    Supervisor(strategy="one_for_some")  # type: ignore[arg-type]
    procs = meshio.this_host().spawn_procs(per_host={"gpus": 2}, supervisor=sup,
                                           restart="transient", shutdown="brutal_kill")
    meshio.this_host().spawn_procs(restart="sometimes")  # type: ignore[arg-type]
    meshio.this_host().spawn_procs(shutdown="gently")  # type: ignore[arg-type]
    workers = await procs.spawn("w", Worker, 4)
    assert_type(workers, Worker)
    assert_type(procs.options(restart="transient"), meshio.ProcMesh)
    assert_type(await procs.options(restart="temporary").spawn("t", Worker, 4), Worker)
    assert_type(await procs.options(restart="permanent").spawn("p", Worker, n=4), Worker)
    await procs.options(restart="transient").spawn("t", Worker, "4")  # type: ignore[arg-type]
    await procs.spawn("t", Worker, 4, restart="transient")  # type: ignore[call-arg]
    procs.options(restart="sometimes")  # type: ignore[arg-type]
    assert_type(sup.events(), AsyncGenerator[SupervisionEvent, None])
    async for event in sup.events():
        assert_type(event.kind, Literal["failure", "restart", "escalation", "stopped", "stall",
                                        "poison"])
        assert_type(event.rank, int)
        assert_type(event.cause, str)
        break
    assert_type(await sup.wait_failed(), SupervisionError)
    assert_type(await procs.ready(), None)
    assert_type(await procs.slice(gpus=0).ready(), None)
    assert_type(sup.failure, SupervisionError | None)


async def rdma() -> None:
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 2})
    workers = await procs.spawn("w", Worker, 16)
    buf = await workers.slice(procs=0).buffer.call_one()
    assert_type(buf, RDMABuffer)
    assert_type(await buf.read_into(bytearray(16), offset=0, length=16), int)
    assert_type(await buf.write_from(b"x" * 16, offset=0), int)
    assert_type(await buf.options(timeout=1.0).read_into(bytearray(16)), int)
    assert_type(buf.backend, Backend)
    assert_type(buf.size, int)
    assert_type(buf.handle, Handle)
    assert_type(backend_for(buf), Backend)
    assert_type(available_backends(), tuple[Backend, ...])
    RDMABuffer(bytearray(16), backend="gpu")  # type: ignore[arg-type]
    await buf.read_into(bytearray(16), offset="0")  # type: ignore[arg-type]
    # Only memory: objects with the buffer protocol, or tensors.
    RDMABuffer(memoryview(bytearray(8)))
    RDMABuffer(torch.zeros(8))
    RDMABuffer("not memory")  # type: ignore[arg-type]
    RDMABuffer([0, 1, 2])  # type: ignore[arg-type]
    await buf.write_from(torch.ones(4))
    await buf.read_into(16)  # type: ignore[arg-type]
    assert_type(await buf.drop(), None)
    assert_type(await meshio.setup_torch_distributed(procs, master_port=29500),
                list[meshio.Point])
