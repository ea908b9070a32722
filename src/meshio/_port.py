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
from ._exceptions import ClosedResourceError, MeshioError, SchemaError
from ._transport._messages import PortSend
from ._transport._runtime import on_loop, runtime
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
        return (Port, (self._addr, self._id))

    def __repr__(self) -> str:
        return f"<Port {self._id} at {self._addr}>"

    def send(self, value: T) -> None:
        """Send ``value`` to the receiver (fire and forget, in order)."""
        packer = Packer()
        body = packer.pack(value, False)
        on_loop(_send, self._addr, PortSend(self._id, msgspec.Raw(body)), packer.out)

    def close(self) -> None:
        """Tell the receiver no more values will come."""
        on_loop(_send, self._addr, PortSend(self._id, MSGPACK_NIL, True), [])


def _send(addr: str, msg: PortSend, out: OutBuffers) -> None:
    runtime().connect(addr).send_message(msg, out)


class PortReceiver(Generic[T]):
    """The receiving end of a channel, in the process that opened it."""

    def __init__(self, port_id: int) -> None:
        self._id = port_id
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._decoder = TypedDecoder(Any)

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
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def recv(self) -> T:
        """The next value.

        Raises:
            ClosedResourceError: the port was closed and every value has been read.
            SchemaError: the next value could not be decoded here (its
                reconstruction raised, or it was over the message size
                limit); later values can still be received.
        """
        while not self._items:
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
