"""A worker that cannot reach its controller (it died while the worker
started, a TLS setting the worker's dial refuses) exits at once, saying
why, instead of waiting forever: on a host agent (no parent-death signal)
it held its agent, and a Slurm allocation, past ``idle_timeout``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from fifo_gate import Gate
from gone import wait_gone
from meshio._launcher import LocalLauncher, WorkerSpec

#: generous bound on a worker's start and exit on a loaded machine
GUARD = 60.0


@pytest.mark.parametrize("keep_alive", [None, 0.5])
async def test_a_worker_whose_controller_is_unreachable_exits_saying_why(
        capfd: pytest.CaptureFixture[str], keep_alive: float | None) -> None:
    """Nobody listens where the worker's controller should be: it exits
    with 1 (with ``keep_alive``, once no controller re-attached within it)
    and its stderr names the address and the error."""
    tag = uuid.uuid4().hex[:12]
    controller = f"@meshio-test-{tag}/controller"  # (abstract: nothing listens there)
    spec = WorkerSpec(worker=f"lonely-{tag}", listen=f"@meshio-test-{tag}/w0",
                      controller=controller, secret=b"s" * 32, label="[lonely]",
                      keep_alive=keep_alive)
    proc = await LocalLauncher().launch(spec)
    try:
        assert await asyncio.wait_for(proc.wait(), GUARD) == 1
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
    sys.stderr.flush()  # (its forwarded lines, written)
    err = capfd.readouterr().err
    assert f"cannot connect to its controller at {controller}" in err


CONTROLLER = """
import os, sys
import meshio
sys.path.insert(0, {tests!r})
from fifo_gate import hold

def boot() -> None:
    with open({pids!r}, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
    hold({ready!r}, {release!r})

async def main() -> None:
    await meshio.this_host().spawn_procs(keep_alive=1.0, bootstrap=boot, name="orphan")

meshio.run(main())
"""



async def test_a_worker_whose_controller_died_before_it_dialled_exits(tmp_path: Path) -> None:
    """The controller is SIGKILLed while its worker (``keep_alive``) runs
    its bootstrap: once done, the worker cannot reach it, and exits when
    no controller re-attached within ``keep_alive`` (saying why on a
    stderr nobody reads any more raised ``BrokenPipeError``, which skipped
    the start of that wait: the worker spun for good, logging it)."""
    gate = Gate(tmp_path)
    pids = tmp_path / "pids"
    source = CONTROLLER.format(tests=str(Path(__file__).parent), pids=str(pids),
                               ready=gate.ready, release=gate.release)
    (tmp_path / "controller.py").write_text(source)
    controller = await asyncio.create_subprocess_exec(
        sys.executable, str(tmp_path / "controller.py"), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        await gate.wait_held(GUARD)
        worker = int(pids.read_text())
        controller.kill()
        await controller.wait()
        await gate.open()
        await wait_gone([worker], GUARD / 2)
    finally:
        if pids.exists():  # (a worker left spinning fails the test, not the next ones)
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pids.read_text()), signal.SIGKILL)
        if controller.returncode is None:
            controller.kill()
            await controller.wait()
