"""RDMA with torch tensors, on every backend.  torch is imported here at
collection, not inside a test (under the emulated soft-RoCE VM its import
alone outlasts a test's timeout), and only by the controller: the workers
import the actors from ``rdma_actors``."""

from __future__ import annotations

import pytest

from meshio import RDMABuffer
from meshio.rdma import RDMASizeError
from rdma_actors import N, Owner, Peer

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.filterwarnings("ignore::meshio.RDMAFallbackWarning")


async def test_controller_reads_into_a_tensor(pair: tuple[Owner, Peer], backend: str) -> None:
    owner, _ = pair
    buf = await owner.register.call_one(backend)
    dst = torch.zeros(N // 4, dtype=torch.int32)
    await buf.read_into(dst)
    assert bytes(dst.numpy().tobytes()) == await owner.content.call_one(0, N)


async def test_a_non_contiguous_tensor_is_refused() -> None:
    with pytest.raises(RDMASizeError, match="not contiguous"):
        RDMABuffer(torch.zeros(4, 4).t())
