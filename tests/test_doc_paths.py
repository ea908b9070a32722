"""Where the documentation sends a reader to a test (``tests/test_x.py``), the
file is there; and the notebook tour names the test that runs it."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOUR = ROOT / "examples" / "tour.ipynb"
#: a path under the repository's tests/ (not examples/user_tests/...)
TEST_PATH = re.compile(r"(?<![\w/.])tests/[\w/]+\.py")


def _documents() -> dict[str, str]:
    """Text a reader reads: the README, the docs pages, the tour's markdown."""
    texts = {"README.md": (ROOT / "README.md").read_text()}
    for page in sorted((ROOT / "docs").rglob("*.md")):
        texts[str(page.relative_to(ROOT))] = page.read_text()
    texts["examples/tour.ipynb"] = _markdown(TOUR)
    return texts


def _markdown(notebook: Path) -> str:
    cells = json.loads(notebook.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def test_every_test_file_the_docs_name_exists() -> None:
    missing = [(doc, path) for doc, text in _documents().items()
               for path in TEST_PATH.findall(text) if not (ROOT / path).is_file()]
    assert missing == []


def test_the_tour_names_the_test_that_runs_it() -> None:
    named = TEST_PATH.findall(_markdown(TOUR))
    assert named, "the tour names no test"
    for path in named:
        assert "tour.ipynb" in (ROOT / path).read_text(), (
            f"the tour says {path} runs it, but {path} never mentions it")
