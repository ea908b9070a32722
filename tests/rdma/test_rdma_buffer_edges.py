"""The edges of a transfer's range, on every backend this process has: a
negative ``length`` is refused as such (it was reported as a range that
"exceeds the buffer"), and a read of 0 bytes into an empty destination is
a transfer that copies nothing (it was refused as "the buffer is empty"),
while still failing on a dropped buffer as every transfer does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from meshio.rdma import RDMAError, RDMASizeError
from rdma_actors import N, Owner, Peer

GUARD = 60

pytestmark = pytest.mark.filterwarnings("ignore::meshio.RDMAFallbackWarning")

#: empty destinations, each made anew
EMPTY: list[Callable[[], Any]] = [bytearray, lambda: memoryview(bytearray()),
                                  lambda: np.zeros(0)]


async def test_a_negative_length_is_refused_as_such(pair: tuple[Owner, Peer],
                                                     backend: str) -> None:
    owner, _ = pair
    buf = await owner.register.call_one(backend)
    for length in (-1, np.int64(-5)):
        with pytest.raises(RDMASizeError) as info:
            await asyncio.wait_for(buf.read_into(bytearray(16), length=length), GUARD)
        assert str(info.value) == (f"read_into: length must be >= 0 (or None: to the end), "
                                   f"got {int(length)}")
    with pytest.raises(RDMASizeError, match=r"^write_from: offset must be an int >= 0, got -1$"):
        await asyncio.wait_for(buf.write_from(b"x", offset=-1), GUARD)


async def test_zero_bytes_into_an_empty_destination(pair: tuple[Owner, Peer],
                                                    backend: str) -> None:
    owner, _ = pair
    buf = await owner.register.call_one(backend)
    for make in EMPTY:
        for edge in ({"length": 0}, {"offset": N}, {"offset": 7, "length": 0}):
            assert await asyncio.wait_for(buf.read_into(make(), **edge), GUARD) == 0
    with pytest.raises(RDMASizeError, match="read_into destination: the buffer is empty"):
        await asyncio.wait_for(buf.read_into(bytearray(), length=1), GUARD)  # bytes to copy
    await buf.drop()
    for make in EMPTY:
        with pytest.raises(RDMAError, match="dropped"):
            await asyncio.wait_for(buf.read_into(make(), length=0), GUARD)
