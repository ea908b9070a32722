"""An actor's call to a process that dies mid-call (SIGKILL) fails with a
``SupervisionError`` naming that process's pid and host, as the
controller's calls do: the caller dialled the callee (a connection whose
peer never says hello back), and the pid comes from the socket itself."""

from __future__ import annotations

import asyncio
import os
import signal
import socket

import meshio
from meshio import Actor, endpoint

GUARD = 60.0


class Callee(Actor):
    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def hang(self, started: meshio.Port[str]) -> None:
        started.send("started")
        await asyncio.Event().wait()


class Caller(Actor):
    @endpoint
    async def call_hang(self, callee: Callee, started: meshio.Port[str]) -> tuple[int, str, str]:
        try:
            await callee.hang.call_one(started)
        except meshio.SupervisionError as e:
            return e.pid, e.host, str(e)
        raise AssertionError("the call did not fail")


async def test_a_dead_callee_is_named_by_pid_and_host_in_an_actors_error() -> None:
    host = meshio.this_host()
    async with host.spawn_procs(per_host={"procs": 1}, name="callers") as callers, \
            host.spawn_procs(per_host={"procs": 1}, name="callees") as callees:
        caller = await callers.spawn("caller", Caller)
        callee = await callees.spawn("callee", Callee)
        pid = await callee.pid.call_one()
        port, started = meshio.Channel[str].open()
        failed = caller.call_hang.call_one(callee, port)
        assert await asyncio.wait_for(started.recv(), GUARD) == "started"
        os.kill(pid, signal.SIGKILL)
        got_pid, got_host, message = await asyncio.wait_for(failed, GUARD)
    assert (got_pid, got_host) == (pid, socket.gethostname()), message
    assert f"process {pid} " in message, message
