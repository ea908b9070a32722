"""``setup_torch_distributed`` given a proc mesh received by an actor (a
reference to processes another controller started) was an
``AttributeError`` on the reference's missing state: it is a RuntimeError
saying to call it in the controller that started the processes, as every
other owner-only operation of a reference is, and nothing reaches them."""

from __future__ import annotations

import asyncio
import os

import meshio
from meshio import Actor, endpoint

DEADLINE = 60.0


class Env(Actor):
    @endpoint
    def rank(self) -> str | None:
        return os.environ.get("RANK")


class Setter(Actor):
    @endpoint
    async def setup(self, procs: meshio.ProcMesh) -> str:
        """What ``setup_torch_distributed`` raised here: ``type: message``."""
        try:
            await meshio.setup_torch_distributed(procs)
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "no error"


async def test_a_proc_mesh_reference_is_refused_saying_where_to_call_it() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}, name="ctl") as ctl, \
            meshio.this_host().spawn_procs(per_host={"procs": 2}, name="world") as world:
        setter = await ctl.spawn("setter", Setter)
        env = await world.spawn("env", Env)
        caught = await asyncio.wait_for(setter.setup.call_one(world), DEADLINE)
        assert caught == (
            "RuntimeError: setup_torch_distributed: proc mesh 'world' is a reference "
            "(passed on by the controller that started its processes); call it in that "
            "controller"), caught
        assert list((await env.rank.call()).values()) == [None, None]  # nothing was set
