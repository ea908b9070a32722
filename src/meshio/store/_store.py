"""``WeightStore``: versioned snapshots of a state dict, published by one
process and read whole by many, never half-written.

The owner (the process that created the store: an actor, or the controller)
keeps each published version as one block of memory registered as an
:class:`~meshio.rdma.RDMABuffer`: readers copy it with the RDMA layer (one
copy by cross-memory attach on the owner's host, ibverbs or TCP chunks from
another host), the same layer large message values use.  A version never
changes once published, and a reader holds it (a lease) while it copies, so
no read mixes two versions.  The owner's runtime serves the leases
(:class:`~meshio._transport._messages.StoreOp`), not its actors: a busy
publisher still answers readers.

Readers on another host than the owner's read through a relay: the owner
grants each version to one reader per host (the relay), which pulls it
whole into memory of its own, registered, and keeps it as a version of a
store of its runtime (named :func:`_relay_key`); the owner sends the other
readers of that host to the relay, which they copy from at memory speed.
So the owner sends each version once per host.  A reader whose relay dies
or fails reads from the owner instead.

A store is one object: a handle names it by name and a random id, so a
store created anew under the same name (a restarted learner's) is another
store, never reached through the old one's handles.  A store closes when
the actor that created it stops (:class:`_Anchor`: the RDMA registry hears
of the stop) or its process's runtime closes: every waiting reader, in any
process, is woken with :class:`~meshio.RDMAError` naming the store, and so
is every later read.  Its versions go once no reader copies them.  Its
number of the newest version lives in a cell kept for the life of the
process (:data:`_cells`), so a handle read after the close, even by
cross-memory attach from another process, reads the store's last version,
never freed memory.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import os
import secrets
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar

import msgspec

from .._checks import check_seconds
from .._context import Context, _context
from .._exceptions import MeshioError, RDMAError
from .._transport._bulk import HOST_ID, address_of, cma, copied, executor
from .._transport._connection import Connection, Pending
from .._transport._messages import Reply, StoreOp
from .._transport._pool import pin_for_cuda, pool_view
from .._transport._runtime import (
    Runtime,
    existing_runtime,
    not_its_loop,
    register_handler,
    runtime,
)
from .._transport._serial import Buffers, import_torch
from ..rdma import RDMABuffer
from ..rdma._memory import Memory, memory_of
from ..rdma._registry import Handle, Registration, Registry

if TYPE_CHECKING:
    import torch

__all__ = ("WeightStore",)

#: each tensor of a snapshot starts at a multiple of this many bytes
_ALIGN: Final = 64
_T = TypeVar("_T")
#: a tensor of a snapshot: its name, dtype, shape, byte offset and byte length
#: (tuples of strs and ints: those a reader decodes, one a tensor, are not
#: tracked by the garbage collector, which would go through them all at each
#: of its collections)
_Entry = tuple[str, str, tuple[int, ...], int, int]
_Layout = list[_Entry]
#: tensors gone through (checked, made, copied) between two turns of the
#: event loop: a state dict of 100,000 tensors holds it milliseconds at a
#: time, not for seconds (its process keeps answering heartbeats)
_KEYS: Final = 1024
#: a tensor of fewer bytes than this is copied through staging memory with
#: its neighbours, up to :data:`_KEYS` of them in up to :data:`_SPAN` bytes
#: a transfer (a transfer costs syscalls, or a message, however small it is);
#: a larger one straight into its destination
_SMALL: Final = 1 << 16
_SPAN: Final = 1 << 20


#: a grant's ``version`` when none came in time, when the relay's pull
#: failed, and when the store is closed (:attr:`_Grant.closed` says why)
_TIMED_OUT: Final = -1
_RELAY_FAILED: Final = -2
_CLOSED: Final = -3
#: the newest version number a store takes (its cell holds a signed 64-bit int)
_MAX_VERSION: Final = 2**63 - 1


class _Grant(msgspec.Struct, frozen=True, array_like=True):
    """The owner's answer to "acquire": a version held for the reader under
    ``lease``, where it lies and how it is laid out (``version`` < 0: see
    :data:`_TIMED_OUT`...).  ``relay``: no lease, read the version from the
    relay of the reader's host at this runtime address.  ``closed``: why the
    store closed (``version`` :data:`_CLOSED`)."""

    version: int
    lease: int = 0
    buffer: Handle | None = None
    layout: _Layout = []
    relay: str = ""
    closed: str = ""


_grant = msgspec.msgpack.Decoder(_Grant)
_encode = msgspec.msgpack.Encoder().encode


# ------------------------------------------------------------ the owner

_Cell = ctypes.c_int64 * 2
#: every store's cell, by store id: the id (a reader of another process
#: checks it, so a reused pid or address never passes for the store) and
#: the newest version's number (-1: none).  Kept for the life of the
#: process, never freed: a handle of a closed store reads its last version
#: (by cross-memory attach from another process of its host), not memory
#: since given to something else.  16 bytes a store.
_cells: dict[int, ctypes.Array[ctypes.c_int64]] = {}


def _new_cell() -> tuple[int, ctypes.Array[ctypes.c_int64]]:
    """A new store's id (random, > 0, unused in this process) and its cell."""
    while True:
        sid = secrets.randbits(63)
        if sid and sid not in _cells:
            cell = _cells[sid] = _Cell(sid, -1)
            return sid, cell


class _Version:
    __slots__ = ("buffer", "layout", "leases", "memory", "version")

    def __init__(self, version: int, memory: memoryview, layout: _Layout) -> None:
        self.version = version
        self.memory = memory  # the block: back to the pool once dropped
        self.buffer = RDMABuffer(memory)
        self.layout = layout
        self.leases = 0

    def drop(self, registry: Registry | None) -> None:
        """Unregister the block (a reader starting a copy of it gets
        RDMAError); nothing if the runtime's registry is gone (its close
        released every block)."""
        if registry is not None:
            registry.release(self.buffer.handle.buf)


class _Waiter:
    """A reader waiting for a version from ``at_least`` on."""

    __slots__ = ("at_least", "conn", "fire", "timer")

    def __init__(self, at_least: int, fire: Callable[[int], None], conn: Connection | None,
                 timer: asyncio.TimerHandle | None) -> None:
        self.at_least, self.fire, self.conn, self.timer = at_least, fire, conn, timer


#: a wait's key in :attr:`_Owner.waiters`
_WaitKey = tuple[Connection | None, int]


class _Owner:
    """A store's versions in the process that publishes them (or a relay's,
    in a process that relays them: ``name`` is then its key)."""

    def __init__(self, rt: Runtime, name: str, keep: int, actor: str = "",
                 where: str = "", key: str = "") -> None:
        self.rt = rt
        self.name = name
        self.keep = keep
        #: the actor that created the store, and its name[rank] ("": the
        #: controller, or no actor)
        self.actor = actor
        self.where = where
        #: its id (unique in this process) and the cell of its newest version
        self.id, self.cell = _new_cell()
        #: what names it on the wire (:attr:`StoreOp.store`)
        self.key = key or f"{name}#{self.id:x}"
        self.versions: dict[int, _Version] = {}  # oldest first
        #: by lease id: the version it holds, and the reader's connection
        #: (None: a reader of this process)
        self.leases: dict[int, tuple[_Version, Connection | None]] = {}
        self.lease_ids = itertools.count(1)
        #: the readers waiting for a version, by their connection and request
        #: (None and a number of :attr:`waits`: a reader of this process)
        self.waiters: dict[_WaitKey, _Waiter] = {}
        self.waits = itertools.count(1)
        #: by reader host: the version its relay pulls or holds, the relay's
        #: connection and runtime address
        self.relays: dict[str, tuple[int, Connection, str]] = {}
        #: leases granted to readers of other processes, by their host ("":
        #: the owner's): what the owner sent to each host (tests count it)
        self.served: Counter[str] = Counter()
        #: a relay's: the newest version its pull of failed (its readers
        #: asking for it read from the owner)
        self.failed = -1
        #: why the store closed ("": open)
        self.closed = ""

    @staticmethod
    def of(store: WeightStore) -> _Owner:
        """The owner's state of ``store`` (in its owner's process)."""
        owner = store._local()
        if owner is None:
            raise RuntimeError(f"{store!r} is not owned by this process")
        return owner

    @property
    def latest(self) -> int:
        """The newest version's number (-1: none), read by readers of this host."""
        return int(self.cell[1])

    def registry(self) -> Registry | None:
        """The runtime's RDMA registry, where the versions are registered
        (None: none was made, or the runtime closed it)."""
        return self.rt.state(Registry) if self.rt.has_state(Registry) else None

    def add(self, v: _Version) -> None:
        if self.closed:  # (a relay's pull that ended as its runtime closed)
            v.drop(self.registry())
            return
        self.versions[v.version] = v
        self.cell[1] = max(self.latest, v.version)
        ready = [w for w in self.waiters.values() if w.at_least <= v.version]
        self.waiters = {k: w for k, w in self.waiters.items() if w.at_least > v.version
                        and (w.conn is None or not w.conn.closed)}
        for w in ready:
            if w.timer is not None:
                w.timer.cancel()
            w.fire(v.version)
        self.prune()

    def acquire(self, conn: Connection | None, host: str = "", relay: str = "") -> _Grant:
        """A lease on the newest version; for a reader that may relay
        (``relay``, on ``host``), the relay of its host instead when that
        host has one for this version (else the reader becomes it)."""
        v = self.versions[self.latest]
        if relay and conn is not None:
            at = self.relays.get(host)
            if at is not None and at[0] == v.version and not at[1].closed:
                return _Grant(v.version, relay=at[2])
            self.relays[host] = (v.version, conn, relay)
        if conn is not None:
            self.served[host] += 1
        lease = next(self.lease_ids)
        self.leases[lease] = (v, conn)
        v.leases += 1
        return _Grant(v.version, lease, v.buffer.handle, v.layout)

    def release(self, lease: int, conn: Connection | None = None, host: str = "") -> None:
        """Lease ``lease`` is given back; with ``host``, by a relay of that
        host that will not relay its version (its pull failed)."""
        at = self.relays.get(host)
        if host and at is not None and at[1] is conn:
            del self.relays[host]
        held = self.leases.pop(lease, None)
        if held is not None:
            held[0].leases -= 1
            self.prune()

    def prune(self) -> None:
        """Drop versions beyond the newest ``keep`` (all, once closed) that
        no reader holds (a reader whose connection ended holds nothing)."""
        for lease, (v, conn) in list(self.leases.items()):
            if conn is not None and conn.closed:
                del self.leases[lease]
                v.leases -= 1
        self.relays = {h: at for h, at in self.relays.items() if not at[1].closed}
        newest = [] if self.closed else sorted(self.versions)[-self.keep:]
        for number in [n for n in self.versions if n not in newest]:
            v = self.versions[number]
            if v.leases == 0:
                del self.versions[number]
                v.drop(self.registry())

    def wait(self, at_least: int, fire: Callable[[int], None], conn: Connection | None,
             timeout: float | None, loop: asyncio.AbstractEventLoop, req: int = 0
             ) -> _WaitKey | None:
        """``fire(version)`` once a version from ``at_least`` on exists
        (at once if one does), ``fire(-1)`` after ``timeout`` seconds, or
        ``fire(-3)`` once the store is closed (at once if it is).  Returns
        the wait's key, for :meth:`drop` (None: fired at once); ``req``: the
        request of a reader of another process (on ``conn``) it answers."""
        if self.closed:
            fire(_CLOSED)
            return None
        if self.latest >= at_least:
            fire(self.latest)
            return None
        if at_least <= self.failed:
            fire(_RELAY_FAILED)
            return None
        key = (conn, req) if conn is not None else (None, next(self.waits))
        waiter = self.waiters[key] = _Waiter(at_least, fire, conn, None)
        if timeout is not None:
            def expire() -> None:
                if self.waiters.pop(key, None) is not None:
                    fire(_TIMED_OUT)

            waiter.timer = loop.call_later(timeout, expire)
        return key

    def drop(self, key: _WaitKey) -> _Waiter | None:
        """The reader of wait ``key`` gave up: its waiter, if still waiting,
        goes (unfired: returned)."""
        waiter = self.waiters.pop(key, None)
        if waiter is not None and waiter.timer is not None:
            waiter.timer.cancel()
        return waiter

    def lost(self, conn: Connection) -> None:
        """Reader connection ``conn`` is gone (its process died): its waits
        and leases go, and its relay with it."""
        for key in [k for k in self.waiters if k[0] is conn]:
            self.drop(key)
        self.prune()

    def fail(self, version: int) -> None:
        """A relay's pull of ``version`` failed: its readers read from the
        owner."""
        self.failed = max(self.failed, version)
        self._wake(_RELAY_FAILED)

    def close(self, why: str) -> None:
        """Close the store (once; :meth:`_Stores.retire` does, which keeps
        what remains): its waiters, in this process and others, learn
        ``why``; its versions are unregistered at once (no new copy of
        one starts) and go once no reader copies them; none comes again.
        The cell keeps the newest version's number."""
        if self.closed:
            return
        self.closed = why
        self._wake(_CLOSED)
        self.relays.clear()
        registry = self.registry()
        for v in self.versions.values():
            v.drop(registry)
        self.prune()

    def _wake(self, code: int) -> None:
        """Every waiter gets ``code`` (< 0)."""
        waiters, self.waiters = self.waiters, {}
        for w in waiters.values():
            if w.timer is not None:
                w.timer.cancel()
            w.fire(code)


#: why a store closed with its process's runtime
_RUNTIME_CLOSED: Final = ("the runtime of its process closed (its meshio.run returned, or "
                          "its worker exited)")


_anchor_ids = itertools.count(1)


class _Anchor(Registration):
    """A store's entry in the RDMA registry of its runtime, registered under
    the actor that created the store.  Stopping an actor releases its
    registrations (``ActorCell.stop`` calls :meth:`Registry.release_owned`),
    and closing the runtime releases them all: the one moment this layer
    hears of either.  Releasing the anchor closes the store.  It registers
    no memory (its id is < 0: no handle names it)."""

    __slots__ = ("store", "stores")

    def __init__(self, stores: _Stores, store: _Owner) -> None:
        super().__init__(-next(_anchor_ids), Memory(None, 0, 0, False), store.actor)
        self.stores, self.store = stores, store

    def release(self) -> None:
        super().release()
        store = self.store
        self.stores.retire(store, _RUNTIME_CLOSED if store.rt.closed else
                           f"the actor {store.where} that created it was stopped")


class _Stores:
    """The stores owned by one runtime, and those it relays
    (``rt.state(_Stores)``)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        #: open stores and relays, by key
        self.by_key: dict[str, _Owner] = {}
        #: the open store of each name (a relay has none)
        self.named: dict[str, _Owner] = {}
        #: closed stores, by key: why, and the versions readers still copy
        self.closed: dict[str, _Owner] = {}
        rt.on_any_lost.append(self.lost)

    def create(self, name: str, keep: int, ctx: Context[Any] | None) -> _Owner:
        """A new store ``name`` of the actor of ``ctx`` (None: of no actor),
        closed when that actor stops."""
        if ctx is None:
            owner = _Owner(self.rt, name, keep)
        else:
            owner = _Owner(self.rt, name, keep, ctx.mesh._target,
                           f"{ctx.actor_name!r} (rank {ctx.point.rank})")
            anchor = _Anchor(self, owner)
            self.rt.state(Registry).by_id[anchor.id] = anchor
        self.by_key[owner.key] = self.named[name] = owner
        return owner

    def find(self, key: str) -> _Owner | None:
        """Store (or relay) ``key``, open or closed."""
        return self.by_key.get(key) or self.closed.get(key)

    def lost(self, conn: Connection) -> None:
        """Connection ``conn`` of this runtime is lost (a reader's process
        died): every store here drops what the reader held (:meth:`_Owner.lost`)."""
        for owner in [*self.by_key.values(), *self.closed.values()]:
            owner.lost(conn)

    def relay(self, key: str) -> _Owner:
        """The versions this process relays to its host's readers under
        ``key`` (:func:`_relay_key`): the newest one is kept."""
        owner = self.by_key.get(key)
        if owner is None:
            owner = self.by_key[key] = _Owner(self.rt, key, 1, key=key)
        return owner

    def retire(self, owner: _Owner, why: str) -> None:
        """Close ``owner`` for ``why``; what remains answers its handles."""
        owner.close(why)
        if self.by_key.get(owner.key) is owner:
            del self.by_key[owner.key]
        if self.named.get(owner.name) is owner:
            del self.named[owner.name]
        self.closed[owner.key] = owner  # (its handles, and its leases' releases, find it)

    def close(self) -> None:
        owners, self.by_key, self.named = self.by_key, {}, {}
        for owner in owners.values():
            owner.close(_RUNTIME_CLOSED)


def _relay_key(owner: str, key: str) -> str:
    """The key a relay serves store ``key`` of runtime ``owner`` under."""
    return f"relay:{owner}/{key}"


def _serve(rt: Runtime, conn: Connection, msg: StoreOp, bufs: Buffers) -> None:
    """The owner's side of a reader's request (runs in its runtime)."""
    stores = rt.state(_Stores)
    owner = stores.find(msg.store)
    if owner is None and msg.store.startswith("relay:") and msg.op == "acquire":
        owner = stores.relay(msg.store)  # a reader sent here before the relay's grant came
    if msg.op == "release":
        if owner is not None:
            owner.release(msg.version, conn, msg.host)
        return
    if msg.op == "cancel":  # its reader gave request ``version`` up
        waiter = owner.drop((conn, msg.version)) if owner is not None else None
        if waiter is not None:  # (else its answer is on the way already)
            waiter.fire(_TIMED_OUT)  # the answer it waits for, and no more
        return
    if owner is None:  # its handle's process is gone: this one took its address
        conn.send_message(Reply(msg.req, msgspec.Raw(_encode(_Grant(_CLOSED, closed=(
            f"its process is gone; pid {os.getpid()}, which took its address (a process "
            f"replaced, as procs.replace() does), has no store {msg.store!r}"))))))
        return
    timeout = None if msg.timeout < 0 else msg.timeout

    def fire(version: int) -> None:
        if conn.closed:
            return
        if msg.op == "wait" or version < 0:
            conn.send_message(Reply(msg.req, msgspec.Raw(_encode(_Grant(
                version, closed=owner.closed if version == _CLOSED else "")))))
        else:
            conn.send_message(Reply(msg.req, msgspec.Raw(_encode(
                owner.acquire(conn, msg.host, msg.relay)))))

    owner.wait(msg.version, fire, conn, timeout, rt.loop, msg.req)


register_handler(StoreOp, _serve)


# ------------------------------------------------------------- readers

def _decode_grant(raw: Any, bufs: Buffers) -> _Grant:
    return _grant.decode(bytes(raw))


def _dtype(name: str) -> Any:
    return getattr(import_torch(), name.removeprefix("torch."))


def _check_version(value: object, what: str) -> None:
    """Raise unless ``value`` is a version number (``what`` names the
    argument, as in ``"WeightStore.publish: version"``)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int >= 0, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{what} must be an int >= 0, got {value!r}")
    if value > _MAX_VERSION:
        raise ValueError(f"{what} must be at most 2**63-1 (the store keeps version numbers "
                         f"as signed 64-bit ints), got {value!r}")


def _no_dense_data(t: torch.Tensor) -> tuple[str, str]:
    """What tensor ``t`` is when its elements are not one dense block of
    data of its own, and what to publish instead ("" for a meta tensor,
    which has no data); ``("", "")``: they are.  A snapshot holds each
    tensor's elements as one dense block, so only strided tensors with data
    are published or read into (on any device; subclasses such as
    ``nn.Parameter`` too)."""
    if t.is_quantized:
        return ("a quantized tensor",
                "its dequantize(), or its int_repr() and its scales and zero points")
    if t.is_nested:
        return "a nested tensor", "its unbind() pieces, or its to_padded_tensor()"
    if t.layout != import_torch().strided:
        return f"a tensor of layout {t.layout}", "its to_dense()"
    if t.device.type == "meta":
        return "a meta tensor", ""
    return "", ""


def _unpublishable(t: torch.Tensor) -> str:
    """Why tensor ``t`` cannot be published ("": it can), and what to
    publish instead (see :func:`_no_dense_data`)."""
    what, instead = _no_dense_data(t)
    if not what:
        return ""
    if not instead:
        return (f"{what} has no data to publish: publish one with data (to_empty() and a load, "
                "for a model built on the meta device)")
    return f"{what} cannot be published: publish {instead}"


def _overlaps(t: torch.Tensor) -> bool:
    """Whether elements of strided tensor ``t`` may share memory (an
    ``expand()``ed dim has stride 0): taking its dims of size > 1 by stride,
    each stride must pass the extent of the dims before it.  Exact for the
    views slicing, ``expand``, ``unfold`` and transposes make; a hand-made
    ``as_strided`` that interleaves two dims counts as overlapping."""
    if t.is_contiguous():
        return False
    extent = 1  # elements spanned by the dims taken so far
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride(), strict=True)
                               if sz > 1):
        if stride < extent:
            return True
        extent += (size - 1) * stride
    return False


class WeightStore:
    """Versioned snapshots of a state dict: one process publishes, any
    process reads a whole version (never a mix of two).

    ``WeightStore("policy")`` creates the store in this process (an actor,
    typically the learner, or the controller), which alone publishes.  The
    store is a value: pass it to actors, return it from endpoints; every
    copy reads the owner's versions.

    A store lives as long as the actor that created it (created outside an
    actor: as its process's ``meshio.run``).  Once that actor is stopped the
    store is closed: a read waiting for a version, in any process, raises
    :class:`~meshio.RDMAError` naming the store, as does every later read
    and publish; :attr:`latest` stays at its last version.  An actor spawned
    in its place may create a store of the same name: that is another store,
    with versions of its own, which the old store's copies never reach (they
    say the old one is closed); read it through a copy of the new one.

    The store belongs to the event loop it was made on, as a proc mesh does:
    used from another (a later ``asyncio.run``, one in a thread), it raises
    :class:`~meshio.WrongLoopError` (:class:`~meshio.ClosedResourceError`
    once its own has ended); its copies read from any loop.

    Args:
        name: the store's name, unique among the open stores of its process.
        keep: versions kept beyond those a reader is copying (the newest
            ``keep``); memory stays bounded however many are published.

    Raises:
        TypeError: ``name`` is not a str, or ``keep`` not an int (a bool).
        ValueError: ``name`` is empty or taken in this process, or ``keep``
            < 1.
    """

    __slots__ = ("_handle_owner", "_host", "_id", "_key", "_latest_addr", "_name", "_pid",
                 "_rt", "_seen")

    def __init__(self, name: str, *, keep: int = 2) -> None:
        if not isinstance(name, str):
            raise TypeError(f"WeightStore: name must be a str, got {type(name).__name__} "
                            f"{name!r}")
        if not name:
            raise ValueError("WeightStore: name must not be empty")
        if not isinstance(keep, int) or isinstance(keep, bool):
            raise TypeError(f"WeightStore: keep must be an int >= 1, got {type(keep).__name__} "
                            f"{keep!r}")
        if keep < 1:
            raise ValueError(f"WeightStore: keep must be an int >= 1, got {keep!r}")
        rt = runtime()
        stores = rt.state(_Stores)
        old = stores.named.get(name)
        if old is not None:
            if not old.actor or old.actor in rt.actors:
                raise ValueError(f"WeightStore: a store named {name!r} exists in this process")
            # its actor is gone without a stop (its constructor failed): an
            # actor spawned anew takes the name
            stores.retire(old, f"the actor {old.where} that created it is gone, and a new "
                               f"store of that name was created")
        owner = stores.create(name, keep, _context.get(None))
        self._name = name
        self._id = owner.id
        self._key = owner.key
        self._handle_owner = rt.addr
        #: the runtime that made it, whose loop uses it (None: a copy)
        self._rt: Runtime | None = rt
        self._pid = os.getpid()
        self._host = HOST_ID
        self._latest_addr = ctypes.addressof(owner.cell)
        self._seen = -1

    @classmethod
    def _remote(cls, name: str, sid: int, owner: str, pid: int, host: str, latest_addr: int
                ) -> WeightStore:
        store = cls.__new__(cls)
        store._name, store._id, store._key = name, sid, f"{name}#{sid:x}"
        store._handle_owner, store._pid, store._rt = owner, pid, None
        store._host, store._latest_addr, store._seen = host, latest_addr, -1
        return store

    def __reduce__(self) -> tuple[Any, ...]:
        return (WeightStore._remote, (self._name, self._id, self._handle_owner, self._pid,
                                      self._host, self._latest_addr))

    def __repr__(self) -> str:
        return f"<WeightStore {self._name!r} of pid {self._pid} on {self._host.split('/')[0]}>"

    @property
    def name(self) -> str:
        return self._name

    def _local(self) -> _Owner | None:
        """The owner's state (open or closed), for the store made here; None
        for a copy (received: another process's store, or an in-process
        worker's read by its caller, reads as another process does).

        Raises:
            WrongLoopError: the store is used off the event loop of the
                runtime that made it (:class:`ClosedResourceError` once that
                loop has ended).
        """
        owner_rt = self._rt
        if owner_rt is None or self._pid != os.getpid():  # (or a fork's copy)
            return None
        if existing_runtime() is not owner_rt:  # (an actor's thread: its loop's)
            raise not_its_loop(owner_rt, f"WeightStore {self._name!r}")
        return owner_rt.state(_Stores).find(self._key)

    def _closed(self, why: str) -> RDMAError:
        return RDMAError(f"WeightStore {self._name!r} of pid {self._pid} on "
                         f"{self._host.split('/')[0]} is closed: {why}; it publishes no "
                         f"more versions (a store created again under that name is another "
                         f"store: read it through a copy of that one)")

    @property
    def latest(self) -> int | None:
        """The newest version's number (None: none published yet).  Exact
        in the owner's process and on its host; from another host, the
        newest this copy of the store has seen.  Once the store is closed,
        its last version."""
        owner = self._local()
        if owner is not None:
            return owner.latest if owner.latest >= 0 else None
        if self._host == HOST_ID:
            cell = _Cell()
            try:  # (the cell outlives the store: never freed memory)
                cma("read", self._pid, ctypes.addressof(cell), self._latest_addr,
                    ctypes.sizeof(cell))
            except OSError:
                pass  # the owner is gone: what was seen last
            else:
                if cell[0] == self._id:  # (else: another process took the owner's pid)
                    self._seen = max(self._seen, cell[1])
        return self._seen if self._seen >= 0 else None

    @property
    def kept(self) -> tuple[int, ...]:
        """The versions held in memory, oldest first (in the owner's
        process while the store is open; empty elsewhere)."""
        owner = self._local()
        return tuple(owner.versions) if owner is not None and not owner.closed else ()

    # ----------------------------------------------------------- publish

    async def publish(self, state_dict: Mapping[str, torch.Tensor], *, version: int) -> None:
        """Make a snapshot of ``state_dict`` the newest version.  Returns
        once the snapshot is the store's own (one copy, made off the event
        loop): the caller may change its tensors at once.

        Raises:
            RuntimeError: this process does not own the store.
            TypeError: ``state_dict`` is not a mapping of ``str`` to tensors;
                a tensor is quantized, nested, sparse (a layout other than
                strided) or on the meta device (the error names its key; the
                store's memory is untouched); or ``version`` is not an int (a
                bool).
            ValueError: ``version`` is negative, above 2**63-1, or not above
                the newest version.
            RDMAError: the store is closed (the actor that created it was
                stopped).
        """
        owner = self._local()
        if owner is None:
            raise RuntimeError(f"WeightStore.publish: {self!r} is a copy (a store passed to "
                               f"another actor or process arrives as one): only its owner, "
                               f"the WeightStore({self._name!r}) where it was made, publishes")
        torch = import_torch()
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"WeightStore.publish: expected a mapping of str to tensors, got "
                            f"{type(state_dict).__name__}")
        _check_version(version, "WeightStore.publish: version")
        layout: _Layout = []
        tensors: list[Any] = []
        at = 0
        for i, (key, t) in enumerate(list(state_dict.items())):
            await _turn(i)
            if not isinstance(key, str) or not isinstance(t, torch.Tensor):
                raise TypeError(f"WeightStore.publish: expected str keys and tensors, got "
                                f"{type(key).__name__} -> {type(t).__name__} (key {key!r})")
            if why := _unpublishable(t):
                raise TypeError(f"WeightStore.publish: key {key!r}: {why}")
            n = t.numel() * t.element_size()
            layout.append((key, str(t.dtype), tuple(t.shape), at, n))
            tensors.append(t)
            at = -(-(at + n) // _ALIGN) * _ALIGN
        self._check_newer(owner, version)
        memory = pool_view(max(at, 1))
        if any(t.device.type == "cuda" for t in tensors):
            pin_for_cuda(memory)
        await asyncio.get_running_loop().run_in_executor(
            executor(), _fill, memory, tensors, layout)
        self._check_newer(owner, version)  # (another publish, or the close, may have come)
        owner.add(_Version(version, memory, layout))

    def _check_newer(self, owner: _Owner, version: int) -> None:
        if owner.closed:
            raise self._closed(owner.closed)
        if version <= owner.latest:
            raise ValueError(f"WeightStore.publish: version {version} is not above the newest "
                             f"({owner.latest}) of store {owner.name!r}")

    # -------------------------------------------------------------- read

    async def read(self, *, at_least: int | None = None, timeout: float | None = None,
                   keys: Iterable[str] | None = None,
                   shard: Callable[[str, torch.Tensor], torch.Tensor] | None = None
                   ) -> dict[str, torch.Tensor]:
        """The newest version (one from ``at_least`` on, waiting up to
        ``timeout`` seconds for it) as new CPU tensors.

        Args:
            at_least: the oldest acceptable version (default: any).
            timeout: seconds to wait for such a version (default: no bound).
            keys: read these tensors only (default: all).
            shard: ``shard(name, tensor)`` returns the part of each tensor
                to read, a view of it (``lambda n, t: t[rank::world]``):
                only the bytes from its first to its last element are
                copied.  Called on a ``meta`` tensor.  A view is what
                slicing, int indexing, ``narrow``, ``select``, ``view``
                (to another dtype too), ``.T``, ``unsqueeze``, ``expand``,
                ``as_strided``, ``.real``/``.imag`` and ``conj()`` return;
                indexing by a tensor or a mask, ``flip``, ``clone``,
                ``.to(dtype)`` and a ``reshape`` that must copy return a
                new tensor, which is refused (take the view, then index the
                tensor read).

        Raises:
            TimeoutError: no such version within ``timeout``.
            KeyError: a key of ``keys`` is not in the version.
            TypeError: ``shard`` returned something other than a tensor,
                ``timeout`` is not a number (a str, a bool), or
                ``at_least`` is not an int (a bool).
            ValueError: ``shard`` returned a tensor that is not a view of
                the one it was given, or reaches outside it (the key and
                what it returned are named), ``timeout`` is not seconds
                >= 0 (NaN, or an int no float holds), or ``at_least`` is
                not in 0..2**63-1.
            RDMAError: the store is closed, before or while this waits (the
                actor that created it was stopped; or its process died and
                ``procs.replace()`` put another at its address), or the
                version was dropped while copied (the same).
        """
        async def copy(grant: _Grant, memory: _Source) -> dict[str, Any]:
            wanted = _select(grant.layout, keys)
            out: dict[str, Any] = {}
            if shard is None and len(wanted) == len(grant.layout):
                total = max(e[3] + e[4] for e in grant.layout) if grant.layout else 0
                block = pool_view(max(total, 1))
                await _copy_range(grant, memory, block, 0, total)
                for i, (key, dtype, shape, off, n) in enumerate(wanted):
                    await _turn(i)
                    out[key] = _tensor(block, dtype, shape, off, n)
                return out
            if shard is None:  # each into a tensor of its own
                torch = import_torch()
                targets: list[tuple[Any, _Entry]] = []
                for i, entry in enumerate(wanted):
                    await _turn(i)
                    targets.append((torch.empty(entry[2], dtype=_dtype(entry[1])), entry))
                await _copy_into(grant, memory, targets)
                return {entry[0]: t for t, entry in targets}
            for i, (key, dtype, shape, off, _) in enumerate(wanted):
                await _turn(i)
                out[key] = await _read_shard(grant, memory, key, dtype, shape, off, shard)
            return out

        return await self._using("read", at_least, timeout, copy)

    async def read_into(self, dst: Mapping[str, torch.Tensor], *, at_least: int | None = None,
                        timeout: float | None = None) -> int:
        """Copy the newest version (one from ``at_least`` on, waiting up to
        ``timeout`` seconds) into the tensors of ``dst``, in place; returns
        its number.  Every key of the version must be in ``dst`` with the
        same shape and dtype; its tensors may be on a GPU (a generator's
        ``model.state_dict()``) or views.

        Raises:
            TypeError: ``dst`` is not a mapping of name to tensor (checked
                before any wait).
            ValueError: a key is missing or extra, or a shape or dtype differs
                (the key and both are named), a tensor of ``dst`` has no dense
                data (quantized, nested, sparse, meta) or elements that share
                memory (an ``expand()``ed view; the key is named): ``dst`` is
                then untouched; or ``timeout`` is not seconds
                >= 0 or ``at_least`` is not in 0..2**63-1 (as for
                :meth:`read`; not a number, not an int: ``TypeError``).
            TimeoutError: no such version within ``timeout``.
            RDMAError: the store is closed (see :meth:`read`).
        """
        if not isinstance(dst, Mapping):
            raise TypeError(f"WeightStore.read_into: dst must be a mapping of name to tensor "
                            f"(a state_dict()), got {type(dst).__name__}")

        async def copy(grant: _Grant, memory: _Source) -> int:
            torch = import_torch()
            have = {e[0]: e for e in grant.layout}
            missing = sorted(set(have) - set(dst))
            extra = sorted(set(dst) - set(have))
            if missing or extra:
                said = ([f"has keys {missing} missing from dst"] if missing else []) + (
                    [f"lacks keys {extra} that dst has"] if extra else [])
                raise ValueError(f"WeightStore.read_into: version {grant.version} of "
                                 f"{self._name!r} {', and '.join(said)}")
            targets: list[tuple[Any, _Entry]] = []
            for i, entry in enumerate(grant.layout):
                await _turn(i)
                key, dtype, shape = entry[:3]
                t = dst[key]
                if not isinstance(t, torch.Tensor):
                    raise ValueError(f"WeightStore.read_into: dst[{key!r}] is a "
                                     f"{type(t).__name__}, not a tensor")
                if what := _no_dense_data(t)[0]:
                    raise ValueError(f"WeightStore.read_into: dst[{key!r}] is {what}, with no "
                                     f"dense data of its own to write the version into: pass "
                                     f"strided tensors with data (on the CPU or a GPU)")
                if t.shape != shape or str(t.dtype) != dtype:
                    raise ValueError(f"WeightStore.read_into: key {key!r}: the store has shape "
                                     f"{tuple(shape)} ({dtype}), dst has {tuple(t.shape)} "
                                     f"({t.dtype})")
                if _overlaps(t):
                    raise ValueError(f"WeightStore.read_into: dst[{key!r}] has elements that "
                                     f"share memory (shape {tuple(t.shape)}, strides "
                                     f"{t.stride()}: an expand()ed, unfold()ed or as_strided "
                                     f"view), so it cannot hold the version's values: pass a "
                                     f"tensor of its own (its clone())")
                targets.append((t, entry))
            await _copy_into(grant, memory, targets)
            return grant.version

        return await self._using("read_into", at_least, timeout, copy)

    async def versions(self) -> AsyncGenerator[int, None]:
        """Each newest version as it is published, from the current one on
        (versions published faster than the loop body runs are skipped).

        Raises:
            RDMAError: the store is closed (see :meth:`read`).
        """
        last = -1
        while True:
            last = await self._wait(last + 1)
            self._seen = max(self._seen, last)
            yield last

    # ---------------------------------------------------- the owner's side

    async def _wait(self, at_least: int, timeout: float | None = None) -> int:
        owner = self._local()
        if owner is not None:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[int] = loop.create_future()

            def fire(version: int) -> None:
                if not fut.done():
                    fut.set_result(version)

            key = owner.wait(at_least, fire, None, timeout, loop)
            try:
                version = await fut
            except asyncio.CancelledError:
                if key is not None:  # (its reader gave up: the waiter goes now)
                    owner.drop(key)
                raise
            if version == _CLOSED:
                raise self._closed(owner.closed)
            return version
        grant = await self._request(StoreOp(0, "wait", self._key, at_least,
                                            -1.0 if timeout is None else timeout))
        return grant.version

    async def _request(self, msg: StoreOp, to: str | None = None) -> _Grant:
        """``msg`` to the owner's runtime (or the relay's at ``to``)."""
        rt = runtime()
        conn = rt.connect(to or self._handle_owner)
        fut: asyncio.Future[_Grant] = rt.loop.create_future()
        req = conn.next_req(Pending(fut, _decode_grant, f"WeightStore.{msg.op}",
                                    f"store {self._name!r}", f"owner pid {self._pid}"))
        conn.send_message(msgspec.structs.replace(msg, req=req))
        try:
            grant = await asyncio.shield(fut)
        except asyncio.CancelledError:
            if not fut.done() and not conn.closed:  # its wait there ends, answered at once
                conn.send_message(StoreOp(0, "cancel", msg.store, req))

            def give_back(f: asyncio.Future[_Grant]) -> None:
                """A lease granted after all goes back (an error: retrieved)."""
                if not f.cancelled() and f.exception() is None and f.result().lease:
                    if msg.relay:  # made the relay of this host
                        self._unrelay(f.result())
                    else:
                        self._release(f.result().lease, to)

            fut.add_done_callback(give_back)
            raise
        if grant.version == _CLOSED:
            raise self._closed(grant.closed)
        return grant

    def _release(self, lease: int, to: str | None = None, host: str = "") -> None:
        """Give a lease of the owner (in another process), or of the relay
        at ``to``, back (``host``: see :meth:`_Owner.release`)."""
        conn = runtime().conns.get(to or self._handle_owner)
        if conn is not None and not conn.closed:
            key = _relay_key(self._handle_owner, self._key) if to else self._key
            conn.send_message(StoreOp(0, "release", key, lease, host=host))

    def _unrelay(self, grant: _Grant) -> None:
        """This process, made the relay of its host for ``grant``, will not
        pull it: the readers sent to it, and the owner, learn so."""
        runtime().state(_Stores).relay(_relay_key(self._handle_owner, self._key)).fail(
            grant.version)
        self._release(grant.lease, None, HOST_ID)

    async def _using(self, what: str, at_least: int | None, timeout: float | None,
                     copy: Callable[[_Grant, _Source], Awaitable[_T]]) -> _T:
        """``copy(grant, memory)`` of a version held meanwhile: through the
        relay of this host, or from the owner when the relay fails (``what``:
        the method, ``"read"`` or ``"read_into"``, as errors name it)."""
        if at_least is not None:
            _check_version(at_least, f"WeightStore.{what}: at_least")
        if timeout is not None:
            timeout = check_seconds(timeout, f"WeightStore.{what}", "timeout", zero=True,
                                    also=" or None")
        try:
            async with _Lease(self, at_least or 0, timeout, relayed=True) as held:
                return await copy(*held)
        except _RelayLost:
            async with _Lease(self, at_least or 0, timeout, relayed=False) as held:
                return await copy(*held)


class _RelayLost(Exception):
    """The relay a reader was sent to died or failed (it reads from the owner)."""


class _Lease:
    """``async with``: a version held while it is copied (the grant, and
    the registered block when it is in this process: the owner's, or the
    copy this process relays).  Raises :class:`_RelayLost` when the relay
    of this host fails (``relayed``: a reader of another host than the
    owner's reads through it)."""

    __slots__ = ("at_least", "grant", "local", "pull", "relay", "relayed", "store", "timeout")

    def __init__(self, store: WeightStore, at_least: int, timeout: float | None,
                 relayed: bool) -> None:
        self.store, self.at_least, self.timeout = store, at_least, timeout
        self.relayed = relayed and store._host != HOST_ID
        self.local: _Owner | None = None
        self.grant: _Grant | None = None
        #: the runtime address of the relay holding the lease ("": the owner)
        self.relay = ""
        #: this process relays the version: its pull from the owner
        self.pull: _Pull | None = None

    async def __aenter__(self) -> tuple[_Grant, _Source]:
        store = self.store
        owner = self.local = store._local()
        if owner is not None:
            version = await store._wait(self.at_least, self.timeout)
            if version < 0:
                raise self._timed_out()
            if owner.closed:  # (since the wait ended)
                raise store._closed(owner.closed)
            grant = self.grant = owner.acquire(None)
            memory: _Source = owner.versions[grant.version].memory
        elif not self.relayed:
            grant = await store._request(self._acquire(self.at_least, ""))
            if grant.version < 0:
                raise self._timed_out()
            self.grant, memory = grant, None
        else:
            grant, memory = await self._relayed()
        store._seen = max(store._seen, grant.version)
        return grant, memory

    def _acquire(self, at_least: int, relay: str) -> StoreOp:
        return StoreOp(0, "acquire", self.store._key, at_least,
                       -1.0 if self.timeout is None else self.timeout, HOST_ID, relay)

    async def _relayed(self) -> tuple[_Grant, _Source]:
        """A version through the relay of this host: this process is it
        (it pulls the version from the owner), or another is."""
        store = self.store
        rt = runtime()
        key = _relay_key(store._handle_owner, store._key)
        grant = await store._request(self._acquire(self.at_least, rt.addr))
        if grant.version < 0:
            raise self._timed_out()
        if grant.relay:
            try:
                held = await store._request(StoreOp(0, "acquire", key, grant.version, -1.0),
                                            grant.relay)
            except (MeshioError, OSError) as e:
                raise _RelayLost from e
            if held.version < 0:
                raise _RelayLost
            self.grant, self.relay = held, grant.relay
            return held, None
        self.pull = _Pull(store, rt.state(_Stores).relay(key), grant)
        return grant, self.pull

    def _timed_out(self) -> TimeoutError:
        return TimeoutError(f"WeightStore {self.store._name!r}: no version from "
                            f"{self.at_least} on within {self.timeout}s")

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: object) -> None:
        if self.pull is not None:  # the pull goes on for the host's other readers
            task = self.pull.task
            if isinstance(exc, asyncio.CancelledError):
                task.cancel()
            try:
                await task
            except BaseException:
                self.store._unrelay(self.pull.grant)
                if exc is None:
                    raise
        grant = self.grant
        if grant is None:
            return
        if self.local is not None:
            self.local.release(grant.lease)
        else:
            self.store._release(grant.lease, self.relay or None)
        if self.relay and isinstance(exc, (MeshioError, OSError)):
            raise _RelayLost from exc  # the relay died while this copied from it


#: a relay pulls a version in pieces of this many bytes, this many at once
_PIECE: Final = 16 << 20
_PIECES: Final = 4


class _Pull:
    """A relay's one copy of a whole version from the owner, in pieces (a
    task its lease owns): a copy out of the bytes pulled so far starts while
    the rest comes.  Once all are in, the owner's lease goes back and the
    version is the relay's, served to its host's readers."""

    def __init__(self, store: WeightStore, relay: _Owner, grant: _Grant) -> None:
        self.grant = grant
        self.size = max((e[3] + e[4] for e in grant.layout), default=0)
        self.memory = pool_view(max(self.size, 1))
        #: bytes pulled from the start on, and an event set when that grows
        self.pulled = 0
        self.grew = asyncio.Event()
        self.task = runtime().tasks.start(self.run(store, relay))

    async def run(self, store: WeightStore, relay: _Owner) -> None:
        starts = range(0, self.size, _PIECE)
        done = [False] * len(starts)
        window = asyncio.Semaphore(_PIECES)

        async def piece(i: int, at: int) -> None:
            async with window:
                n = min(_PIECE, self.size - at)
                await _copy_range(self.grant, None, self.memory[at:at + n], at, n)
            done[i] = True
            while self.pulled < self.size and done[self.pulled // _PIECE]:
                self.pulled = min(self.pulled + _PIECE, self.size)
            grew, self.grew = self.grew, asyncio.Event()
            grew.set()

        try:
            async with asyncio.TaskGroup() as pieces:  # one failing ends the others
                for i, at in enumerate(starts):
                    pieces.create_task(piece(i, at))
        finally:
            self.grew.set()  # a copy waiting sees the task ended
        store._release(self.grant.lease)
        relay.add(_Version(self.grant.version, self.memory, self.grant.layout))

    async def ready(self, end: int) -> None:
        """Until the first ``end`` bytes are pulled (the pull's error if it fails)."""
        while self.pulled < end:
            if self.task.done():
                return self.task.result()  # raises: the pull failed
            await self.grew.wait()


_Source = memoryview | _Pull | None
"""Where a reader copies a version from: a block in this process, a relay's
pull in this process, or (None) the RDMA buffer of its grant."""


# ------------------------------------------------------------- copying

def _fill(memory: memoryview, tensors: list[Any], layout: _Layout) -> None:
    """A publish's one copy (in a copy thread): each tensor into its place."""
    torch = import_torch()
    base = address_of(memory)
    for t, (_, _, _, off, n) in zip(tensors, layout, strict=True):
        if n and _direct(t):
            ctypes.memmove(base + off, t.data_ptr(), n)
        elif n:
            dst = torch.frombuffer(memory, dtype=t.dtype, count=t.numel(), offset=off)
            dst.view(t.shape).copy_(t.detach())


def _tensor(block: memoryview, dtype: str, shape: tuple[int, ...], off: int, n: int) -> Any:
    """A tensor aliasing ``n`` bytes of ``block`` from ``off``."""
    torch = import_torch()
    dt = _dtype(dtype)
    if not n:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(block, dtype=dt, count=n // dt.itemsize, offset=off).view(shape)


async def _turn(i: int) -> None:
    """Let the event loop run after every :data:`_KEYS` tensors (``i``: this
    one's count)."""
    if i % _KEYS == _KEYS - 1:
        await asyncio.sleep(0)


async def _copy_range(grant: _Grant, memory: _Source, dst: Any, off: int, n: int) -> None:
    """Copy ``n`` bytes of the granted version from ``off`` into ``dst``
    (a buffer or contiguous CPU tensor): from the block itself in this
    process (once pulled there, for a relay), else by the RDMA layer."""
    if isinstance(memory, _Pull):
        await memory.ready(off + n)
        memory = memory.memory
    if memory is not None:
        target = memory_of(dst, "WeightStore.read destination", writable=True)
        await copied([asyncio.get_running_loop().run_in_executor(
            executor(), ctypes.memmove, target.addr, address_of(memory) + off, n)])
        return
    assert grant.buffer is not None
    await RDMABuffer._from_handle(grant.buffer).read_into(dst, offset=off, length=n)


async def _copy_into(grant: _Grant, memory: _Source, targets: list[tuple[Any, _Entry]]
                     ) -> None:
    """Copy each entry of the granted version into its tensor (of its shape
    and dtype, on any device): a large one straight into a contiguous CPU
    tensor, the others through staging memory, neighbours together (see
    :data:`_SMALL`), letting the event loop run after each transfer."""
    torch = import_torch()
    targets = sorted((p for p in targets if p[1][4]), key=lambda p: p[1][3])
    staging = memoryview(bytearray())
    i = 0
    while i < len(targets):
        t, (_, _, _, start, n) = targets[i]
        if n >= _SMALL and _direct(t):
            await _copy_range(grant, memory, t, start, n)
            i += 1
        else:  # a span: this one and the small ones after it
            end, j = start + n, i + 1
            while j < len(targets) and j - i < _KEYS:
                _, _, _, at, n = targets[j][1]
                if n >= _SMALL or at + n - start > _SPAN:
                    break
                end, j = at + n, j + 1
            span, i = targets[i:j], j
            if staging.nbytes < end - start:
                staging = pool_view(end - start)
            if any(t.device.type == "cuda" for t, _ in span):
                pin_for_cuda(staging)
            await _copy_range(grant, memory, staging, start, end - start)
            base = address_of(staging)
            for t, (_, dtype, shape, at, n) in span:
                if _direct(t):
                    ctypes.memmove(t.data_ptr(), base + at - start, n)
                else:  # (as the copy into a CPU tensor: into a leaf that
                    # requires grad, or an inference tensor, too)
                    with torch.inference_mode():
                        t.copy_(_tensor(staging, dtype, shape, at - start, n))
        await asyncio.sleep(0)


def _direct(t: torch.Tensor) -> bool:
    """Whether the bytes go straight between ``t``'s memory and the
    version's: a contiguous CPU tensor, plain or a parameter (a subclass
    may have no memory of its own; ``copy_`` conjugates into a lazily
    conjugated view, and negates into a negated one)."""
    torch = import_torch()
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu"
            and t.is_contiguous() and not t.is_conj() and not t.is_neg())


def _select(layout: _Layout, keys: Iterable[str] | None) -> _Layout:
    if keys is None:
        return layout
    if isinstance(keys, str):
        raise TypeError("WeightStore.read: keys must be an iterable of str, not one str")
    by_key = {e[0]: e for e in layout}
    wanted = list(keys)
    missing = [k for k in wanted if k not in by_key]
    if missing:
        raise KeyError(f"WeightStore.read: keys {missing} are not in the version "
                       f"(it has {sorted(by_key)})")
    return [by_key[k] for k in wanted]


async def _read_shard(grant: _Grant, memory: _Source, key: str, dtype: str,
                      shape: tuple[int, ...], off: int,
                      shard: Callable[[str, Any], Any]) -> Any:
    """The part of one tensor ``shard`` selects: only the bytes between its
    first and last element are copied."""
    torch = import_torch()
    meta = torch.empty(shape, dtype=_dtype(dtype), device="meta")
    part = _shard_view(key, meta, shard)
    if part.numel() == 0:
        return torch.empty(part.shape, dtype=part.dtype)
    item = part.element_size()  # (a view may be of another dtype: its own units)
    first = part.storage_offset()
    last = first + sum((size - 1) * stride for size, stride in zip(part.shape, part.stride(),
                                                                   strict=True))
    count = last - first + 1
    block = pool_view(count * item)
    await _copy_range(grant, memory, block, off + first * item, count * item)
    flat = torch.frombuffer(block, dtype=part.dtype, count=count)
    out = torch.as_strided(flat, part.shape, part.stride(), 0)
    if part.is_conj():  # a lazily conjugated view (t.conj()): its values are conjugated
        out = torch.conj_physical(out)
    if part.is_neg():  # a lazily negated view (t.conj().imag)
        out = torch.neg(out)
    return out.contiguous()


def _shard_view(key: str, meta: Any, shard: Callable[[str, Any], Any]) -> Any:
    """What ``shard(key, meta)`` returns, checked: a view of ``meta`` (its
    storage, identical for every view of it, and unshared by any new
    tensor) within its bytes."""
    torch = import_torch()
    storage = meta.untyped_storage()  # (held: each view of meta returns this same object)
    nbytes = meta.numel() * meta.element_size()
    part = shard(key, meta)
    if not isinstance(part, torch.Tensor):
        raise TypeError(f"WeightStore.read: shard({key!r}, t) must return a view of t "
                        f"(a tensor), got {type(part).__name__}")
    what = (f"{part.device.type} tensor of shape {tuple(part.shape)} ({part.dtype}, strides "
            f"{part.stride()}, offset {part.storage_offset()})")
    if (part.device.type != "meta" or part.layout != torch.strided
            or part.untyped_storage() is not storage):
        raise ValueError(
            f"WeightStore.read: shard({key!r}, t) must return a view of t, got a new {what}: "
            f"its elements are not t's (indexing by a tensor or a mask, flip, clone, "
            f".to(dtype) and a reshape of a non-contiguous view make copies); return a view "
            f"(slices, ints, narrow, select, view, .T, as_strided) and index the tensors read")
    if part.numel():
        end = (part.storage_offset() + sum((size - 1) * stride for size, stride
                                           in zip(part.shape, part.stride(), strict=True))
               + 1) * part.element_size()
        if end > nbytes:
            raise ValueError(f"WeightStore.read: shard({key!r}, t) returned a view of t that "
                             f"reaches outside it: a {what} ends at byte {end} of t, which "
                             f"has {nbytes}")
    return part
