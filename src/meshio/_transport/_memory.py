"""Connections between runtimes of one process, in memory: the in-process
transport's wire (httpx's ``MockTransport`` is the model).

:func:`memory_pipe` joins two :class:`~._connection.Connection`\\ s with a
pair of :class:`MemoryTransport`\\ s that behave as a stream socket does for
them: bytes written on one end arrive, in order and later (never within the
write), at the other's ``get_buffer``/``buffer_updated``; reading pauses and
resumes; ``abort`` and ``close`` end both sides with ``connection_lost``.
Every byte is copied on write, as a socket would, so a sender may reuse its
buffers at once and the receiver decodes real frames: schemas, limits and
errors behave as between processes.  Each end delivers in the context of its
own runtime (:attr:`~._runtime.Runtime.context`), so code that runs because
of a message sees that runtime as :func:`~._runtime.runtime`.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from typing import TYPE_CHECKING, Any

from ._connection import Connection

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ("MemoryBackend", "MemoryTransport", "memory_pipe")


class MemoryTransport(asyncio.Transport):
    """One end of an in-memory stream: writes go to :attr:`peer`'s protocol."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: asyncio.BufferedProtocol,
                 context: contextvars.Context, name: str) -> None:
        super().__init__({"peername": name})
        self._loop = loop
        self._protocol = protocol
        self._context = context
        self.peer: MemoryTransport | None = None
        self._inbox: deque[memoryview] = deque()  # written by the peer, not delivered yet
        self._paused = False
        self._scheduled = False
        self._closing = False  # close() or abort() was called on either end
        self._lost = False  # connection_lost delivered

    # -------------------------------------------------- the writing end

    def write(self, data: bytes | bytearray | memoryview) -> None:
        peer = self.peer
        if self._closing or peer is None or not data:
            return
        peer._inbox.append(memoryview(bytes(data)))
        peer._schedule()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def get_write_buffer_size(self) -> int:
        """Always 0: every write is copied to the peer at once, as into a
        socket with room for it, so nothing waits to be sent (or read from
        the writer's memory) and the writer is never paused."""
        return 0

    def can_write_eof(self) -> bool:
        return False

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """End both sides once what was written has been delivered."""
        self._end(abort=False)

    def abort(self) -> None:
        """End both sides now; what was not delivered is dropped."""
        self._end(abort=True)

    def _end(self, abort: bool) -> None:
        for end in (self, self.peer):
            if end is not None:
                end._closing = True
                if abort:
                    end._lose()
                else:
                    end._schedule()

    # -------------------------------------------------- the reading end

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        assert isinstance(protocol, asyncio.BufferedProtocol)
        self._protocol = protocol

    def is_reading(self) -> bool:
        return not self._paused

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        if self._paused:
            self._paused = False
            self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled and not self._lost:
            self._scheduled = True
            # (in a copy: a call served in the delivery, as mailbox calls
            # that find their actor idle are, may dial this runtime's peers,
            # which enters their contexts, this runtime's among them)
            self._loop.call_soon(self._deliver, context=self._context.copy())

    def _deliver(self) -> None:
        """Hand the protocol what waits, as a socket's reads would, until
        it pauses; then, once the stream is closed and drained, the end."""
        self._scheduled = False
        try:
            self._feed()
        except Exception as e:  # as a socket transport does: report, then drop the stream
            self._loop.call_exception_handler({
                "message": "meshio: in-process connection failed reading", "exception": e,
                "transport": self, "protocol": self._protocol})
            self._end(abort=True)
            return
        if self._closing and not self._inbox:
            self._lose()

    def _feed(self) -> None:
        protocol = self._protocol
        while self._inbox and not self._paused and not self._lost:
            chunk = self._inbox[0]
            buf = memoryview(protocol.get_buffer(len(chunk)))
            n = min(len(buf), len(chunk))
            if not n:
                raise RuntimeError("get_buffer() returned an empty buffer")
            buf[:n] = chunk[:n]
            if n == len(chunk):
                self._inbox.popleft()
            else:
                self._inbox[0] = chunk[n:]
            protocol.buffer_updated(n)

    def _lose(self) -> None:
        if not self._lost:
            self._lost = True
            self._inbox.clear()
            self._loop.call_soon(self._protocol.connection_lost, None, context=self._context)


def memory_pipe(loop: asyncio.AbstractEventLoop,
                a: asyncio.BufferedProtocol, a_context: contextvars.Context, a_name: str,
                b: asyncio.BufferedProtocol, b_context: contextvars.Context, b_name: str
                ) -> None:
    """Connect protocols ``a`` and ``b`` (``connection_made`` is called on
    both, ``b`` first, in their contexts); ``a_name`` is ``a``'s address
    (``b``'s ``peername``) and the other way round."""
    ta = MemoryTransport(loop, a, a_context, b_name)
    tb = MemoryTransport(loop, b, b_context, a_name)
    ta.peer, tb.peer = tb, ta
    b_context.run(b.connection_made, tb)
    a_context.run(a.connection_made, ta)


class MemoryBackend:
    """A runtime's way to the in-process runtimes on its loop (the
    :class:`~._sockets.Backend` interface, as its sockets): a dialled
    connection is joined at once to a new one at the peer."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def dial(self, conn: Connection, addr: str) -> None:
        rt, peer = self.rt, self.rt.in_memory(addr)
        assert peer is not None
        accepted = Connection(peer, None)
        peer.all_conns.add(accepted)
        memory_pipe(rt.loop, conn, rt.context, rt.addr, accepted, peer.context, addr)

    async def dialled(self, conn: Connection) -> None:
        pass  # (up at once)

    def close(self) -> None:
        pass  # (its connections are the runtime's: closed with it)
