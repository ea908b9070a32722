"""A Jupyter kernel of this virtualenv for the tests that run notebooks in
a real kernel (``tests/test_notebook.py``, ``tests/test_tour.py``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

#: the kernelspec's name
KERNEL = "meshio-test"


def kernelspec(mp: pytest.MonkeyPatch, tmp: Path) -> None:
    """A kernelspec ``KERNEL`` for this interpreter, found through
    JUPYTER_PATH: whatever kernels the machine has installed (or none, in a
    fresh virtualenv), the kernel runs in this virtualenv."""
    spec = tmp / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "meshio test", "language": "python"}))
    mp.setenv("JUPYTER_PATH", str(tmp / "jupyter"))
    mp.setenv("JUPYTER_PLATFORM_DIRS", "1")  # no migration warning
    mp.setenv("IPYTHONDIR", str(tmp / "ipython"))
    mp.delenv("PYTHONSTARTUP", raising=False)
