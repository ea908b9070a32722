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
(ms), the controller's CPU per call (µs), a PNG plot, and the per-hop costs
fitted from the measurements with the projected time for 1,000 hosts x 8
processes (the model is printed with the numbers).

On one 2-core machine every "host" shares the same two cores, so the
absolute times measure total CPU more than network latency: read the
controller's CPU per call (what the tree is for) and the ratios.

Usage: python benchmarks/bench_fanout.py [--hosts 2 4 8 16 32] [--per-host 8]
       [--calls 30] [--plot benchmarks/fanout.png]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
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


async def run(hosts: list[int], per_host: int, calls: int) -> dict[tuple[int, str], Row]:
    results: dict[tuple[int, str], Row] = {}
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
    finally:
        await job.kill()
    return results


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = a + b x``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def model(results: dict[tuple[int, str], tuple[float, float, float, float]], hosts: list[int],
          per_host: int) -> None:
    """Per-hop costs from the measurements and the projection to 1,000 hosts."""
    n = [float(h * per_host) for h in hosts]
    # the controller's CPU per call: per message sent (direct: one per actor)
    # and per answer received (every mode: one per actor)
    _, direct_cpu = fit(n, [results[(h, "direct")][3] for h in hosts])
    _, tree_cpu = fit(n, [results[(h, "tree")][3] for h in hosts])
    send_us = max(direct_cpu - tree_cpu, 0.0)  # a Call sent, beyond what an answer costs
    answer_us = tree_cpu
    # wall time: a relay level costs a hop; the flat mode has one level
    base, per_actor_ms = fit(n, [results[(h, "flat")][0] for h in hosts])
    hop_ms = max(results[(hosts[0], "flat")][0] - results[(hosts[0], "direct")][0], 0.0) \
        + base / 2
    H, P, w = 1000, 8, 16
    depth = math.ceil(math.log(H, w))
    msgs = H * P
    print("\nModel (from the fits above):")
    print(f"  controller CPU per call = msgs_sent x {send_us:.1f} µs + answers x "
          f"{answer_us:.1f} µs; direct: msgs_sent = answers = N actors; tree: "
          f"msgs_sent <= width")
    print(f"  wall = depth x hop ({hop_ms:.2f} ms: one relay level on this machine) + "
          f"N x {per_actor_ms * 1e3:.1f} µs (answers through the controller)")
    direct = msgs * (send_us + answer_us) / 1e3
    tree = (w * send_us + msgs * answer_us) / 1e3
    print(f"  1,000 hosts x 8 = {msgs} actors, width {w}: depth {depth}")
    print(f"    controller CPU per call: direct {direct:.0f} ms, tree {tree:.0f} ms")
    print(f"    wall per call (tree): {depth * hop_ms + msgs * per_actor_ms:.0f} ms "
          f"(on a real cluster each relay has its own cores: the hops overlap, the "
          f"answers' decoding at the controller remains)")


def plot(results: dict[tuple[int, str], tuple[float, float, float, float]], hosts: list[int],
         per_host: int, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    n = [float(h * per_host) for h in hosts]
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
    p = argparse.ArgumentParser(description=(__doc__ or '').splitlines()[0])
    p.add_argument("--hosts", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    p.add_argument("--per-host", type=int, default=8)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--plot", type=Path, default=Path(__file__).with_name("fanout.png"))
    args = p.parse_args()
    print(f"fan-out on {os.cpu_count()} CPUs: hosts {args.hosts}, {args.per_host} per host, "
          f"{args.calls} calls each")
    results = asyncio.run(run(args.hosts, args.per_host, args.calls))
    model(results, args.hosts, args.per_host)
    plot(results, args.hosts, args.per_host, args.plot)


if __name__ == "__main__":
    main()
