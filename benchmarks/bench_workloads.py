"""The RL workload of ``examples/rl_grpo.py`` on meshio and on Ray 2.60, side
by side in one run: time per RL step (two rollouts through the generators,
one learner step, one weight publish), weight-sync time (a 16 / 256 MiB
state dict from the learner to both generators), and what a generator
SIGKILLed with a rollout in flight costs (that step's time beyond the
median step).  meshio: a ``Service`` of two supervised generator replicas
(the rollout fails over) and a ``WeightStore``; Ray: actors, the object
store, ``max_restarts=1, max_task_retries=1`` (the rollout is retried on the
restarted actor).  Ray runs in its own virtualenv (``ray==2.60.0 numpy
torch==2.13.0``, made on first use as ``benchmarks/peers/run.py`` makes
its own).

    python benchmarks/bench_workloads.py [--steps 40] [--kill-at 20] [--readme]

``--readme`` writes the table into ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import torch

import meshio
from meshio import Actor, endpoint
from meshio.store import WeightStore

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "examples"), os.path.join(HERE, "peers")]
from grpo import ROLLOUTS  # noqa: E402
from rl_grpo import rl_system  # noqa: E402
from run import VENVS, ensure_venv  # noqa: E402

MiB = 1 << 20
BEGIN, END = "<!-- workloads:begin (python benchmarks/bench_workloads.py --readme) -->", \
    "<!-- workloads:end -->"


class Big(Actor):
    """The learner's side of the weight sync: a state dict of ``mib`` MiB."""

    def __init__(self) -> None:
        self.store = WeightStore("big")
        self.version = 0
        self.w = torch.empty(0)

    @endpoint
    async def publish(self, mib: int) -> tuple[WeightStore, int]:
        if self.w.numel() != mib * MiB // 4:  # (the learner's parameters, made once)
            self.w = torch.ones(mib * MiB // 4)
        self.version += 1
        await self.store.publish({"w": self.w}, version=self.version)
        return self.store, self.version


class Reader(Actor):
    """A generator's side: its own parameters, filled in place."""

    def __init__(self) -> None:
        self.w = torch.empty(0)

    @endpoint
    async def pull(self, store: WeightStore, version: int, numel: int) -> int:
        if self.w.numel() != numel:
            self.w = torch.empty(numel)
        return await store.read_into({"w": self.w}, at_least=version, timeout=60.0)


async def measure_meshio(steps: int, kill_at: int, sync_mib: list[int], reps: int
                         ) -> dict[str, object]:
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0)
    async with rl_system(sup) as (gen_procs, svc, _):
        times: list[float] = []
        rewards: list[float] = []
        failure_ms = 0.0
        for step in range(steps):
            t0 = time.perf_counter()
            rollouts = [asyncio.ensure_future(svc.rollout.route(step, r))
                        for r in range(ROLLOUTS)]
            if step == kill_at:
                await asyncio.sleep(0)
                os.kill(gen_procs.pids[0], signal.SIGKILL)
            done = await asyncio.gather(*rollouts)
            dt = (time.perf_counter() - t0) * 1e3
            if step == kill_at:
                failure_ms = dt
            else:
                times.append(dt)
            rewards.append(statistics.fmean(r for _, _, r in done))
        await gen_procs.ready()  # (the killed replica is back before the sync)
        async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name="big") as one:
            big = await one.spawn("big", Big)
            readers = await gen_procs.spawn("readers", Reader)
            sync: dict[str, float] = {}
            for mib in sync_mib:
                samples = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    handle, version = await big.publish.call_one(mib)
                    await readers.pull.call(handle, version, mib * MiB // 4)
                    samples.append((time.perf_counter() - t0) * 1e3)
                sync[str(mib)] = statistics.median(samples)
    median = statistics.median(times)
    return {"step_ms": median, "failure_ms": failure_ms - median, "sync_ms": sync,
            "reward_first5": statistics.fmean(rewards[:5]),
            "reward_last5": statistics.fmean(rewards[-5:])}


def measure_ray(steps: int, kill_at: int, sync_mib: list[int], reps: int
                ) -> dict[str, object] | str:
    """Ray's figures, or why they are missing."""
    VENVS.setdefault("venv-ray-torch", ([["torch==2.13.0"], ["ray==2.60.0", "numpy"]],
                                        "import ray, torch"))
    try:
        python = ensure_venv("venv-ray-torch")
    except (subprocess.CalledProcessError, OSError) as e:
        return f"its virtualenv could not be made: {e}"
    p = subprocess.run([python, os.path.join(HERE, "workloads_ray.py"), "--steps", str(steps),
                        "--kill-at", str(kill_at), "--sync-reps", str(reps), "--sync-mib",
                        *map(str, sync_mib)], capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        return f"exit status {p.returncode}: {p.stderr[-500:]}"
    result: dict[str, object] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


def table(m: dict[str, object], r: dict[str, object] | str) -> str:
    def cell(d: dict[str, object] | str, key: str, sub: str | None = None) -> float | None:
        if isinstance(d, str):
            return None
        v = d[key]
        if sub is not None:
            assert isinstance(v, dict)
            v = v[sub]
        assert isinstance(v, (int, float))
        return float(v)

    rows = [("time per RL step (2 rollouts, 1 learner step, 1 publish), ms", "step_ms", None)]
    rows += [(f"weight sync, {mib} MiB state dict to 2 generators, ms", "sync_ms", mib)
             for mib in (m["sync_ms"] if isinstance(m["sync_ms"], dict) else {})]
    rows.append(("a generator SIGKILLed mid-rollout: extra time of that step, ms",
                 "failure_ms", None))
    lines = ["| | meshio | Ray 2.60 | Ray / meshio |", "|---|---|---|---|"]
    for label, key, sub in rows:
        a, b = cell(m, key, sub), cell(r, key, sub)
        ratio = f"{b / a:.1f}x" if a and b else "—"
        lines.append(f"| {label} | {a:,.1f} | {'not measured' if b is None else f'{b:,.1f}'} "
                     f"| {ratio} |")
    lines.append(f"| mean reward, first 5 / last 5 steps | {cell(m, 'reward_first5'):.2f} / "
                 f"{cell(m, 'reward_last5'):.2f} | "
                 + ("—" if isinstance(r, str) else
                    f"{cell(r, 'reward_first5'):.2f} / {cell(r, 'reward_last5'):.2f}") + " | |")
    if isinstance(r, str):
        lines.append(f"\nRay not measured: {r}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--kill-at", type=int, default=20)
    ap.add_argument("--sync-mib", type=int, nargs="+", default=[16, 256])
    ap.add_argument("--sync-reps", type=int, default=5)
    ap.add_argument("--readme", action="store_true")
    args = ap.parse_args()
    m = meshio.run(measure_meshio(args.steps, args.kill_at, args.sync_mib, args.sync_reps))
    r = measure_ray(args.steps, args.kill_at, args.sync_mib, args.sync_reps)
    text = table(m, r)
    print(text)
    print(json.dumps({"meshio": m, "ray": r}))
    if args.readme:
        path = os.path.join(HERE, "README.md")
        readme = open(path).read()
        stamp = time.strftime("%Y-%m-%d %H:%M")
        block = f"{BEGIN}\n\nMeasured {stamp}, one run, medians:\n\n{text}\n\n{END}"
        if BEGIN in readme:
            readme = readme[:readme.index(BEGIN)] + block + readme[readme.index(END) + len(END):]
        else:
            readme += f"\n## RL workload against Ray\n\n{block}\n"
        with open(path, "w") as f:
            f.write(readme)


if __name__ == "__main__":
    main()
