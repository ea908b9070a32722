"""The RL loop of ``examples/rl_grpo.py`` and its weight sync, written for
Ray 2.60 as a Ray user writes them (actors, ``ray.put``/``ray.get`` through
the object store, ``max_restarts``/``max_task_retries`` for the generator
that is killed).  Run by ``benchmarks/bench_workloads.py`` in a virtualenv
with ``ray==2.60.0``, ``numpy`` and ``torch==2.13.0``; prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from typing import Any

import ray
import torch

EXAMPLES = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                         "examples"))
sys.path.insert(0, EXAMPLES)
from grpo import ACTIONS, ROLLOUTS, Rollouts, grpo_loss, reward, sample  # noqa: E402

MiB = 1 << 20


@ray.remote(num_cpus=0)
class Reward:
    def score(self, actions: list[int]) -> list[float]:
        return reward(actions)


@ray.remote(num_cpus=0)
class Learner:
    def __init__(self, lr: float) -> None:
        self.logits = torch.nn.Parameter(torch.zeros(ACTIONS))
        self.opt = torch.optim.SGD([self.logits], lr=lr)
        self.rollouts = Rollouts()
        self.ref = ray.put({"logits": self.logits.detach().clone()})
        self.big: dict[str, torch.Tensor] = {}

    def latest(self) -> tuple[int, list[Any]]:
        return self.rollouts.version, [self.ref]  # (in a list: the reference, not its value)

    def submit(self, step: int, rollout: int, actions: list[int], rewards: list[float]) -> None:
        group = self.rollouts.add(step, rollout, actions, rewards)
        if group is None:
            return
        loss = grpo_loss(self.logits, group)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.ref = ray.put({"logits": self.logits.detach().clone()})

    def publish_big(self, mib: int) -> list[Any]:
        """A state dict of ``mib`` MiB into the object store (the weight sync)."""
        if self.big.get("w") is None or self.big["w"].numel() != mib * MiB // 4:
            self.big = {"w": torch.ones(mib * MiB // 4)}
        return [ray.put(self.big)]


@ray.remote(num_cpus=0, max_restarts=1, max_task_retries=1)
class Generator:
    def __init__(self, learner: Any, reward: Any) -> None:
        self.learner, self.reward = learner, reward
        self.logits = torch.zeros(ACTIONS)
        self.big = torch.empty(0)

    def pid(self) -> int:
        return os.getpid()

    def rollout(self, step: int, rollout: int) -> tuple[int, int, float]:
        version, (ref,) = ray.get(self.learner.latest.remote())
        self.logits.copy_(ray.get(ref)["logits"])
        actions = sample(self.logits, step, rollout)
        rewards = ray.get(self.reward.score.remote(actions))
        ray.get(self.learner.submit.remote(step, rollout, actions, rewards))
        return os.getpid(), version, statistics.fmean(rewards)

    def pull(self, refs: list[Any]) -> int:
        w = ray.get(refs[0])["w"]
        if self.big.numel() != w.numel():
            self.big = torch.empty_like(w)
        self.big.copy_(w)  # into the generator's own parameters, as load_state_dict does
        return self.big.numel()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--kill-at", type=int, default=20)
    ap.add_argument("--sync-mib", type=int, nargs="+", default=[16, 256])
    ap.add_argument("--sync-reps", type=int, default=5)
    args = ap.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": EXAMPLES}},  # (grpo, for its actors)
             _temp_dir=os.path.join("/tmp", f"rayw-{os.getpid()}"))
    learner = Learner.remote(0.5)
    reward = Reward.remote()
    gens = [Generator.remote(learner, reward) for _ in range(ROLLOUTS)]
    pids = ray.get([g.pid.remote() for g in gens])
    steps: list[float] = []
    rewards: list[float] = []
    failure_ms = 0.0
    for step in range(args.steps):
        t0 = time.perf_counter()
        refs = [g.rollout.remote(step, r) for r, g in enumerate(gens)]
        if step == args.kill_at:
            os.kill(pids[0], signal.SIGKILL)  # (its rollout is in flight)
        done = ray.get(refs)
        dt = (time.perf_counter() - t0) * 1e3
        if step == args.kill_at:
            failure_ms = dt
        else:
            steps.append(dt)
        rewards.append(statistics.fmean(r for _, _, r in done))
    sync: dict[str, float] = {}
    for mib in args.sync_mib:
        times = []
        for _ in range(args.sync_reps):
            t0 = time.perf_counter()
            refs = ray.get(learner.publish_big.remote(mib))
            ray.get([g.pull.remote(refs) for g in gens])
            times.append((time.perf_counter() - t0) * 1e3)
        sync[str(mib)] = statistics.median(times)
    median = statistics.median(steps)
    print(json.dumps({"step_ms": median, "failure_ms": failure_ms - median, "sync_ms": sync,
                      "reward_first5": statistics.fmean(rewards[:5]),
                      "reward_last5": statistics.fmean(rewards[-5:]), "ray": ray.__version__}))
    ray.shutdown()


if __name__ == "__main__":
    main()
