"""The README's code, as a reader copies it: every python block compiles
(top-level ``await`` allowed: most are fragments of a ``main()``), and every
block that is a complete program (it calls ``meshio.run``) runs as a script
and prints what its comments say; a fragment that must work as written (the
Supervision section's wait after a SIGKILL) runs in a test of its own.  The
blocks are read with the docs pages' parser (tests/test_docs.py)."""

from __future__ import annotations

import ast
import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import meshio
from test_docs import Block, parse_blocks

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DEADLINE = 120

BLOCKS = [b for b in parse_blocks(README.read_text(), "README.md") if b.lang == "python"]
PROGRAMS = [b for b in BLOCKS if "meshio.run(" in b.code]

#: what a program prints (lines), by a phrase of its code; the others only run
PRINTS = {
    "class Worker(Actor)": [
        "[1.0, 1.0]",
        "gave up: Worker.crunch (0, 1)",
    ],
}


def test_every_python_block_compiles() -> None:
    for b in BLOCKS:
        compile(b.code, f"README.md:{b.line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
                dont_inherit=True)


def test_the_error_tree_names_every_exported_error() -> None:
    """The README's tree of errors holds every ``MeshioError`` subclass that
    ``meshio`` exports, under its parent, with the builtin it also is."""
    tree = next(b.code for b in parse_blocks(README.read_text(), "README.md")
                if b.code.startswith("MeshioError\n"))
    parent: dict[str, str] = {}
    line_of: dict[str, str] = {}
    stack = ["MeshioError"]
    for line in tree.splitlines()[1:]:
        m = re.match(r"^([│ ]*)[├└]── (\w+)", line)
        if m is None:  # a continued description
            continue
        depth = len(m[1]) // 4
        del stack[depth + 1:]
        parent[m[2]], line_of[m[2]] = stack[depth], line
        stack.append(m[2])
    exported = {name: obj for name in meshio.__all__
                if isinstance(obj := getattr(meshio, name), type)
                and issubclass(obj, meshio.MeshioError) and obj is not meshio.MeshioError}
    assert set(parent) == set(exported)
    for name, cls in exported.items():
        assert parent[name] == cls.__bases__[0].__name__, name
        for builtin in cls.__bases__[1:]:
            assert f"also {builtin.__name__}" in line_of[name], line_of[name]


class Idle(meshio.Actor):
    pass


async def test_the_supervised_kill_recipe_runs_as_written() -> None:
    """The Supervision section's recipe for a SIGKILL of your own under a
    supervisor that restarts (its ``failure`` event, then ``procs.ready()``)
    runs as written and ends once the replacement is up; ``wait_failed()``,
    which the README once named there, has not returned (it does when the
    supervisor gives up: a reader waiting on it hung)."""
    [recipe] = [b.code for b in BLOCKS if "event.pid == victim" in b.code]
    space: dict[str, Any] = {}
    exec(compile("async def recipe(procs, sup):\n"
                 + textwrap.indent(recipe.rstrip("\n") + "\nreturn victim\n", "    "),
                 "README.md", "exec"),
         {"os": os, "signal": signal}, space)
    sup = meshio.Supervisor(strategy="one_for_one", max_restarts=3, within=60.0)
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}, supervisor=sup) as procs:
        await procs.options(restart="permanent").spawn("idle", Idle)
        gave_up = asyncio.ensure_future(procs.wait_failed())
        victim = await asyncio.wait_for(space["recipe"](procs, sup), DEADLINE)
        assert victim not in procs.pids
        assert not gave_up.done()
        gave_up.cancel()


def test_the_deadlines_program_is_complete() -> None:
    """The "Deadlines and cancellation" block is a program, not a fragment:
    its class annotates with itself, so it needs the future import."""
    deadlines = [b for b in PROGRAMS if "class Worker(Actor)" in b.code]
    assert len(deadlines) == 1, [b.line for b in PROGRAMS]
    assert deadlines[0].code.startswith("from __future__ import annotations\n")


@pytest.mark.timeout(DEADLINE + 30)
@pytest.mark.parametrize("block", PROGRAMS, ids=[f"line-{b.line}" for b in PROGRAMS])
def test_a_complete_program_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "readme_program.py"
    script.write_text("\n" * (block.line - 1) + block.code)  # tracebacks name README lines
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    env.pop("PYTHONSTARTUP", None)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=DEADLINE,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"README.md:{block.line}\n{proc.stdout}\n{proc.stderr}"
    lines = proc.stdout.splitlines()
    for phrase, prints in PRINTS.items():
        for want in prints if phrase in block.code else []:
            assert want in lines, f"README.md:{block.line}: {want!r} not printed\n{proc.stdout}"
