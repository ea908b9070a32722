"""``Port`` and ``Channel``: streaming values back to whoever opened the channel.

``port, receiver = Channel[int].open()`` in any process (controller or
actor); pass ``port`` to actors as an argument; they ``port.send(v)`` as
often as they like and ``port.close()`` when done; the owner reads with
``await receiver.recv()`` or ``async for v in receiver``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar

import msgspec

from ._constants import MSGPACK_NIL
from ._exceptions import ClosedResourceError, MeshioError, SchemaError, SupervisionError
from ._transport._connection import Connection
from ._transport._messages import PortSend
from ._transport._runtime import Runtime, actor_thread, on_loop, runtime
from ._transport._serial import Buffers, OutBuffers, Packer, TypedDecoder

__all__ = ("Channel", "Port", "PortReceiver")

T = TypeVar("T")

_ids = itertools.count(1)
_CLOSE = object()


class _Undecodable:
    """Stands in the queue for a value that could not be received."""

    __slots__ = ("error",)

    def __init__(self, error: MeshioError) -> None:
        self.error = error


class Port(Generic[T]):
    """The sending end of a channel; a small value that can travel anywhere."""

    __slots__ = ("_addr", "_id")

    def __init__(self, addr: str, port_id: int) -> None:
        self._addr = addr
        self._id = port_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (_received, (self._addr, self._id))

    def __repr__(self) -> str:
        return f"<Port {self._id} at {self._addr}>"

    def send(self, value: T) -> None:
        """Send ``value`` to the receiver (fire and forget, in order)."""
        packer = Packer()
        body = packer.pack(value, False)
        on_loop(_send, self._addr, PortSend(self._id, msgspec.Raw(body)), packer)

    def close(self) -> None:
        """Tell the receiver no more values will come."""
        on_loop(_send, self._addr, PortSend(self._id, MSGPACK_NIL, True), [])


def _send(addr: str, msg: PortSend, out: OutBuffers) -> None:
    runtime().connect(addr).send_message(msg, out)


def _received(addr: str, port_id: int) -> Port[Any]:
    """A port arriving in this process (unpickled): its receiver learns that
    this process holds it, once per process (see :meth:`PortReceiver.recv`)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # (a thread decoding a large value: not announced)
        if getattr(actor_thread, "rt", None) is None:
            return Port(addr, port_id)
    on_loop(_announce, addr, port_id)
    return Port(addr, port_id)


class _Held:
    """Per runtime: the ports of other processes this one told it holds."""

    def __init__(self, rt: Runtime) -> None:
        self.told: set[tuple[str, int]] = set()

    def close(self) -> None:
        self.told.clear()


def _announce(addr: str, port_id: int) -> None:
    rt = runtime()
    told = rt.state(_Held).told
    if addr == rt.addr or (addr, port_id) in told:
        return
    told.add((addr, port_id))
    rt.connect(addr).send_message(PortSend(port_id, MSGPACK_NIL, held=True))


class PortReceiver(Generic[T]):
    """The receiving end of a channel, in the process that opened it."""

    def __init__(self, port_id: int) -> None:
        self._id = port_id
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._decoder = TypedDecoder(Any)
        #: connections of the other processes that hold the port
        self._holders: set[Connection] = set()
        #: once every holder is gone (and none came since): what recv raises
        self._orphaned: SupervisionError | None = None

    def _held(self, conn: Connection) -> None:
        self._holders.add(conn)
        self._orphaned = None

    def _lost(self, conn: Connection) -> None:
        if conn not in self._holders:
            return
        self._holders.discard(conn)
        if not self._holders:
            self._orphaned = SupervisionError(
                f"port {self._id}: every process that held it is gone (the last, pid "
                f"{conn.peer_pid} at {conn.peer}, lost its connection) without closing it; "
                f"nothing more can arrive", pid=conn.peer_pid, cause="every sender is gone")
            self._wake()

    def _put(self, msg: PortSend, bufs: Buffers) -> None:
        if msg.close:
            self._append(_CLOSE)
            return
        try:
            value = self._decoder.decode(msg.value, bufs)
        except BaseException as e:  # the value's own reconstruction code may raise anything
            self._put_error(SchemaError(f"a value sent to port {self._id} cannot be decoded "
                                        f"in this process: {type(e).__name__}: {e}"))
            return
        self._append(value)

    def _put_error(self, error: MeshioError) -> None:
        """A value that could not be received: :meth:`recv` raises ``error``."""
        self._append(_Undecodable(error))

    def _append(self, item: Any) -> None:
        self._items.append(item)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def recv(self) -> T:
        """The next value.

        Raises:
            ClosedResourceError: the port was closed and every value has been read.
            SchemaError: the next value could not be decoded here (its
                reconstruction raised, or it was over the message size
                limit); later values can still be received.
            SupervisionError: nothing is left to read and every other
                process the port was passed to is gone without closing it
                (instead of waiting forever).
        """
        while not self._items:
            if self._orphaned is not None:
                raise self._orphaned
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        item = self._items[0]
        if item is _CLOSE:
            raise ClosedResourceError(f"port {self._id} is closed and every value sent "
                                      "before has been read; nothing more will arrive")
        self._items.popleft()
        if type(item) is _Undecodable:
            raise item.error
        value: T = item
        return value

    async def __aiter__(self) -> AsyncIterator[T]:
        while True:
            try:
                yield await self.recv()
            except ClosedResourceError:
                return

    def close(self) -> None:
        """Stop receiving; later sends to the port are dropped."""
        runtime().ports.pop(self._id, None)


class Channel(Generic[T]):
    """Opens ports: ``port, receiver = Channel[int].open()``."""

    @staticmethod
    def open() -> tuple[Port[T], PortReceiver[T]]:
        rt = runtime()
        port_id = next(_ids)
        receiver: PortReceiver[T] = PortReceiver(port_id)
        rt.ports[port_id] = receiver
        return Port(rt.addr, port_id), receiver
