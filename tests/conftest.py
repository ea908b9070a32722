"""Shared fixtures: every test must leave no worker process behind."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest

import meshio
import meshio._runtime
from meshio.testing import child_pids


@pytest.fixture(autouse=True)
def no_leaked_workers() -> Iterator[None]:
    before = child_pids()
    yield
    leaked = child_pids() - before
    for pid in leaked:
        os.kill(pid, 9)
    assert not leaked, f"test leaked worker processes {sorted(leaked)}"


@pytest.fixture(autouse=True)
async def close_meshio_runtime() -> AsyncIterator[None]:
    """Each test has its own event loop: close that loop's meshio runtime
    (listening socket, connections) with it."""
    yield
    meshio._runtime.close_runtime()


@pytest.fixture
async def procs() -> AsyncIterator[meshio.ProcMesh]:
    """Two worker processes on this host, stopped after the test."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as pm:
        yield pm
