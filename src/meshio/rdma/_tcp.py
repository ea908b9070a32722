"""The ``tcp`` fallback: chunks over the meshio connection, served by the
owner's runtime (not its actors); a :class:`RDMAFallbackWarning` is emitted
once.  :func:`serve_op` is the owner's side of every RDMA request that
travels that way: ``tcp`` chunks, ``drop``, the ``ibverbs`` connection
set-up."""

from __future__ import annotations

import asyncio
import ctypes
import os
import warnings
from typing import Final

from .._constants import MSGPACK_NIL
from .._exceptions import RDMAFallbackWarning
from .._transport._connection import Connection
from .._transport._messages import ErrorInfo, Fail, RdmaOp, Reply, Transfer
from .._transport._runtime import Runtime, register_handler, runtime
from .._transport._serial import KIND_BYTEARRAY, Buffers
from ._memory import Memory
from ._registry import Handle, Registry, _request

#: bytes per TCP chunk, and chunks in flight
TCP_CHUNK: Final = 8 << 20
TCP_WINDOW: Final = 4

_warned = False


def _warn_tcp(h: Handle) -> None:
    global _warned
    if not _warned:
        _warned = True
        why = ("the tcp backend was forced" if h.backend or os.environ.get("MESHIO_RDMA_BACKEND")
               else "no same-host path or ibverbs device between these processes")
        warnings.warn(f"meshio RDMA: {why}; transfers go over TCP (slower)",
                      RDMAFallbackWarning, stacklevel=4)


async def transfer(h: Handle, op: Transfer, local: Memory, offset: int, length: int) -> None:
    """Chunks over the meshio connection (the transfer's timeout is applied
    around the whole transfer by :meth:`RDMABuffer._run`)."""
    _warn_tcp(h)
    rt = runtime()
    view = memoryview((ctypes.c_char * local.size).from_address(local.addr)).cast("B")
    sem = asyncio.Semaphore(TCP_WINDOW)

    async def chunk(start: int, n: int) -> None:
        async with sem:
            if op == "read":
                data = await _request(rt, h, RdmaOp(0, "read", h.buf, h.token, offset + start,
                                                    n), None)
                view[start:start + n] = data
            else:
                await _request(rt, h, RdmaOp(0, "write", h.buf, h.token, offset + start, n),
                               None, [(view[start:start + n], KIND_BYTEARRAY)])

    await asyncio.gather(*(chunk(s, min(TCP_CHUNK, length - s))
                           for s in range(0, length, TCP_CHUNK)))


def serve_op(rt: Runtime, conn: Connection, msg: RdmaOp, bufs: Buffers) -> None:
    """The owner's side of an RDMA request (a ``tcp`` chunk, ``drop``, the
    ``ibverbs`` set-up); runs in its runtime, not an actor."""
    registry = rt.state(Registry)
    reg = registry.by_id.get(msg.buf)
    if reg is None or reg.token != msg.token:
        if msg.op != "drop":
            conn.send_message(Fail(msg.req, ErrorInfo(
                "rdma", "RDMAError", f"RDMA {msg.op}: buffer {msg.buf} of pid {os.getpid()} "
                "was dropped")))
        else:
            conn.send_message(Reply(msg.req, MSGPACK_NIL))
        return
    size = reg.memory.size
    if msg.op in ("read", "write") and (msg.offset < 0 or msg.offset + msg.length > size):
        conn.send_message(Fail(msg.req, ErrorInfo(
            "rdma", "RDMASizeError", f"RDMA {msg.op}: offset {msg.offset} + length "
            f"{msg.length} exceeds buffer {msg.buf}'s {size} bytes")))
        return
    match msg.op:
        case "read":
            conn.send_message(Reply(msg.req, MSGPACK_NIL),
                              [(reg.view()[msg.offset:msg.offset + msg.length], KIND_BYTEARRAY)])
        case "write":
            reg.view()[msg.offset:msg.offset + msg.length] = bufs[0]
            conn.send_message(Reply(msg.req, MSGPACK_NIL))
        case "drop":
            registry.release(msg.buf)
            conn.send_message(Reply(msg.req, MSGPACK_NIL))
        case "connect":
            # deferred: imports the cffi module (absent without libibverbs)
            from ._ibverbs_qp import accept

            conn.send_message(Reply(msg.req, MSGPACK_NIL),
                              [(accept(rt, conn, msg.info), KIND_BYTEARRAY)])


register_handler(RdmaOp, serve_op)
