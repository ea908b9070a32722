"""Run a controller script in a fresh interpreter, as a user runs one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

#: a fresh interpreter that starts workers (and may import torch)
DEADLINE = 120


def run_script(tmp_path: Path, source: str, *args: str) -> list[str]:
    """Write ``source`` to ``tmp_path/script.py``, run it there with
    ``args`` (stdin ``/dev/null``), check that it exits 0 (else fail with its
    stderr) and return the lines of its stdout."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    proc = subprocess.run([sys.executable, str(script), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=DEADLINE,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()
