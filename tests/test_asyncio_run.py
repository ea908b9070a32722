"""A controller under plain ``asyncio.run`` (or any loop meshio does not
run itself) whose proc mesh was never stopped: once its main returns, the
loop's runtime closes with the loop, as ``meshio.run`` closes it: the
workers exit (their connections drop) and the controller's inspection
file, which holds its secret, is removed; nothing is printed.  Under
``meshio.run`` it always was; under ``asyncio.run`` the workers lived on
until the controller process exited, the file for good."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import meshio

SCRIPT = """
import asyncio, json, os, select, time

import meshio
from meshio._inspect import inspection_dir


class A(meshio.Actor):
    @meshio.endpoint
    async def pid(self) -> int:
        return os.getpid()


async def main() -> list[int]:
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 2})  # never stopped
    a = await procs.spawn("a", A)
    return list((await a.pid.call()).values())


pids = asyncio.run(main())
left = set()
for p in pids:
    try:
        left.add(os.pidfd_open(p))
    except ProcessLookupError:  # exited and reaped already, as the loop ended
        pass
end = time.monotonic() + 30
while left and time.monotonic() < end:  # (readable once the process exited)
    ready, _, _ = select.select(list(left), [], [], end - time.monotonic())
    left -= set(ready)
print(json.dumps({"alive": len(left),
                  "file": (inspection_dir() / f"{os.getpid()}.json").exists()}))
"""


def test_asyncio_run_closes_the_runtime_with_its_loop(tmp_path: Path) -> None:
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent(SCRIPT))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"alive": 0, "file": False}, proc.stdout
    assert proc.stderr == "", proc.stderr


REPEATED = """
import asyncio, gc, json, os, select, sys, warnings

import meshio


class A(meshio.Actor):
    @meshio.endpoint
    async def pid(self) -> int:
        return os.getpid()


kept = []


async def main() -> list[int]:
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 2})  # never stopped
    a = await procs.spawn("a", A)
    if sys.argv[2] == "keep":  # (a reference outliving the loop)
        kept.append(a)
    return list((await a.pid.call()).values())


def fds() -> list[str]:
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # (the listing's own, closed by now)
            pass
    return links


def children() -> set[int]:
    kids = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except (OSError, ValueError):  # not a process, or gone
            continue
        if int(stat.rpartition(")")[2].split()[1]) == os.getpid():
            kids.add(int(entry))
    return kids


def wait_exited(pids: list[int]) -> None:
    # (not reaped: the next launch reaps what the loop no longer watches)
    fds = []
    for p in pids:
        try:
            fds.append(os.pidfd_open(p))
        except ProcessLookupError:  # reaped already, as the loop ended
            pass
    while fds:
        ready, _, _ = select.select(fds, [], [], 30)
        assert ready, "a worker did not exit within 30 s of its loop's end"
        for fd in ready:
            fds.remove(fd)
            os.close(fd)


run = meshio.run if sys.argv[1] == "meshio" else asyncio.run
report = {"fds": [], "pidfds": [], "earlier": []}
earlier = set()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", ResourceWarning)
    for _ in range(3):
        pids = run(main())
        gc.collect()
        held = fds()
        report["fds"].append(len(held))
        report["pidfds"].append(sum("pidfd" in link for link in held))
        report["earlier"].append(sorted(children() & earlier))
        wait_exited(pids)
        earlier |= set(pids)
report["warnings"] = [str(w.message) for w in caught]
print(json.dumps(report))
"""


@pytest.mark.parametrize("runner", ["asyncio", "meshio"])
@pytest.mark.parametrize("keep", ["keep", "drop"])
def test_loops_that_end_unstopped_leave_nothing_behind(tmp_path: Path, runner: str,
                                                       keep: str) -> None:
    """Run after run of a program whose proc mesh is never stopped (its
    actor mesh kept past the loop's end, or dropped): each loop's end
    closes every pidfd, pipe and socket its workers' watch held (no
    ResourceWarning, the same fds after each run), and each run's workers,
    once exited, are reaped at the next launch (no zombies pile up)."""
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent(REPEATED))
    proc = subprocess.run([sys.executable, str(script), runner, keep], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["warnings"] == [], report
    assert report["pidfds"] == [0, 0, 0], report
    assert len(set(report["fds"])) == 1, report
    assert report["earlier"] == [[], [], []], report


def test_meshio_run_of_a_function_says_to_call_it() -> None:
    """``meshio.run(main)``, the function not called: a TypeError saying so
    (not ``'function' object has no attribute 'close'``), in a cell too."""

    async def main() -> None:
        raise AssertionError("never called")

    with pytest.raises(TypeError, match=r"call the function, `meshio\.run\(main\(\)\)` \(in a "
                                        r"notebook cell: `await main\(\)`\); got function"):
        meshio.run(main)  # type: ignore[arg-type]
