"""The ``ibverbs`` RDMA backend: RDMA READ/WRITE on reliable-connected queue pairs.

On the process's device (:mod:`._ibverbs_device`, which loads the cffi
binding: importing this module raises :class:`ImportError` when it was not
built).  Per runtime (one per event loop), its :class:`IbEndpoint` state: a
completion queue whose channel's fd is watched by the loop, and one RC queue
pair per peer process in each direction, all destroyed when the runtime
closes::

    reader (transfer)                          owner (accept, in its runtime)
    QP to the owner, RESET → INIT    ──────►   "connect" RdmaOp, info = our QPN/PSN/GID
                                     ◄──────   QP for the reader, INIT → RTR → RTS;
    RTR → RTS                                  reply = its QPN/PSN/GID
    RDMA READ / WRITE (handle.ib: addr, rkey)  ... no code of the owner runs

The owner's CPU is not involved in a transfer: the set-up is one message the
first time a process reaches an owner, served by the owner's runtime.

Failures: a completion error breaks the queue pair (RC semantics); it is
destroyed, every transfer on it fails, and the next one connects afresh.
``MESHIO_IB_TIMEOUT`` (the IB local ACK timeout exponent, 4.096 µs · 2^n,
default 16 ≈ 0.27 s) and ``MESHIO_IB_RETRY_CNT`` (default 3) bound how long
a transfer to a dead owner takes to fail: about a second by default.
"""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import os
import secrets
import struct
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from .._constants import MSGPACK_NIL
from .._exceptions import RDMAError
from .._transport._messages import RdmaOp, RdmaOpName, Reply, Transfer
from .._transport._runtime import runtime
from .._transport._serial import KIND_BYTEARRAY, Buffers
from ._ibverbs_cffi import CData, QueuePair, _check, _ptr, _raise, ffi, lib
from ._ibverbs_device import REMOTE_ACCESS, IbRegistration, Remote, acquire, release, status
from ._memory import Memory
from ._registry import Handle, OwnerSide, Registration, Registry, _request

if TYPE_CHECKING:
    from .._transport._connection import Connection
    from .._transport._runtime import Runtime

__all__ = ("SERVES", "IbEndpoint", "accept", "status", "transfer")

#: IB local ACK timeout exponent and transport retries: a dead peer fails
#: after about 4.096 µs · 2^TIMEOUT · (RETRY_CNT + 1)
TIMEOUT: Final = int(os.environ.get("MESHIO_IB_TIMEOUT", "16"))
RETRY_CNT: Final = int(os.environ.get("MESHIO_IB_RETRY_CNT", "3"))
#: send-queue depth of each queue pair, entries of each completion queue
SQ_DEPTH: Final = 64
CQ_DEPTH: Final = 1024
#: largest single RDMA message (the port's ``max_msg_sz`` caps it further)
MAX_CHUNK: Final = 1 << 30


# ------------------------------------------------------------ queue pairs

#: connection exchange: version, QPN, PSN, GID, LID, MTU, RDMA READs accepted.
#: A reply with version 0 carries an error message instead.
_QP_INFO: Final = struct.Struct("<BII16sHBB")
_QP_VERSION: Final = 1


@dataclass(frozen=True)
class _QpInfo:
    qpn: int
    psn: int
    gid: bytes
    lid: int
    mtu: int
    rd_atomic: int

    def pack(self) -> bytes:
        return _QP_INFO.pack(_QP_VERSION, self.qpn, self.psn, self.gid, self.lid, self.mtu,
                             self.rd_atomic)

    @classmethod
    def unpack(cls, data: bytes, where: str) -> _QpInfo:
        if data[:1] == b"\0":
            raise RDMAError(f"{where}: {data[1:].decode(errors='replace')}")
        if len(data) != _QP_INFO.size or data[0] != _QP_VERSION:
            raise RDMAError(f"{where}: malformed queue-pair information from the peer "
                            "(a different meshio version?)")
        _, qpn, psn, gid, lid, mtu, rd = _QP_INFO.unpack(data)
        return cls(qpn, psn, gid, lid, mtu, rd)


class _Broken(RDMAError):
    """A transfer failed only because its queue pair broke under another one."""


class _Failed(RDMAError):
    """A work request completed with an error status (``ibv_wc_status``)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class _Qp:
    """One RC queue pair, connected to one peer process."""

    __slots__ = ("broken", "ep", "local", "peer", "qp", "remote", "slots", "waiting")

    def __init__(self, ep: IbEndpoint, peer: str) -> None:
        if ep.closed:
            raise ep.gone()
        self.ep = ep
        self.peer = peer
        dev = ep.device
        init = ffi.new("struct ibv_qp_init_attr *")
        init.send_cq = ep.cq
        init.recv_cq = ep.cq
        init.cap.max_send_wr = min(SQ_DEPTH, dev.max_qp_wr)
        init.cap.max_recv_wr = 1
        init.cap.max_send_sge = 1
        init.cap.max_recv_sge = 1
        init.qp_type = lib.IBV_QPT_RC
        init.sq_sig_all = 0
        self.qp: QueuePair | None = _ptr(lib.ibv_create_qp(dev.pd, init),
                                         f"ibv_create_qp on {dev.name}")
        self.local = _QpInfo(self.qp.qp_num, secrets.randbits(24), dev.gid, dev.lid,
                             dev.mtu, dev.rd_atomic)
        self.remote: _QpInfo | None = None
        self.broken: RDMAError | None = None
        self.slots = asyncio.Semaphore(int(init.cap.max_send_wr))
        self.waiting: dict[int, asyncio.Future[None]] = {}
        try:
            attr = ffi.new("struct ibv_qp_attr *")
            attr.qp_state = lib.IBV_QPS_INIT
            attr.pkey_index = 0
            attr.port_num = dev.port
            attr.qp_access_flags = REMOTE_ACCESS
            self._modify(attr, lib.IBV_QP_STATE | lib.IBV_QP_PKEY_INDEX | lib.IBV_QP_PORT
                         | lib.IBV_QP_ACCESS_FLAGS, "INIT")
        except BaseException:
            self.destroy()
            raise

    def _modify(self, attr: CData, mask: int, state: str) -> None:
        assert self.qp is not None
        _check(lib.ibv_modify_qp(self.qp, attr, mask),
               f"ibv_modify_qp(→{state}) on {self.ep.device.name} for peer {self.peer}")

    def connect(self, remote: _QpInfo) -> None:
        """INIT → RTR → RTS, aimed at the peer's queue pair."""
        dev = self.ep.device
        attr = ffi.new("struct ibv_qp_attr *")
        attr.qp_state = lib.IBV_QPS_RTR
        attr.path_mtu = min(dev.mtu, remote.mtu)
        attr.dest_qp_num = remote.qpn
        attr.rq_psn = remote.psn
        attr.max_dest_rd_atomic = dev.rd_atomic
        attr.min_rnr_timer = 12
        ah = attr.ah_attr
        ah.is_global = 1
        ah.grh.dgid.raw = list(remote.gid)
        ah.grh.sgid_index = dev.gid_index
        ah.grh.hop_limit = 64
        ah.dlid = remote.lid
        ah.sl = 0
        ah.src_path_bits = 0
        ah.port_num = dev.port
        self._modify(attr, lib.IBV_QP_STATE | lib.IBV_QP_AV | lib.IBV_QP_PATH_MTU
                     | lib.IBV_QP_DEST_QPN | lib.IBV_QP_RQ_PSN | lib.IBV_QP_MAX_DEST_RD_ATOMIC
                     | lib.IBV_QP_MIN_RNR_TIMER, "RTR")
        attr = ffi.new("struct ibv_qp_attr *")
        attr.qp_state = lib.IBV_QPS_RTS
        attr.timeout = TIMEOUT
        attr.retry_cnt = RETRY_CNT
        attr.rnr_retry = 0
        attr.sq_psn = self.local.psn
        attr.max_rd_atomic = max(1, min(dev.rd_atomic, remote.rd_atomic))
        self._modify(attr, lib.IBV_QP_STATE | lib.IBV_QP_TIMEOUT | lib.IBV_QP_RETRY_CNT
                     | lib.IBV_QP_RNR_RETRY | lib.IBV_QP_SQ_PSN | lib.IBV_QP_MAX_QP_RD_ATOMIC,
                     "RTS")
        self.remote = remote

    async def post(self, op: Transfer, laddr: int, lkey: int, raddr: int, rkey: int,
                   length: int) -> None:
        """RDMA READ (remote → local) or WRITE (local → remote) of ``length``
        bytes, split at the port's largest message; returns when all
        completed, raises on the first failed completion."""
        ep = self.ep
        opcode = lib.IBV_WR_RDMA_READ if op == "read" else lib.IBV_WR_RDMA_WRITE
        chunk = min(ep.device.max_msg, MAX_CHUNK)
        futs: list[asyncio.Future[None]] = []
        try:
            for start in range(0, length, chunk):
                await self.slots.acquire()
                try:
                    await ep.slots.acquire()
                except BaseException:
                    self.slots.release()
                    raise
                if self.broken is not None:
                    self.release()
                    raise _Broken(str(self.broken))
                n = min(chunk, length - start)
                sge = ffi.new("struct ibv_sge *")
                sge.addr = laddr + start
                sge.length = n
                sge.lkey = lkey
                wr = ffi.new("struct ibv_send_wr *")
                wr_id = next(ep.wr_ids)
                wr.wr_id = wr_id
                wr.sg_list = sge
                wr.num_sge = 1
                wr.opcode = opcode
                wr.send_flags = lib.IBV_SEND_SIGNALED
                wr.wr.rdma.remote_addr = raddr + start
                wr.wr.rdma.rkey = rkey
                bad = ffi.new("struct ibv_send_wr **")
                assert self.qp is not None
                rc = lib.ibv_post_send(self.qp, wr, bad)
                if rc != 0:
                    self.release()
                    _check(rc, f"ibv_post_send(RDMA {op.upper()}) to peer {self.peer}")
                fut = ep.loop.create_future()
                self.waiting[wr_id] = fut
                ep.owners[wr_id] = self
                futs.append(fut)
            for fut in futs:
                await fut
        except BaseException as e:
            if any(not f.done() for f in futs):
                # Cancelled (or failed) with work in flight: destroying the
                # queue pair guarantees no DMA reaches the local buffer later.
                self.fail(e if isinstance(e, RDMAError) else
                          RDMAError(f"RDMA {op} to {self.peer} was cancelled"))
            first: BaseException | None = None
            for f in futs:
                if f.done() and not f.cancelled():
                    exc = f.exception()  # retrieved: no "never retrieved" log
                    if isinstance(exc, _Failed) and first is None:
                        first = exc
            if first is not None and isinstance(e, _Broken):
                raise first from None  # our own failure, seen while posting more
            raise

    def completed(self, wr_id: int, status: int, vendor_err: int) -> None:
        fut = self.waiting.pop(wr_id, None)
        self.release()
        if fut is None or fut.done():
            return
        if status == lib.IBV_WC_SUCCESS:
            fut.set_result(None)
            return
        why = ffi.string(lib.ibv_wc_status_str(status)).decode()
        what = f"{why} (status {status}, vendor error {vendor_err:#x})"
        fut.set_exception(_Broken(what) if status == lib.IBV_WC_WR_FLUSH_ERR
                          else _Failed(what, status))
        self.fail(_Broken(f"the queue pair to {self.peer} broke: {why}"))

    def release(self) -> None:
        self.slots.release()
        self.ep.slots.release()

    def fail(self, error: RDMAError) -> None:
        """Break this queue pair: forget it, destroy it, fail what waits on it."""
        if self.broken is None:
            self.broken = error
        ep = self.ep
        if ep.out.get(self.peer) is self:
            del ep.out[self.peer]
        if ep.inbound.get(self.peer) is self:
            del ep.inbound[self.peer]
        self.destroy()
        waiting, self.waiting = self.waiting, {}
        for wr_id, fut in waiting.items():
            ep.owners.pop(wr_id, None)
            self.release()
            if not fut.done():
                fut.set_exception(_Broken(str(error)))

    def destroy(self) -> None:
        qp, self.qp = self.qp, None
        if qp is not None and self.ep.device.pid == os.getpid():
            lib.ibv_destroy_qp(qp)


# --------------------------------------------------------------- endpoint

class IbEndpoint:
    """The backend's state in one runtime (``rt.state(IbEndpoint)``): a
    completion queue, its channel watched by the runtime's loop, and the
    queue pairs; all destroyed when the runtime closes."""

    def __init__(self, rt: Runtime) -> None:
        self.loop = loop = rt.loop
        self.closed = False
        with ExitStack() as undo:  # a failure part-way destroys what was made
            self.device = dev = acquire()
            undo.callback(release, dev)
            self.channel = _ptr(lib.ibv_create_comp_channel(dev.ctx),
                                f"ibv_create_comp_channel({dev.name})")
            undo.callback(lib.ibv_destroy_comp_channel, self.channel)
            self.fd = fd = self.channel.fd
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
            self.cq = _ptr(lib.ibv_create_cq(dev.ctx, CQ_DEPTH, ffi.NULL, self.channel, 0),
                           f"ibv_create_cq({dev.name})")
            undo.callback(lib.ibv_destroy_cq, self.cq)
            _check(lib.ibv_req_notify_cq(self.cq, 0), "ibv_req_notify_cq")
            undo.pop_all()
        #: reader side, by owner address; owner side, by peer address
        self.out: dict[str, _Qp] = {}
        self.inbound: dict[str, _Qp] = {}
        self.connecting: dict[str, asyncio.Lock] = {}
        self.owners: dict[int, _Qp] = {}  # wr_id → its queue pair
        self.wr_ids = itertools.count(1)
        self.slots = asyncio.Semaphore(CQ_DEPTH)
        self._wc = ffi.new("struct ibv_wc[]", 32)
        self._ev_cq = ffi.new("struct ibv_cq **")
        self._ev_ctx = ffi.new("void **")
        loop.add_reader(fd, self._on_event)

    def _on_event(self) -> None:
        events = 0
        while lib.ibv_get_cq_event(self.channel, self._ev_cq, self._ev_ctx) == 0:
            events += 1
        if events:
            lib.ibv_ack_cq_events(self.cq, events)
        _check(lib.ibv_req_notify_cq(self.cq, 0), "ibv_req_notify_cq")
        self._drain()

    def _drain(self) -> None:
        wc = self._wc
        while True:
            n = lib.ibv_poll_cq(self.cq, 32, wc)
            if n < 0:
                _raise("ibv_poll_cq", -n)
            for i in range(n):
                w = wc[i]
                qp = self.owners.pop(w.wr_id, None)
                if qp is not None:
                    qp.completed(w.wr_id, w.status, w.vendor_err)
            if n < 32:
                return

    async def qp_to(self, rt: Runtime, h: Handle, where: str) -> _Qp:
        """The queue pair to ``h``'s owner process, connected on first use."""
        qp = self.out.get(h.owner)
        if qp is not None:
            return qp
        lock = self.connecting.setdefault(h.owner, asyncio.Lock())
        async with lock:
            qp = self.out.get(h.owner)
            if qp is not None:
                return qp
            qp = _Qp(self, h.owner)
            try:
                reply = await _request(rt, h, RdmaOp(0, "connect", h.buf, h.token,
                                                     info=qp.local.pack()), None)
                qp.connect(_QpInfo.unpack(bytes(reply), where))
            except BaseException:
                qp.destroy()
                raise
            self.out[h.owner] = qp
            if self.connecting.get(h.owner) is lock:
                del self.connecting[h.owner]
            return qp

    def accept(self, peer: str, info: bytes) -> bytes:
        """Owner side of ``connect``: our queue pair for ``peer``, connected
        to its queue pair described by ``info``."""
        remote = _QpInfo.unpack(info, f"ibverbs connect from {peer}")
        old = self.inbound.get(peer)
        if old is not None and old.broken is None and old.remote == remote:
            return old.local.pack()  # a repeated request: same answer
        if old is not None:
            old.fail(RDMAError(f"ibverbs: {peer} reconnected"))
        qp = _Qp(self, peer)
        try:
            qp.connect(remote)
        except BaseException:
            qp.destroy()
            raise
        self.inbound[peer] = qp
        return qp.local.pack()

    def local_key(self, rt: Runtime, addr: int, length: int,
                  op: Transfer) -> tuple[int, IbRegistration | None]:
        """An lkey covering ``addr``: a registered RDMABuffer of this process
        that contains it, else a registration for this transfer (returned,
        to be closed)."""
        for reg in rt.state(Registry).by_id.values():
            ib = reg.ib
            if (ib is not None and ib.registered and ib.addr <= addr
                    and addr + length <= ib.addr + ib.size):
                return ib.lkey, None
        # READ writes into local memory; WRITE only reads it (may be read-only).
        access = lib.IBV_ACCESS_LOCAL_WRITE if op == "read" else 0
        mr = IbRegistration(addr, length, access)
        return mr.lkey, mr

    def gone(self) -> RDMAError:
        """The error of a transfer on this endpoint once its runtime closed."""
        return RDMAError(f"ibverbs: the meshio runtime of this event loop (pid {os.getpid()}) "
                         "closed while the transfer was under way; finish transfers before "
                         "meshio.run returns")

    def close(self) -> None:
        """The runtime is closing: fail the transfers in flight, destroy the
        queue pairs, the completion queue and its channel, release the device."""
        if self.closed or self.device.pid != os.getpid():
            return  # closed already, or a forked child's copy: the parent's to destroy
        self.closed = True
        running = not self.loop.is_closed()
        if running:
            self.loop.remove_reader(self.fd)
        gone = self.gone()
        for qp in [*self.out.values(), *self.inbound.values()]:
            if running:
                qp.fail(gone)  # its transfers fail instead of waiting forever
            else:
                qp.destroy()
        self.out.clear()
        self.inbound.clear()
        lib.ibv_destroy_cq(self.cq)
        lib.ibv_destroy_comp_channel(self.channel)
        release(self.device)


# -------------------------------------------------------------- the backend

def _serve_connect(rt: Runtime, conn: Connection, msg: RdmaOp, bufs: Buffers,
                   reg: Registration) -> None:
    conn.send_message(Reply(msg.req, MSGPACK_NIL), [(accept(rt, conn, msg.info), KIND_BYTEARRAY)])


#: the owner's side of a holder's queue-pair set-up
SERVES: Final[Mapping[RdmaOpName, OwnerSide]] = {"connect": _serve_connect}


def accept(rt: Runtime, conn: Connection, info: bytes) -> bytes:
    """Owner side of a holder's queue-pair set-up (served by the runtime).

    Never raises: a failure goes back to the holder in the reply, which
    raises it there."""
    peer = conn.peer or f"pid {conn.peer_pid}"
    try:
        return rt.state(IbEndpoint).accept(peer, bytes(info))
    except RDMAError as e:
        return b"\0" + f"the owner (pid {os.getpid()}) could not connect: {e}".encode()


async def transfer(h: Handle, op: Transfer, local: Memory, offset: int, length: int) -> None:
    """RDMA ``op`` ("read": owner → local, "write": local → owner) of
    ``length`` bytes at ``offset`` of ``h``'s buffer, one-sidedly."""
    rt = runtime()
    local_addr = local.addr
    where = (f"RDMA {op} on buffer {h.buf} of pid {h.pid} on {h.host.split('/')[0]} "
             "(ibverbs)")
    if length == 0:
        # nothing to move, and RDMA checks no remote key for 0 bytes: the
        # owner tells whether the buffer is still registered
        try:
            await _request(rt, h, RdmaOp(0, "read", h.buf, h.token, offset, 0), None)
        except RDMAError as e:
            raise RDMAError(f"{where}: {e}") from None
        return
    remote = Remote.unpack(h.ib, where)
    ep = rt.state(IbEndpoint)
    lkey, mr = ep.local_key(rt, local_addr, length, op)
    try:
        for attempt in range(3):
            try:
                qp = await ep.qp_to(rt, h, where)
            except RDMAError as e:
                raise RDMAError(f"{where}: queue-pair set-up failed: {e}") from None
            try:
                await qp.post(op, local_addr, lkey, remote.addr + offset, remote.rkey, length)
                return
            except _Broken as e:
                # Another transfer broke the shared queue pair: ours is
                # intact and idempotent, so run it again on a fresh one.
                if attempt == 2:
                    raise RDMAError(f"{where}: {e}") from None
            except RDMAError as e:
                raise RDMAError(f"{where}: {_explain(e)}") from None
    finally:
        if mr is not None:
            mr.close()


def _explain(e: RDMAError) -> str:
    status = e.status if isinstance(e, _Failed) else None
    if status == lib.IBV_WC_REM_ACCESS_ERR:
        return (f"the owner refused the access: the buffer was dropped (its memory "
                f"registration is gone) ({e})")
    if status == lib.IBV_WC_RETRY_EXC_ERR:
        return (f"the owner does not answer: the process is gone or the network path "
                f"to it is down ({e})")
    return str(e)
