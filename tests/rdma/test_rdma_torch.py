"""RDMA with torch tensors, on every backend.  torch is imported here at
collection, not inside a test (under the emulated soft-RoCE VM its import
alone outlasts a test's timeout), and only by the controller: the workers
import the actors from ``rdma_actors``."""

from __future__ import annotations

import pytest

from meshio import RDMABuffer
from meshio.rdma import RDMAError, RDMASizeError
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


async def test_a_meta_tensor_is_refused_for_having_no_data() -> None:
    """A meta tensor was refused as GPU memory lacking GPUDirect "which this
    host does not offer"; it has no memory at all, and the message says so."""
    for call in (lambda: RDMABuffer(torch.zeros(4, device="meta")),
                 lambda: RDMABuffer(bytearray(16)).read_into(torch.zeros(4, device="meta"))):
        with pytest.raises(RDMAError) as info:
            await call()  # (RDMABuffer raises before there is anything to await)
        message = str(info.value)
        assert "a meta tensor has no data" in message
        assert "GPU" not in message and "this host" not in message


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_a_cuda_tensor_is_refused_as_not_implemented() -> None:
    """GPU memory is refused as not implemented (on any host), not as
    hardware this host lacks."""
    with pytest.raises(RDMAError) as info:
        RDMABuffer(torch.zeros(4, device="cuda"))
    message = str(info.value)
    assert "a tensor on cuda:0" in message and "is not implemented" in message
    assert "this host does not offer" not in message


async def test_integer_tensors_are_offsets_and_lengths() -> None:
    data = bytearray(range(32))
    buf = RDMABuffer(data)
    dst = bytearray(4)
    assert await buf.read_into(dst, offset=torch.tensor(4), length=torch.tensor(4)) == 4
    assert dst == data[4:8]
    for bad in (torch.tensor(True), torch.tensor(1.0)):
        with pytest.raises(TypeError, match="offset must be an integer"):
            await buf.read_into(dst, offset=bad)
    await buf.drop()
