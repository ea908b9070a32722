"""An endpoint called like a method (``counters.add(k=1)``) is a type error,
and so is one called through the class (``Counter.add.call(k=1)``).

At run time the first raises a ``TypeError`` naming the adverbs, the
second an ``AttributeError`` saying to spawn the actors first; the
``__call__`` and ``__getattr__`` that say so are defined for the
interpreter only, so type checkers still report the mistakes.  Checked by
``mypy --strict tests/typing/`` and ``pyright`` (strict), never run: each
``# type: ignore[code]`` line is an error both must report.
"""

# pyright: reportUnnecessaryTypeIgnoreComment=error
# (each expected-error line below must be an error for pyright too)

from __future__ import annotations

from meshio import Actor, ProcMesh, Service, endpoint


class Counter(Actor):
    @endpoint
    async def add(self, k: int) -> int:
        return k


async def called_like_a_method(procs: ProcMesh) -> None:
    counters = await procs.spawn("counters", Counter)
    await counters.add(k=1)  # type: ignore[operator]
    counters.add.call(k=1)
    Counter.add.call(k=1)  # type: ignore[attr-defined]
    counters.call(Counter.add, k=1)
    service = Service(counters)
    await service.add(k=1)  # type: ignore[operator]
    await service.add.route(k=1)
