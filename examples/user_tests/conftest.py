"""Fixtures of a user's test suite. meshio's pytest plugin (installed with
meshio) gives ``meshio_procs``, a proc mesh per test stopped after it, and a
leak check (``meshio_leak_check = true`` in pytest.ini) that fails a test
which leaves worker processes, sockets or fds behind."""

from __future__ import annotations

import pytest

import meshio


@pytest.fixture
def procs(meshio_procs: meshio.ProcMesh) -> meshio.ProcMesh:
    """Two worker processes on this host, stopped after the test (the
    plugin's ``meshio_procs`` under the name these tests use)."""
    return meshio_procs
