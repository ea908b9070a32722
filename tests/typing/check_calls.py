"""Type inference of call deadlines, cancellation and retry policies
and monitors (issue 18 items 1-3, 6).

Checked by ``mypy --strict tests/typing/`` and ``pyright`` (strict), never
run.  Each ``assert_type`` line is a claim about what the checker infers;
each ``# type: ignore[code]`` line is an error it must report.
"""

# pyright: reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from typing import assert_type

import meshio
from meshio import Actor, ActorDown, Monitor, Point, Retry, SupervisionError, endpoint


class Worker(Actor):
    @endpoint(retry=Retry(attempts=3, on=(ConnectionError, SupervisionError), backoff=0.1))
    async def fetch(self, url: str) -> bytes:
        ctx = meshio.context()
        assert_type(ctx.deadline, float | None)
        assert_type(ctx.remaining(), float | None)
        assert_type(ctx.cancelled(), bool)
        return url.encode()

    @endpoint(retryable=True)
    def step(self) -> int:
        return 0


async def use(w: Worker) -> None:
    assert_type(await w.fetch.options(timeout=2.0).call_one("x"), bytes)
    assert_type(await w.step.call_one(), int)
    assert_type(Retry().attempts, int)
    assert_type(Retry().on, tuple[type[BaseException], ...])
    async with meshio.monitor(w) as m:
        assert_type(m, Monitor)
        async for down in m:
            assert_type(down, ActorDown)
            assert_type(down.point, Point)
            assert_type(down.cause, str)
    meshio.monitor("w")  # type: ignore[arg-type]
    Retry(on=(int,))  # type: ignore[arg-type]
    Retry(on=ValueError)  # type: ignore[arg-type]
    Retry(attempts="3")  # type: ignore[arg-type]
