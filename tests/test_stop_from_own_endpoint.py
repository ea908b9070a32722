"""An actor mesh stopped from one of its own endpoints: the caller hears
that the actor was stopped, and the stop leaves no traceback behind."""

from __future__ import annotations

import asyncio
import logging

import pytest

import meshio
from meshio import Actor, endpoint
from meshio.testing import in_process_host

GUARD = 30.0


class SelfStop(Actor):
    @endpoint
    async def stop_me(self) -> str:
        await meshio.context().mesh.stop()
        return "returned"


async def test_a_mesh_stopped_by_its_own_endpoint_logs_no_callback_error(
        caplog: pytest.LogCaptureFixture) -> None:
    """The stop's task is the endpoint's, which the stop cancels: ``gather``
    then ends with a CancelledError set (not cancelled), and the stop's
    done callback raised it ("Exception in callback ... _unanswered ...
    CancelledError" on the worker's stderr).  (In-process workers: their
    loop, and so its errors, are this process's.)"""
    caplog.set_level(logging.ERROR, "asyncio")
    async with in_process_host().spawn_procs(per_host={"p": 2}) as procs:
        mesh = await procs.spawn("selfstop", SelfStop)
        with pytest.raises(meshio.SupervisionError, match="was stopped while handling"):
            await asyncio.wait_for(mesh.slice(p=0).stop_me.call_one(), GUARD)
        await asyncio.wait_for(procs.stacks(), GUARD)  # (a round trip: the callback ran)
    assert "Exception in callback" not in caplog.text
