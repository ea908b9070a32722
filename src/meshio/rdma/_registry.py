"""What both sides of an RDMA buffer share, below the backends: the owner's
:class:`Registry` of registered memory (a state of its runtime), the
:class:`Handle` that travels, a request served by the owner's runtime
(``tcp`` transfers, ``drop``, the ``ibverbs`` connection set-up; the owner's
side is :func:`._backends.serve_op`), and :class:`RdmaBackend`, what each
backend module provides."""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import secrets
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeAlias

import msgspec

from .._exceptions import CallTimeout, RDMAError, SupervisionError
from .._transport._connection import Connection, Pending
from .._transport._messages import RdmaOp, RdmaOpName, Transfer
from .._transport._pool import owned_view
from .._transport._runtime import Runtime
from .._transport._serial import Buffers
from .._transport._tasks import within
from ._fence import OwnerFence
from ._memory import Memory

if TYPE_CHECKING:
    from ._ibverbs_device import IbRegistration

#: an RDMA backend's name
Backend: TypeAlias = Literal["same_host", "ibverbs", "tcp"]
#: every backend meshio knows, fastest first where they compete
BACKENDS: Final[tuple[Backend, ...]] = ("same_host", "ibverbs", "tcp")
#: why a transfer on a dropped buffer fails, and what to do (each backend
#: puts the transfer, the buffer, its owner and itself before it)
DROPPED: Final = ("the buffer was dropped (drop() was called, its owning actor stopped or "
                  "its runtime closed): ask its owner for a new RDMABuffer")
#: why the owner refuses a request on a registered tensor whose memory moved
#: (:meth:`Memory.moved`)
MOVED: Final = ("its memory moved (the registered tensor was resized past its storage, and "
                "torch freed the registered memory): drop the buffer and register the tensor "
                "again")


#: the owner's side of one kind of request (:class:`RdmaOp`) on a registered
#: buffer, run by its runtime once the request is known valid (its buffer
#: registered, its token right, its range inside the buffer)
OwnerSide: TypeAlias = Callable[[Runtime, Connection, RdmaOp, Buffers, "Registration"], None]


class RdmaBackend(Protocol):
    """One way to reach another process's registered memory: what each
    backend module (``_same_host``, ``_ibverbs_qp``, ``_tcp``) provides.

    A holder's side is :func:`transfer`; the owner's side, where the owner's
    runtime must act, is in :attr:`SERVES` (by request kind), run by
    :func:`._backends.serve_op`."""

    @property
    def SERVES(self) -> Mapping[RdmaOpName, OwnerSide]:
        """The requests whose owner's side this backend is."""
        ...

    def status(self) -> tuple[bool, str]:
        """Whether this process can use the backend; what allows it or why not."""
        ...

    async def transfer(self, h: Handle, op: Transfer, local: Memory, offset: int,
                       length: int) -> None:
        """``op`` ("read": owner → ``local``, "write": ``local`` → owner) of
        ``length`` bytes at ``offset`` of ``h``'s buffer.  ``length`` may be
        0: nothing is copied, but a dropped buffer or a gone owner fails it
        as it fails any transfer."""
        ...


def view_of(m: Memory) -> memoryview:
    """A writable view of ``m`` that keeps its memory alive while it, or a
    slice of it, lives (:func:`owned_view`): a ``tcp`` read's reply lends
    such a slice of the owner's registration to its connection, which
    reads it after the send returned (written into a peer of this host, or
    queued), so a registration released meanwhile is freed only once the
    frame is sent or its connection ended, never under the copy."""
    return owned_view(m.addr, m.size, m.keep)


# ------------------------------------------------------ owner's registry

#: what a drop waiting too long for the transfers under way warns of
#: (:func:`when_done`): the frames of ``tcp`` reads it served before, the
#: ``same_host`` transfers that found it registered (all those count as one)
LENT_LATE: Final = ("a dropped RDMA buffer is released, though {n} transfers begun before "
                    "the drop still reach its memory")
#: seconds between a drop's first two looks at its ``same_host`` fence, and
#: the most between two (each look waits twice as long as the one before)
_FENCE_PAUSE: Final = (1e-4, 0.05)


class Registration:
    """A registered buffer in its owner process."""

    __slots__ = ("ib", "id", "lent", "memory", "owner", "token", "token_cell")

    def __init__(self, reg_id: int, memory: Memory, owner: str) -> None:
        self.id = reg_id
        self.memory = memory
        self.owner = owner
        self.token = secrets.randbits(63) | 1
        # (a cell a released registration left: its readers, late, compare
        # their own token with this new one and read "dropped"; one pop, not a
        # test then a pop: actors' threads register too)
        try:
            self.token_cell = _free_cells.pop()
        except IndexError:
            self.token_cell = ctypes.c_uint64()
        self.token_cell.value = self.token
        self.ib: IbRegistration | None = None
        #: the frames of ``tcp`` reads served from it, done once nothing
        #: reads them any more (:meth:`lend`; a drop waits for them)
        self.lent: list[asyncio.Future[None]] = []

    @property
    def token_addr(self) -> int:
        return ctypes.addressof(self.token_cell)

    def view(self) -> memoryview:
        """The registered memory (see :func:`view_of`)."""
        return view_of(self.memory)

    def lend(self, sent: asyncio.Future[None] | None) -> None:
        """A frame served from this memory was sent (``sent``: what
        ``Connection.send`` returned, None if nothing of it is read later)."""
        if sent is not None:
            self.lent = [f for f in self.lent if not f.done()]
            self.lent.append(sent)

    def release(self) -> None:
        if self.token_cell.value != self.token:  # released already (its cell may be another's)
            return
        self.token_cell.value = 0  # readers on this host see "dropped"
        _free_cells.append(self.token_cell)  # stays mapped: a late reader reads 0, not garbage
        if self.ib is not None:
            self.ib.close()
            self.ib = None


async def _quiet(fence: OwnerFence, reg: Registration) -> None:
    """Return once no ``same_host`` transfer on ``reg`` (released) copies,
    looking at ``fence`` less and less often; it, and its memory, live until
    then (a drop that gave up waiting, or an actor stopped, must not let
    memory a transfer still writes go to other uses)."""
    pause, most = _FENCE_PAUSE
    while not fence.quiet(reg.id):
        await asyncio.sleep(pause)
        pause = min(2 * pause, most)


#: the token cells of released registrations, never unmapped (a late reader
#: of one reads 0, or a later registration's token: not its own), reused by
#: new ones: as many as registrations were ever live at once, not ever made
_free_cells: list[ctypes.c_uint64] = []
_ids = itertools.count(1)


class Registry:
    """The buffers registered in one runtime, by id (``rt.state(Registry)``);
    closing the runtime releases them all."""

    __slots__ = ("by_id", "fence", "rt")

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.by_id: dict[int, Registration] = {}
        #: what ``same_host`` transfers on its buffers lock (:mod:`._fence`;
        #: made with the first buffer, on Linux)
        self.fence: OwnerFence | None = None

    def fence_id(self) -> tuple[int, int] | None:
        """What names the fence in a handle: its fd number and inode (None
        where there is no ``same_host`` backend: not Linux)."""
        if sys.platform != "linux":
            return None
        if self.fence is None:
            self.fence = OwnerFence()
        return self.fence.fd, self.fence.ino

    def release(self, reg_id: int) -> list[asyncio.Future[None]]:
        """Release buffer ``reg_id`` (nothing if it is not registered); what
        still reaches its memory, to wait for: the frames of ``tcp`` reads
        it served (its memory stays alive for them: :func:`view_of`), the
        ``same_host`` transfers that found it registered, still copying
        (then a task, until they are done: it keeps the memory alive too).
        A drop returns once they are done, so that the owner changing the
        memory then reaches no transfer begun before."""
        reg = self.by_id.pop(reg_id, None)
        if reg is None:
            return []
        reg.release()  # (its token 0 first: a transfer locking after reads it)
        # (a store's anchor registers no memory: nothing copies it)
        if self.fence is None or not reg.memory.size or self.fence.quiet(reg.id):
            return reg.lent
        return [*reg.lent, self.rt.tasks.start(_quiet(self.fence, reg),
                                               name=f"RDMA drop fence of buffer {reg.id}")]

    def release_owned(self, owner: str) -> None:
        """Release every buffer registered by the actor ``owner`` (it stopped)."""
        for reg in [r for r in self.by_id.values() if r.owner == owner]:
            self.release(reg.id)

    def close(self) -> None:
        """The runtime is closing: release every buffer."""
        regs, self.by_id = self.by_id, {}
        for reg in regs.values():
            reg.release()
        if self.fence is not None:  # (a holder opening it now finds the buffer dropped)
            self.fence.close()


# ---------------------------------------------------------------- handle

@dataclass(frozen=True)
class Handle:
    """What travels: enough for another process to reach the buffer."""

    owner: str  # meshio address of the owner process
    pid: int
    host: str  # HOST_ID of the owner
    buf: int
    token: int
    token_addr: int
    addr: int
    size: int
    ib: bytes | None = None  # ibverbs remote key / address / port info
    backend: Backend | None = None  # forced backend
    fence: tuple[int, int] | None = None  # the owner's same_host fence: fd number, inode


def _take_buffer(raw: Any, bufs: Buffers) -> Any:
    return bufs[0] if bufs else b""


async def ask_owner(rt: Runtime, h: Handle, msg: RdmaOp, timeout: float | None,
                    out: list[tuple[Any, int]] | None = None) -> Any:
    """One request served by the runtime of ``h``'s owner.  Like a call, it
    is not sent when that process is known down or found not responding
    (``rt.dead``): it fails at once.

    Raises:
        CallTimeout: no answer within ``timeout`` seconds (None: no limit).
        SupervisionError: the transport's own, unchanged: the owner's process
            is gone, not responding (heartbeats), or could not be reached;
            :func:`owner_may_live` tells which.
        RDMAError: the owner refused the request (the buffer was dropped, a
            range outside it).
    """
    fut: asyncio.Future[Any] = rt.loop.create_future()
    pending = Pending(fut, _take_buffer, f"RDMA {msg.op}", f"buffer {h.buf}",
                      f"owner pid {h.pid}")
    dead = rt.dead.get(h.owner)
    if dead is not None:
        raise dead(pending)
    conn = rt.connect(h.owner)
    req = conn.next_req(pending)
    conn.send_message(replace_req(msg, req), out or [])
    try:
        return await within(fut, timeout)
    except TimeoutError:
        raise CallTimeout(f"RDMA {msg.op} on buffer {h.buf}: its owner (pid {h.pid}) did not "
                          f"answer within {timeout}s (stopped, or its loop is blocked); the "
                          f"request may still take effect if it resumes",
                          endpoint=f"RDMABuffer.{msg.op}") from None
    finally:
        conn.pending.pop(req, None)  # given up (timeout, cancel): a late reply is ignored


async def _request(rt: Runtime, h: Handle, msg: RdmaOp, timeout: float | None,
                   out: list[tuple[Any, int]] | None = None) -> Any:
    """:func:`ask_owner` for a transfer (a ``tcp`` chunk, the ``ibverbs``
    set-up): an owner that cannot serve it, whatever the reason, is an
    :class:`RDMAError` saying why, which the backend raises again naming
    the transfer, the buffer and itself; :class:`CallTimeout` if no answer
    comes within ``timeout`` seconds."""
    try:
        return await ask_owner(rt, h, msg, timeout, out)
    except SupervisionError as e:
        raise RDMAError(f"its owner (pid {h.pid}) is unreachable: {e}") from None


#: ``SupervisionError.cause`` of an owner not known to be gone: found not
#: responding by heartbeats (``not_responding`` in ``_transport/_connection.py``:
#: "not responding for 3.0 s"), or not reached by a dial (``_dial_error`` in
#: ``_transport/_sockets.py``).  Every other cause says its process is gone:
#: it exited or was killed (a supervisor kills a hung one), its connection
#: was lost (the controller then kills it), its proc mesh was stopped, its
#: host downed ("partitioned").
_MAY_LIVE: Final = ("connect timed out", "connect failed")


def owner_may_live(e: SupervisionError) -> bool:
    """Whether the owner whose request failed with ``e`` may still be alive,
    its registrations with it (else its process is gone, and they are too)."""
    return e.cause.startswith("not responding") or e.cause in _MAY_LIVE


def replace_req(msg: RdmaOp, req: int) -> RdmaOp:
    return msgspec.structs.replace(msg, req=req)
