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
