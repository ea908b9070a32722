"""A new user's first hour: what the README and docs promise works in a
fresh interpreter, as they write it."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import meshio

ROOT = Path(__file__).resolve().parent.parent
#: a fresh interpreter that spawns workers
DEADLINE = 120


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=DEADLINE, stdin=subprocess.DEVNULL)


def test_import_meshio_makes_the_subpackages_usable() -> None:
    """issue 8 item 5: ``import meshio`` alone gives meshio.rdma,
    meshio.supervision, meshio.endpoints and meshio.testing, as the docs use them."""
    proc = _run(sys.executable, "-c", "import meshio; print(meshio.rdma.RDMABuffer.__name__, "
                "meshio.supervision.ManualClock.__name__, meshio.endpoints.endpoint.__name__, "
                "meshio.testing.child_pids.__name__)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["RDMABuffer", "ManualClock", "endpoint", "child_pids"]


def test_meshio_version() -> None:
    """issue 8 item 5: ``meshio --version``, and ``meshio.__version__`` (the
    one place the version is written: the installed package's metadata
    reads it there)."""
    proc = _run(sys.executable, "-m", "meshio._cli", "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"meshio {version('meshio')}"
    assert meshio.__version__ == version("meshio")


def test_ci_runs_the_readme_setup_commands() -> None:
    """issue 8 item 2: ``.ci/run`` runs exactly the README's two set-up
    commands (read from its "Set up" section) in a fresh virtualenv."""
    proc = _run(sys.executable, str(ROOT / ".ci" / "readme_setup.py"), str(ROOT / "README.md"))
    assert proc.returncode == 0, proc.stderr
    commands = proc.stdout.splitlines()
    assert commands == ["pip install -e '.[torch]' torch==2.13.0 && meshio demo",
                        "pip install -e '.[dev]' && python -m pytest"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m venv --clear .venv" in ci and ". .venv/bin/activate" in ci
    assert "readme_setup.py README.md" in ci


def test_example_user_test_suite_passes() -> None:
    """issue 8 item 6: the small user test suite in examples/user_tests (the
    pytest-asyncio settings and mesh fixture docs/guide.md shows) passes when
    run as a user runs it, each test on both transports (issue 9)."""
    proc = _run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                cwd=ROOT / "examples" / "user_tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "10 passed" in proc.stdout
