"""meshio's own tests use meshio's pytest plugin (meshio.testing._plugin):
the leak check is on for every test (``meshio_leak_check = true`` in
pyproject.toml), so a test fails if it leaves a worker process, a socket or
an fd behind, and each test loop's runtime is closed after it."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

import meshio
from log_watch import LogWatch


@pytest.fixture
def procs(meshio_procs: meshio.ProcMesh) -> meshio.ProcMesh:
    """Two worker processes on this host, stopped after the test (the
    plugin's ``meshio_procs`` under the name the tests use)."""
    return meshio_procs


@pytest.fixture(autouse=True)
def runtime_closed_without_leak_check(request: pytest.FixtureRequest) -> None:
    """Where the leak check is turned off (``-o meshio_leak_check=false``),
    as a quick local run may do, each test still closes its loop's runtime."""
    if not request.config.getini("meshio_leak_check"):
        request.getfixturevalue("meshio_runtime_cleanup")


@pytest.fixture
def controller_log() -> Iterator[LogWatch]:
    """This process's ``meshio`` warnings, awaitable (``await controller_log.wait_for(text)``)."""
    watch = LogWatch()
    logger = logging.getLogger("meshio")
    logger.addHandler(watch)
    yield watch
    logger.removeHandler(watch)
