"""Issue 9: no meshio module imports another inside a function (how the
import cycles of old were held together), but where a heavy optional
dependency is deferred: the ibverbs cffi module, absent without
libibverbs, each said so by a ``# deferred:`` comment above it."""

from __future__ import annotations

import ast
from pathlib import Path

import meshio

SRC = Path(meshio.__file__).parent
#: (module, what it imports): the deferrals allowed
DEFERRED = {("rdma/_backends.py", "_ibverbs_qp"), ("rdma/_buffer.py", "_ibverbs_device")}


def local_imports() -> list[tuple[str, str, int]]:
    """(module, what it imports, line) of each function-local import of a meshio module."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (
                        node.level or (node.module or "").startswith("meshio")):
                    what = node.module or ", ".join(a.name for a in node.names)
                    found.append((path.relative_to(SRC).as_posix(), what, node.lineno))
                elif isinstance(node, ast.Import):
                    found += [(path.relative_to(SRC).as_posix(), a.name, node.lineno)
                              for a in node.names if a.name.startswith("meshio")]
    return found


def test_meshio_modules_are_imported_at_module_level() -> None:
    found = local_imports()
    assert {(module, what) for module, what, _ in found} == DEFERRED, found
    for module, _, line in found:
        above = (SRC / module).read_text().splitlines()[line - 2]
        assert above.strip().startswith("# deferred:"), (module, line, above)
