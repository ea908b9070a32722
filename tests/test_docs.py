"""The documentation site (issue 19 §5): ``mkdocs build --strict`` passes,
the API reference covers every public name, and every code block of the
tutorial and the how-to guides runs, with the output the page shows.

How a page's blocks are run (the conventions a page author follows):

- Each fenced ``python`` block runs, in page order, in one fresh
  interpreter per page (real worker processes), in a namespace of its own
  named ``__main__``, so actor classes defined on the page ship by value as
  from a script. A block with a top-level ``await`` runs on one event loop
  kept for the whole page, as in a notebook.
- A ``text`` block with ``title="Output"`` right after a python block is
  what that block prints (``...`` matches anything, as doctest's ELLIPSIS).
- ``<!-- no-run -->`` on the line before a block leaves it out (cluster-only
  snippets); ``<!-- file: NAME -->`` writes the block to ``NAME`` in the
  page's working directory instead of running it (a test module, a
  ``pytest.ini``), for later blocks to use.

The other pages (the user guide, the design notes, the topic pages) show
fragments; their python blocks must compile.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: the pages whose code blocks run: the tutorial and the how-to guides
RUN_PAGES = [DOCS / "tutorial.md", *sorted((DOCS / "howto").glob("*.md"))]
#: the public packages the API reference must cover, name by name
PACKAGES = ("meshio", "meshio.endpoints", "meshio.rdma", "meshio.supervision",
            "meshio.testing", "meshio.jobs", "meshio.store")
#: a guard against hangs; a page takes a few seconds
DEADLINE = 120

FENCE = re.compile(r"^```(?P<lang>[\w-]*)(?P<attrs>[^\n]*)\n(?P<body>.*?)^```[ \t]*$",
                   re.M | re.S)
MARKER = re.compile(r"<!--\s*(no-run|file:\s*(?P<file>[\w.\-/]+))\s*-->\s*\Z")


@dataclass
class Block:
    line: int  #: the line of the block's first code line in the page
    lang: str
    code: str
    run: bool = True
    file: str | None = None
    output: str | None = None  #: the page's "Output" block after it


def parse_blocks(text: str, page: str = "page") -> list[Block]:
    """The page's fenced blocks of code, each with its marker and shown output."""
    blocks: list[Block] = []
    end = 0
    for m in FENCE.finditer(text):
        before = text[end:m.start()]
        marker = MARKER.search(before)
        lang, attrs, body = m["lang"], m["attrs"], m["body"]
        end = m.end()
        if lang == "text" and 'title="Output"' in attrs:
            last = blocks[-1] if blocks else None
            if last is None or last.lang != "python" or not last.run or before.strip() \
                    or last.output is not None:
                line = text.count("\n", 0, m.start()) + 1
                raise ValueError(f"{page}:{line}: an Output block must follow a python "
                                 "block that runs, with nothing between")
            last.output = body
            continue
        block = Block(line=text.count("\n", 0, m.start("body")) + 1, lang=lang, code=body)
        if marker is not None:
            block.run = False
            block.file = marker["file"]
        blocks.append(block)
    return blocks


#: runs one page's blocks: argv[1] is a JSON list of [page, line, code]
DRIVER = r'''
import ast, asyncio, builtins, json, sys, traceback

blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__", "__builtins__": builtins}
runner = asyncio.Runner()
try:
    for i, (page, line, code) in enumerate(blocks):
        print(f"\x1eBLOCK {i}\x1e", flush=True)
        compiled = compile("\n" * (line - 1) + code, page, "exec",
                           flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(compiled, namespace)
        if result is not None:  # a block with a top-level await: a coroutine
            runner.run(result)
        sys.stdout.flush()
        sys.stderr.flush()
except BaseException:
    traceback.print_exc()
    sys.exit(1)
finally:
    runner.close()
print("\x1eEND\x1e", flush=True)
'''


def run_page(page: Path, cwd: Path) -> tuple[list[Block], list[str]]:
    """Runs the page's blocks in a fresh interpreter in ``cwd``; the blocks
    that ran and what each printed."""
    rel = str(page.relative_to(ROOT))
    blocks = parse_blocks(page.read_text(), rel)
    for b in blocks:
        if b.file is not None:
            (cwd / b.file).write_text(b.code)
    runs = [b for b in blocks if b.run and b.lang == "python"]
    (cwd / "blocks.json").write_text(json.dumps([[str(page), b.line, b.code] for b in runs]))
    (cwd / "driver.py").write_text(DRIVER)
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    env.pop("PYTHONSTARTUP", None)
    proc = subprocess.run([sys.executable, "driver.py", "blocks.json"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=DEADLINE,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{rel}: a block failed\n{proc.stdout}\n{proc.stderr}"
    out = proc.stdout
    assert out.endswith("\x1eEND\x1e\n"), out
    printed = re.split(r"\x1eBLOCK \d+\x1e\n", out.removesuffix("\x1eEND\x1e\n"))[1:]
    assert len(printed) == len(runs), out
    return runs, printed


@pytest.mark.timeout(DEADLINE + 30)
@pytest.mark.parametrize("page", RUN_PAGES, ids=[p.stem for p in RUN_PAGES])
def test_page_blocks_run_and_print_what_the_page_shows(page: Path, tmp_path: Path) -> None:
    """Every python block of the page runs without error, and what a block
    prints is the Output block the page shows after it."""
    runs, printed = run_page(page, tmp_path)
    assert runs, f"{page.name} has no code block that runs"
    checker = doctest.OutputChecker()
    for block, got in zip(runs, printed):
        if block.output is None:
            continue
        want = block.output
        assert checker.check_output(want, got, doctest.ELLIPSIS), (
            f"{page.name}:{block.line}: the block printed\n{got}\nthe page shows\n{want}")


def test_pages_keep_few_blocks_out() -> None:
    """Only a few blocks (cluster-only snippets) are left out of the run,
    and every page shows some output to compare."""
    for page in RUN_PAGES:
        blocks = [b for b in parse_blocks(page.read_text(), page.name) if b.lang == "python"]
        skipped = [b.line for b in blocks if not b.run and b.file is None]
        assert len(skipped) <= 2, f"{page.name}: blocks left out at lines {skipped}"
        assert any(b.output is not None for b in blocks), f"{page.name} shows no output"


def test_parse_blocks_markers_and_outputs() -> None:
    """The page conventions: a marker applies to the next block only; an
    Output block belongs to the python block right before it."""
    page = "\n".join([
        "text", "```python", "print(1)", "```", "", '```text title="Output"', "1", "```",
        "<!-- no-run -->", "```python", "cluster_only()", "```",
        "<!-- file: test_x.py -->", "```python", "def test(): pass", "```",
        "```python", "print(2)", "```", ""])
    a, b, c, d = parse_blocks(page)
    assert (a.line, a.code, a.run, a.output) == (3, "print(1)\n", True, "1\n")
    assert (b.run, b.file, b.output) == (False, None, None)
    assert (c.run, c.file) == (False, "test_x.py")
    assert (d.line, d.run, d.output) == (18, True, None)
    with pytest.raises(ValueError, match="must follow a python block that runs"):
        parse_blocks("<!-- no-run -->\n```python\nx\n```\n```text title=\"Output\"\nx\n```\n")
    with pytest.raises(ValueError, match=r"page:5: an Output block"):
        parse_blocks("```python\nx\n```\nprose\n```text title=\"Output\"\nx\n```\n")



def test_every_python_block_of_the_site_compiles() -> None:
    """The pages whose blocks do not run (the user guide, the design notes,
    the topic pages: fragments that use names defined elsewhere) still hold
    Python that compiles, top-level ``await`` allowed."""
    for page in sorted(DOCS.rglob("*.md")):
        for b in parse_blocks(page.read_text(), page.name):
            if b.lang == "python":
                compile(b.code, f"{page.relative_to(ROOT)}:{b.line}", "exec",
                        flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)

# ------------------------------------------------------------ the site


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as CI builds it (``mkdocs build --strict``)."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    return out


@pytest.mark.timeout(DEADLINE + 30)
def test_mkdocs_build_strict(site: Path) -> None:
    """Every page of the nav is built (a page missing from the nav, a broken
    link or anchor, a docstring mkdocstrings cannot render fails --strict)."""
    assert (site / "index.html").is_file()
    for page in ["tutorial", "guide", "design", "glossary", "supervision", "cluster", "rdma",
                 "howto/cluster", "reference/meshio"]:
        assert (site / page / "index.html").is_file(), page


def _documented() -> dict[str, str]:
    """``{dotted name: reference page text}`` for every ``::: name`` directive."""
    found: dict[str, str] = {}
    for page in sorted((DOCS / "reference").glob("*.md")):
        text = page.read_text()
        for name in re.findall(r"^::: ([\w.]+)$", text, re.M):
            found[name] = text
    return found


def _resolve(dotted: str) -> object:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.timeout(DEADLINE + 30)
@pytest.mark.parametrize("package", PACKAGES)
def test_reference_covers_every_public_name(package: str, site: Path) -> None:
    """Every name in the package's ``__all__`` is in the API reference:
    rendered from its docstring on the package's page (``::: package.name``),
    or, when ``meshio`` exports the same object, linked from that page to
    its entry on the ``meshio`` page. The built site has an entry for each."""
    module = importlib.import_module(package)
    page = DOCS / "reference" / f"{package.removeprefix('meshio.')}.md"
    text = page.read_text()
    documented = _documented()
    missing = []
    for name in module.__all__:
        own = f"{package}.{name}"
        if own in documented:
            continue
        homes = [d for d in documented if d.startswith("meshio.")
                 and d.count(".") == 1 and _resolve(d) is getattr(module, name)]
        if not homes or f"][{homes[0]}]" not in text:
            missing.append(name)
    assert not missing, f"{page.name} neither documents nor links {missing}"
    html = "".join(p.read_text() for p in (site / "reference").rglob("index.html"))
    for name in documented:
        assert f'id="{name}"' in html, f"the built reference has no entry for {name}"
