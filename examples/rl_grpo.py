"""A GRPO-shaped RL loop on meshio: a generator Service (two supervised
replicas, each with a tiny torch policy), a reward actor, and a learner that
publishes its weights to a WeightStore after every step.

Each step, the controller routes two rollouts to the generators.  A
generator reads the newest policy version (in place), samples a group of
actions, has them scored by the reward actor and hands them to the learner
directly; once the learner has every rollout of the step it takes one
GRPO step (group-normalised advantages) and publishes the next version.
Midway, one generator's process is SIGKILLed with a rollout in flight: the
rollout fails over to the other replica (the endpoint is retryable and the
learner takes a rollout once), no step fails, and the replica, restarted by
its supervisor, reads the latest version for its next rollout.

``python examples/rl_grpo.py [--steps N] [--kill-at STEP]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager

import torch
from grpo import ACTIONS, ROLLOUTS, Rollouts, grpo_loss, reward, sample

import meshio
from meshio import Actor, endpoint
from meshio.store import WeightStore


class Policy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(ACTIONS))


class Reward(Actor):
    @endpoint
    async def score(self, actions: list[int]) -> list[float]:
        return reward(actions)


class Learner(Actor):
    def __init__(self, lr: float) -> None:
        self.policy = Policy()
        self.opt = torch.optim.SGD(self.policy.parameters(), lr=lr)
        self.store = WeightStore("policy")
        self.rollouts = Rollouts()

    @endpoint
    async def start(self) -> WeightStore:
        await self.store.publish(self.policy.state_dict(), version=0)
        return self.store

    @endpoint(retryable=True)  # a rollout handed in twice (a failover) is taken once
    async def submit(self, step: int, rollout: int, actions: list[int],
                     rewards: list[float]) -> None:
        group = self.rollouts.add(step, rollout, actions, rewards)
        if group is None:
            return  # the step waits for its other rollouts (or was trained already)
        loss = grpo_loss(self.policy.logits, group)
        self.opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        self.opt.step()  # pyright: ignore[reportUnknownMemberType]
        await self.store.publish(self.policy.state_dict(), version=self.rollouts.version)


class Generator(Actor):
    def __init__(self, store: WeightStore, learner: Learner, reward: Reward) -> None:
        self.store = store
        self.learner = learner
        self.reward = reward
        self.policy = Policy()

    @endpoint(retryable=True)  # safe to run again: the learner takes each rollout once
    async def rollout(self, step: int, rollout: int) -> tuple[int, int, float]:
        """One rollout of ``step``: (this process's pid, the policy version
        used, the mean reward)."""
        version = await self.store.read_into(self.policy.state_dict(), at_least=step,
                                             timeout=60.0)
        actions = sample(self.policy.logits, step, rollout)
        rewards = await self.reward.score.call_one(actions)
        await self.learner.submit.call_one(step, rollout, actions, rewards)
        return os.getpid(), version, statistics.fmean(rewards)


@asynccontextmanager
async def rl_system(sup: meshio.Supervisor) -> AsyncGenerator[tuple[meshio.ProcMesh, Generator,
                                                                   WeightStore]]:
    """The learner and reward actor (one process each) and the generator
    Service (two processes under ``sup``): (the generators' proc mesh, the
    service, the learner's store)."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, name="core") as core, \
            meshio.this_host().spawn_procs(per_host={"procs": 2}, name="generators",
                                           supervisor=sup) as gen_procs:
        learner = await core.slice(procs=0).spawn("learner", Learner, lr=0.5)
        reward_actor = await core.slice(procs=1).spawn("reward", Reward)
        store = await learner.start.call_one()
        generators = await gen_procs.spawn("generators", Generator, store, learner,
                                           reward_actor)
        svc = meshio.Service(generators, routing="least_loaded")
        try:
            yield gen_procs, svc, store
        finally:
            await svc.stop()


async def main(steps: int, kill_at: int) -> None:
    sup = meshio.Supervisor("one_for_one", max_restarts=3, within=60.0)
    async with rl_system(sup) as (gen_procs, svc, store):
        events = sup.events()
        for step in range(steps):
            rollouts = [asyncio.ensure_future(svc.rollout.route(step, r))
                        for r in range(ROLLOUTS)]
            if step == kill_at:
                await asyncio.sleep(0)  # (both rollouts are on their way)
                victim = gen_procs.pids[0]
                os.kill(victim, signal.SIGKILL)
                print(f"step {step}: killed generator process {victim}")
            done = await asyncio.gather(*rollouts)  # (the killed one's rollout failed over)
            pids = [pid for pid, _, _ in done]
            versions = [version for _, version, _ in done]
            mean = statistics.fmean(r for _, _, r in done)
            print(f"step {step}: versions {versions} reward {mean:.3f} pids {pids}")
            if step == kill_at:  # show the replica coming back (the loop did not wait)
                async for event in events:
                    if event.kind == "restart":
                        print(f"step {step}: generator replica back as process {event.pid}")
                        break
        await events.aclose()
        print(f"newest version {store.latest}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A GRPO-shaped RL loop on meshio.")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--kill-at", type=int, default=10)
    args = parser.parse_args()
    meshio.run(main(args.steps, args.kill_at))
