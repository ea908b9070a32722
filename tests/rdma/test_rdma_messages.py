"""What the RDMA errors a user meets say, on every backend this process has:
a transfer on a dropped buffer, or to a dead owner, names the transfer,
the buffer, the owner's pid and the backend (docs/rdma.md); an offset past
the end of the buffer says so, not "length -5"."""

from __future__ import annotations

import asyncio
import re

import pytest

from gone import killed
from meshio.rdma import RDMAError, RDMASizeError
from rdma_actors import N, Owner, Peer

GUARD = 60

pytestmark = pytest.mark.filterwarnings("ignore::meshio.RDMAFallbackWarning")


async def test_an_offset_past_the_end_says_so(pair: tuple[Owner, Peer], backend: str) -> None:
    owner, _ = pair
    buf = await owner.register.call_one(backend)
    for length in (None, 4):
        with pytest.raises(RDMASizeError) as refused:
            await buf.read_into(bytearray(16), offset=N + 5, length=length)
        assert str(refused.value) == (
            f"read_into: offset {N + 5} is past the end of the buffer ({N} bytes)")
    with pytest.raises(RDMASizeError, match=rf"write_from: offset {N + 1} is past the end"):
        await buf.write_from(b"x", offset=N + 1)
    # at the end exactly: nothing to read, no error
    assert await buf.read_into(bytearray(1), offset=N) == 0


async def test_a_dropped_buffer_names_the_backend(pair: tuple[Owner, Peer],
                                                  backend: str) -> None:
    owner, peer = pair
    buf = await owner.register.call_one(backend)
    pid = await owner.pid.call_one()
    assert buf.backend == backend
    await peer.drop.call_one(buf)
    transfers = {"read": lambda: buf.read_into(bytearray(8), length=8),
                 "write": lambda: buf.write_from(b"x" * 8)}
    for op, transfer in transfers.items():
        with pytest.raises(RDMAError) as refused:
            await asyncio.wait_for(transfer(), GUARD)
        message = str(refused.value)
        # (ibverbs names the stage first: "queue-pair set-up failed: ")
        assert re.match(rf"RDMA {op} on buffer {buf.handle.buf} of pid {pid}\b.* "
                        rf"\({backend}\): (.*: )?the buffer was dropped", message), message
        assert "ask its owner for a new RDMABuffer" in message


async def test_a_dead_owner_names_the_backend(pair: tuple[Owner, Peer], backend: str) -> None:
    owner, _ = pair
    buf = await owner.register.call_one(backend)
    pid = await owner.pid.call_one()
    await killed(pid, GUARD)
    with pytest.raises(RDMAError) as refused:
        await asyncio.wait_for(buf.read_into(bytearray(8), length=8), GUARD)
    message = str(refused.value)
    assert message.startswith(f"RDMA read on buffer {buf.handle.buf} of pid {pid}"), message
    assert re.search(rf"\({backend}\): (.*: )?its owner", message), message
