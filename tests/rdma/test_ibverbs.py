"""The ``ibverbs`` backend on a real RDMA device (soft-RoCE inside the test VM:
``bash ../shared/rxe-vm/run-in-rxe-vm.sh -- python -m pytest tests/rdma``).

Everything here is forced onto ``backend="ibverbs"``: RC queue pairs, RDMA
READ/WRITE, completions through the loop.  The last test checks the wire
format against code we did not write: Debian's ``pyverbs`` reads and writes
a buffer that meshio registered.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
import types
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import meshio
import meshio.rdma
from fifo_gate import Gate, hold
from meshio import Actor, RDMABuffer, context, endpoint
from meshio.jobs import ProcessJob
from meshio.rdma import RDMAError, RDMASizeError, available_backends
from meshio.testing import open_fds


def _why_absent() -> str:
    try:
        import meshio.rdma._ibverbs_device  # noqa: F401
    except ImportError as e:
        return (f"ibverbs backend absent: {e} (meshio is built without it when "
                "libibverbs-dev is missing at install)")
    return ("ibverbs backend absent: no RDMA device with an active port here; run inside "
            "the soft-RoCE VM (../shared/rxe-vm/run-in-rxe-vm.sh)")


pytestmark = pytest.mark.skipif("ibverbs" not in available_backends(), reason=_why_absent())

#: generous bound on any single wait (the VM emulates its CPUs)
GUARD = 30.0
#: a dead owner must be reported within this
PROMPT = 15.0
N = 1 << 20
SYSTEM_PYTHON = "/usr/bin/python3"


class Owner(Actor):
    def __init__(self) -> None:
        self.data = bytearray(os.urandom(N))
        self.other = bytearray(os.urandom(4096))
        self.bufs: dict[str, RDMABuffer] = {}

    @endpoint
    async def register(self, name: str = "main") -> RDMABuffer:
        buf = RDMABuffer(self.data if name == "main" else self.other, backend="ibverbs")
        self.bufs[name] = buf
        return buf

    @endpoint
    async def hand_to(self, peer: Peer, offset: int, length: int) -> bytes:
        """Send our buffer to ``peer`` in an actor message; it reads it back."""
        return await peer.read.call_one(self.bufs["main"], offset, length)

    @endpoint
    async def content(self, name: str, offset: int, length: int) -> bytes:
        data = self.data if name == "main" else self.other
        return bytes(data[offset:offset + length])

    @endpoint
    async def drop(self, name: str) -> None:
        await self.bufs[name].drop()

    @endpoint
    async def addr(self) -> str:
        return context().proc.addr

    @endpoint
    async def nap(self, ready: str, release: str) -> None:
        """Block this process's event loop (see fifo_gate): an ``async def``,
        since a plain ``def`` endpoint would run in the actor's thread."""
        hold(ready, release)

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


class Peer(Actor):
    @endpoint
    async def read(self, buf: RDMABuffer, offset: int, length: int) -> bytes:
        assert buf.backend == "ibverbs"
        dst = bytearray(length)
        assert await buf.read_into(dst, offset=offset, length=length) == length
        return bytes(dst)

    @endpoint
    async def write(self, buf: RDMABuffer, data: bytes, offset: int) -> int:
        return await buf.write_from(data, offset=offset)  # bytes: a read-only source

    @endpoint
    async def drop(self, buf: RDMABuffer) -> None:
        await buf.drop()

    @endpoint
    async def addr(self) -> str:
        return context().proc.addr


@pytest.fixture
async def pair(procs: meshio.ProcMesh) -> AsyncIterator[tuple[Owner, Peer]]:
    owner = await procs.slice(procs=0).spawn("owner", Owner)
    peer = await procs.slice(procs=1).spawn("peer", Peer)
    yield owner, peer


async def test_read_and_write_with_offsets(pair: tuple[Owner, Peer]) -> None:
    owner, peer = pair
    buf = await owner.register.call_one()
    assert buf.handle.ib is not None and buf.size == N
    # The owner hands the buffer over in an actor message of its own.
    assert (await asyncio.wait_for(owner.hand_to.call_one(peer, 0, N), GUARD)
            == await owner.content.call_one("main", 0, N))
    for offset, length in [(1, 4095), (N - 7, 7), (123457, 300001), (N - 1, 1)]:
        got = await asyncio.wait_for(peer.read.call_one(buf, offset, length), GUARD)
        assert got == await owner.content.call_one("main", offset, length)
    for offset, size in [(0, 1), (333, 70001), (N - 4096, 4096), (0, N)]:
        patch = os.urandom(size)
        assert await asyncio.wait_for(peer.write.call_one(buf, patch, offset), GUARD) == size
        assert await owner.content.call_one("main", offset, size) == patch
    # Writes land exactly: nothing around them moved.
    before = await owner.content.call_one("main", 0, N)
    patch = os.urandom(1000)
    await peer.write.call_one(buf, patch, 5000)
    after = await owner.content.call_one("main", 0, N)
    assert after == before[:5000] + patch + before[6000:]


async def test_handles_across_hosts(tmp_path: Path) -> None:
    """issue 10: a buffer owned on one host (a host agent of a ProcessJob,
    its workers reached over authenticated TCP) is handed to a worker on
    another host in an actor message and read and written there one-sidedly
    over ibverbs.  In the VM both agents share the one soft-RoCE device;
    across real hosts each uses its own."""
    job = ProcessJob(meshes={"hosts": 2}, cache_dir=tmp_path / ".meshio")
    try:
        state = await job.state()
        async with state.hosts.spawn_procs() as procs:
            owner = await procs.slice(hosts=0).spawn("owner", Owner)
            peer = await procs.slice(hosts=1).spawn("peer", Peer)
            addrs = {await owner.addr.call_one(), await peer.addr.call_one()}
            assert len(addrs) == 2 and all(a.startswith("tcp://") for a in addrs)
            buf = await owner.register.call_one()
            assert buf.backend == "ibverbs"
            assert (await asyncio.wait_for(owner.hand_to.call_one(peer, 0, N), GUARD)
                    == await owner.content.call_one("main", 0, N))
            patch = os.urandom(70001)
            assert await asyncio.wait_for(peer.write.call_one(buf, patch, 333), GUARD) == 70001
            assert await owner.content.call_one("main", 333, 70001) == patch
    finally:
        await job.kill()


async def test_controller_transfers_in_chunks_concurrently(
        pair: tuple[Owner, Peer], monkeypatch: pytest.MonkeyPatch) -> None:
    """A small "largest message" splits each transfer into many work
    requests, more than a send queue holds; transfers run concurrently on
    one queue pair."""
    import meshio.rdma._ibverbs_qp as ibq

    monkeypatch.setattr(ibq, "MAX_CHUNK", 8192)
    owner, _ = pair
    buf = await owner.register.call_one()
    assert buf.backend == "ibverbs"
    whole = bytearray(N)
    await asyncio.wait_for(buf.read_into(whole), GUARD)  # 128 work requests
    assert whole == await owner.content.call_one("main", 0, N)
    ranges = [(i * 65536 + i, 65536 - 2 * i) for i in range(16)]
    dsts = [bytearray(n) for _, n in ranges]
    await asyncio.wait_for(asyncio.gather(*(
        buf.read_into(d, offset=o, length=n) for d, (o, n) in zip(dsts, ranges))), GUARD)
    for d, (o, n) in zip(dsts, ranges):
        assert d == whole[o:o + n]
    patches = [os.urandom(20000) for _ in range(8)]
    await asyncio.wait_for(asyncio.gather(*(
        buf.write_from(p, offset=i * 100000) for i, p in enumerate(patches))), GUARD)
    for i, p in enumerate(patches):
        assert await owner.content.call_one("main", i * 100000, len(p)) == p


async def test_size_errors(pair: tuple[Owner, Peer]) -> None:
    owner, _ = pair
    buf = await owner.register.call_one()
    with pytest.raises(RDMASizeError, match="exceeds"):
        await buf.read_into(bytearray(16), offset=N - 8, length=16)
    with pytest.raises(RDMASizeError, match="destination holds 16 bytes"):
        await buf.read_into(bytearray(16), length=32)
    with pytest.raises(RDMASizeError, match="exceeds"):
        await buf.write_from(b"x" * 10, offset=N - 5)
    with pytest.raises(RDMASizeError, match="offset must be"):
        await buf.read_into(bytearray(16), offset=-1, length=4)
    with pytest.raises(RDMASizeError, match=f"offset {N + 1} is past the end of the buffer"):
        await buf.read_into(bytearray(N), offset=N + 1)
    # ...and nothing broke: the buffer still works.
    dst = bytearray(16)
    await asyncio.wait_for(buf.read_into(dst, offset=N - 16), GUARD)
    assert dst == await owner.content.call_one("main", N - 16, 16)


async def test_drop_then_use(pair: tuple[Owner, Peer]) -> None:
    owner, peer = pair
    buf = await owner.register.call_one()
    other = await owner.register.call_one("other")
    assert len(await asyncio.wait_for(peer.read.call_one(buf, 0, 64), GUARD)) == 64
    await owner.drop.call_one("main")  # the owner deregisters its memory
    # The peer's queue pair is set up: the owner's device refuses the rkey.
    with pytest.raises(meshio.ActorError) as err:
        await asyncio.wait_for(peer.read.call_one(buf, 0, 64), GUARD)
    assert err.value.remote_type.endswith("RDMAError")
    assert "dropped" in err.value.remote_message
    assert "ibverbs" in err.value.remote_message
    # That broke the queue pair; the next transfer connects afresh.
    got = await asyncio.wait_for(peer.read.call_one(other, 0, 4096), GUARD)
    assert got == await owner.content.call_one("other", 0, 4096)
    # The controller has no queue pair yet: the set-up says "dropped".
    with pytest.raises(RDMAError, match="dropped"):
        await asyncio.wait_for(buf.read_into(bytearray(8), length=8), GUARD)
    # Dropped from a holder: released in the owner.
    await peer.drop.call_one(other)
    with pytest.raises(meshio.ActorError, match="dropped"):
        await asyncio.wait_for(peer.write.call_one(other, b"late", 0), GUARD)
    await buf.drop()  # idempotent


async def test_dead_owner_fails_promptly(pair: tuple[Owner, Peer]) -> None:
    owner, peer = pair
    buf = await owner.register.call_one()
    pid = await owner.pid.call_one()
    assert len(await asyncio.wait_for(peer.read.call_one(buf, 0, 8), GUARD)) == 8
    dst = bytearray(N)
    await asyncio.wait_for(buf.read_into(dst), GUARD)  # the controller's queue pair
    reading = asyncio.Event()

    async def keep_reading() -> int:
        n = 0
        while True:
            await buf.read_into(dst)
            n += 1
            reading.set()

    ongoing = asyncio.ensure_future(keep_reading())
    await asyncio.wait_for(reading.wait(), GUARD)
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(RDMAError) as err:
        await asyncio.wait_for(ongoing, GUARD)
    assert time.monotonic() - t0 < PROMPT
    message = str(err.value)
    assert f"pid {pid}" in message and "ibverbs" in message, message
    # The peer's queue pair is set up too: its next transfer fails as promptly.
    t0 = time.monotonic()
    with pytest.raises(meshio.ActorError) as aerr:
        await asyncio.wait_for(peer.read.call_one(buf, 0, 8), GUARD)
    assert time.monotonic() - t0 < PROMPT
    assert aerr.value.remote_type.endswith("RDMAError")
    assert f"pid {pid}" in aerr.value.remote_message


async def test_one_sided_while_the_owner_is_blocked(pair: tuple[Owner, Peer],
                                                   tmp_path: Path) -> None:
    owner, peer = pair
    buf = await owner.register.call_one()
    assert len(await asyncio.wait_for(peer.read.call_one(buf, 0, 8), GUARD)) == 8
    before = await owner.content.call_one("main", 0, N)
    gate = Gate(tmp_path)
    napping = asyncio.ensure_future(owner.nap.call_one(gate.ready, gate.release))
    await gate.wait_held(GUARD)  # the owner's loop is blocked until the gate opens
    got = await asyncio.wait_for(peer.read.call_one(buf, 4096, 65536), GUARD)
    patch = os.urandom(3000)
    assert await asyncio.wait_for(peer.write.call_one(buf, patch, 100), GUARD) == 3000
    assert not napping.done(), "the owner's loop ran during the transfers"
    assert got == before[4096:4096 + 65536]
    await gate.open()
    await asyncio.wait_for(napping, GUARD)
    assert await owner.content.call_one("main", 100, 3000) == patch


async def test_loopback_registered_destination_and_cancellation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In one process: a queue pair to ourselves, a destination that is
    itself registered (its memory region is reused), and a transfer
    cancelled in flight (its queue pair is destroyed, the next one works)."""
    import meshio.rdma._ibverbs_qp as ibq

    src = bytearray(os.urandom(N))
    dst = bytearray(N)
    a = RDMABuffer(src, backend="ibverbs")
    b = RDMABuffer(dst, backend="ibverbs")
    registered: list[int] = []

    class Counting(ibq.IbRegistration):
        def __init__(self, addr: int, size: int, access: int) -> None:
            registered.append(size)
            super().__init__(addr, size, access)

    monkeypatch.setattr(ibq, "IbRegistration", Counting)
    try:
        await asyncio.wait_for(a.read_into(dst, offset=0, length=N), GUARD)
        assert dst == src
        assert registered == []  # b's memory region served as the destination
        patch = os.urandom(12345)
        await asyncio.wait_for(a.write_from(patch, offset=999), GUARD)
        assert src[999:999 + len(patch)] == patch
        assert registered == [len(patch)]  # bytes: registered for this transfer only
        with pytest.raises(meshio.CallTimeout, match="ibverbs"):
            await a.options(timeout=1e-9).read_into(bytearray(N))
        again = bytearray(N)
        await asyncio.wait_for(a.read_into(again), GUARD)
        assert again == src
    finally:
        await a.drop()
        await b.drop()


async def test_closing_the_runtime_fails_transfers_and_closes_the_device() -> None:
    """Closing the runtime (as the end of ``meshio.run`` does) fails a transfer
    in flight, destroys the runtime's queue pairs, completion channel and
    registrations, and closes the device it was the last user of: no fd of
    the device stays open in the process."""
    from meshio._transport._runtime import close_runtime

    def device_fds() -> list[str]:
        return [what for what in open_fds().values() if "infiniband" in what]

    a = RDMABuffer(bytearray(os.urandom(N)), backend="ibverbs")
    await asyncio.wait_for(a.read_into(bytearray(8), length=8), GUARD)  # a queue pair to us
    assert device_fds()  # the device and the runtime's completion channel
    reading = asyncio.ensure_future(a.read_into(bytearray(N)))
    await asyncio.sleep(0)  # one step: it posts its work request, then waits
    assert not reading.done()
    close_runtime()
    with pytest.raises(RDMAError, match=r"runtime of this event loop .* closed"):
        await asyncio.wait_for(reading, GUARD)
    assert device_fds() == []


# ------------------------------------------------- against Debian's pyverbs

PYVERBS_PEER = textwrap.dedent("""
    import json, os, sys, time
    import pyverbs.enums as e
    from pyverbs.addr import GID, AHAttr, GlobalRoute
    from pyverbs.cq import CQ
    from pyverbs.device import Context
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
    from pyverbs.wr import SGE, SendWR

    def say(**kw):
        print(json.dumps(kw), flush=True)

    def hear():
        return json.loads(sys.stdin.readline())

    def gid_str(raw_hex):
        return ":".join(raw_hex[i:i + 4] for i in range(0, 32, 4))

    def wait(cq):
        end = time.monotonic() + 20
        while time.monotonic() < end:
            n, wcs = cq.poll(1)
            if n:
                assert wcs[0].status == e.IBV_WC_SUCCESS, wcs[0].status
                return
        raise SystemExit("no completion")

    cfg = hear()
    port, gidx, size = cfg["port"], cfg["gid_index"], cfg["size"]
    ctx = Context(name=cfg["device"])
    pd = PD(ctx)
    cq = CQ(ctx, 8)
    mr = MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE)
    cap = QPCap(max_send_wr=4, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap),
            QPAttr(port_num=port))
    pattr = ctx.query_port(port)
    psn = 4242
    say(qpn=qp.qp_num, psn=psn, lid=pattr.lid, mtu=int(pattr.active_mtu),
        gid=ctx.query_gid(port, gidx).gid.replace(":", ""))
    peer = hear()
    attr = QPAttr(port_num=port)
    attr.path_mtu = min(int(pattr.active_mtu), peer["mtu"])
    attr.dest_qp_num = peer["qpn"]
    attr.rq_psn = peer["psn"]
    attr.sq_psn = psn
    attr.max_rd_atomic = 1
    attr.max_dest_rd_atomic = 1
    attr.min_rnr_timer = 12
    attr.timeout = 14
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    gr = GlobalRoute(dgid=GID(gid_str(peer["gid"])), sgid_index=gidx, hop_limit=64)
    attr.ah_attr = AHAttr(port_num=port, is_global=1, gr=gr, dlid=peer["lid"])
    qp.to_rts(attr)

    # RDMA READ of the meshio buffer, then RDMA WRITE into it.
    wr = SendWR(opcode=e.IBV_WR_RDMA_READ, num_sge=1, sg=[SGE(mr.buf, peer["length"], mr.lkey)])
    wr.set_wr_rdma(peer["rkey"], peer["addr"] + peer["offset"])
    qp.post_send(wr)
    wait(cq)
    got = mr.read(peer["length"], 0)
    patch = os.urandom(peer["length"])
    mr.write(patch, peer["length"], 0)
    wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(mr.buf, peer["length"], mr.lkey)])
    wr.set_wr_rdma(peer["rkey"], peer["addr"] + peer["write_offset"])
    qp.post_send(wr)
    wait(cq)
    say(read=got.hex(), wrote=patch.hex())
""")


def _have_pyverbs() -> bool:
    if not os.path.exists(SYSTEM_PYTHON):
        return False
    return subprocess.run([SYSTEM_PYTHON, "-c", "import pyverbs.device"],
                          capture_output=True, check=False).returncode == 0


async def test_pyverbs_peer_reads_and_writes_a_meshio_buffer() -> None:
    if not _have_pyverbs():
        pytest.skip(f"Debian's python3-pyverbs is not installed for {SYSTEM_PYTHON} "
                    "(apt-get install python3-pyverbs)")
    import meshio.rdma._ibverbs_device as ibd
    import meshio.rdma._ibverbs_qp as ibq
    from meshio._transport._runtime import runtime

    data = bytearray(os.urandom(N))
    buf = RDMABuffer(data, backend="ibverbs")  # registered in this (controller) process
    port = runtime().state(ibq.IbEndpoint).device
    assert buf.handle.ib is not None
    _, addr, size, rkey, _, _ = ibd._DESC.unpack(buf.handle.ib)
    assert (addr, size) == (buf.handle.addr, N)
    proc = await asyncio.create_subprocess_exec(
        SYSTEM_PYTHON, "-c", PYVERBS_PEER, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        limit=1 << 22)  # its last line carries 2 x 64 KiB in hex
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    async def hear() -> dict[str, object]:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), GUARD)
        if not line:
            err = await proc.stderr.read() if proc.stderr else b""
            raise AssertionError(f"the pyverbs peer died: {err.decode()}")
        got: dict[str, object] = json.loads(line)
        return got

    def say(**kw: object) -> None:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(kw).encode() + b"\n")

    try:
        say(device=port.name, port=port.port, gid_index=port.gid_index, size=65536)
        theirs = await hear()
        info = ibq._QpInfo(int(str(theirs["qpn"])), int(str(theirs["psn"])),
                          bytes.fromhex(str(theirs["gid"])), int(str(theirs["lid"])),
                          int(str(theirs["mtu"])), 1)
        conn = types.SimpleNamespace(peer="pyverbs-peer", peer_pid=proc.pid)
        reply = ibq.accept(runtime(), conn, info.pack())  # type: ignore[arg-type]
        ours = ibq._QpInfo.unpack(reply, "accept")
        offset, write_offset, length = 70001, 500000, 65536
        say(qpn=ours.qpn, psn=ours.psn, gid=ours.gid.hex(), lid=ours.lid, mtu=ours.mtu,
            addr=addr, rkey=rkey, offset=offset, write_offset=write_offset, length=length)
        result = await hear()
        assert bytes.fromhex(str(result["read"])) == data[offset:offset + length]
        assert data[write_offset:write_offset + length] == bytes.fromhex(str(result["wrote"]))
        assert await asyncio.wait_for(proc.wait(), GUARD) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await asyncio.wait_for(proc.wait(), GUARD)
        await buf.drop()


@pytest.mark.timeout(300)
def test_doctor_finds_the_device_and_a_low_memlock_limit() -> None:
    """issue 19 item 4: ``meshio doctor --require ibverbs`` passes on a
    device with an active port; without CAP_IPC_LOCK (dropped by
    ``setpriv``) a low ``ulimit -l`` is a warning saying what to do.
    (torch and the Kubernetes client are hidden from the child: importing
    them takes minutes on the VM's emulated CPUs, and nothing here needs them.)"""
    hide = "import sys; sys.modules['torch'] = sys.modules['kubernetes'] = None"
    argv = [sys.executable, "-c", f"{hide}\nfrom meshio._cli import main; main()", "doctor",
            "--json", "--require", "ibverbs"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    ib = json.loads(proc.stdout)["checks"]["ibverbs"]
    assert ib["detail"].startswith("RDMA devices with an active port: ")
    if os.geteuid() != 0:
        return  # setpriv cannot drop what an ordinary user does not have
    low = 64 << 10

    def lower_memlock() -> None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (low, low))

    proc = subprocess.run(["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock",
                           *argv], capture_output=True, text=True, timeout=120,
                          preexec_fn=lower_memlock)
    assert proc.returncode == 0, proc.stderr  # a warning, not missing
    ib = json.loads(proc.stdout)["checks"]["ibverbs"]
    assert ib["status"] == "warning"
    assert ib["facts"] == {"memlock": low, "cap_ipc_lock": False}
    assert "ulimit -l is 64 KiB, and this process lacks CAP_IPC_LOCK" in ib["detail"]
