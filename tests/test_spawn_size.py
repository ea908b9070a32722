"""Spawning an actor mesh of N points sends O(N) bytes: each actor's
``SpawnActor`` carries its reference to the whole mesh (``context().mesh``),
which must not hold the N addresses and ranks one by one (N of them, each
of N addresses: O(N^2), gigabytes at a few thousand points)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import meshio
from meshio import Actor, context, endpoint
from meshio._actor_mesh import _addr_runs, _shared_addrs
from meshio._extent import rank_runs, shared_ranks
from meshio._transport._connection import Connection
from meshio.testing import in_process_host


class Peer(Actor):
    @endpoint(concurrent=True)  # (asked by a peer busy asking it)
    async def rank(self) -> int:
        return context().point.rank

    @endpoint
    async def ranks_of_peers(self) -> list[int]:
        """The ranks of every actor of this mesh, asked through the actor's
        own reference to it."""
        return sorted((await context().mesh.rank.call()).values())


@pytest.fixture
def bytes_sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The bytes of the frames sent (on the transport's ``Connection``, an
    internal: no public API counts bytes), by every runtime of this process."""
    sent = [0]
    send = Connection.send

    def counting_send(self: Connection, body: bytes, out: Any) -> None:
        sent[0] += len(body)
        send(self, body, out)

    monkeypatch.setattr(Connection, "send", counting_send)
    yield sent


async def _spawn_bytes(n: int, sent: list[int]) -> int:
    async with in_process_host().spawn_procs(per_host={"procs": n}) as procs:
        before = sent[0]
        mesh = await procs.spawn("peers", Peer)
        spawned = sent[0] - before
        # each actor's reference to its own mesh reaches every peer
        assert (await mesh.slice(procs=n - 1).ranks_of_peers.call_one()) == list(range(n))
    return spawned


async def test_spawn_sends_bytes_linear_in_points(bytes_sent: list[int]) -> None:
    small, large = await _spawn_bytes(64, bytes_sent), await _spawn_bytes(256, bytes_sent)
    # 4x the points: about 4x the bytes (each point's reference of all the
    # points made it 16x)
    assert large / small < 6, (small, large)


@pytest.mark.parametrize("addrs", [
    [],
    [f"@meshio-1/procs-ab-{i}" for i in range(300)],
    ["h1:7/p-0", "h1:7/p-1", "h2:7/p-2", "h2:7/p-3", ""],
    ["a", "a0", "a1", "a07", "a08", "9", "10", "b1", "b0", "b1", "", ""],
])
def test_addresses_travel_as_runs_and_come_back_the_same(addrs: list[str]) -> None:
    runs = _addr_runs(addrs)
    assert _shared_addrs(runs) == tuple(addrs)
    assert _shared_addrs(runs) is _shared_addrs(_addr_runs(addrs))  # (one per process)


def test_a_proc_meshs_addresses_are_one_run_per_host() -> None:
    addrs = [f"host{h}:5000/procs-1a2b-{h * 8 + i}" for h in range(4) for i in range(8)]
    assert len(_addr_runs(addrs)) == 4


@pytest.mark.parametrize("ranks", [[], list(range(500)), [3, 4, 5, 9, 1, 2, 2, 0]])
def test_ranks_travel_as_runs_and_come_back_the_same(ranks: list[int]) -> None:
    assert shared_ranks(rank_runs(ranks)) == tuple(ranks)
    assert len(rank_runs(range(500))) == 1


class Relay(Actor):
    @endpoint
    async def ranks_through(self, view: Peer) -> list[int]:
        return sorted((await view.rank.call()).values())


@pytest.mark.meshio_procs(per_host={"procs": 4})
async def test_a_strided_slice_reference_calls_its_actors(procs: meshio.ProcMesh) -> None:
    peers = await procs.spawn("peers", Peer)
    relay = await procs.spawn("relay", Relay)
    # the view travels to an actor (ranks 0 and 2: runs of one) and is called there
    view = peers.slice(procs=slice(0, 4, 2))
    assert await relay.slice(procs=1).ranks_through.call_one(view) == [0, 2]
