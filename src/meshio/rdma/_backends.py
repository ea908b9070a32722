"""The three RDMA backends behind one Protocol
(:class:`~._registry.RdmaBackend`): :func:`backend` names the module of
each, and :func:`serve_op` is the owner's side of every request that
reaches its runtime: checked here (the buffer registered, its token, the
range, its memory not moved), ``drop`` done here (the registry's), every
other kind handed to the backend that serves it (``tcp`` chunks, the
``ibverbs`` connection set-up).
"""

from __future__ import annotations

import os

from .._constants import MSGPACK_NIL
from .._transport._connection import Connection
from .._transport._messages import ErrorInfo, Fail, RdmaOp, Reply
from .._transport._runtime import Runtime, register_handler
from .._transport._serial import Buffers
from .._transport._tasks import when_done
from . import _same_host, _tcp
from ._registry import BACKENDS, DROPPED, LENT_LATE, MOVED, Backend, RdmaBackend, Registry

__all__ = ("backend", "serve_op")

#: the backends asked which serves a request: the one that must be imported last
_ASKED: tuple[Backend, ...] = tuple(sorted(BACKENDS, key=lambda name: name == "ibverbs"))


def backend(name: Backend) -> RdmaBackend:
    """The backend ``name``.

    Raises:
        ImportError: ``ibverbs``, when meshio was built without its binding
            (or libibverbs does not load).
    """
    match name:
        case "same_host":
            return _same_host
        case "tcp":
            return _tcp
        case "ibverbs":
            # deferred: imports the cffi module (absent without libibverbs)
            from . import _ibverbs_qp

            return _ibverbs_qp


def serve_op(rt: Runtime, conn: Connection, msg: RdmaOp, bufs: Buffers) -> None:
    """The owner's side of an RDMA request; runs in its runtime, not an actor."""
    registry = rt.state(Registry)
    reg = registry.by_id.get(msg.buf)
    if reg is None or reg.token != msg.token:
        if msg.op != "drop":
            # the holder's side names the transfer and the backend around it
            conn.send_message(Fail(msg.req, ErrorInfo(
                "rdma", "RDMAError", DROPPED)))
        else:
            conn.send_message(Reply(msg.req, MSGPACK_NIL))
        return
    size = reg.memory.size
    if msg.op in ("read", "write") and (msg.offset < 0 or msg.offset + msg.length > size):
        conn.send_message(Fail(msg.req, ErrorInfo(
            "rdma", "RDMASizeError", f"RDMA {msg.op}: offset {msg.offset} + length "
            f"{msg.length} exceeds buffer {msg.buf}'s {size} bytes")))
        return
    if msg.op == "drop":  # answered once the reads served before are done with its memory

        def dropped() -> None:
            conn.send_message(Reply(msg.req, MSGPACK_NIL))

        if not when_done(registry.release(msg.buf), dropped, LENT_LATE):
            dropped()
        return
    if reg.memory.moved():  # (a one-sided read or write cannot tell: no owner code runs)
        conn.send_message(Fail(msg.req, ErrorInfo("rdma", "RDMAError", MOVED)))
        return
    for name in _ASKED:
        try:
            serve = backend(name).SERVES.get(msg.op)
        except ImportError:  # no ibverbs here: a holder cannot have asked for its set-up
            continue
        if serve is not None:
            serve(rt, conn, msg, bufs, reg)
            return
    conn.send_message(Fail(msg.req, ErrorInfo(
        "rdma", "RDMAError", f"RDMA {msg.op}: no backend of pid {os.getpid()} serves it")))


register_handler(RdmaOp, serve_op)
