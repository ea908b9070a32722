"""Fault-tolerant data-parallel training: a gang of DDP ranks (gloo, CPU)
under a ``one_for_all`` supervisor.

Midway through, one rank is SIGKILLed.  The step in flight fails with
``SupervisionError``; the supervisor replaces the whole gang (in parallel),
each replacement starts with its predecessor's torch.distributed settings
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, a fresh ``MASTER_PORT``), and
``await procs.ready()`` returns once all are back.  The controller then has
the new ranks form a process group, loads its last checkpoint into them and
goes on from that step: the loss keeps going down.
"""

from __future__ import annotations

import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import meshio
from meshio import Actor, endpoint

STEPS = 24
KILL_AT = 13
CHECKPOINT_EVERY = 5
#: the weights the ranks learn, from their own shards of synthetic data
TRUE_W = torch.tensor([[2.0], [-1.0], [0.5], [3.0]])


class Trainer(Actor):
    """One DDP rank: a linear model trained on its shard of each batch."""

    def __init__(self, lr: float) -> None:
        self.model = torch.nn.Linear(4, 1, bias=False)
        with torch.no_grad():  # a reproducible run: every rank starts from zero
            self.model.weight.zero_()
        self.lr = lr
        self.ddp: DistributedDataParallel | None = None

    @endpoint
    def join(self) -> int:
        """Join the process group of this incarnation of the gang (a ``def``
        endpoint: the rendezvous blocks its actor's thread, not the loop)."""
        dist.init_process_group("gloo")
        self.ddp = DistributedDataParallel(self.model)
        return os.getpid()

    @endpoint
    def load(self, weights: torch.Tensor) -> None:
        with torch.no_grad():
            self.model.weight.copy_(weights)

    @endpoint
    def weights(self) -> torch.Tensor:
        return self.model.weight.detach().clone()

    @endpoint
    def step(self, step: int) -> float:
        """One SGD step on this rank's shard; the gradients are averaged
        across the gang by DDP's all-reduce."""
        assert self.ddp is not None, "join() first"
        gen = torch.Generator().manual_seed(step * 1000 + dist.get_rank())
        x = torch.randn(32, 4, generator=gen)
        y = x @ TRUE_W + 0.01 * torch.randn(32, 1, generator=gen)
        loss = torch.nn.functional.mse_loss(self.ddp(x), y)
        self.model.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        with torch.no_grad():  # plain SGD
            for p in self.model.parameters():
                assert p.grad is not None
                p.sub_(self.lr * p.grad)
        return float(loss.item())


async def main() -> None:
    sup = meshio.Supervisor("one_for_all", max_restarts=2, within=60.0)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup,
                                              shutdown="brutal_kill") as procs:
        await meshio.setup_torch_distributed(procs)
        trainers = await procs.spawn("trainers", Trainer, lr=0.05)
        await trainers.join.call()
        checkpoint = (0, await trainers.slice(procs=0).weights.call_one())
        losses: list[float] = []
        step, killed = 0, False
        while step < STEPS:
            if step == KILL_AT and not killed:
                killed = True
                victim = procs.pids[1]
                os.kill(victim, signal.SIGKILL)
                print(f"step {step}: SIGKILL rank 1 (pid {victim})")
            try:
                loss = sum((await trainers.step.call(step)).values()) / len(procs)
            except meshio.SupervisionError as e:
                print(f"step {step} failed: {e.cause}")
                await procs.ready()  # the whole gang was replaced
                pids = (await trainers.join.call()).values()
                step, weights = checkpoint
                await trainers.load.call(weights)
                print(f"gang back (pids {pids}), resumed from the checkpoint of step {step}")
                continue
            losses.append(loss)
            print(f"step {step}: loss {loss:.4f}")
            step += 1
            if step % CHECKPOINT_EVERY == 0:
                checkpoint = (step, await trainers.slice(procs=0).weights.call_one())
        async for event in sup.events():
            print(f"event {event.kind} {event.mesh} rank {event.rank}: {event.cause}")
            if event.kind == "restart" and event.rank == 1:
                break
        print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} steps")


if __name__ == "__main__":
    meshio.run(main())
