"""The ``tcp`` fallback: chunks over the meshio connection, served by the
owner's runtime (not its actors: :data:`SERVES`); a
:class:`RDMAFallbackWarning` is emitted once (:func:`warn_fallback`)."""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import Mapping
from typing import Final

from .._constants import MSGPACK_NIL
from .._exceptions import RDMAError, RDMAFallbackWarning
from .._transport._connection import Connection
from .._transport._messages import RdmaOp, RdmaOpName, Reply, Transfer
from .._transport._pool import pool_view
from .._transport._runtime import Runtime, runtime
from .._transport._serial import KIND_BYTEARRAY, Buffers
from .._transport._tasks import together
from ._memory import Memory
from ._registry import Handle, OwnerSide, Registration, _request, view_of

#: bytes per TCP chunk, and chunks in flight
TCP_CHUNK: Final = 8 << 20
TCP_WINDOW: Final = 4

_warned = False


def warn_fallback(h: Handle, stacklevel: int) -> None:
    """The :class:`RDMAFallbackWarning` of a transfer on ``h``, once per
    process, attributed to the frame ``stacklevel`` above the caller's (1:
    the caller's own line), as :func:`warnings.warn` counts."""
    global _warned
    if not _warned:
        _warned = True
        why = ("the tcp backend was forced" if h.backend or os.environ.get("MESHIO_RDMA_BACKEND")
               else "no same-host path or ibverbs device between these processes")
        warnings.warn(f"meshio RDMA: {why}; transfers go over TCP (slower)",
                      RDMAFallbackWarning, stacklevel=stacklevel + 1)


async def transfer(h: Handle, op: Transfer, local: Memory, offset: int, length: int) -> None:
    """Chunks over the meshio connection (the transfer's timeout is applied
    around the whole transfer by :meth:`RDMABuffer._run`, which warns:
    :func:`warn_fallback`).

    A write sends a copy of each chunk, made as the chunk goes: a chunk's
    frame is read after it was sent (queued, or written into a peer of this
    host once the peer asks), also after a write given up (timed out,
    cancelled) returned, once its owner resumes; the copy, not ``local``, is
    read then, so what lands is the source as it was during the write, never
    bytes its caller put there since.  The copies are of the pool of
    mapped memory (:func:`pool_view`): a block goes back to it once its
    frame no longer reads it, and serves a later chunk without page
    faults."""
    rt = runtime()
    view = view_of(local)
    sem = asyncio.Semaphore(TCP_WINDOW)
    where = f"RDMA {op} on buffer {h.buf} of pid {h.pid} on {h.host.split('/')[0]} (tcp)"

    async def chunk(start: int, n: int) -> None:
        async with sem:
            try:
                if op == "read":
                    data = await _request(rt, h, RdmaOp(0, "read", h.buf, h.token,
                                                        offset + start, n), None)
                    view[start:start + n] = data
                else:
                    copy = pool_view(max(n, 1))[:n]
                    copy[:] = view[start:start + n]
                    await _request(rt, h, RdmaOp(0, "write", h.buf, h.token, offset + start,
                                                 n), None, [(copy, KIND_BYTEARRAY)])
            except RDMAError as e:  # the owner's reason (dropped, unreachable)
                raise type(e)(f"{where}: {e}") from None

    # (one empty chunk for 0 bytes: the owner still refuses a dropped buffer)
    # (a chunk that fails stops the others: none lands in memory its caller has back)
    await together(chunk(s, min(TCP_CHUNK, length - s))
                   for s in range(0, max(length, 1), TCP_CHUNK))


def _serve_read(rt: Runtime, conn: Connection, msg: RdmaOp, bufs: Buffers,
                reg: Registration) -> None:
    reg.lend(conn.send_message(Reply(msg.req, MSGPACK_NIL),
                               [(reg.view()[msg.offset:msg.offset + msg.length],
                                 KIND_BYTEARRAY)]))


def _serve_write(rt: Runtime, conn: Connection, msg: RdmaOp, bufs: Buffers,
                 reg: Registration) -> None:
    reg.view()[msg.offset:msg.offset + msg.length] = bufs[0]
    conn.send_message(Reply(msg.req, MSGPACK_NIL))


#: the owner's side of a chunk
SERVES: Final[Mapping[RdmaOpName, OwnerSide]] = {"read": _serve_read, "write": _serve_write}


def status() -> tuple[bool, str]:
    """Always usable: the fallback."""
    return True, ("chunks over meshio's connections, served by the owner's runtime (a "
                  "fallback: RDMAFallbackWarning once when used)")
