"""Forwarded worker output and the controller's own output, in a real
controller process: neither splits a line of the other."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

CONTROLLER = """
import asyncio
import sys

import meshio
from meshio import Actor, endpoint
from meshio import _launcher

# The controller finishes its partial lines only once the workers' lines have
# reached it: the forwarder's data_received is watched for them.
received: dict[str, int] = {}
waiters: list[tuple[str, int, asyncio.Future[None]]] = []
forward = _launcher.Forward.data_received


def watched(self, data: bytes) -> None:
    forward(self, data)
    key = f"{id(self)}"
    seen = received.get(key + "buf", b"") + data  # markers may straddle chunks
    *done, rest = seen.split(b"\\n")
    received[key + "buf"] = rest
    for line in done:
        marker = (self._prefix + line).split(b" #")[0].decode()
        received[marker] = received.get(marker, 0) + 1
    for marker, n, fut in waiters:
        if received.get(marker, 0) >= n and not fut.done():
            fut.set_result(None)


_launcher.Forward.data_received = watched


async def lines_arrived(marker: str, n: int) -> None:
    fut = asyncio.get_running_loop().create_future()
    waiters.append((marker, n, fut))
    if received.get(marker, 0) >= n:
        fut.set_result(None)
    await asyncio.wait_for(fut, 30)


class Talker(Actor):
    @endpoint
    def say(self, marker: str, n: int, stream: str) -> None:
        for i in range(n):
            print(f"{marker} #{i}", file=getattr(sys, stream))


async def main() -> None:
    procs = await meshio.this_host().spawn_procs(per_host={"procs": 2})
    talkers = await procs.spawn("talkers", Talker)
    for rnd, stream in enumerate(["stdout", "stdout", "stderr"]):
        out = getattr(sys, stream)
        print(f"controller {stream} line {rnd} begins", end="", file=out, flush=True)
        marker = f"worker {stream} round {rnd}"
        await talkers.say.call(marker, 3, stream)
        await lines_arrived(f"[procs procs=0] {marker}", 3)
        await lines_arrived(f"[procs procs=1] {marker}", 3)
        print(" ... and ends", file=out, flush=True)
    print("last controller line, no newline", end="", flush=True)
    await talkers.say.call("worker stdout late", 2, "stdout")
    await lines_arrived("[procs procs=0] worker stdout late", 2)
    await lines_arrived("[procs procs=1] worker stdout late", 2)
    await procs.stop()


meshio.run(main())
"""


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """CONTROLLER's run, in a fresh interpreter."""
    tmp_path = tmp_path_factory.mktemp("output")
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent(CONTROLLER))
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONWARNINGS": "error"})


def test_forwarded_lines_never_split_a_controller_line(
        controller: subprocess.CompletedProcess[str]) -> None:
    """issue 8 item 7: while the controller is in the middle of a line
    (``print(..., end="")``), workers' lines wait for it to end; each
    controller line and each worker line comes out whole, on stdout and
    stderr."""
    proc = controller
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for stream, text, rounds in (("stdout", proc.stdout, (0, 1)), ("stderr", proc.stderr, (2,))):
        lines = text.splitlines()
        ours = [line for line in lines if not line.startswith("[procs ")]
        theirs = [line for line in lines if line.startswith("[procs ")]
        for rnd in rounds:
            assert f"controller {stream} line {rnd} begins ... and ends" in ours, text
            for rank in (0, 1):
                for i in range(3):
                    assert f"[procs procs={rank}] worker {stream} round {rnd} #{i}" in theirs, text
        for line in theirs:
            assert line.count("[procs ") == 1 and " #" in line, text
        expected = {f"controller {stream} line {rnd} begins ... and ends" for rnd in rounds}
        if stream == "stdout":
            expected.add("last controller line, no newline")
        assert set(ours) == expected, text


def test_worker_lines_held_behind_a_partial_line_come_out_at_exit(
        controller: subprocess.CompletedProcess[str]) -> None:
    """issue 8 item 7: worker lines held behind a controller line that never
    ends still come out, on their own line, when the controller exits."""
    proc = controller
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last, tail = proc.stdout.split("last controller line, no newline")
    assert last.endswith("\n"), proc.stdout
    assert tail.startswith("\n") and tail.endswith("\n"), proc.stdout
    assert sorted(tail.splitlines()[1:]) == [
        f"[procs procs={r}] worker stdout late #{i}" for r in (0, 1) for i in (0, 1)], proc.stdout
