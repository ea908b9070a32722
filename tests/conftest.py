"""meshio's own tests use meshio's pytest plugin (meshio.testing._plugin):
the leak check is on for every test (``meshio_leak_check = true`` in
pyproject.toml), so a test fails if it leaves a worker process, a socket or
an fd behind, and each test loop's runtime is closed after it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvloop

import meshio
from log_watch import LogWatch
from meshio._transport._serial import Limits, limits
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


@pytest.fixture(scope="session")
def uvloop_started() -> None:
    """uvloop opens a pipe pair for the whole process on its first run: open
    it before any test's leak check (tests that run loops of their own)."""
    uvloop.run(asyncio.sleep(0))


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


@contextlib.contextmanager
def limits_kept() -> Iterator[None]:
    """set_limits changes this process and the environment workers inherit:
    put both back after the block."""
    env = {name: os.environ.get(f"MESHIO_{name.upper()}") for name in Limits.__slots__}
    saved = {name: getattr(limits, name) for name in Limits.__slots__}
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(limits, name, value)
        for name, text in env.items():
            if text is None:
                os.environ.pop(f"MESHIO_{name.upper()}", None)
            else:
                os.environ[f"MESHIO_{name.upper()}"] = text


@pytest.fixture
def restore_limits() -> Iterator[None]:
    """The test may call set_limits: its limits are undone after it."""
    with limits_kept():
        yield


@pytest.fixture(scope="module")
def width() -> Iterator[int]:
    """A fan-out width of 2 for the module's meshes spanning hosts: over 3
    hosts or more, relays send calls on to sub-ranges (a tree of depth 2+)."""
    with limits_kept():
        meshio.set_limits(fanout_width=2)
        yield 2
