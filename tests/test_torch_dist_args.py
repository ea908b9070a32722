"""The arguments of ``setup_torch_distributed``, checked before anything is
sent: a bad ``master_port`` was taken (``70000`` reached the workers'
``MASTER_PORT``; ``"29500"`` failed as a ``SchemaError`` naming a private
helper actor), and an actor mesh failed with ``UnknownEndpointError ...
'_state'``.  No torch needed: only the environment is set."""

from __future__ import annotations

import os

import pytest

import meshio
from meshio import Actor, endpoint


class Env(Actor):
    @endpoint
    def master_port(self) -> str | None:
        return os.environ.get("MASTER_PORT")


@pytest.mark.parametrize(("port", "error", "match"), [
    (0, ValueError, r"must be a TCP port, 1\.\.65535, or None \(a free one\), got 0"),
    (-1, ValueError, r"must be a TCP port, 1\.\.65535.*got -1"),
    (70000, ValueError, r"must be a TCP port, 1\.\.65535.*got 70000"),
    ("29500", TypeError, r"must be an int TCP port or None \(a free one\), got str '29500'"),
    (True, TypeError, r"must be an int TCP port.*got bool True"),
    (29500.0, TypeError, r"must be an int TCP port.*got float 29500\.0"),
], ids=["zero", "negative", "too-large", "str", "bool", "float"])
async def test_a_bad_master_port_is_refused_before_anything_is_set(
        port: object, error: type[Exception], match: str) -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        env = await procs.spawn("env", Env)
        with pytest.raises(error, match=r"^setup_torch_distributed\(master_port=\.\.\.\) " + match):
            await meshio.setup_torch_distributed(procs, master_port=port)  # type: ignore[arg-type]
        assert await env.master_port.call_one() is None  # nothing reached the process


async def test_a_good_master_port_is_set() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        env = await procs.spawn("env", Env)
        await meshio.setup_torch_distributed(procs, master_port=65535)
        assert await env.master_port.call_one() == "65535"


async def test_an_actor_mesh_is_not_a_proc_mesh() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        env = await procs.spawn("env", Env)
        with pytest.raises(TypeError, match=r"^setup_torch_distributed: expected a ProcMesh "
                                            r"\(the processes of the world\), got ActorMesh "
                                            r"<ActorMesh 'env' of Env"):
            await meshio.setup_torch_distributed(env)  # type: ignore[arg-type]
        assert await env.master_port.call_one() is None


async def test_a_host_mesh_is_not_a_proc_mesh() -> None:
    with pytest.raises(TypeError, match=r"expected a ProcMesh .*got HostMesh"):
        await meshio.setup_torch_distributed(meshio.this_host())  # type: ignore[arg-type]
