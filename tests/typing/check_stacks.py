"""Type inference of ``stacks()`` on actor and proc meshes and of what it
returns (``meshio.Stacks`` and its parts).

Checked by ``mypy --strict tests/typing/`` and ``pyright`` (strict), never
run; see ``check_endpoints.py``.
"""

# pyright: reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from typing import assert_type

import meshio
from meshio import Actor, ActorStacks, StackFrame, Stacks, TaskStack, endpoint


class Trainer(Actor):
    @endpoint
    async def step(self) -> float:
        return 0.0


async def use(trainers: Trainer, untyped: meshio.ActorMesh[Trainer],
              procs: meshio.ProcMesh) -> None:
    stacks = await trainers.stacks()
    assert_type(stacks, Stacks)
    assert_type(await trainers.slice(gpus=0).stacks(timeout=2.5), Stacks)
    assert_type(await untyped.stacks(), Stacks)
    assert_type(await procs.stacks(timeout=1), Stacks)
    assert_type(stacks.actors, tuple[ActorStacks, ...])
    assert_type(stacks.errors, tuple[str, ...])
    assert_type(stacks.text(), str)
    assert_type(stacks.json(), str)
    assert_type(Stacks.from_json(stacks.json()), Stacks)
    actor = stacks.actors[0]
    assert_type(actor.rank, int)
    assert_type(actor.point, dict[str, int])
    assert_type(actor.endpoint, str | None)
    assert_type(actor.running_for, float | None)
    assert_type(actor.tasks, tuple[TaskStack, ...])
    assert_type(actor.thread, tuple[StackFrame, ...])
    assert_type(actor.innermost(), StackFrame | None)
    assert_type(actor.idle, bool)
    assert_type(actor.constructing, bool)
    assert_type(actor.tasks[0].frames[0].line, int)
    await trainers.stacks(timeout="1")  # type: ignore[arg-type]
    await procs.stacks(2.0)  # type: ignore[call-arg]
    actor.rank = 1  # type: ignore[misc]
