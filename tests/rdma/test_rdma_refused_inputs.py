"""Memory whose bytes are not what another process may copy is refused, as
a buffer to register and as a transfer's destination or source, with a
message saying what to do: a NumPy ``dtype=object`` array holds object
pointers (a peer's write into one crashed the owner)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from meshio import RDMABuffer
from meshio.rdma import RDMAError


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
