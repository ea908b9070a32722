"""Tests use meshio's public API or ``meshio.testing`` helpers, not the
private attributes of its objects (issue 18, "the runtime underneath"): a
private *module* may be imported to test its parts, but ``obj._name`` on
anything other than a module, ``self`` or ``cls`` is refused here."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import TypeGuard

TESTS = Path(__file__).resolve().parent
#: the fuzz test of the port value decoder hands it messages as the
#: transport does (a port receiver's sink methods, which only the runtime calls)
ALLOWED = {"test_wire_fuzz.py: receiver._put", "test_wire_fuzz.py: receiver._items"}


def _modules(tree: ast.AST) -> set[str]:
    """The names an ``import`` statement of the file binds to a module."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):  # (a module, or a name in one: both count)
            names.update(a.asname or a.name for a in node.names
                         if a.name.lstrip("_")[:1].islower())
    return names


def private_reaches(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    modules = _modules(tree) | {"self", "cls"}
    found = []
    for node in ast.walk(tree):
        if _patches_private(node, modules):  # monkeypatch.setattr(obj, "_name", ...)
            found.append(f"{path.relative_to(TESTS)}:{node.lineno}: {ast.unparse(node)}")
            continue
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            continue
        if _a_module(node.value, modules):
            continue  # a private module, or a module's private name
        if f"{path.relative_to(TESTS)}: {ast.unparse(node)}" not in ALLOWED:
            found.append(f"{path.relative_to(TESTS)}:{node.lineno}: {ast.unparse(node)}")
    return found


def _patches_private(node: ast.AST, modules: set[str]) -> TypeGuard[ast.Call]:
    """``node`` is ``setattr``-like (``monkeypatch.setattr(obj, "_name", ...)``)
    on a private name of something other than a module."""
    return (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("setattr")
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str) and node.args[1].value.startswith("_")
            and not node.args[1].value.startswith("__")
            and not _a_module(node.args[0], modules))


def _a_module(expr: ast.expr, modules: set[str]) -> bool:
    """``expr`` is a module: an imported one, or a dotted path down from
    one through names that read as modules (lower case: not a class)."""
    while isinstance(expr, ast.Attribute):
        if not expr.attr.lstrip("_")[:1].islower():
            return False
        expr = expr.value
    return isinstance(expr, ast.Name) and expr.id in modules


def test_tests_do_not_reach_into_meshio_s_objects() -> None:
    found = [line for path in sorted(TESTS.rglob("*.py")) for line in private_reaches(path)]
    assert not found, ("private attributes reached by tests (use public API or a "
                       "meshio.testing helper):\n" + "\n".join(found))
