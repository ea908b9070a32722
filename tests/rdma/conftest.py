"""Fixtures of the RDMA suite: each backend this process has, and an owner
and a peer actor in two worker processes."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

import meshio
from meshio.rdma import available_backends
from rdma_actors import Owner, Peer

if os.environ.get("MESHIO_REQUIRE_IBVERBS") == "1" and "ibverbs" not in available_backends():
    # CI's soft-RoCE VM stage: a device or a binding gone missing would
    # otherwise skip every ibverbs test and pass
    raise RuntimeError("MESHIO_REQUIRE_IBVERBS=1 but the ibverbs backend is absent here "
                       f"(available: {available_backends()})")


@pytest.fixture(params=available_backends())
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
async def pair(procs: meshio.ProcMesh) -> AsyncIterator[tuple[Owner, Peer]]:
    owner = await procs.slice(procs=0).spawn("owner", Owner)
    peer = await procs.slice(procs=1).spawn("peer", Peer)
    yield owner, peer
