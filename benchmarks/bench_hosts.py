"""Cross-host call cost, side by side in one run: one actor in one worker
process, reached

- ``unix``: on this host, the default ``this_host()`` proc mesh (Unix socket);
- ``loopback tcp`` / ``loopback tls``: through a host agent on loopback
  (``ProcessJob``), so over authenticated TCP, without and with mutual TLS;
- ``netns tcp`` / ``netns tls``: through a host agent in a network namespace
  (tests/netns_hosts.py: its own address behind a veth pair and a bridge),
  without and with mutual TLS: a real cross-host path, less the wire;
- ``monarch tcp``: Monarch 0.7.0's ``this_host()`` mesh over TCP on
  localhost (``enable_transport(ChannelTransport.TcpWithLocalhost)``: its
  ``"tcp"`` needs a host name resolving to a non-loopback address); its own
  virtualenv, skipped with a note where it is not installed.

Measured: latency, the median of ``--calls`` sequential ``call_one``
round trips (µs); throughput, ``--inflight`` calls in flight at once
(calls/s, the median of 3 bursts).  Each configuration runs in a fresh
controller process (one controller serves the hosts of one job: one
secret, one TLS setting), the configurations interleaved over
``--rounds`` rounds; the table gives the median over rounds [min-max].

Needs root for the namespaces (their rows are skipped without it).

Usage: python benchmarks/bench_hosts.py [--calls 2000] [--inflight 1000] [--rounds 3]
       [--monarch-venv benchmarks/.venv-monarch]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Generator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CONFIGS = ("unix", "loopback tcp", "loopback tls", "netns tcp", "netns tls")

MONARCH = """
import asyncio, json, os, statistics, sys, time
from monarch._rust_bindings.monarch_hyperactor.channel import ChannelTransport
from monarch.actor import Actor, endpoint, enable_transport, this_host

class Ping(Actor):
    @endpoint
    async def ping(self, x: int) -> int:
        return x

async def main(calls, inflight):
    # "tcp" is TcpWithHostname: it needs the host name to resolve to a
    # non-loopback address, which this machine's does not
    enable_transport(ChannelTransport.TcpWithLocalhost)
    procs = this_host().spawn_procs(per_host={"procs": 1})
    one = procs.spawn("ping", Ping)
    for i in range(200):
        await one.ping.call_one(i)
    lat = []
    for i in range(calls):
        t0 = time.perf_counter()
        await one.ping.call_one(i)
        lat.append(time.perf_counter() - t0)
    bursts = []
    for _ in range(3):
        t0 = time.perf_counter()
        await asyncio.gather(*(one.ping.call_one(i) for i in range(inflight)))
        bursts.append(inflight / (time.perf_counter() - t0))
    await procs.stop()
    print("RESULT " + json.dumps({"latency_us": statistics.median(lat) * 1e6,
                                  "calls_per_s": statistics.median(bursts)}), flush=True)

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"""


def _tls(tmp: Path) -> Any:
    """Mutual-TLS certificates of one CA, valid for loopback and every
    address a namespace host or its bridge can have."""
    import trustme

    from meshio.jobs import TLSConfig

    ca = trustme.CA()
    ips = ["127.0.0.1", *(f"10.{net}.0.{i}" for net in range(100, 250) for i in (1, 10))]
    ca.issue_cert(*ips).private_key_and_cert_chain_pem.write_to_path(tmp / "host.pem")
    ca.cert_pem.write_to_path(tmp / "ca.pem")
    return TLSConfig(tmp / "host.pem", tmp / "host.pem", tmp / "ca.pem")


@contextmanager
def _netns(tmp: Path, tls: Any) -> Generator[tuple[list[str], Path]]:
    sys.path.insert(0, str(HERE.parent / "tests"))
    from meshio.jobs._job import write_secret
    from netns_hosts import netns_hosts  # type: ignore[import-not-found]  # pyright: ignore

    secret = tmp / "job.secret"
    write_secret(secret, secrets.token_bytes(32))
    args = () if tls is None else ("--tls-cert", str(tls.cert), "--tls-key", str(tls.key),
                                   "--tls-ca", str(tls.ca))
    with netns_hosts(1, secret, agent_args=args) as hosts:  # pyright: ignore
        yield [str(h.agent_addr) for h in hosts], secret  # pyright: ignore


@asynccontextmanager
async def _procs(config: str, tmp: Path) -> AsyncGenerator[Any]:
    import meshio
    from meshio.jobs import ProcessJob

    tls = _tls(tmp) if config.endswith("tls") else None
    async with AsyncExitStack() as stack:
        if config == "unix":
            hosts = meshio.this_host()
        elif config.startswith("loopback"):
            job = ProcessJob(meshes={"h": 1}, cache_dir=tmp / ".meshio", tls=tls)
            stack.push_async_callback(job.kill)
            hosts = (await job.state()).h
        else:
            addrs, secret = stack.enter_context(_netns(tmp, tls))
            hosts = meshio.attach(addrs, secret_file=secret, tls=tls)
        yield await stack.enter_async_context(hosts.spawn_procs())


async def one(config: str, calls: int, inflight: int) -> dict[str, float]:
    """Latency and throughput of one configuration, in this process."""
    from meshio._bench import Ping, round_trips

    with tempfile.TemporaryDirectory() as d:
        async with _procs(config, Path(d)) as procs:
            mesh = await procs.spawn("ping", Ping)
            one_actor = mesh.slice(**{k: 0 for k in procs.extent.labels})
            lat = statistics.median(await round_trips(one_actor, calls)) * 1e6
            bursts: list[float] = []
            for _ in range(3):
                t0 = time.perf_counter()
                await asyncio.gather(*(one_actor.ping.call_one(i) for i in range(inflight)))
                bursts.append(inflight / (time.perf_counter() - t0))
    return {"latency_us": lat, "calls_per_s": statistics.median(bursts)}


def run_child(argv: list[str]) -> dict[str, float] | str:
    """A fresh process's result, or why it has none."""
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, float] = json.loads(line[len("RESULT "):])
            return result
    return (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--inflight", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--monarch-venv", default=str(HERE / ".venv-monarch"))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # child: one configuration
    args = ap.parse_args()
    if args.one:
        import meshio

        print("RESULT " + json.dumps(meshio.run(one(args.one, args.calls, args.inflight))),
              flush=True)
        return
    configs = [c for c in CONFIGS if os.geteuid() == 0 or not c.startswith("netns")]
    monarch = Path(args.monarch_venv) / "bin" / "python"
    notes = [] if os.geteuid() == 0 else ["netns rows skipped: network namespaces need root"]
    if monarch.exists():
        configs.append("monarch tcp")
    else:
        notes.append(f"monarch tcp skipped: no Monarch virtualenv at {args.monarch_venv} "
                     "(--monarch-venv; torch==2.13.0 then torchmonarch==0.7.0)")
    results: dict[str, list[dict[str, float]]] = {c: list[dict[str, float]]() for c in configs}
    for rnd in range(args.rounds):
        for config in configs:
            if config == "monarch tcp":
                argv = [str(monarch), "-c", MONARCH, str(args.calls), str(args.inflight)]
            else:
                argv = [sys.executable, __file__, "--one", config, "--calls", str(args.calls),
                        "--inflight", str(args.inflight)]
            got = run_child(argv)
            if isinstance(got, str):
                notes.append(f"{config}, round {rnd + 1}: failed: {got}")
            else:
                results[config].append(got)
            print(f"round {rnd + 1} {config}: {got}", file=sys.stderr, flush=True)

    def cell(values: list[float], fmt: str) -> str:
        if not values:
            return "n/a"
        return (f"{statistics.median(values):{fmt}} "
                f"[{min(values):{fmt}}-{max(values):{fmt}}]")

    base = statistics.median(r["latency_us"] for r in results["unix"]) if results["unix"] \
        else None
    print(f"\n{args.rounds} rounds; latency: median of {args.calls} sequential call_one; "
          f"throughput: {args.inflight} in flight\n")
    print("| path | latency µs | x unix | calls/s |")
    print("|---|---|---|---|")
    for config, rs in results.items():
        lat = [r["latency_us"] for r in rs]
        ratio = f"{statistics.median(lat) / base:.2f}" if lat and base else "n/a"
        print(f"| {config} | {cell(lat, '.0f')} | {ratio} | "
              f"{cell([r['calls_per_s'] for r in rs], '.0f')} |")
    for note in notes:
        print(f"\nnote: {note}")


if __name__ == "__main__":
    main()
