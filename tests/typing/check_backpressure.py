"""Type inference of bounded mailboxes (issue 18 item 4): ``max_queued`` at
spawn, ``on_full`` per call, ``broadcast`` as an awaitable, ``Overloaded``.

Checked by ``mypy --strict tests/typing/`` and ``pyright`` (strict), never
run.  Each ``assert_type`` line is a claim about what the checker infers;
each ``# type: ignore[code]`` line is an error it must report.
"""

# pyright: reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from collections.abc import Awaitable
from typing import assert_type

import meshio
from meshio import Actor, Overloaded, endpoint


class Sink(Actor):
    @endpoint
    async def take(self, x: int) -> int:
        return x


async def use(procs: meshio.ProcMesh) -> None:
    assert_type(procs.options(max_queued=100), meshio.ProcMesh)
    sink = await procs.options(max_queued=100).spawn("sink", Sink)
    assert_type(sink.take.broadcast(1), Awaitable[None])
    await sink.take.broadcast(1)
    sink.take.broadcast(2)  # not awaited: it still goes
    assert_type(await sink.take.options(on_full="raise").call_one(3), int)
    assert_type(await sink.take.options(on_full="wait").choose(5), int)
    try:
        await sink.take.options(on_full="raise").broadcast(4)
    except Overloaded as e:
        assert_type(e.actor, str)
        assert_type(e.rank, int)
        assert_type(e.max_queued, int)
    sink.take.options(on_full="drop")  # type: ignore[arg-type]
    sink.take.broadcast("x")  # type: ignore[arg-type]
    procs.options(max_queued="10")  # type: ignore[arg-type]
