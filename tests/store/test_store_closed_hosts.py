"""Readers on another host (a network namespace, tests/netns_hosts.py),
which read through a relay of their host, waiting for a version of a store
whose owner is then stopped: each is told the store closed (RDMAError
naming it), none waits for ever."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from test_store_closed import until_waiting

import meshio
import meshio.store._store as store_impl
from meshio import Actor, endpoint
from meshio._transport._bulk import HOST_ID
from meshio.store import WeightStore
from netns_hosts import Host, requires_netns

pytestmark = [requires_netns, pytest.mark.filterwarnings("ignore::meshio.RDMAFallbackWarning")]

GUARD = 30.0
CLOSED = r"WeightStore 'far' of pid \d+ on .* is closed: the actor 'learner' \(rank 0\)"


class Learner(Actor):
    def __init__(self) -> None:
        self.store = WeightStore("far")

    @endpoint
    async def handle(self) -> WeightStore:
        return self.store

    @endpoint
    async def publish(self, version: int) -> None:
        await self.store.publish({"w": torch.full((1 << 16,), float(version))}, version=version)

    @endpoint
    async def served(self) -> dict[str, int]:
        return dict(store_impl._Owner.of(self.store).served)

    @endpoint
    async def until_waiting(self, n: int) -> None:
        await until_waiting(self.store, n)


class Reader(Actor):
    @endpoint
    async def host(self) -> str:
        return HOST_ID

    @endpoint(concurrent=True)
    async def read(self, store: WeightStore, at_least: int) -> float:
        return float((await store.read(at_least=at_least))["w"][0])

    @endpoint(concurrent=True)
    async def watch(self, store: WeightStore) -> list[int]:
        return [v async for v in store.versions()]


def assert_closed(e: BaseException | None) -> None:
    """``e`` is the closed store's RDMAError, raised in a reader's process."""
    assert isinstance(e, meshio.ActorError) and e.remote_type == "meshio.RDMAError", e
    assert re.search(CLOSED, str(e)), e


async def test_readers_on_another_host_are_told_the_store_closed(
        hosts: list[Host], secret_file: Path) -> None:
    async with meshio.attach([hosts[0].agent_addr], secret_file=secret_file).spawn_procs(
            ) as own, meshio.attach([hosts[1].agent_addr], secret_file=secret_file
                                    ).spawn_procs(per_host={"procs": 2}) as procs:
        learner = await own.spawn("learner", Learner)
        readers = await procs.spawn("readers", Reader)
        remote, = set((await readers.host.call()).values())
        assert remote != HOST_ID
        store = await learner.handle.call_one()
        await learner.publish.call_one(1)
        got = await asyncio.wait_for(readers.read.call(store, 1), GUARD)
        assert got.values() == [1.0, 1.0]
        assert await learner.served.call_one() == {remote: 1}  # through the host's relay
        one, two = readers.slice(procs=0), readers.slice(procs=1)
        waiting: list[asyncio.Future[Any]] = [
                   asyncio.ensure_future(one.read.call_one(store, 2)),
                   asyncio.ensure_future(two.read.call_one(store, 2)),
                   asyncio.ensure_future(two.watch.call_one(store))]
        await asyncio.wait_for(learner.until_waiting.call_one(len(waiting)), GUARD)
        await learner.stop()
        _, pending = await asyncio.wait(waiting, timeout=GUARD)
        for f in pending:
            f.cancel()
        assert not pending, f"{len(pending)} reads still wait {GUARD} s after the owner stopped"
        for f in waiting:
            assert_closed(f.exception())
        try:
            await asyncio.wait_for(one.read.call_one(store, 0), GUARD)
        except meshio.ActorError as e:
            assert_closed(e)
        else:
            raise AssertionError("a read of the closed store returned")
