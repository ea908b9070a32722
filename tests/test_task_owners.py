"""Every task has an owner (issue 18, "the runtime underneath"): meshio
starts tasks only through :class:`~meshio._transport._tasks.TaskOwner`
(which cancels and awaits them when its object closes) or ``awaited``
(a task its caller awaits, ``together`` several), or inside an
``asyncio.TaskGroup``."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import meshio
from meshio._transport._runtime import runtime
from meshio._transport._tasks import TaskOwner, awaited, together

SRC = Path(meshio.__file__).resolve().parent
#: the module where tasks are made
OWNERS = SRC / "_transport" / "_tasks.py"
MAKERS = {"create_task", "ensure_future"}


def _task_groups(tree: ast.AST) -> set[str]:
    """Names bound by ``async with asyncio.TaskGroup() as name``."""
    return {item.optional_vars.id for node in ast.walk(tree) if isinstance(node, ast.AsyncWith)
            for item in node.items
            if isinstance(item.optional_vars, ast.Name)
            and isinstance(item.context_expr, ast.Call)
            and ast.unparse(item.context_expr.func) in ("asyncio.TaskGroup", "TaskGroup")}


def test_tasks_are_made_only_by_their_owners() -> None:
    stray = []
    for path in sorted(SRC.rglob("*.py")):
        if path == OWNERS:
            continue
        tree = ast.parse(path.read_text(), str(path))
        groups = _task_groups(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in MAKERS:
                if isinstance(node.value, ast.Name) and node.value.id in groups:
                    continue  # a TaskGroup owns what it starts
                stray.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.Name) and node.id in MAKERS:
                stray.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.id}")
    assert not stray, ("tasks started outside an owner (use TaskOwner.start, or awaited() "
                       "for a task the caller awaits):\n" + "\n".join(stray))


async def test_an_owner_keeps_its_tasks_until_they_end_and_cancels_the_rest() -> None:
    owner = TaskOwner("a test")
    done = owner.start(asyncio.sleep(0))
    gate = asyncio.Event()
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await gate.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    waiting = owner.start(forever())
    assert len(owner) == 2
    await done
    assert len(owner) == 1 and list(owner) == [waiting]
    await owner.aclose()
    assert cancelled.is_set() and waiting.cancelled() and len(owner) == 0


async def test_a_task_an_owner_starts_while_closing_is_cancelled_too() -> None:
    owner = TaskOwner("a test")
    late: list[asyncio.Task[Any]] = []
    started = asyncio.Event()

    async def spawner() -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            late.append(owner.start(asyncio.Event().wait()))

    owner.start(spawner())
    await started.wait()  # (only a started task runs its finally when cancelled)
    await owner.aclose()
    assert len(late) == 1 and late[0].cancelled() and len(owner) == 0


async def test_closing_the_runtime_cancels_its_tasks() -> None:
    rt = runtime()
    gate = asyncio.Event()
    task = rt.tasks.start(gate.wait())
    rt.close()
    await asyncio.wait([task])
    assert task.cancelled()


async def test_awaited_is_cancelled_with_what_the_caller_awaits() -> None:
    inner = asyncio.Event()
    fut = awaited(inner.wait())
    fut.cancel()
    await asyncio.wait([fut])
    assert fut.cancelled()


async def test_together_gives_results_in_order() -> None:
    async def after(n: int, value: str) -> str:
        for _ in range(n):
            await asyncio.sleep(0)
        return value

    assert await together([after(3, "a"), after(0, "b"), after(1, "c")]) == ["a", "b", "c"]


async def _ended(what: list[str], forever: asyncio.Event) -> None:
    try:
        await forever.wait()
    finally:
        what.append("ended")


async def test_together_ends_the_others_before_raising_the_first_failure() -> None:
    """Unlike ``asyncio.gather``, which leaves the others running with no
    owner (a failed start's other hellos, a TCP read's other chunks)."""
    ended: list[str] = []
    forever = asyncio.Event()

    async def fails() -> None:
        await asyncio.sleep(0)
        raise meshio.ProcessStartError("rank 1 failed")

    try:
        await together([_ended(ended, forever), fails(), _ended(ended, forever)])
    except meshio.ProcessStartError as e:
        assert str(e) == "rank 1 failed"
    else:
        raise AssertionError("together() returned")
    assert ended == ["ended", "ended"]  # both cancelled and waited for: none still running


async def test_together_cancelled_ends_every_one() -> None:
    ended: list[str] = []
    forever = asyncio.Event()
    started = asyncio.Event()

    async def first() -> None:
        started.set()
        await _ended(ended, forever)

    outer = awaited(together([first(), _ended(ended, forever)]))
    await started.wait()
    outer.cancel()
    await asyncio.wait([outer])
    assert outer.cancelled()
    assert ended == ["ended", "ended"]
