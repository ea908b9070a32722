"""The user guide's testing section (docs/guide.md, "Testing your meshio
program") is a suite a reader can rebuild from the page alone: its
``pytest.ini``, the ``counter.py`` it shows and its ``test_counter.py``
blocks, written to a directory as the page names them, pass under pytest.
(The guide's other pages only compile, tests/test_docs.py; its §1 Counter
takes a ``start`` and has no ``rank`` endpoint, which these tests need.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_docs import parse_blocks

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guide.md"
DEADLINE = 240


def _section() -> str:
    text = GUIDE.read_text()
    start = text.index("## 11. Testing your meshio program")
    end = text.find("\n## ", start + 1)  # the last section: to the end of the page
    return text[start:] if end < 0 else text[start:end]


@pytest.mark.timeout(DEADLINE + 30)
def test_the_testing_section_is_a_suite_that_passes(tmp_path: Path) -> None:
    blocks = parse_blocks(_section(), "guide.md")
    ini = [b.code for b in blocks if b.lang == "ini"]
    counter = [b.code for b in blocks if b.lang == "python"
               and b.code.startswith("# counter.py\n")]
    tests = [b.code for b in blocks if b.lang == "python"
             and b.code.startswith("# test_counter.py")]
    assert len(ini) == 1 and len(counter) == 1 and len(tests) == 2, (ini, counter, tests)
    (tmp_path / "pytest.ini").write_text(ini[0])
    (tmp_path / "counter.py").write_text(counter[0])
    (tmp_path / "test_counter.py").write_text("\n\n".join(tests))
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=DEADLINE,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # three tests, each on both transports (the module's pytestmark)
    assert "6 passed" in proc.stdout, proc.stdout
