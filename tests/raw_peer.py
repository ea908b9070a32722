"""A raw peer for wire tests: dials a runtime with the job's handshake and
speaks frames by hand (``meshio._transport._frames.frame_header`` +
``meshio._transport._messages``)."""

from __future__ import annotations

import asyncio
import struct

import pytest

from meshio import AuthenticationError
from meshio._transport import _messages as M
from meshio._transport._handshake import CHALLENGE_SIZE, Handshake, tcp_address
from meshio.testing._helpers import open_job_connection

#: generous bound on any single wait: a regression fails instead of hanging
DEADLINE = 30.0


async def read_frame(r: asyncio.StreamReader) -> tuple[M.Message, list[bytes]]:
    """The next frame's message and its out-of-band buffers."""
    body_len, nbufs = struct.unpack("<II", await r.readexactly(8))
    descs = struct.unpack(f"<{nbufs}Q", await r.readexactly(8 * nbufs)) if nbufs else ()
    msg = M.decode_message(await r.readexactly(body_len))
    bufs = [await r.readexactly(d & ((1 << 56) - 1)) for d in descs]
    return msg, bufs


async def dial(addr: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An authenticated raw connection to the runtime listening at ``addr``."""
    return await asyncio.wait_for(open_job_connection(addr), DEADLINE)


async def expect_eof(r: asyncio.StreamReader) -> None:
    """The peer closes (or resets) the connection; nothing else arrives."""
    try:
        rest = await asyncio.wait_for(r.read(), DEADLINE)
    except ConnectionResetError:
        return
    assert rest == b""


async def close(w: asyncio.StreamWriter) -> None:
    w.close()
    try:
        await w.wait_closed()
    except ConnectionError:
        pass


async def refused_by(host: str, port: int) -> None:
    """Dial ``host:port`` with another job's secret: the listener proves
    itself first, and this peer sees that it belongs to another job."""
    hs = Handshake(b"x" * 32, dialler=True, end=tcp_address(host, port))
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(hs.start())
    with pytest.raises(AuthenticationError):
        hs.feed(await asyncio.wait_for(reader.readexactly(CHALLENGE_SIZE), DEADLINE))
    await close(writer)
