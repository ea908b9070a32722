"""``Port`` and ``Channel``: streaming values back to whoever opened the channel.

``port, receiver = Channel[int].open()`` in any process (controller or
actor); pass ``port`` to actors as an argument; they ``port.send(v)`` as
often as they like and ``port.close()`` when done; the owner reads with
``await receiver.recv()`` or ``async for v in receiver``.

The runtime holds each open receiver weakly, by port id, until the
channel ends: the sender's close arrives, the owner closes the receiver,
or nothing holds the receiver any more.  Values for a port no longer
registered are dropped, as for a closed one.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, NoReturn, TypeVar

import msgspec

from ._constants import MSGPACK_NIL
from ._exceptions import ClosedResourceError, MeshioError, SchemaError, SupervisionError
from ._transport._bulk import snapshot
from ._transport._connection import Connection
from ._transport._messages import PortSend
from ._transport._runtime import Runtime, actor_thread, check_loop, not_its_loop, on_loop, runtime
from ._transport._serial import Buffers, OutBuffers, Packer, TypedDecoder, Unsendable, hands_port

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

    __slots__ = ("__weakref__", "_addr", "_id")

    def __init__(self, addr: str, port_id: int) -> None:
        self._addr = addr
        self._id = port_id

    def __reduce__(self) -> tuple[Any, ...]:
        hands_port(self._addr, self._id)  # (its receiver, if here, counts where it goes)
        return (_received, (self._addr, self._id))

    def __repr__(self) -> str:
        return f"<Port {self._id} at {self._addr}>"

    def send(self, value: T) -> None:
        """Send ``value`` to the receiver (fire and forget, in order); once
        the receiver is closed (or gone), values are dropped.  What it holds
        now is sent: change a buffer or tensor in place right after (the next
        rollout into the same one), and the receiver still gets this one (its
        parts are copied, as a broadcast's).

        Raises:
            SchemaError: ``value`` cannot be encoded (its pickling raised,
                or it is over the message size limit); nothing is sent.
            WrongLoopError: called from a thread that runs no event loop
                (not an actor's): ``loop.call_soon_threadsafe(port.send,
                value)`` sends from there.
        """
        packer = Packer()
        try:
            body = packer.pack(value, False)
        except (SchemaError, Unsendable) as e:  # over the size limit; a receiver, a service
            raise SchemaError(f"{self!r}: the value cannot be sent: {e}") from None
        except Exception as e:  # the value's own pickling code may raise anything
            raise SchemaError(f"{self!r}: the value cannot be sent: {type(e).__name__}: {e}; "
                              "send a value msgpack or pickle can encode") from e
        on_loop(_send, self._addr, PortSend(self._id, msgspec.Raw(body)), snapshot(packer))

    def close(self) -> None:
        """Tell the receiver no more values will come."""
        on_loop(_send_close, self._addr, self._id)


def _send(addr: str, msg: PortSend, out: OutBuffers) -> None:
    runtime().connect(addr).send_message(msg, out)


def _send_close(addr: str, port_id: int) -> None:
    rt = runtime()
    if rt.has_state(_Held):  # (told again if the port arrives here again)
        rt.state(_Held).told.pop((addr, port_id), None)
    rt.connect(addr).send_message(PortSend(port_id, MSGPACK_NIL, True), [])


def _received(addr: str, port_id: int) -> Port[Any]:
    """A port arriving in this process (unpickled): its receiver learns that
    this process holds it, once per process (see :meth:`PortReceiver.recv`)."""
    port: Port[Any] = Port(addr, port_id)
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # (a thread decoding a large value: not announced)
        if getattr(actor_thread, "rt", None) is None:
            return port
    on_loop(_announce, port)
    return port


class _Held:
    """Per runtime: the ports of other processes this one told it holds (so
    that it tells each once), each for as long as the :class:`Port` that
    arrived here is neither closed nor garbage-collected (a port handed
    over and never closed here, its receiver closed or dropped, stayed for
    good: one entry per step of an RL loop handing a fresh port to a
    generator each step).  Telling a receiver again that this process holds
    its port (when it arrives again) changes nothing there."""

    def __init__(self, rt: Runtime) -> None:
        self.told: weakref.WeakValueDictionary[tuple[str, int], Port[Any]] = (
            weakref.WeakValueDictionary())

    def close(self) -> None:
        self.told.clear()


def _announce(port: Port[Any]) -> None:
    rt = runtime()
    told = rt.state(_Held).told
    key = (port._addr, port._id)
    if port._addr == rt.addr or key in told:
        return
    told[key] = port
    rt.connect(port._addr).send_message(PortSend(port._id, MSGPACK_NIL, held=True))


class PortReceiver(Generic[T]):
    """The receiving end of a channel, in the process that opened it.

    Any number of tasks may wait in :meth:`recv` at once; each value goes to
    one of them.
    """

    def __init__(self, port_id: int) -> None:
        self._id = port_id
        #: the runtime whose open ports it is in (that of the loop the
        #: channel was opened on: the only one that feeds it); None: in none
        self._rt: Runtime | None = None
        self._items: deque[Any] = deque()
        #: the tasks waiting in recv (each woken to look again on news)
        self._waiters: set[asyncio.Future[None]] = set()
        self._decoder = TypedDecoder(Any)
        #: connections of the other processes that hold the port
        self._holders: set[Connection] = set()
        #: connections of fan-out relays that answer for the processes they
        #: relayed a message holding the port to: how many such messages
        self._relays: dict[Connection, int] = {}
        #: once every holder is gone (and none came since): what recv raises
        self._orphaned: SupervisionError | None = None
        #: closed by its owner (:meth:`close`): recv raises at once
        self._closed = False
        #: takes this receiver out of the runtime's open ports (see Channel.open)
        self._unregister: Callable[[], None] | None = None

    def __reduce__(self) -> NoReturn:
        raise Unsendable(self, "a PortReceiver", "it stays in the process that opened its "
                         "channel (values arrive there); send the Port instead (open the "
                         "channel where the values are read, e.g. in the receiving actor, "
                         "and return or pass its Port to the senders)")

    def _held(self, conn: Connection) -> None:
        self._holders.add(conn)
        self._orphaned = None

    def _relaying(self, conn: Connection) -> None:
        self._relays[conn] = self._relays.get(conn, 0) + 1
        self._orphaned = None

    def _released(self, conn: Connection, holders: tuple[str, ...]) -> None:
        """The relay of ``conn`` answers for one message fewer: of the
        processes it passed it on to, those at ``holders`` hold the port
        from now on (each counted as a process the port was handed to, until
        it dies: whether it read the port or not, as it answered or was
        passed a broadcast), the others are gone."""
        n = self._relays.get(conn, 0)
        if not n:
            return
        for addr in holders:
            self._hold(conn.rt, addr)
        if n > 1:
            self._relays[conn] = n - 1
            return
        del self._relays[conn]
        if not self._holders and not self._relays:
            self._orphan(f"the last, the processes that the fan-out relay pid {conn.peer_pid} "
                         f"at {conn.peer} passed it on to, are gone", -1)

    def _hold(self, rt: Runtime, addr: str) -> None:
        """Count the process at ``addr`` among the holders by its connection
        (dialled if there is none: its loss ends the count, as a dial that
        fails does); a process known dead holds nothing."""
        if addr == rt.addr or addr in rt.dead:
            return
        conn = rt.connect(addr)
        if conn.closed:
            return
        self._held(conn)
        if conn.transport is None:  # being dialled
            rt.tasks.start(self._dialled(rt, conn))

    async def _dialled(self, rt: Runtime, conn: Connection) -> None:
        await rt.sockets.dialled(conn)
        if conn.closed:  # it never came up (else its loss is told as any)
            self._lost(conn)

    def _lost(self, conn: Connection) -> None:
        relayed = self._relays.pop(conn, None)
        if conn not in self._holders and relayed is None:
            return
        self._holders.discard(conn)
        if not self._holders and not self._relays:
            self._orphan(f"the last, pid {conn.peer_pid} at {conn.peer}, lost its connection",
                         conn.peer_pid)

    def _orphan(self, last: str, pid: int) -> None:
        self._orphaned = SupervisionError(
            f"port {self._id}: every process that held it is gone ({last}) without closing "
            f"it; nothing more can arrive", pid=pid, cause="every sender is gone")
        self._wake()

    def _put(self, msg: PortSend, bufs: Buffers) -> None:
        if msg.close:
            self._end()  # nothing sent after it can be read
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
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _end(self) -> None:
        """Leave the runtime's open ports (once)."""
        unregister, self._unregister = self._unregister, None
        if unregister is not None:
            unregister()

    async def recv(self) -> T:
        """The next value.

        Raises:
            ClosedResourceError: the port was closed and every value has been
                read, or this receiver was closed (:meth:`close`), even
                while waiting here.
            SchemaError: the next value could not be decoded here (its
                reconstruction raised, or it was over the message size
                limit); later values can still be received.
            SupervisionError: nothing is left to read and every other
                process the port was passed to is gone without closing it
                (instead of waiting forever).
            WrongLoopError: it has to wait on another event loop than the
                one the channel was opened on (only that loop's runtime
                feeds it; a value already here is returned); or, once that
                loop has ended, ClosedResourceError.
        """
        while True:
            if self._closed:
                raise ClosedResourceError(f"port {self._id}: its receiver was closed "
                                          "(PortReceiver.close()); nothing more can be "
                                          "received from it")
            if self._items:
                break
            if self._orphaned is not None:
                raise self._orphaned
            loop = asyncio.get_running_loop()
            rt = self._rt
            if rt is not None and loop is not rt.loop:  # (asked here: a value ready is no wait)
                raise not_its_loop(rt, f"the receiver of port {self._id}")
            waiter = loop.create_future()
            self._waiters.add(waiter)
            try:
                await waiter
            finally:
                self._waiters.discard(waiter)
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
        if self._rt is not None:
            check_loop(self._rt, f"the receiver of port {self._id}")
        while True:
            try:
                yield await self.recv()
            except ClosedResourceError:
                return

    def close(self) -> None:
        """Stop receiving: values not yet read are dropped, and so are later
        sends to the port; :meth:`recv` raises :class:`ClosedResourceError`
        (in tasks waiting there too)."""
        self._closed = True
        self._items.clear()
        self._end()
        self._wake()


class _Sink:
    """What the runtime holds of an open receiver: a weak reference (values
    for a receiver nobody holds any more are dropped)."""

    __slots__ = ("_receiver",)

    def __init__(self, receiver: PortReceiver[Any],
                 callback: Callable[[weakref.ref[PortReceiver[Any]]], None]) -> None:
        self._receiver = weakref.ref(receiver, callback)

    def _put(self, msg: PortSend, bufs: Buffers, /) -> None:
        receiver = self._receiver()
        if receiver is not None:
            receiver._put(msg, bufs)

    def _put_error(self, error: MeshioError, /) -> None:
        receiver = self._receiver()
        if receiver is not None:
            receiver._put_error(error)

    def _held(self, conn: Connection, /) -> None:
        receiver = self._receiver()
        if receiver is not None:
            receiver._held(conn)

    def _relaying(self, conn: Connection, /) -> None:
        receiver = self._receiver()
        if receiver is not None:
            receiver._relaying(conn)

    def _released(self, conn: Connection, holders: tuple[str, ...], /) -> None:
        receiver = self._receiver()
        if receiver is not None:
            receiver._released(conn, holders)

    def _lost(self, conn: Connection, /) -> None:
        receiver = self._receiver()
        if receiver is not None:
            receiver._lost(conn)


def _register(rt: Runtime, receiver: PortReceiver[Any]) -> None:
    """Enter ``receiver`` in ``rt``'s open ports until it ends or is
    garbage-collected, whichever comes first: it belongs to ``rt`` (is read
    on its loop)."""
    port_id = receiver._id
    ports = rt.ports
    receiver._rt = rt

    def gone(_: object = None) -> None:  # (may run in any thread: one dict operation)
        ports.pop(port_id, None)

    ports[port_id] = _Sink(receiver, gone)
    receiver._unregister = gone


class Channel(Generic[T]):
    """Opens ports: ``port, receiver = Channel[int].open()``."""

    @staticmethod
    def open() -> tuple[Port[T], PortReceiver[T]]:
        rt = runtime()
        port_id = next(_ids)
        receiver: PortReceiver[T] = PortReceiver(port_id)
        _register(rt, receiver)
        return Port(rt.addr, port_id), receiver
