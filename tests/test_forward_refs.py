"""Classes defined in the user's script (``__main__``, shipped by value to the
workers) whose field annotations are strings (``from __future__ import
annotations``, or a forward reference such as ``"list[Tree]"``) travel as
endpoint arguments and results; a name that cannot be resolved is a
``SchemaError`` naming the endpoint, the argument and the name."""

from __future__ import annotations

from pathlib import Path

import pytest

from script_run import run_script

SCRIPT = """
{future}
import dataclasses

import msgspec

import meshio
from meshio import Actor, SchemaError, endpoint


@dataclasses.dataclass
class Inner:
    x: int


@dataclasses.dataclass
class Outer:
    inner: Inner
    tags: list[Inner]


@dataclasses.dataclass
class Tree:
    v: int
    kids: "list[Tree]"


class Leaf(msgspec.Struct):
    x: int


class S(msgspec.Struct):
    v: int
    leaf: Leaf
    kids: "list[S]" = []


@dataclasses.dataclass
class Bad:
    x: "Missing"  # noqa: F821  (defined nowhere)


def total(t: Tree) -> int:
    return t.v + sum(total(k) for k in t.kids)


class W(Actor):
    @endpoint
    def outer(self, o: Outer) -> Outer:
        return Outer(Inner(o.inner.x + 1), o.tags)

    @endpoint
    def tree(self, t: Tree) -> Tree:
        return Tree(total(t), [t])

    @endpoint
    def struct(self, s: S) -> S:
        return S(s.v + s.leaf.x, Leaf(0), [s])

    @endpoint
    def bad(self, b: Bad) -> int:
        return 0

    @endpoint
    def bad_result(self) -> Bad:
        return Bad(1)

    @endpoint
    def star(self, *ids: int, **kw: str) -> str:
        return f"{{ids}}-{{kw}}"


async def main() -> None:
    async with meshio.this_host().spawn_procs(per_host={{"procs": 1}}) as procs:
        w = await procs.spawn("w", W)
        print("OUTER", await w.outer.call_one(Outer(Inner(1), [Inner(2)])), flush=True)
        t = await w.tree.call_one(Tree(1, [Tree(2, [])]))
        print("TREE", t.v, type(t).__name__, type(t.kids[0].kids[0]).__name__, flush=True)
        s = await w.struct.call_one(S(1, Leaf(2), [S(3, Leaf(4))]))
        print("STRUCT", s.v, type(s.kids[0].kids[0]).__name__, flush=True)
        for name, call in [("BAD", lambda: w.bad.call_one(Bad(1))),
                           ("BAD_RESULT", w.bad_result.call_one),
                           ("STAR", lambda: w.star.call_one(1, a="ok", b=2))]:
            try:
                await call()
            except SchemaError as e:
                print(name, str(e).splitlines()[0], flush=True)


meshio.run(main())
"""


@pytest.mark.parametrize("future", ["from __future__ import annotations", ""],
                         ids=["future-annotations", "string-annotations"])
def test_main_classes_with_string_annotations_travel(tmp_path: Path, future: str) -> None:
    """probe3 item 1: a dataclass or Struct in ``__main__`` referring to
    another one, or to itself, by a string annotation used to fail every
    call with ProtocolError (NameError: name 'Inner' is not defined),
    arguments and results alike; probe3 item 5: a bad ``**kwargs`` value's
    path names its key."""
    lines = run_script(tmp_path, SCRIPT.format(future=future))
    assert "OUTER Outer(inner=Inner(x=2), tags=[Inner(x=2)])" in lines, lines
    assert "TREE 3 Tree Tree" in lines, lines
    assert "STRUCT 3 S" in lines, lines
    bad = next(line for line in lines if line.startswith("BAD "))
    assert "W.bad" in bad and "argument 'b'" in bad and "Missing" in bad, bad
    bad = next(line for line in lines if line.startswith("BAD_RESULT "))
    assert "W.bad_result" in bad and "the result" in bad and "Missing" in bad, bad
    star = next(line for line in lines if line.startswith("STAR "))
    assert "at `$.kw['b']`" in star, star
