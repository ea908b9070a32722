"""Memory whose bytes are not what another process may copy is refused, as
a buffer to register and as a transfer's destination or source, with a
message saying what to do: a NumPy ``dtype=object`` array holds object
pointers (a peer's write into one crashed the owner), a tensor with a lazy
conjugate or negative bit holds other values than its bytes (they were
copied as they lie, the bit ignored), and a sparse tensor was told to call
``.contiguous()``, which does not make it one range of bytes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from meshio import RDMABuffer
from meshio.rdma import RDMAError

torch = pytest.importorskip("torch")


async def _refused(obj: Any) -> list[str]:
    """The messages of registering ``obj``, reading into it and writing
    from it (each must raise RDMAError)."""
    target = RDMABuffer(bytearray(64))
    uses: list[Callable[[], Awaitable[object]]] = [
        lambda: RDMABuffer(obj).drop(),  # (RDMABuffer raises before there is anything to await)
        lambda: target.read_into(obj, length=1),
        lambda: target.write_from(obj)]
    messages = []
    for use in uses:
        with pytest.raises(RDMAError) as info:
            await use()
        messages.append(str(info.value))
    await target.drop()
    return messages


async def test_an_array_of_python_objects_is_refused() -> None:
    for arr in (np.array([object(), object()], dtype=object),
                np.zeros(2, dtype=[("x", "<f8"), ("Ohm", "O")])):  # (a field's name: not its type)
        for message in await _refused(arr):
            assert "holds Python objects" in message and "numeric dtype" in message
    fields = np.zeros(2, dtype=[("x", "<f8"), ("Ohm", "<i4")])  # no object: registers
    await RDMABuffer(fields).drop()


async def test_a_lazily_conjugated_or_negated_tensor_is_refused() -> None:
    conj = torch.tensor([1 + 2j, 3 - 4j]).conj()
    neg = torch.tensor([1 + 2j]).conj().imag  # (one element: contiguous)
    assert conj.is_conj() and neg.is_neg() and conj.is_contiguous() and neg.is_contiguous()
    for message in await _refused(conj):
        assert "conjugate bit" in message and ".resolve_conj()" in message
    for message in await _refused(neg):
        assert "negative bit" in message and ".resolve_neg()" in message
    await RDMABuffer(conj.resolve_conj()).drop()
    await RDMABuffer(neg.resolve_neg()).drop()


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
async def test_a_sparse_tensor_is_told_to_call_to_dense() -> None:
    for sparse in (torch.zeros(10).to_sparse(), torch.zeros(2, 2).to_sparse_csr()):
        for message in await _refused(sparse):
            assert ".to_dense()" in message and ".contiguous()" not in message
