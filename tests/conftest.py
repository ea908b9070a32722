"""meshio's own tests use meshio's pytest plugin (meshio.testing._plugin):
the leak check is on for every test (``meshio_leak_check = true`` in
pyproject.toml), so a test fails if it leaves a worker process, a socket or
an fd behind, and each test loop's runtime is closed after it."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

import meshio
from log_watch import LogWatch
from meshio._transport._serial import limits
from meshio.jobs._job import write_secret
from netns_hosts import Host, netns_hosts


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


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    """A job secret in a file."""
    path = tmp_path / "job.secret"
    write_secret(path, secrets.token_bytes(32))
    return path


@pytest.fixture
def hosts(secret_file: Path) -> Iterator[list[Host]]:
    """Two network-namespace hosts (tests/netns_hosts.py), an agent on each."""
    with netns_hosts(2, secret_file) as h:
        yield h


@pytest.fixture(scope="module")
def width() -> Iterator[int]:
    """A fan-out width of 2 for the module's meshes spanning hosts: over 3
    hosts or more, relays send calls on to sub-ranges (a tree of depth 2+)."""
    env = os.environ.get("MESHIO_FANOUT_WIDTH")
    before = limits.fanout_width
    meshio.set_limits(fanout_width=2)
    try:
        yield 2
    finally:
        limits.fanout_width = before
        if env is None:
            del os.environ["MESHIO_FANOUT_WIDTH"]
        else:
            os.environ["MESHIO_FANOUT_WIDTH"] = env
