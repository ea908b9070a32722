"""A worker that cannot reach its controller (it died while the worker
started, a TLS setting the worker's dial refuses) exits at once, saying
why, instead of waiting forever: on a host agent (no parent-death signal)
it held its agent, and a Slurm allocation, past ``idle_timeout``."""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid

import pytest

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
