"""Fault-tolerant data-parallel training on meshio, the torchft way: a rank
that dies is left out, the others go on, and its replacement joins later.

N ranks (one process each, no supervisor) train a tiny MLP with gloo:
each step every member computes the gradient of its shard of the step's
batch, the gradients are summed with one ``all_reduce``, and only once
every member's all-reduce succeeded does the controller tell them to apply
it (``commit``), so a step is applied once or not at all.  Each rank then
publishes its weights to its own :class:`~meshio.store.WeightStore`
(version = the number of steps applied).

Midway, one rank is SIGKILLed as a step begins.  The survivors' all-reduce
fails, they drop their process group and the step is not applied.  The
controller sees the dead rank as a hole (nothing restarts it), starts
``procs.replace(rank)`` in the background and has the N-1 survivors form a
new process group (``setup_torch_distributed`` on a mesh with a hole: a
new world of the live processes, on a fresh port) and redo the step: they
are never restarted.  At the first step after the replacement is up, it
reads the weights of that step from a survivor's store, and the N ranks
form a new group again.  The step's batch is split among however many
ranks there are and the gradient is that of the whole batch, so the loss
curve does not care how many ranks computed it.

``python examples/ft_training.py [--ranks N] [--steps S] [--kill-at K]
[--kill-rank R] [--plot docs/img/ft_training.png]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import meshio
from meshio import Actor, current_rank, endpoint
from meshio.store import WeightStore

FEATURES, HIDDEN, BATCH = 8, 32, 64
LR = 0.05
#: a replacement not up this many steps after the failure is waited for
#: (so a run this short shows it joining; a long job would train on)
REJOIN_WAIT = 5
#: the function the ranks learn
TEACHER = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(1234)) / 3


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch of ``step`` (the same wherever it is computed)."""
    x = torch.randn(BATCH, FEATURES, generator=torch.Generator().manual_seed(step))
    return x, torch.tanh(2 * (x @ TEACHER))


class Trainer(Actor):
    """One data-parallel rank."""

    def __init__(self, lr: float) -> None:
        # every rank starts from the same weights
        torch.manual_seed(0)  # pyright: ignore[reportUnknownMemberType]
        self.model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(),
                                         torch.nn.Linear(HIDDEN, 1))
        self.lr = lr
        self.store = WeightStore("weights")
        #: the process group generation this rank is a member of (-1: none)
        self.generation = -1
        #: (step, the averaged gradient) of the step computed last
        self.pending: tuple[int, torch.Tensor] | None = None
        #: the steps this rank applied, in order
        self.applied: list[int] = []

    @endpoint
    def weights(self) -> WeightStore:
        return self.store

    @endpoint
    async def heal(self, source: WeightStore, step: int) -> int:
        """Load the weights after ``step`` steps from another rank's store
        (a replacement, before it joins)."""
        version = await source.read_into(self.model.state_dict(), at_least=step, timeout=60.0)
        if version != step:
            raise RuntimeError(f"heal: expected the weights of step {step}, got {version}")
        return version

    @endpoint
    def join(self, generation: int, members: list[int]) -> None:
        """Form the process group of ``generation`` with the other members
        (``setup_torch_distributed`` set its variables; a ``def`` endpoint:
        the rendezvous blocks the actor's thread, not its event loop)."""
        if current_rank().rank not in members:
            return  # a replacement that started meanwhile: it joins next time
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
        self.generation = generation

    @endpoint
    def compute(self, step: int, generation: int) -> float | None:
        """Phase one of a step: this rank's part of the batch, gradients
        summed across the group.  The loss of the whole batch, or None: not
        a member of ``generation``, or the all-reduce failed (a member
        died; the group is dropped)."""
        if generation != self.generation:
            return None
        rank, world = dist.get_rank(), dist.get_world_size()
        x, y = batch(step)
        self.model.zero_grad()
        sse = ((self.model(x[rank::world]) - y[rank::world]) ** 2).sum()
        sse.backward()
        flat = torch.cat([p.grad.flatten() for p in self.model.parameters()
                          if p.grad is not None] + [sse.detach().reshape(1)])
        try:
            dist.all_reduce(flat)  # pyright: ignore[reportUnknownMemberType]
        except RuntimeError:  # a peer is gone: this group is done
            dist.destroy_process_group()
            self.generation = -1
            return None
        self.pending = (step, flat[:-1] / BATCH)
        return float(flat[-1]) / BATCH

    @endpoint
    async def commit(self, step: int, generation: int) -> None:
        """Phase two: every member's all-reduce succeeded, apply the step
        and publish the weights (version: the number of steps applied)."""
        if generation != self.generation:
            return
        assert self.pending is not None and self.pending[0] == step
        grad, offset = self.pending[1], 0
        with torch.no_grad():
            for p in self.model.parameters():
                p.sub_(self.lr * grad[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.applied.append(step)
        await self.store.publish(self.model.state_dict(), version=step + 1)

    @endpoint
    def history(self) -> tuple[list[int], torch.Tensor]:
        """The steps applied here, and the weights now (flat)."""
        params = [p.detach().flatten() for p in self.model.parameters()]
        return self.applied, torch.cat(params)


async def main(ranks: int, steps: int, kill_at: int, kill_rank: int,
               plot: str | None) -> None:
    losses: dict[int, tuple[float, int]] = {}  # step → (loss, world size)
    async with meshio.this_host().spawn_procs(per_host={"ranks": ranks}, name="dp") as procs, \
            asyncio.TaskGroup() as tg:
        trainers = await procs.spawn("trainers", Trainer, lr=LR)
        generation, members = 0, list[int]()
        stores: dict[int, WeightStore] = {}
        replacing: asyncio.Task[None] | None = None
        failed_at = rejoined = steps
        step = 0
        while step < steps:
            if replacing is not None and (replacing.done() or step >= failed_at + REJOIN_WAIT):
                await replacing
                replacing = None
            holes = {p.rank for p in procs.holes}
            if set(range(ranks)) - holes != set(members):  # a new generation
                start = time.perf_counter()
                world = [p.rank for p in await meshio.setup_torch_distributed(procs)]
                joining = [rank for rank in world if members and rank not in members]
                for rank in joining:  # a replacement: the weights first
                    await trainers.slice(ranks=rank).heal.call_one(stores[members[0]], step)
                    rejoined = step
                generation, members = generation + 1, world
                await trainers.join.call(generation, members)
                stores = {p.rank: s for p, s in (await trainers.weights.call()).items()}
                print(f"step {step}: generation {generation}, ranks {members}"
                      + (f", rank {joining[0]} joined with the weights of step {step}"
                         if joining else "")
                      + f" ({1000 * (time.perf_counter() - start):.0f} ms)")
            began = time.perf_counter()
            if step == kill_at and failed_at == steps:
                # (as the step begins: killed after it was sent, a rank could
                # answer first on a busy machine, and the step would succeed)
                os.kill(procs.pids[kill_rank], signal.SIGKILL)
                print(f"step {step}: SIGKILL rank {kill_rank}")
            attempt = trainers.compute.call(step, generation)
            try:
                done = {p.rank: loss for p, loss in (await attempt).items()}
            except meshio.SupervisionError:  # a member died (not known as a hole yet)
                done = {}
            if any(done.get(rank) is None for rank in members):
                failure = await procs.wait_failed()  # the dead rank is a hole now
                print(f"step {step}: aborted in generation {generation} after "
                      f"{1000 * (time.perf_counter() - began):.0f} ms (rank {failure.rank} "
                      f"died): not applied, the {len(members) - 1} others redo it")
                replacing = tg.create_task(procs.replace(failure.rank))
                failed_at = step
                continue
            await trainers.commit.call(step, generation)
            loss = done[members[0]]
            assert loss is not None  # (every member's is)
            losses[step] = (loss, len(members))
            print(f"step {step}: loss {loss:.4f} world {len(members)}")
            step += 1
        histories = (await trainers.history.call()).items()
        for point, (applied, _) in histories:
            print(f"rank {point.rank} applied steps {applied}")
        weights = [w for _, (_, w) in histories]
        print(f"the same weights on every rank: {all(torch.equal(w, weights[0]) for w in weights)}")
    if plot is not None:
        _plot(plot, losses, rejoined, ranks)


def _plot(path: str, losses: dict[int, tuple[float, int]], rejoined: int, ranks: int) -> None:
    """Loss against step, the steps run short-handed shaded."""
    import matplotlib  # (only to draw the plot)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(losses)
    short = [s for s in steps if losses[s][1] < ranks]
    fig: Any  # (matplotlib's **kwargs are untyped: pyright would call every call unknown)
    ax: Any
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=100)
    ax.plot(steps, [losses[s][0] for s in steps], marker=".", color="tab:blue", label="loss")
    if short:
        ax.axvline(short[0] - 0.5, color="tab:red", linestyle="--",
                   label=f"a rank SIGKILLed during step {short[0]} (redone without it)")
        ax.axvspan(short[0] - 0.5, rejoined - 0.5, color="tab:red", alpha=0.15,
                   label=f"{ranks - 1} ranks while the replacement starts")
        ax.axvline(rejoined - 0.5, color="tab:green", linestyle=":",
                   label=f"the replacement joins at step {rejoined}, weights from the store")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (whole batch)")
    ax.set_title(f"data-parallel training over {ranks} ranks, one rank lost and replaced")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    print(f"plot written to {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Fault-tolerant data-parallel training.")
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--kill-at", type=int, default=10)
    parser.add_argument("--kill-rank", type=int, default=1)
    parser.add_argument("--plot", help="write a PNG of the loss against step here")
    args = parser.parse_args()
    meshio.run(main(args.ranks, args.steps, args.kill_at, args.kill_rank, args.plot))
