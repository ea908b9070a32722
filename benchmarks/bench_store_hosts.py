"""The weight store across two hosts (issue 17 section 1): a 256 MiB version
published on one network-namespace host and read on another, against a raw
TCP socket between the same two namespaces, in one run.

The hosts are network namespaces (tests/netns_hosts.py).  Rows, interleaved
over ``--rounds`` rounds:

- ``raw tcp``: a blocking socket in the first namespace ``sendall``s the
  bytes to one in the second, which ``recv_into``s one reused buffer (no
  page faults: the ceiling) and acks with 1 byte (bench_hosts_bulk.py's
  ``raw tcp block-reused``);
- ``store, 1 reader``: a learner actor on the first host publishes a new
  version, then one reader actor on the second host times
  ``await store.read_into(dst)`` (the reader is its host's relay: it pulls
  the version over the ``tcp`` RDMA backend, then copies it into ``dst``);
- ``store, 3 readers``: three readers on the second host read it at once
  (one relay pulls it, the two others copy from the relay): the time until
  all have it; the learner sends the version once.

Medians of ``--reps`` transfers per round (after one warm-up), the median
over rounds, in MiB/s of the version's size, and each row's ratio to raw.

Needs root (network namespaces).

Usage: sudo python benchmarks/bench_store_hosts.py [--mib 256] [--reps 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_hosts_bulk import send_raw, serve

import meshio
from meshio import Actor, endpoint
from meshio.store import WeightStore

HERE = Path(__file__).resolve().parent
MiB = 1 << 20


def state_dict(mib: int, version: int) -> dict[str, torch.Tensor]:
    """``mib`` MiB of float32 in 16 tensors, each element ``version``."""
    per = mib * MiB // 16 // 4
    return {f"layer{i}.weight": torch.full((per,), float(version)) for i in range(16)}


class Learner(Actor):
    def __init__(self, mib: int) -> None:
        self.store = WeightStore("bench-hosts")
        self.sd = state_dict(mib, 0)

    @endpoint
    async def handle(self) -> WeightStore:
        return self.store

    @endpoint
    async def publish(self, version: int) -> None:
        for t in self.sd.values():
            t.fill_(float(version))
        await self.store.publish(self.sd, version=version)

    @endpoint
    async def served(self) -> int:
        from meshio.store._store import _Owner

        return sum(_Owner.of(self.store).served.values())


class Reader(Actor):
    def __init__(self, mib: int) -> None:
        self.dst = {k: torch.zeros_like(t) for k, t in state_dict(mib, 0).items()}

    @endpoint
    async def read_into(self, store: WeightStore, version: int) -> float:
        t0 = time.perf_counter()
        got = await store.read_into(self.dst, at_least=version)
        took = time.perf_counter() - t0
        if got != version or float(self.dst["layer15.weight"][-1]) != float(version):
            raise AssertionError(f"read version {got}, expected {version}")
        return took


# ------------------------------------------------------------------ raw socket

def raw_round(a: object, b: object, n: int, reps: int) -> float:
    """The median seconds of a raw transfer from host ``a`` to host ``b``."""
    me = [sys.executable, __file__, "--nbytes", str(n), "--reps", str(reps + 1)]
    recv = subprocess.Popen(["ip", "netns", "exec", b.netns, *me,  # type: ignore[attr-defined]
                             "--serve", b.addr],  # type: ignore[attr-defined]
                            stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout is not None and recv.stdout.readline().strip() == "ready"
        out = subprocess.run(["ip", "netns", "exec", a.netns, *me,  # type: ignore[attr-defined]
                              "--send", b.addr],  # type: ignore[attr-defined]
                             capture_output=True, text=True, timeout=600, check=True)
        line, = (x for x in out.stdout.splitlines() if x.startswith("RESULT "))
        times: list[float] = json.loads(line[len("RESULT "):])
        return statistics.median(times[1:])
    finally:
        recv.wait(60)
        recv.stdout.close()  # type: ignore[union-attr]


# ------------------------------------------------------------------ the store

async def store_rounds(hosts: list[object], secret: Path, mib: int, reps: int, rounds: int,
                       raw: list[float], n: int) -> tuple[list[float], list[float], float]:
    one: list[float] = []
    three: list[float] = []
    version = 0
    addrs = [h.agent_addr for h in hosts]  # type: ignore[attr-defined]
    async with meshio.attach(addrs[:1], secret_file=secret).spawn_procs() as own, \
            meshio.attach(addrs[1:], secret_file=secret).spawn_procs(
                per_host={"procs": 3}) as procs:
        learner = (await own.spawn("learner", Learner, mib)).slice(procs=0)
        readers = await procs.spawn("readers", Reader, mib)
        first = readers.slice(procs=0)
        store = await learner.handle.call_one()
        for r in range(rounds):
            if r:
                raw.append(raw_round(hosts[0], hosts[1], n, reps))
            times: list[float] = []
            for i in range(reps + 1):
                version += 1
                await learner.publish.call_one(version)
                took = await first.read_into.call_one(store, version)
                if i:
                    times.append(took)
            one.append(statistics.median(times))
            times = []
            for i in range(reps + 1):
                version += 1
                await learner.publish.call_one(version)
                t0 = time.perf_counter()
                await readers.read_into.call(store, version)
                if i:
                    times.append(time.perf_counter() - t0)
            three.append(statistics.median(times))
        served: int = await learner.served.call_one()
    return one, three, served / version


def main(mib: int, reps: int, rounds: int) -> None:
    sys.path.insert(0, str(HERE.parent / "tests"))
    from meshio.jobs._job import write_secret
    from netns_hosts import netns_hosts

    n = mib * MiB
    with tempfile.TemporaryDirectory() as tmp:
        secret = Path(tmp) / "job.secret"
        write_secret(secret, secrets.token_bytes(32))
        with netns_hosts(2, secret) as hosts:
            raw = [raw_round(hosts[0], hosts[1], n, reps)]
            one, three, per_version = asyncio.run(
                store_rounds(list(hosts), secret, mib, reps, rounds, raw, n))
    bw_raw = n / statistics.median(raw) / MiB
    print(f"| {mib} MiB between two namespace hosts, median of {reps} x {rounds} rounds "
          f"| MiB/s [min-max over rounds] | x raw tcp |")
    print("|---|---|---|")
    for name, times in (("raw tcp socket", raw), ("store, 1 reader (read_into)", one),
                        ("store, 3 readers at once (each)", three)):
        bws = [n / t / MiB for t in times]
        bw = n / statistics.median(times) / MiB
        print(f"| {name} | {bw:,.0f} [{min(bws):,.0f}-{max(bws):,.0f}] "
              f"| {bw / bw_raw:.2f}x |")
    print(f"\nthe learner sent each version {per_version:.2f} times to the readers' host")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--nbytes", type=int, default=0)
    ap.add_argument("--serve", default="")
    ap.add_argument("--send", default="")
    args = ap.parse_args()
    if args.serve:  # the raw row's ends: bench_hosts_bulk.py's blocking socket
        serve(args.serve, "block-reused", "", args.nbytes, args.reps)
    elif args.send:
        print("RESULT " + json.dumps(send_raw(args.send, "block", "", args.nbytes, args.reps)))
    else:
        main(args.mib, args.reps, args.rounds)
