"""A user's tests of their actor, with the fixtures of conftest.py; each runs
twice, on worker processes and on the in-process transport (the actors on the
test's own loop: no processes, same schemas, errors and adverbs)."""

from __future__ import annotations

import pytest
from counter import Counter

import meshio

pytestmark = pytest.mark.meshio_transports()


async def test_every_rank_counts(procs: meshio.ProcMesh) -> None:
    counters = await procs.spawn("counters", Counter, start=10)
    assert (await counters.add.call(5)).values() == [15, 15]
    assert await counters.slice(procs=1).add.call_one(1) == 16


async def test_ranks(procs: meshio.ProcMesh) -> None:
    counters = await procs.spawn("counters", Counter)
    assert sorted((await counters.rank.call()).values()) == [0, 1]


async def test_remote_error_is_readable(procs: meshio.ProcMesh) -> None:
    counters = await procs.spawn("counters", Counter)
    with pytest.raises(meshio.ActorError) as info:
        await counters.slice(procs=0).fail.call_one()
    assert info.value.remote_type == "ValueError"
    assert "counter says no" in info.value.remote_message


async def test_bad_argument_is_a_schema_error(procs: meshio.ProcMesh) -> None:
    counters = await procs.spawn("counters", Counter)
    with pytest.raises(meshio.SchemaError, match=r"\$\.n"):
        await counters.add.call("five")  # type: ignore[arg-type]


async def test_two_dims(meshio_host: meshio.HostMesh) -> None:
    async with meshio_host.spawn_procs(per_host={"hosts": 2, "gpus": 2}) as procs:
        counters = await procs.spawn("counters", Counter)
        ranks = await counters.slice(gpus=1).rank.call()
        assert ranks.sizes == {"hosts": 2} and ranks.values() == [1, 3]
