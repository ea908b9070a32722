"""Type inference of ``@endpoint(concurrent=N)`` (a bound on the calls of an
endpoint that run at once in one actor).

Checked by ``mypy --strict tests/typing/`` and ``pyright`` (strict), never
run.  Each ``assert_type`` line is a claim about what the checkers infer;
each ``# type: ignore[code]`` line is an error they must report.
"""

# pyright: reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from typing import assert_type

from meshio import Actor, EndpointDescriptor, ProcMesh, endpoint


class Limited(Actor):
    @endpoint(concurrent=8)  # an int: at most 8 calls of it at once
    async def fetch(self, url: str) -> bytes:
        return url.encode()

    @endpoint(concurrent=True)
    async def free(self) -> None: ...


async def check(procs: ProcMesh) -> None:
    limited = await procs.spawn("limited", Limited)
    fetch: EndpointDescriptor[Limited, [str], bytes] = Limited.fetch
    assert_type(Limited.fetch.concurrent, bool)
    assert_type(Limited.fetch.limit, int | None)
    assert_type(await limited.fetch.call_one("u"), bytes)
    endpoint(concurrent="8")  # type: ignore[call-overload]
    endpoint(concurrent=2.0)  # type: ignore[call-overload]
    del fetch
