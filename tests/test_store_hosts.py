"""The weight store across hosts (issue 17 section 1): a learner on one host
owns the store; readers on another host (network namespaces,
tests/netns_hosts.py) read each version through
one relay of their host, so the owner sends it once per host; a relay
SIGKILLed mid-pull leaves its readers to read from the owner."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

import meshio
import meshio.store._store as store_impl
from meshio import Actor, endpoint
from meshio._transport._bulk import HOST_ID
from meshio.store import WeightStore
from netns_hosts import Host, requires_netns

pytestmark = [requires_netns, pytest.mark.filterwarnings("ignore::meshio.RDMAFallbackWarning")]

GUARD = 60.0
ROWS = 1 << 16  # 1 MiB of float32 in "w"


def state(version: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((ROWS, 4), float(version)),
            "b": torch.full((1000,), version, dtype=torch.int64)}


def versions_in(sd: dict[str, torch.Tensor]) -> list[float]:
    return sorted({float(v) for t in sd.values() for v in t.flatten().tolist()})


class Reader(Actor):
    @endpoint
    async def host(self) -> str:
        return HOST_ID

    @endpoint
    async def read(self, store: WeightStore) -> list[float]:
        return versions_in(await store.read())

    @endpoint
    async def read_shard(self, store: WeightStore) -> list[float]:
        sd = await store.read(shard=lambda name, t: t[1::3])
        assert sd["w"].shape == (len(range(1, ROWS, 3)), 4)
        return versions_in(sd)

    @endpoint
    async def arm_kill(self, store: WeightStore, readers: int) -> None:
        """Become a relay that dies mid-pull: half the version copied, once
        ``readers`` other readers wait for it here."""
        async def dying(pull: store_impl._Pull, store: WeightStore,
                        relay: store_impl._Owner) -> None:
            half = pull.size // 2
            await store_impl._copy_range(pull.grant, None, pull.memory[:half], 0, half)
            async with asyncio.timeout(GUARD):
                while len(relay.waiters) < readers:
                    await asyncio.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)

        store_impl._Pull.run = dying  # type: ignore[method-assign,assignment]


class Learner(Actor):
    def __init__(self, name: str) -> None:
        self.store = WeightStore(name)

    @endpoint
    async def handle(self) -> WeightStore:
        return self.store

    @endpoint
    async def publish(self, version: int) -> None:
        await self.store.publish(state(version), version=version)

    @endpoint
    async def served(self) -> dict[str, int]:
        """The versions the owner sent, by host."""
        return dict(store_impl._Owner.of(self.store).served)

    @endpoint
    async def relays(self) -> list[str]:
        return list(store_impl._Owner.of(self.store).relays)


@asynccontextmanager
async def learner_and_readers(hosts: list[Host], secret_file: Path, name: str
                              ) -> AsyncIterator[tuple[Any, WeightStore, Any, str]]:
    """A learner owning store ``name`` on the first host, 3 readers on the
    second, and the readers' host."""
    async with meshio.attach([hosts[0].agent_addr], secret_file=secret_file).spawn_procs(
            ) as own, meshio.attach([hosts[1].agent_addr], secret_file=secret_file
                                    ).spawn_procs(per_host={"procs": 3}) as procs:
        learner = (await own.spawn("learner", Learner, name)).slice(procs=0)
        readers = await procs.spawn("readers", Reader)
        remote, = set((await readers.host.call()).values())
        assert remote != HOST_ID  # the namespace is another host
        yield learner, await learner.handle.call_one(), readers, remote


async def test_a_version_goes_once_to_each_host(hosts: list[Host], secret_file: Path) -> None:
    async with learner_and_readers(hosts, secret_file, "once") as (learner, store, readers,
                                                                   remote):
        for v in (1, 2):
            await learner.publish.call_one(v)
            got = await asyncio.wait_for(readers.read.call(store), GUARD)
            assert got.values() == [[float(v)]] * 3  # each read is the one version
            assert await learner.served.call_one() == {remote: v}  # once per version
        got = await asyncio.wait_for(readers.read_shard.call(store), GUARD)
        assert got.values() == [[2.0]] * 3
        assert await learner.served.call_one() == {remote: 2}  # the relay's copy served them
        # published while they read: still one version per read
        async def publish() -> None:
            for v in range(3, 8):
                await learner.publish.call_one(v)

        *meshes, _ = await asyncio.wait_for(asyncio.gather(
            *(readers.read.call(store) for _ in range(4)), publish()), GUARD)
        for mesh in meshes:
            assert all(len(vs) == 1 for vs in mesh.values())


async def test_a_relay_killed_mid_pull_leaves_its_readers_to_the_owner(
        hosts: list[Host], secret_file: Path) -> None:
    async with learner_and_readers(hosts, secret_file, "kill") as (learner, store, readers,
                                                                   remote):
        relay, others = readers.slice(procs=0), [readers.slice(procs=i) for i in (1, 2)]
        await learner.publish.call_one(1)
        await relay.arm_kill.call_one(store, 2)
        dying = asyncio.ensure_future(relay.read.call_one(store))
        async with asyncio.timeout(GUARD):  # the owner made it the host's relay
            while remote not in await learner.relays.call_one():
                await asyncio.sleep(0.01)
        got = await asyncio.wait_for(
            asyncio.gather(*(r.read.call_one(store) for r in others)), GUARD)
        assert got == [[1.0], [1.0]]
        with pytest.raises(meshio.SupervisionError):
            await asyncio.wait_for(dying, GUARD)
        # the relay, then each reader on its own
        assert await learner.served.call_one() == {remote: 3}
        await learner.publish.call_one(2)
        assert await asyncio.wait_for(others[0].read.call_one(store), GUARD) == [2.0]
        assert await learner.served.call_one() == {remote: 4}  # a new relay


async def test_a_store_the_controller_owns_is_read_on_another_host(
        hosts: list[Host], secret_file: Path) -> None:
    """The controller may own the store (issue 17: "created in the
    publishing actor (or the controller)"): readers on another host reach it."""
    store = WeightStore("controller-owned")
    async with meshio.attach([hosts[1].agent_addr], secret_file=secret_file).spawn_procs(
            per_host={"procs": 2}) as procs:
        readers = await procs.spawn("readers", Reader)
        for v in (1, 2):
            await store.publish(state(v), version=v)
            got = await asyncio.wait_for(readers.read.call(store), GUARD)
            assert got.values() == [[float(v)]] * 2
        served = dict(store_impl._Owner.of(store).served)
        remote, = set((await readers.host.call()).values())
        assert served == {remote: 2}  # once per version to that host
