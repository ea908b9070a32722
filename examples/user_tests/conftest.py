"""Fixtures of a user's test suite: a proc mesh per test, stopped after it,
and a check that no worker process outlives its test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

import meshio
from meshio.testing import child_pids


@pytest.fixture(autouse=True)
def no_leaked_workers() -> Iterator[None]:
    before = child_pids()
    yield
    assert child_pids() <= before, "a test left worker processes behind"


@pytest.fixture
async def procs() -> AsyncIterator[meshio.ProcMesh]:
    """Two worker processes on this host, stopped after the test."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        yield procs
