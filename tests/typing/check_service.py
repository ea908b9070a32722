"""Type inference of services (``meshio.Service``).

Checked by ``mypy --strict tests/typing/`` and ``pyright`` (strict), never
run.  Each ``assert_type`` line is a claim about what the checker infers;
each ``# type: ignore[code]`` line is an error it must report.
"""

# pyright: reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import assert_type

import meshio
from meshio import Actor, ReplicaStats, ValueMesh, endpoint


class Generator(Actor):
    def __init__(self, temperature: float) -> None:
        self.temperature = temperature

    @endpoint
    async def generate(self, prompt: str, max_tokens: int = 16) -> list[int]:
        return [len(prompt)] * max_tokens

    @endpoint(retryable=True)
    def version(self) -> int:
        return 0


def last(replicas: Sequence[ReplicaStats], session: Hashable | None) -> ReplicaStats:
    return replicas[-1]


async def use(procs: meshio.ProcMesh) -> None:
    generators = await procs.spawn("generators", Generator, temperature=0.7)
    svc = meshio.Service(generators, routing="sticky")  # (session= below: sticky)
    # A service is typed as its actor class: endpoints carry their result type.
    assert_type(svc, Generator)
    assert_type(await svc.generate.route("hi", session="user-1"), list[int])
    assert_type(await svc.generate.route("hi", max_tokens=4), list[int])
    assert_type(await svc.version.route(), int)
    assert_type(await svc.generate.options(timeout=5.0).route("hi", session=7), list[int])
    assert_type(await svc.generate.call("hi"), ValueMesh[list[int]])
    # Without session=, route's arguments are checked against the endpoint.
    await svc.generate.route(1)  # type: ignore[call-overload]
    await svc.generate.route("hi", tokens=4)  # type: ignore[call-overload]
    # scale and stats
    await svc.scale(replicas=3)
    await svc.scale(3)  # type: ignore[call-arg]
    stats = svc.stats()
    assert_type(stats, list[ReplicaStats])
    assert_type(stats[0].in_flight, int)
    assert_type(stats[0].completed, int)
    assert_type(stats[0].latency_p99, float | None)
    # Routing: a policy name or a function of the live replicas and the session.
    meshio.Service(generators, routing="least_loaded")
    meshio.Service(generators, routing=last)
    meshio.Service(generators, routing="fastest")  # type: ignore[arg-type]
    meshio.Service(procs)  # type: ignore[type-var]
