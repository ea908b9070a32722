"""A 64 MiB value between two hosts: meshio against raw sockets, one run.

The hosts are network namespaces (tests/netns_hosts.py: each its own
address behind a veth pair and a bridge); the sender is in the root
namespace, the receiver on a namespace host.  Rows, interleaved over
``--rounds`` rounds, each in fresh processes:

- ``raw tcp block``: a blocking socket, ``sendall`` of the value, the
  receiver ``recv_into`` new memory per value (an anonymous map, its pages
  committed as data arrives, as meshio's receive targets are), then a
  1-byte ack;
- ``raw tcp block-reused``: the same into one buffer reused for every value
  (no page faults: a ceiling no receiver handing out a new value reaches);
- ``raw tcp asyncio`` / ``raw tcp uvloop``: both ends on that loop, the
  sender ``transport.write``, the receiver a ``BufferedProtocol`` filling
  new memory per value; ``...-sliced``: the sender writes 256 KiB slices as
  the transport drains (``pause_writing``/``resume_writing``);
- ``raw tls ...``: the same under stdlib ``ssl`` with the contexts meshio's
  ``tls=`` builds (``TLSConfig.server_context``/``client_context``, mutual,
  the same trustme certificates);
- ``meshio tcp|tls bytes|tensor (LOOP)``: ``call_one`` with the value as the
  argument of an actor in a worker on the namespace host (reached through
  its ``meshio agent``), answered with its length; the controller on
  ``uvloop`` (``meshio.run``) or ``asyncio`` (``asyncio.run``);
  ``bytes-result|tensor-result``: the other way, the actor's result (a
  value it made once), received by the controller in the root namespace.

Each row times ``--reps`` transfers after one warm-up (connection set-up
excluded) and keeps their median; the table gives the median over rounds
[min-max] in MiB/s, and each meshio row's ratio to the best raw row of its
kind (tcp or tls) that receives into new memory, and to ``block-reused``.

Needs root (network namespaces).

Usage: sudo python benchmarks/bench_hosts_bulk.py [--mib 64] [--reps 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import os
import secrets
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import meshio
from meshio import Actor, endpoint

HERE = Path(__file__).resolve().parent
RAW_PORT = 29600
RAW = [f"raw {t} {io}" for t in ("tcp", "tls")
       for io in ("block", "block-reused", "asyncio", "uvloop", "asyncio-sliced",
                  "uvloop-sliced")]
MESHIO = [f"meshio {t} {what} ({loop})" for t in ("tcp", "tls")
          for what in ("bytes", "tensor", "bytes-result", "tensor-result")
          for loop in ("uvloop", "asyncio")]


class Sink(Actor):
    def __init__(self) -> None:
        # now, not on the first tensor: importing torch blocks the worker
        # for seconds on a loaded machine, past the heartbeat timeout
        import torch  # noqa: F401  # pyright: ignore[reportUnusedImport]
        #: what ``give`` returns, made on its first call
        self.value: Any = None

    @endpoint
    async def length(self, data: bytes) -> int:
        return len(data)

    @endpoint
    async def nbytes(self, t: Any) -> int:  # a torch.Tensor
        return int(t.numel() * t.element_size())

    @endpoint
    async def give(self, what: str, n: int) -> Any:
        """A value of ``n`` bytes made once (``bytes``, or a tensor), as a result."""
        if self.value is None:
            import torch

            data = os.urandom(n)
            self.value = torch.frombuffer(bytearray(data), dtype=torch.uint8) \
                if what == "tensor" else data
        return self.value


# ------------------------------------------------------------------ raw sockets

def _contexts(tls_dir: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    from meshio.jobs import TLSConfig

    d = Path(tls_dir)
    cfg = TLSConfig(d / "host.pem", d / "host.pem", d / "ca.pem")
    return cfg.server_context(), cfg.client_context()


def _target(n: int) -> memoryview:
    """New memory for a value, untouched like meshio's (an anonymous map: its
    pages are committed as data arrives, not zeroed first)."""
    return memoryview(mmap.mmap(-1, n))


def _serve_block(sock: socket.socket, n: int, reps: int, ctx: ssl.SSLContext | None,
                 reuse: bool) -> None:
    conn, _ = sock.accept()
    if ctx is not None:
        conn = ctx.wrap_socket(conn, server_side=True)
    view = _target(n)
    for _ in range(reps):
        pos = 0
        if not reuse:
            view = _target(n)
        while pos < n:
            got = conn.recv_into(view[pos:])
            if not got:
                raise ConnectionError("sender closed early")
            pos += got
        conn.sendall(b"k")
    conn.close()


class _Receiver(asyncio.BufferedProtocol):
    """Fills new memory with each value, acks each."""

    def __init__(self, n: int, done: asyncio.Future[None], reps: int) -> None:
        self.n, self.done, self.left = n, done, reps
        self.view, self.pos = _target(n), 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.pos:]

    def buffer_updated(self, nbytes: int) -> None:
        self.pos += nbytes
        if self.pos == self.n:
            self.transport.write(b"k")
            self.left -= 1
            if not self.left:
                self.done.set_result(None)
            self.view, self.pos = _target(self.n), 0

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError("sender closed early"))


async def _serve_async(sock: socket.socket, n: int, reps: int, ctx: ssl.SSLContext | None
                       ) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    sock.setblocking(False)
    server = await loop.create_server(lambda: _Receiver(n, done, reps), sock=sock, ssl=ctx)
    async with server:
        await done


def _run_loop(io: str, main: Any) -> Any:
    if io.startswith("uvloop"):
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def serve(addr: str, io: str, tls_dir: str, n: int, reps: int) -> None:
    """The receiving end of a raw row (run on the namespace host)."""
    ctx = _contexts(tls_dir)[0] if tls_dir else None
    sock = socket.create_server((addr, RAW_PORT))
    print("ready", flush=True)
    if io.startswith("block"):
        _serve_block(sock, n, reps, ctx, reuse=io == "block-reused")
    else:
        _run_loop(io, _serve_async(sock, n, reps, ctx))


class _Sender(asyncio.Protocol):
    """Counts acks; :meth:`send` writes 256 KiB slices as the transport
    drains (what meshio does with a large frame)."""

    def __init__(self) -> None:
        self.acks: asyncio.Queue[None] = asyncio.Queue()
        self.queue: deque[memoryview] = deque()
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport

    def data_received(self, data: bytes) -> None:
        for _ in data:
            self.acks.put_nowait(None)

    def send(self, value: bytes) -> None:
        view = memoryview(value)
        self.queue.extend(view[i:i + (1 << 18)] for i in range(0, len(view), 1 << 18))
        self.resume_writing()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        while self.queue and not self.paused:
            self.transport.write(self.queue.popleft())


def send_raw(addr: str, io: str, tls_dir: str, n: int, reps: int) -> list[float]:
    """The sending end of a raw row: the seconds of each timed transfer."""
    ctx = _contexts(tls_dir)[1] if tls_dir else None
    payload = os.urandom(n)
    times: list[float] = []
    if io.startswith("block"):
        sock = socket.create_connection((addr, RAW_PORT))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ctx is not None:
            sock = ctx.wrap_socket(sock, server_hostname=addr)
        for _ in range(reps):
            t0 = time.perf_counter()
            sock.sendall(payload)
            if sock.recv(1) != b"k":
                raise ConnectionError("no ack")
            times.append(time.perf_counter() - t0)
        sock.close()
        return times

    async def main() -> None:
        loop = asyncio.get_running_loop()
        transport, proto = await loop.create_connection(
            _Sender, addr, RAW_PORT, ssl=ctx, server_hostname=addr if ctx else None)
        for _ in range(reps):
            t0 = time.perf_counter()
            if io.endswith("sliced"):
                proto.send(payload)
            else:
                transport.write(payload)
            await proto.acks.get()
            times.append(time.perf_counter() - t0)
        transport.close()

    _run_loop(io, main())
    return times


# ------------------------------------------------------------------ meshio

async def send_meshio(agent: str, secret: str, tls_dir: str, what: str, n: int,
                      reps: int) -> list[float]:
    """The seconds of each timed call carrying the value to the namespace host
    (``what`` "bytes" or "tensor"), or back from it ("bytes-result",
    "tensor-result": the actor's result)."""
    from meshio.jobs import TLSConfig

    d = Path(tls_dir) if tls_dir else None
    tls = None if d is None else TLSConfig(d / "host.pem", d / "host.pem", d / "ca.pem")
    if what == "tensor":
        import torch

        value: Any = torch.frombuffer(bytearray(os.urandom(n)), dtype=torch.uint8)
    else:
        value = os.urandom(n)
    call: Callable[[Any], Any]
    times: list[float] = []
    async with meshio.attach([agent], secret_file=secret, tls=tls).spawn_procs() as procs:
        sink = await procs.spawn("sink", Sink)
        one = sink.slice(**{k: 0 for k in procs.extent.labels})
        if what.endswith("-result"):
            kind = what.removesuffix("-result")

            async def call(v: Any) -> int:
                got = await one.give.call_one(kind, n)
                return len(got) if kind == "bytes" else int(got.numel())
        else:
            call = (lambda v: one.nbytes.call_one(v)) if what == "tensor" else (
                lambda v: one.length.call_one(v))
        for _ in range(reps):
            t0 = time.perf_counter()
            got = await call(value)
            times.append(time.perf_counter() - t0)
            if got != n:
                raise AssertionError(f"moved {n} bytes, {got} arrived")
    return times


# ------------------------------------------------------------------ driver

def _result(argv: list[str], env: dict[str, str] | None = None) -> list[float] | str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            times: list[float] = json.loads(line[len("RESULT "):])
            return times
    return (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]


def _row(row: str, hosts: dict[str, Any], tmp: Path, secret: Path, n: int, reps: int,
         base: str) -> list[float] | str:
    """Run one row in fresh processes: the seconds of its timed transfers."""
    kind = row.split()[1]
    host = hosts[kind]
    tls_dir = str(tmp) if kind == "tls" else ""
    me = [sys.executable, __file__, "--nbytes", str(n), "--reps", str(reps + 1),
          "--tls-dir", tls_dir]
    if row.startswith("raw"):
        io = row.split()[2]
        server = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, *me, "--serve", host.addr, "--io", io],
            stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            if server.stdout.readline().strip() != "ready":
                return "the raw receiver did not start"
            got = _result([*me, "--send", host.addr, "--io", io])
            server.wait(60)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
            if server.stdout is not None:
                server.stdout.close()
    else:
        what, loop = row.split()[2], row.split()[3].strip("()")
        env = {**os.environ, "PYTHONPATH": base} if row.endswith("[base]") else None
        got = _result([*me, "--meshio", host.agent_addr, "--what", what, "--loop", loop,
                       "--secret", str(secret)], env)
    return got if isinstance(got, str) else got[1:]  # less the warm-up


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", nargs="*", default=RAW + MESHIO)
    ap.add_argument("--base", default="", help="also run each meshio row's controller on "
                    "the meshio source tree at this path (rows marked [base]: an A/B of the "
                    "sending side; the workers run this tree)")
    # children
    ap.add_argument("--nbytes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--tls-dir", default="", help=argparse.SUPPRESS)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--send", help=argparse.SUPPRESS)
    ap.add_argument("--io", help=argparse.SUPPRESS)
    ap.add_argument("--meshio", help=argparse.SUPPRESS)
    ap.add_argument("--what", help=argparse.SUPPRESS)
    ap.add_argument("--loop", help=argparse.SUPPRESS)
    ap.add_argument("--secret", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.io, args.tls_dir, args.nbytes, args.reps)
        return
    if args.send:
        times = send_raw(args.send, args.io, args.tls_dir, args.nbytes, args.reps)
        print("RESULT " + json.dumps(times), flush=True)
        return
    if args.meshio:
        go = send_meshio(args.meshio, args.secret, args.tls_dir, args.what, args.nbytes,
                         args.reps)
        times = meshio.run(go) if args.loop == "uvloop" else asyncio.run(go)
        print("RESULT " + json.dumps(times), flush=True)
        return
    if os.geteuid() != 0:
        sys.exit("bench_hosts_bulk.py needs root (network namespaces)")
    n = args.mib << 20
    sys.path.insert(0, str(HERE.parent / "tests"))
    from bench_hosts import _tls

    from meshio.jobs._job import write_secret
    from netns_hosts import netns_hosts  # type: ignore[import-not-found]  # pyright: ignore

    rows = [v for r in args.rows
            for v in ((r, f"{r} [base]") if args.base and r.startswith("meshio") else (r,))]
    results: dict[str, list[float]] = {r: [] for r in rows}
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        tls = _tls(tmp)
        secret = tmp / "job.secret"
        write_secret(secret, secrets.token_bytes(32))
        tls_args = ("--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--tls-ca",
                    str(tls.ca))
        with ExitStack() as stack:  # one host with a plain agent, one with a TLS agent
            hosts: dict[str, Any] = {
                kind: stack.enter_context(netns_hosts(1, secret, agent_args=a))[0]  # pyright: ignore
                for kind, a in (("tcp", ()), ("tls", tls_args))}
            for rnd in range(args.rounds):
                for row in rows:
                    got = _row(row, hosts, tmp, secret, n, args.reps, args.base)
                    if isinstance(got, str):
                        notes.append(f"{row}, round {rnd + 1}: failed: {got}")
                    else:
                        results[row].append(n / statistics.median(got) / (1 << 20))
                    said = got if isinstance(got, str) else f"{results[row][-1]:.0f} MiB/s"
                    print(f"round {rnd + 1} {row}: {said}", file=sys.stderr, flush=True)
    med = {r: statistics.median(v) for r, v in results.items() if v}
    print(f"\n{args.mib} MiB per transfer; {args.rounds} rounds of {args.reps} timed "
          "transfers; MiB/s: median over rounds [min-max] of each round's median\n")
    print("| row | MiB/s | / best raw | / raw block-reused |")
    print("|---|---|---|---|")
    for row, vals in results.items():
        if not vals:
            print(f"| {row} | n/a | | |")
            continue
        kind = row.split()[1]
        raws = [med[r] for r in RAW if r in med and r.split()[1] == kind
                and not r.endswith("reused")]
        block = med.get(f"raw {kind} block-reused")
        best = f"{med[row] / max(raws):.2f}" if raws else "n/a"
        vs_block = f"{med[row] / block:.2f}" if block else "n/a"
        print(f"| {row} | {med[row]:.0f} [{min(vals):.0f}-{max(vals):.0f}] | {best} | "
              f"{vs_block} |")
    for note in notes:
        print(f"\nnote: {note}")


if __name__ == "__main__":
    main()
