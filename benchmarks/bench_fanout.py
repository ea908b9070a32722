"""Fan-out: the time of one ``call`` to every actor of a mesh spanning many
hosts, with and without the fan-out tree, and a projection to 1,000 hosts.

Hosts are ``meshio agent`` processes on loopback (``ProcessJob``), each
running ``--per-host`` worker processes: 2 -> 32 hosts, 16 -> 256 actors.
For each size the same mesh is called with

- ``direct``: ``fanout_width=0``, one message per actor from the controller;
- ``flat``: ``fanout_width=64``, one message per host (its first process
  calls the others);
- ``tree``: ``fanout_width=4``, a tree of hosts, 4 messages per relay.

Reported: median and 10th/90th percentile of ``--calls`` sequential calls
(ms), the controller's CPU per call (µs), the **floor** for each size (the
same number of bare Python processes each echoing 8 bytes over a Unix
socket, written to and waited for with ``epoll`` by a plain loop: what
waking that many processes once costs on this machine), a PNG plot, and the per-hop costs
fitted from the measurements (with the fit's R² and residuals) and the
projected time for 1,000 hosts x 8 processes and for 4,096 hosts x 32
(131,072 actors); the model is printed with the numbers.

On one 2-core machine every "host" shares the same two cores, so the
absolute times measure total CPU more than network latency: read the
controller's CPU per call (what the tree is for) and the ratios.  Busy
polling is off here (``set_limits(busy_poll=0)``, inherited by every
process): the controller's CPU per call is what the model fits, and polling
would add the time it waits for answers to it (interleaved runs at 64 and
256 actors gave the same wall times with and without).

Usage: python benchmarks/bench_fanout.py [--hosts 2 4 8 16 32] [--per-host 8]
       [--calls 30] [--plot benchmarks/fanout.png]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import meshio
from meshio import Actor, endpoint
from meshio.jobs import ProcessJob

MODES = {"direct": 0, "flat": 64, "tree": 4}


class Node(Actor):
    @endpoint
    async def ping(self) -> int:
        return 1


async def measure(mesh: Node, calls: int) -> tuple[list[float], float]:
    """Wall times (ms) of ``calls`` sequential calls; controller CPU µs per call."""
    for _ in range(3):
        await mesh.ping.call()  # connections up, paths warm
    times: list[float] = []
    cpu0 = time.process_time()
    for _ in range(calls):
        t0 = time.perf_counter()
        result = await mesh.ping.call()
        times.append((time.perf_counter() - t0) * 1e3)
        assert sum(result.values()) == len(result)
    return times, (time.process_time() - cpu0) / calls * 1e6


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


Row = tuple[float, float, float, float]


async def run(hosts: list[int], per_host: int, calls: int
              ) -> tuple[dict[tuple[int, str], Row], float]:
    """The rows by (hosts, mode); the median round trip (ms) of one
    ``call_one`` to an actor on another host."""
    results: dict[tuple[int, str], Row] = {}
    rtts: list[float] = []
    cache = Path(tempfile.mkdtemp()) / ".meshio"
    job = ProcessJob(meshes={"hosts": max(hosts)}, cache_dir=cache)
    try:
        state = await job.state()
        for h in hosts:
            async with state.hosts.slice(hosts=slice(0, h)).spawn_procs(
                    per_host={"procs": per_host}) as procs:
                mesh = await procs.spawn("nodes", Node)
                for mode, width in MODES.items():
                    meshio.set_limits(fanout_width=width)
                    times, cpu = await measure(mesh, calls)
                    med = statistics.median(times)
                    results[(h, mode)] = (med, pct(times, 0.1), pct(times, 0.9), cpu)
                    print(f"{h:3d} hosts {h * per_host:4d} actors  {mode:6s}  median "
                          f"{med:8.2f} ms  p10 {pct(times, 0.1):8.2f}  p90 {pct(times, 0.9):8.2f}"
                          f"  controller CPU {cpu:9.0f} µs/call", flush=True)
                far = mesh.slice(hosts=h - 1, procs=per_host - 1)
                for _ in range(calls):
                    t0 = time.perf_counter()
                    await far.ping.call_one()
                    rtts.append((time.perf_counter() - t0) * 1e3)
    finally:
        await job.kill()
    return results, statistics.median(rtts)


_ECHO = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
while b := s.recv(8):
    s.sendall(b)
"""


def floor(n: int, calls: int) -> float:
    """The median wall time (ms) of writing 8 bytes to each of ``n`` bare
    Python processes and reading every echo back (``epoll``, no framing, no
    event loop): the least one call to ``n`` actors in ``n`` processes can
    cost on this machine."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "echo")
        server = socket.socket(socket.AF_UNIX)
        server.bind(path)
        server.listen(n)
        procs = [subprocess.Popen([sys.executable, "-c", _ECHO, path]) for _ in range(n)]
        conns = [server.accept()[0] for _ in range(n)]
        by_fd = {c.fileno(): c for c in conns}
        poller = select.epoll()
        try:
            for c in conns:
                poller.register(c.fileno(), select.EPOLLIN)
            times: list[float] = []
            for _ in range(calls + 3):  # (3 to warm up)
                t0 = time.perf_counter()
                for c in conns:
                    c.sendall(b"12345678")
                left = n
                while left:
                    for fd, _ in poller.poll():
                        by_fd[fd].recv(8)  # (each process answers once a round)
                        left -= 1
                times.append((time.perf_counter() - t0) * 1e3)
        finally:
            poller.close()
            for c in conns:
                c.close()
            server.close()
            for proc in procs:
                proc.wait()
    return statistics.median(times[3:])


def controller_cost_hot(n: int = 256, rounds: int = 200) -> float:
    """The controller's own CPU per actor for one gathered call, measured in
    this process with nothing else running (µs): the call's slots, their
    request numbers, the actors' call numbers, and decoding a relay's
    :class:`Answers` message into the results, without sockets or workers.
    On one 2-core machine the fitted ``a`` also holds the cost of sharing
    the cores (and caches) with every worker; a controller on its own host
    pays this."""
    import timeit

    import msgspec

    from meshio._transport._connection import Connection, Gathering
    from meshio._transport._fanout import FanoutState
    from meshio._transport._messages import Answers, encode_message

    loop = asyncio.new_event_loop()
    decode = Node.ping.schema.unpack_result  # type: ignore[attr-defined]
    conn = Connection(None, None)  # type: ignore[arg-type]  # never connected
    numbers = FanoutState()
    addrs = [f"tcp://10.0.{i // 8}.1:{7000 + i % 8}" for i in range(n)]
    one = msgspec.Raw(msgspec.msgpack.encode(1))
    answers = encode_message(Answers([(1 + k, one) for k in range(n)], []))

    def call() -> None:
        conn._req = 0  # each round's requests are 1..n, as the answers say
        g = Gathering(loop, "nodes", [0] * n, decode, "Node.ping", "nodes", range(n))
        g.sent(conn, g.slots)
        for addr in addrs:
            numbers.number("nodes", addr)
        conn.deliver(answers, [])
        assert not g.left

    try:
        best = min(timeit.repeat(call, number=rounds, repeat=5))
    finally:
        loop.close()
    return best / rounds / n * 1e6


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = a + b x``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def fit_quality(xs: list[float], ys: list[float]) -> str:
    """How well ``fit`` describes the points: R² and each point's residual."""
    a, b = fit(xs, ys)
    my = statistics.fmean(ys)
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys) or 1.0
    residuals = ", ".join(f"{(y - a - b * x) / y:+.0%}" for x, y in zip(xs, ys))
    return f"y = {a:.0f} + {b:.2f} x, R² {1 - ss_res / ss_tot:.3f}, residuals {residuals}"


def model(results: dict[tuple[int, str], Row], hosts: list[int], per_host: int,
          rtt_ms: float) -> None:
    """Per-hop costs from the measurements and the projection to 1,000 hosts."""
    n = [float(h * per_host) for h in hosts]
    # the controller's CPU per call: per answer (every mode: one per actor)
    # and per message sent (direct: one per actor; tree: at most the width)
    _, direct_us = fit(n, [results[(h, "direct")][3] for h in hosts])
    _, answer_us = fit(n, [results[(h, "tree")][3] for h in hosts])
    send_us = max(direct_us - answer_us, 0.0)
    # one host's own part: its relay calls the other processes of its host
    # (the smallest size, flat: one relay level) beyond the network round trip
    host_ms = max(results[(hosts[0], "flat")][0] - rtt_ms, 0.0)
    hot_us = controller_cost_hot()
    print("\nModel (per-hop costs fitted from the rows above):")
    print(f"  a = {answer_us:.1f} µs: the controller's CPU per actor (slot, numbers, decoding its "
          "answer into the ValueMesh), here sharing 2 cores with every worker")
    print(f"  a_hot = {hot_us:.2f} µs: the same work measured alone (a controller on its own host)")
    print(f"  s = {send_us:.1f} µs: the CPU to encode and send one message")
    print(f"  r = {rtt_ms:.2f} ms: one call_one round trip to another host")
    print(f"  l = {host_ms:.2f} ms: a relay calling its host's {per_host - 1} other processes")
    print("  fit of the controller's CPU per call (µs) against actors:")
    print(f"    direct: {fit_quality(n, [results[(h, 'direct')][3] for h in hosts])}")
    print(f"    tree:   {fit_quality(n, [results[(h, 'tree')][3] for h in hosts])}")
    print("  controller CPU per call: direct N x (s + a); tree w x s + N x a")
    print("  wall per call (tree): depth x (r + w x s) + l x (P - 1) / "
          f"{per_host - 1} + N x a  (relays of one level work in parallel, each on its own host)")
    for H, P in ((1000, 8), (4096, 32)):
        project(H, P, answer_us, hot_us, send_us, rtt_ms, host_ms / (per_host - 1))


def project(H: int, P: int, answer_us: float, hot_us: float, send_us: float, rtt_ms: float,
            proc_ms: float, w: int = 16) -> None:
    """The model's call + gather to ``H`` hosts of ``P`` actors each."""
    N = H * P
    depth = math.ceil(math.log(H, w))
    host_ms = proc_ms * (P - 1)
    controller_tree = (w * send_us + N * answer_us) / 1e3
    controller_direct = N * (send_us + answer_us) / 1e3
    wall_tree = depth * (rtt_ms + w * send_us / 1e3) + host_ms + N * answer_us / 1e3
    print(f"  {H:,} hosts x {P} = {N:,} actors, width {w}: depth {depth}")
    print(f"    controller CPU per call: direct {controller_direct:.0f} ms, "
          f"tree {controller_tree:.0f} ms")
    print(f"    wall per call (tree): {wall_tree:.0f} ms, of which answers at the controller "
          f"{N * answer_us / 1e3:.0f} ms")
    hot_tree = (w * send_us + N * hot_us) / 1e3
    print(f"    with a_hot: controller CPU per call (tree) {hot_tree:.0f} ms, "
          f"wall {wall_tree - N * (answer_us - hot_us) / 1e3:.0f} ms")


def plot(results: dict[tuple[int, str], Row], floors: dict[int, float], hosts: list[int],
         per_host: int, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    n = [float(h * per_host) for h in hosts]
    ax1.plot(n, [floors[h] for h in hosts], marker="x", linestyle=":",
             color="gray", label="floor (bare echo processes)")
    for mode in MODES:
        ax1.plot(n, [results[(h, mode)][0] for h in hosts], marker="o", label=mode)
        ax2.plot(n, [results[(h, mode)][3] / 1e3 for h in hosts], marker="o", label=mode)
    ax1.set(xlabel=f"actors ({per_host} per host)", ylabel="median call time (ms)",
            title="one call to every actor")
    ax2.set(xlabel=f"actors ({per_host} per host)", ylabel="controller CPU per call (ms)",
            title="controller's work")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--hosts", type=int, nargs="+", default=[2, 4, 8, 16, 32],
                   help="host counts, at least two different ones (the model fits a line)")
    p.add_argument("--per-host", type=int, default=8,
                   help="processes per host, at least 2 (the model times a relay calling "
                        "its host's others)")
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--plot", type=Path, default=Path(__file__).with_name("fanout.png"))
    args = p.parse_args()
    # checked before anything is measured: the model needs these to fit its costs
    hosts = sorted(set(args.hosts))  # (the smallest first: the model's one-level size)
    if len(hosts) < 2 or hosts[0] < 1:
        p.error(f"--hosts {' '.join(map(str, args.hosts))}: give at least two different host "
                "counts, each at least 1, for the model to fit a line through")
    args.hosts = hosts
    if args.per_host < 2:
        p.error(f"--per-host {args.per_host}: give at least 2, for the model to time a relay "
                "calling its host's other processes")
    if args.calls < 1:
        p.error(f"--calls {args.calls}: give at least 1")
    meshio.set_limits(busy_poll=0)  # CPU spent working, not waiting (see above)
    print(f"fan-out on {os.cpu_count()} CPUs: hosts {args.hosts}, {args.per_host} per host, "
          f"{args.calls} calls each")
    results, rtt_ms = asyncio.run(run(args.hosts, args.per_host, args.calls))
    floors: dict[int, float] = {}
    for h in args.hosts:  # (once meshio's processes are gone)
        floors[h] = floor(h * args.per_host, args.calls)
        print(f"{h:3d} hosts {h * args.per_host:4d} actors  floor   median {floors[h]:8.2f} ms",
              flush=True)
    first, last = args.hosts[0], args.hosts[-1]
    print(f"{last * args.per_host} actors vs {first * args.per_host}: "
          + ", ".join(f"{mode} {results[(last, mode)][0] / results[(first, mode)][0]:.1f}x"
                      for mode in MODES) + f", floor {floors[last] / floors[first]:.1f}x")
    model(results, args.hosts, args.per_host, rtt_ms)
    plot(results, floors, args.hosts, args.per_host, args.plot)


if __name__ == "__main__":
    main()
