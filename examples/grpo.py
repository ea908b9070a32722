"""The framework-free part of the RL recipe (``examples/rl_grpo.py``, and
the same loop on Ray in ``benchmarks/workloads_ray.py``): a tiny policy
over a few actions, sampling a GRPO group, the group-normalised policy
gradient loss, and the learner's bookkeeping of the rollouts of a step."""

from __future__ import annotations

import torch

ACTIONS = 8  # the policy picks one of 8 actions
TARGET = 5  # the one the reward pays for
SAMPLES = 16  # actions per rollout (a GRPO group)
ROLLOUTS = 2  # rollouts per step

Group = dict[int, tuple[list[int], list[float]]]


def reward(actions: list[int]) -> list[float]:
    return [1.0 if a == TARGET else 0.0 for a in actions]


def sample(logits: torch.Tensor, step: int, rollout: int) -> list[int]:
    """A group of actions drawn from the policy (seeded by step and rollout)."""
    seed = torch.Generator().manual_seed(1000 * step + rollout)
    with torch.no_grad():
        drawn = torch.multinomial(torch.softmax(logits, 0), SAMPLES, replacement=True,
                                  generator=seed)
    return [int(a) for a in drawn]


def grpo_loss(logits: torch.Tensor, group: Group) -> torch.Tensor:
    """The GRPO loss of one step's rollouts: advantages normalised within
    each rollout's group of samples."""
    loss = torch.zeros(())
    for actions, rewards in group.values():
        r = torch.tensor(rewards)
        advantages = (r - r.mean()) / (r.std() + 1e-6)
        logp = torch.log_softmax(logits, 0)[torch.tensor(actions)]
        loss = loss - (advantages * logp).mean()
    return loss


class Rollouts:
    """The learner's view of the rollouts handed in: each step's group, once
    all of its rollouts are in (a rollout handed in twice, after a failover,
    counts once; one of a step already trained is ignored)."""

    def __init__(self) -> None:
        self.version = 0
        self.pending: dict[int, Group] = {}

    def add(self, step: int, rollout: int, actions: list[int],
            rewards: list[float]) -> Group | None:
        if step < self.version:
            return None
        group = self.pending.setdefault(step, {})
        group[rollout] = (actions, rewards)
        if len(group) < ROLLOUTS:
            return None
        del self.pending[step]
        self.version = step + 1
        return group
