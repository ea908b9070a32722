"""Actor classes defined in ``__main__``: an IPython shell with top-level
``await`` (what Jupyter does), and a plain ``python script.py``.

Each runs in a fresh interpreter so that ``__main__`` really is the
notebook / script; the test reads what it prints.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernels import KERNEL, kernelspec

#: generous: a fresh interpreter, IPython, two workers
DEADLINE = 120

IPYTHON_DRIVER = r'''
import json, sys
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
cells = json.load(open(sys.argv[1]))
for i, cell in enumerate(cells):
    result = shell.run_cell(cell, store_history=True)
    if not result.success:
        print(f"CELL {i} FAILED: {result.error_before_exec or result.error_in_exec!r}",
              flush=True)
        sys.exit(1)
print("ALL CELLS OK", flush=True)
'''

CELLS = [
    # 1: imports
    """
import dataclasses, os
import msgspec
import meshio
from meshio import Actor, endpoint
""",
    # 2: an actor class and a value type, both living in the notebook's __main__
    """
@dataclasses.dataclass
class Vec:
    x: int
    y: int

class Cfg(msgspec.Struct, frozen=True):
    lr: float
    layers: list[int] = []

class Greeter(Actor):
    def __init__(self, greeting: str) -> None:
        self.greeting = greeting

    @endpoint
    async def greet(self, name: str) -> str:
        return f"{self.greeting}, {name} from rank {meshio.current_rank().rank}"

    @endpoint
    def add(self, a: Vec, b: Vec) -> Vec:
        return Vec(a.x + b.x, a.y + b.y)

    @endpoint
    def scaled(self, c: Cfg, k: int) -> Cfg:
        return Cfg(c.lr * k, [*c.layers, k])

    @endpoint
    def where(self) -> list:
        return [type(self).__module__, os.getpid()]
""",
    # 3: top-level await, all in one cell: spawn, call, print
    """
procs = await meshio.this_host().spawn_procs(per_host={"procs": 2})
greeters = await procs.spawn("greeters", Greeter, "hello")
values = await greeters.greet.call(name="notebook")
print("RESULT", sorted(values.values()))
""",
    # 4: later cells keep using the same loop, procs and actors
    """
print("VEC", await greeters.slice(procs=1).add.call_one(Vec(1, 2), Vec(10, 20)))
print("CFG", await greeters.slice(procs=0).scaled.call_one(Cfg(0.5, [4]), 2))
where = (await greeters.where.call()).values()
print("WHERE " + " | ".join([json.dumps([w[0] for w in where]),
                             json.dumps(sorted(w[1] for w in where)),
                             json.dumps(sorted(procs.pids))]))
""",
    # 5: the class is edited and re-run, as one does in a notebook
    """
class Greeter(Actor):
    @endpoint
    async def greet(self, name: str) -> str:
        return f"bonjour {name}"

greeters2 = await procs.spawn("greeters2", Greeter)
print("EDITED", await greeters2.slice(procs=0).greet.call_one(name="again"))
print("OLD", await greeters.slice(procs=0).greet.call_one(name="still"))
""",
    # 6: an error inside an endpoint defined in the notebook is readable
    """
class Broken(Actor):
    @endpoint
    def fail(self) -> int:
        raise ZeroDivisionError("notebook says no")

broken = await procs.spawn("broken", Broken)
try:
    await broken.fail.call()
except meshio.ActorError as e:
    print("ERROR", e.remote_type, "|", e.remote_message, "|", "Broken.fail" in e.remote_traceback
          or "fail" in e.remote_traceback)
""",
    # 7: stop
    """
await procs.stop()
print("STOPPED")
""",
]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("PYTHONSTARTUP", None)
    env["IPYTHONDIR"] = str(cwd / "ipython")  # no user profile, no history file
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=DEADLINE, stdin=subprocess.DEVNULL)


def _lines(out: str, tag: str) -> list[str]:
    return [line[len(tag) + 1:] for line in out.splitlines() if line.startswith(tag + " ")]


def test_ipython_top_level_await_with_actor_class_in_main(tmp_path: Path) -> None:
    pytest.importorskip("IPython")
    driver = tmp_path / "driver.py"
    driver.write_text(IPYTHON_DRIVER)
    cells = [textwrap.dedent(c) for c in CELLS]
    cells[0] += "import json\n"
    (tmp_path / "cells.json").write_text(json.dumps(cells))
    proc = _run([sys.executable, str(driver), str(tmp_path / "cells.json")], tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "ALL CELLS OK" in out
    assert _lines(out, "RESULT") == [
        "['hello, notebook from rank 0', 'hello, notebook from rank 1']"]
    assert _lines(out, "VEC") == ["Vec(x=11, y=22)"]
    assert _lines(out, "CFG") == ["Cfg(lr=1.0, layers=[4, 2])"]
    (where,) = _lines(out, "WHERE")
    modules, pids, proc_pids = where.split(" | ")
    assert json.loads(modules) == ["__main__", "__main__"]
    assert json.loads(pids) == json.loads(proc_pids)  # one actor per worker process
    assert _lines(out, "EDITED") == ["bonjour again"]
    assert _lines(out, "OLD") == ["hello, still from rank 0"]
    assert _lines(out, "ERROR") == ["ZeroDivisionError | notebook says no | True"]
    assert _lines(out, "STOPPED") == [] and "STOPPED" in out.splitlines()


SCRIPT = """
from __future__ import annotations  # annotations resolved lazily, in the worker too

import dataclasses
import os

import meshio
from meshio import Actor, endpoint


@dataclasses.dataclass
class Vec:
    x: int
    y: int


CONTROLLER_PID = os.getpid()


class Calc(Actor):
    def __init__(self, scale: int) -> None:
        self.scale = scale

    @endpoint
    def norm1(self, v: Vec) -> int:
        return (abs(v.x) + abs(v.y)) * self.scale

    @endpoint
    async def double(self, v: Vec) -> Vec:
        return Vec(v.x * 2, v.y * 2)

    @endpoint
    def module(self) -> str:
        return f"{type(self).__module__} {os.getpid() != CONTROLLER_PID}"


async def main() -> int:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        calc = await procs.spawn("calc", Calc, 3)
        print("NORM", (await calc.norm1.call(Vec(1, -2))).values(), flush=True)
        print("DOUBLE", await calc.slice(procs=1).double.call_one(Vec(1, 2)), flush=True)
        print("MODULE", (await calc.module.call()).values(), flush=True)
        try:
            await calc.norm1.call(Vec("x", 1))
        except meshio.SchemaError as e:
            print("SCHEMA", "$.v.x" in str(e), flush=True)
    return 7


print("RETURNED", meshio.run(main()), flush=True)
"""


def test_plain_script_with_actor_class_in_main(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    proc = _run([sys.executable, str(script)], tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert _lines(out, "NORM") == ["[9, 9]"]
    assert _lines(out, "DOUBLE") == ["Vec(x=2, y=4)"]
    assert _lines(out, "MODULE") == ["['__main__ True', '__main__ True']"]
    assert _lines(out, "SCHEMA") == ["True"]
    assert _lines(out, "RETURNED") == ["7"]


STRUCT_SCRIPT = """
from typing import ClassVar

import msgspec

import meshio
from meshio import Actor, endpoint


class Base(msgspec.Struct, frozen=True, kw_only=True):
    id: int = 0


class Event(Base, frozen=True, tag="event", rename="camel"):
    user_name: str
    tags: list[str] = []
    KIND: ClassVar[str] = "evt"

    def label(self) -> str:
        return f"{self.KIND}:{self.user_name}:{len(self.tags)}:{self.id}"

    def renamed(self, name: str) -> "Event":
        return Event(user_name=name, tags=self.tags, id=self.id)


class Checked(msgspec.Struct):
    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError("n must be >= 0")


class Holder(Actor):
    @endpoint
    def label(self, e: Event) -> str:
        return e.label()

    @endpoint
    def renamed(self, e: Event, name: str) -> Event:
        return e.renamed(name)

    @endpoint
    def wire(self, e: Event) -> dict:
        return msgspec.to_builtins(e)

    @endpoint
    def checked(self, c: Checked) -> int:
        return c.n

    @endpoint
    def same_class(self, e: Event, anything) -> bool:
        return type(anything) is type(e) and anything == e

    @endpoint
    def echo(self, anything):
        return anything


async def main() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        h = (await procs.spawn("holder", Holder)).slice(procs=0)
        e = Event(user_name="ann", tags=["a", "b"], id=3)
        print("LABEL", await h.label.call_one(e), flush=True)
        print("RENAME", await h.renamed.call_one(e, "bob") == Event(user_name="bob",
              tags=["a", "b"], id=3), flush=True)
        print("WIRE", await h.wire.call_one(e) == {"type": "event", "id": 3,
              "userName": "ann", "tags": ["a", "b"]}, flush=True)
        print("CHECKED", await h.checked.call_one(Checked(5)), flush=True)
        bad = Checked(1)
        bad.n = -1
        try:
            await h.checked.call_one(bad)
        except meshio.SchemaError as err:
            print("SCHEMA", "n must be >= 0" in str(err), flush=True)
        print("SAME", await h.same_class.call_one(e, e), flush=True)
        back = await h.echo.call_one([e, Checked(2)])
        print("ECHO", back == [e, Checked(2)] and type(back[0]) is Event, flush=True)


meshio.run(main())
"""


def test_script_with_msgspec_structs_in_main(tmp_path: Path) -> None:
    """msgspec Structs defined in ``__main__`` travel by value with their
    fields, config (frozen, tag, rename, kw_only), defaults, methods and
    ``__post_init__``."""
    script = tmp_path / "structs.py"
    script.write_text(textwrap.dedent(STRUCT_SCRIPT))
    proc = _run([sys.executable, str(script)], tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert _lines(out, "LABEL") == ["evt:ann:2:3"]
    assert _lines(out, "RENAME") == ["True"]
    assert _lines(out, "WIRE") == ["True"]
    assert _lines(out, "CHECKED") == ["5"]
    assert _lines(out, "SCHEMA") == ["True"]
    assert _lines(out, "SAME") == ["True"]
    assert _lines(out, "ECHO") == ["True"]


# ------------------------------------------------------- a real Jupyter kernel

KERNEL_CELLS = [
    # 0: an actor class in the notebook, and a helper that waits until a
    # worker's printed line has reached this kernel's stdout (whichever comes
    # first, the reply or the line, the cell ends only after both)
    '''
import asyncio, sys
import meshio
from meshio import Actor, endpoint

class Talker(Actor):
    @endpoint
    def say(self, text: str) -> str:
        print(text)
        return text

    @endpoint
    async def say_async(self, text: str) -> str:
        print(text, file=sys.stderr)
        return text

    @endpoint
    def fail(self) -> int:
        raise ZeroDivisionError("notebook says no")  # the failing source line

async def printed(call, line, stream="stdout"):
    out = getattr(sys, stream)
    arrived = asyncio.get_running_loop().create_future()

    class Tee:
        def write(self, s):
            if line in s and not arrived.done():
                arrived.set_result(None)
            return out.write(s)

        def __getattr__(self, name):
            return getattr(out, name)

    setattr(sys, stream, Tee())
    try:
        result = await call
        await asyncio.wait_for(arrived, 30)
    finally:
        setattr(sys, stream, out)
    return result
''',
    # 1
    '''
procs = await meshio.this_host().spawn_procs(per_host={"procs": 2})
talkers = await procs.spawn("talkers", Talker)
one = talkers.slice(procs=1)
print("CELL1", await printed(one.say.call_one("line from cell 1"), "line from cell 1"))
''',
    # 2: a later cell: its calls' output is this cell's
    '''
print("CELL2", await printed(one.say.call_one("line from cell 2"), "line from cell 2"))
''',
    # 3: stderr too
    '''
print("CELL3", await printed(one.say_async.call_one("line from cell 3"), "line from cell 3",
                             "stderr"))
''',
    # 4: a remote traceback through notebook code
    '''
try:
    await one.fail.call_one()
except meshio.ActorError as e:
    print(e.remote_traceback)
''',
    # 5: meshio.run where the kernel's loop already runs
    '''
async def main():
    return 1

meshio.run(main())
''',
    # 6: meshio's own line about a process lost goes to the running cell too
    '''
import os, signal
lone = await meshio.this_host().spawn_procs(name="lone")
os.kill(lone.pids[0], signal.SIGKILL)
print("CELL6", await printed(asyncio.sleep(0, "told"), "no supervisor restarts it", "stderr"))
''',
    # 7
    '''
await procs.stop()
print("STOPPED")
''',
]


@pytest.fixture(scope="module")
def kernel_notebook(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Runs KERNEL_CELLS as a notebook in a real ipykernel (through nbclient,
    as Jupyter does); each cell's outputs as text."""
    pytest.importorskip("ipykernel")
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    tmp = tmp_path_factory.mktemp("kernel")
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(textwrap.dedent(c)) for c in KERNEL_CELLS])
    with pytest.MonkeyPatch.context() as mp:
        kernelspec(mp, tmp)
        nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=DEADLINE,
                                allow_errors=True, resources={"metadata": {"path": str(tmp)}}
                                ).execute()

    def text(cell: object) -> str:
        return "".join(o.get("text", "") if o["output_type"] == "stream"
                       else f"{o.get('ename')}: {o.get('evalue')}\n"
                       for o in cell.outputs)  # type: ignore[attr-defined]

    return [text(c) for c in nb.cells]


def test_kernel_worker_output_lands_in_the_cell_that_made_the_call(
        kernel_notebook: list[str]) -> None:
    """issue 8 item 3: in a real kernel, what a worker prints during a call
    made in a later cell is that cell's output (stdout and stderr), not lost
    to the cell that started the workers."""
    cells = kernel_notebook
    assert "[procs procs=1] line from cell 1\n" in cells[1], cells
    assert "[procs procs=1] line from cell 2\n" in cells[2], cells
    assert "[procs procs=1] line from cell 3\n" in cells[3], cells
    assert "CELL2 line from cell 2" in cells[2] and "CELL3 line from cell 3" in cells[3]
    for i, cell in enumerate(cells):
        others = {f"line from cell {n}" for n in (1, 2, 3) if n != i}
        assert not any(o in cell for o in others), (i, cells)
    assert "STOPPED" in cells[7], cells


def test_kernel_meshio_own_lines_land_in_the_running_cell(kernel_notebook: list[str]) -> None:
    """What meshio itself says about an event in the job (here a process
    lost with no supervisor) is the running cell's output, as worker output
    is, not that of the cell whose context started the runtime (cell 1)."""
    cells = kernel_notebook
    lost = "meshio: proc mesh 'lone' rank 0: process "
    assert lost in cells[6] and "killed by signal SIGKILL; no supervisor restarts it" in cells[6]
    assert "CELL6 told" in cells[6]
    assert not any(lost in cell for i, cell in enumerate(cells) if i != 6), cells


def test_kernel_remote_traceback_shows_notebook_source(kernel_notebook: list[str]) -> None:
    """issue 8 item 3: a remote traceback through an endpoint defined in a
    notebook cell names the cell as IPython does (`Cell In[1]`) and shows
    its source line."""
    tb = kernel_notebook[4]
    assert "<dynamic-code>" not in tb, tb
    # the cell named as IPython names it in its own tracebacks, not by its temporary file
    assert "Cell In[1], line " in tb and "ipykernel_" not in tb, tb
    assert 'raise ZeroDivisionError("notebook says no")  # the failing source line' in tb, tb
    assert "in fail" in tb and "ZeroDivisionError: notebook says no" in tb, tb


def test_kernel_meshio_run_says_to_use_top_level_await(kernel_notebook: list[str]) -> None:
    """issue 8 item 3: ``meshio.run()`` in a cell (the kernel's loop is
    running) fails at once, saying to use top-level ``await``."""
    out = kernel_notebook[5]
    assert out.startswith("RuntimeError: meshio.run() cannot run inside a running event loop"), out
    assert "`await main()`" in out, out
    assert "never awaited" not in out, out


LATE_SETUP = """
import asyncio, signal
import meshio
from meshio import Actor, endpoint

class Talker(Actor):
    @endpoint
    def say(self, text: str) -> None:
        print(text)

procs = await meshio.this_host().spawn_procs(per_host={"procs": 1})
talker = await procs.spawn("talker", Talker)
# a call made while no cell runs: on SIGUSR1, sent by the test
asyncio.get_running_loop().add_signal_handler(
    signal.SIGUSR1, lambda: asyncio.ensure_future(talker.say.call("late line")))
"""


def test_kernel_late_worker_output_goes_to_the_last_cell(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 8 item 3: worker output that arrives while no cell runs, after
    the kernel handled another request (a completion), is published as the
    last cell's output (which Jupyter shows there), not the completion's
    (which no frontend shows)."""
    pytest.importorskip("ipykernel")
    manager = pytest.importorskip("jupyter_client.manager")
    kernelspec(monkeypatch, tmp_path)
    km = manager.KernelManager(kernel_name=KERNEL)
    km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=DEADLINE)

        def execute(code: str) -> str:
            msg_id: str = kc.execute(code)
            reply = kc.get_shell_msg(timeout=DEADLINE)
            assert reply["parent_header"]["msg_id"] == msg_id
            assert reply["content"]["status"] == "ok", reply["content"]
            return msg_id

        execute(textwrap.dedent(LATE_SETUP))
        last = execute("x = 1")
        kc.complete("talker.sa")
        assert kc.get_shell_msg(timeout=DEADLINE)["msg_type"] == "complete_reply"
        os.kill(km.provisioner.pid, signal.SIGUSR1)
        while True:  # guarded by get_iopub_msg's timeout
            msg = kc.get_iopub_msg(timeout=DEADLINE)
            if msg["msg_type"] == "stream" and "late line" in msg["content"]["text"]:
                break
        assert msg["content"]["text"] == "[procs procs=0] late line\n"
        assert msg["parent_header"]["msg_id"] == last, msg["parent_header"]
        execute("await procs.stop()")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


SOURCE_SCRIPT = """
import meshio
from meshio import Actor, endpoint


def check(x: int) -> int:
    if x < 0:
        raise ValueError(f"negative: {x}")  # the helper's source line
    return x


class Checker(Actor):
    @endpoint
    def run(self, x: int) -> int:
        return check(x) + 1  # the endpoint's source line


async def main() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        c = await procs.spawn("c", Checker)
        try:
            await c.run.call(-1)
        except meshio.ActorError as e:
            print(e.remote_traceback, flush=True)


meshio.run(main())
"""


def test_script_remote_traceback_shows_source_lines(tmp_path: Path) -> None:
    """issue 8 item 3: a remote traceback through functions and classes of a
    plain script's ``__main__`` shows the script's file and source lines."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SOURCE_SCRIPT))
    proc = _run([sys.executable, str(script)], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tb = proc.stdout
    assert "<dynamic-code>" not in tb, tb
    assert f'File "{script}", line 15, in run' in tb, tb
    assert "return check(x) + 1  # the endpoint's source line" in tb, tb
    assert f'File "{script}", line 8, in check' in tb, tb
    assert 'raise ValueError(f"negative: {x}")  # the helper\'s source line' in tb, tb
