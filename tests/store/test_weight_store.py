"""The weight store (issue 17 section 1): versions published by one process
and read whole by others, on the same-host path and over TCP."""

from __future__ import annotations

import asyncio
import functools
import os
import signal

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshio
from meshio import Actor, endpoint
from meshio.store import WeightStore

GUARD = 60.0


def state(version: int, n: int = 1000) -> dict[str, torch.Tensor]:
    """A state dict whose every element says which version it is."""
    return {
        "w": torch.full((n, 4), float(version)),
        "b": torch.full((n,), version, dtype=torch.int64),
        "h": torch.full((3, 5), float(version), dtype=torch.bfloat16),
        "empty": torch.empty(0, 7),
    }


def versions_in(sd: dict[str, torch.Tensor]) -> set[float]:
    return {float(v) for t in sd.values() for v in t.flatten().unique().tolist()}


class Reader(Actor):
    @endpoint
    async def read(self, store: WeightStore, at_least: int | None = None,
                   timeout: float | None = None) -> dict[str, torch.Tensor]:
        return await store.read(at_least=at_least, timeout=timeout)

    @endpoint
    async def read_keys(self, store: WeightStore, keys: list[str]) -> list[str]:
        return sorted(await store.read(keys=keys))

    @endpoint
    async def read_shard(self, store: WeightStore, rank: int, world: int) -> torch.Tensor:
        sd = await store.read(shard=lambda name, t: t[rank::world])
        return sd["w"]

    @endpoint
    async def read_into(self, store: WeightStore, n: int) -> tuple[int, list[float]]:
        dst = {"w": torch.zeros(n, 4), "b": torch.zeros(n, dtype=torch.int64),
               "h": torch.zeros(3, 5, dtype=torch.bfloat16), "empty": torch.empty(0, 7)}
        ptr = dst["w"].data_ptr()
        version = await store.read_into(dst)
        assert dst["w"].data_ptr() == ptr  # in place
        return version, sorted(versions_in(dst))

    @endpoint
    async def read_into_gpu(self, store: WeightStore, n: int) -> tuple[int, list[float]]:
        dst = {k: t.cuda() for k, t in state(0, n).items()}
        ptrs = {k: t.data_ptr() for k, t in dst.items()}
        version = await store.read_into(dst)
        assert {k: t.data_ptr() for k, t in dst.items()} == ptrs  # in place, on the GPU
        fresh = await store.read()
        assert all(t.is_cuda and torch.equal(t.cpu(), fresh[k]) for k, t in dst.items())
        return version, sorted(versions_in(dst))

    @endpoint
    async def read_into_views(self, store: WeightStore, n: int) -> tuple[int, list[float]]:
        """Into destinations the store cannot copy straight into (as a GPU
        tensor's): non-contiguous views, through one staging block."""
        dst = {"w": torch.zeros(4, n).t(), "b": torch.zeros(2 * n, dtype=torch.int64)[::2],
               "h": torch.zeros(5, 3, dtype=torch.bfloat16).t(), "empty": torch.empty(7, 0).t()}
        ptrs = {k: t.data_ptr() for k, t in dst.items()}
        version = await store.read_into(dst)
        assert {k: t.data_ptr() for k, t in dst.items()} == ptrs  # in place
        assert not dst["w"].is_contiguous()
        fresh = await store.read()
        assert all(torch.equal(dst[k], fresh[k]) for k in dst)
        return version, sorted(versions_in(dst))

    @endpoint
    async def read_into_wrong(self, store: WeightStore) -> str:
        dst = {"w": torch.zeros(3, 4), "b": torch.zeros(1000, dtype=torch.int64),
               "h": torch.zeros(3, 5, dtype=torch.bfloat16), "empty": torch.empty(0, 7)}
        try:
            await store.read_into(dst)
        except ValueError as e:
            return str(e)
        return "no error"

    @endpoint
    async def read_and_die(self, store: WeightStore) -> None:
        """Die in the middle of a read, holding its lease (the shard
        function runs while the version is leased)."""
        def die(name: str, t: torch.Tensor) -> torch.Tensor:
            os.kill(os.getpid(), signal.SIGKILL)
            return t

        await store.read(shard=die)

    @endpoint
    async def latest(self, store: WeightStore) -> int | None:
        return store.latest

    @endpoint
    async def watch(self, store: WeightStore, until: int) -> list[int]:
        """The versions ``versions()`` yields until ``until`` (it may skip
        some published faster than this loop runs)."""
        seen = []
        async for v in store.versions():
            seen.append(v)
            if v >= until:
                break
        return seen


class Learner(Actor):
    """Owns a store, as an RL learner does."""

    def __init__(self) -> None:
        self.store = WeightStore("policy", keep=1)

    @endpoint
    async def handle(self) -> WeightStore:
        return self.store

    @endpoint
    async def step(self, version: int) -> None:
        await self.store.publish(state(version), version=version)


async def test_controller_publishes_actors_read() -> None:
    store = WeightStore("policy-a")
    assert store.latest is None
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        readers = await procs.spawn("readers", Reader)
        one = readers.slice(procs=0)
        assert await one.latest.call_one(store) is None
        with pytest.raises(TimeoutError):  # nothing published yet
            await asyncio.wait_for(one.read.call_one(store, None, 0.2), GUARD)
        src = state(1)
        await store.publish(src, version=1)
        src["w"].fill_(99.0)  # the store's snapshot is its own
        got = await asyncio.wait_for(readers.read.call(store), GUARD)
        for sd in got.values():
            assert versions_in(sd) == {1.0}
            assert sd["w"].shape == (1000, 4) and sd["h"].dtype == torch.bfloat16
            assert sd["empty"].shape == (0, 7)
        assert await one.latest.call_one(store) == 1
        # at_least waits for a version that is published later
        waiting = asyncio.ensure_future(one.read.call_one(store, 3, GUARD))
        await store.publish(state(2), version=2)
        assert not waiting.done() or versions_in(waiting.result()) == {3.0}
        await store.publish(state(3), version=3)
        assert versions_in(await asyncio.wait_for(waiting, GUARD)) == {3.0}
        assert await one.read_into.call_one(store, 1000) == (3, [3.0])
        assert await one.read_into_views.call_one(store, 1000) == (3, [3.0])
        err = await one.read_into_wrong.call_one(store)
        assert "'w'" in err and "(1000, 4)" in err and "(3, 4)" in err, err
        assert await one.read_keys.call_one(store, ["b", "w"]) == ["b", "w"]
        shard = await one.read_shard.call_one(store, 1, 4)
        assert shard.shape == (250, 4) and versions_in({"w": shard}) == {3.0}
        with pytest.raises(ValueError, match="not above"):
            await store.publish(state(3), version=3)
        assert store.kept == (2, 3)  # keep=2, nobody reads


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
async def test_read_into_a_gpu_state_dict() -> None:
    """A generator's model on the GPU takes a version in place."""
    store = WeightStore("policy-gpu")
    await store.publish(state(4), version=4)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        reader = await procs.spawn("reader", Reader)
        assert await reader.read_into_gpu.call_one(store, 1000) == (4, [4.0])


async def test_a_reader_killed_holding_a_lease_frees_its_version() -> None:
    """issue 17 §1: a reader SIGKILLed mid-read (holding a version) does not
    keep that version in memory: once its connection is gone, the next
    publishes drop it (memory stays bounded by keep=2)."""
    store = WeightStore("policy-killed")
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        reader = await procs.spawn("reader", Reader)
        await store.publish(state(1), version=1)
        with pytest.raises(meshio.SupervisionError, match="SIGKILL"):
            await asyncio.wait_for(reader.read_and_die.call_one(store), GUARD)
        for v in (2, 3, 4):
            await store.publish(state(v), version=v)
        assert store.kept == (3, 4)


async def test_shard_takes_the_right_rows() -> None:
    store = WeightStore("policy-shard")
    w = torch.arange(40.0).reshape(10, 4)
    await store.publish({"w": w}, version=0)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        one = (await procs.spawn("readers", Reader)).slice(procs=0)
        got = await one.read_shard.call_one(store, 1, 3)
        assert torch.equal(got, w[1::3])
    local = await store.read(shard=lambda name, t: t[:, 2])
    assert torch.equal(local["w"], w[:, 2])


async def test_an_actor_owns_the_store_and_the_controller_reads() -> None:
    async with meshio.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        learner = (await procs.spawn("learner", Learner)).slice(procs=0)
        reader = (await procs.spawn("reader", Reader)).slice(procs=1)
        store = await learner.handle.call_one()
        watcher = asyncio.ensure_future(reader.watch.call_one(store, 6))
        await learner.step.call_one(5)
        await learner.step.call_one(6)
        seen = await asyncio.wait_for(watcher, GUARD)
        assert seen[-1] == 6 and seen == sorted(set(seen)) and set(seen) <= {5, 6}, seen
        sd = await store.read()
        assert versions_in(sd) == {6.0}
        assert store.latest == 6
        with pytest.raises(RuntimeError, match="owner"):
            await store.publish(state(7), version=7)


async def test_reads_over_tcp(monkeypatch: pytest.MonkeyPatch) -> None:
    """Readers that may not copy from the owner's memory (another host, or
    the tcp backend forced) read over the meshio connection."""
    monkeypatch.setenv("MESHIO_RDMA_BACKEND", "tcp")  # the workers inherit it
    store = WeightStore("policy-tcp")
    await store.publish(state(4, 300_000), version=4)
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        one = (await procs.spawn("readers", Reader)).slice(procs=0)
        sd = await asyncio.wait_for(one.read.call_one(store), GUARD)
        assert versions_in(sd) == {4.0} and sd["w"].shape == (300_000, 4)


async def test_bad_arguments() -> None:
    """A wrong type is a TypeError, a wrong value a ValueError (a bool is no
    count: ``read(at_least=True)`` waited for version 1)."""
    store = WeightStore("policy-bad")
    with pytest.raises(ValueError, match="exists"):
        WeightStore("policy-bad")
    with pytest.raises(ValueError, match="name must not be empty"):
        WeightStore("")
    with pytest.raises(TypeError, match="name must be a str, got int 3"):
        WeightStore(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keep must be an int >= 1, got bool True"):
        WeightStore("policy-keep", keep=True)
    with pytest.raises(ValueError, match="keep must be an int >= 1, got 0"):
        WeightStore("policy-keep", keep=0)
    with pytest.raises(TypeError, match="tensors"):
        await store.publish({"w": [1, 2]}, version=1)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="version must be an int >= 0, got -1"):
        await store.publish({}, version=-1)
    with pytest.raises(TypeError, match="version must be an int >= 0, got bool True"):
        await store.publish({}, version=True)
    await store.publish({"w": torch.ones(2)}, version=0)
    with pytest.raises(KeyError, match="nope"):
        await store.read(keys=["nope"])
    for read in (store.read, functools.partial(store.read_into, {"w": torch.zeros(2)})):
        with pytest.raises(TypeError, match="at_least must be an int >= 0, got bool True"):
            await read(at_least=True)
        with pytest.raises(ValueError, match="at_least must be an int >= 0, got -1"):
            await read(at_least=-1)


class Hammer(Actor):
    @endpoint
    async def reads(self, store: WeightStore, modes: list[str], n: int) -> list[list[float]]:
        """One read per mode, back to back: the versions each one saw."""
        out = []
        for mode in modes:
            if mode == "read":
                sd = await store.read()
            elif mode == "keys":
                sd = await store.read(keys=["b"])
            else:
                sd = {"w": torch.zeros(n, 4), "b": torch.zeros(n, dtype=torch.int64),
                      "h": torch.zeros(3, 5, dtype=torch.bfloat16), "empty": torch.empty(0, 7)}
                await store.read_into(sd)
            out.append(sorted(versions_in(sd)))
        return out


_counter = iter(range(1 << 30))


@pytest.fixture(scope="module", autouse=True)
def _uvloop_pipe() -> None:
    """uvloop opens a pipe once per process, on its first run: open it
    before the (function-scoped) leak check looks at this process's files."""
    meshio.run(asyncio.sleep(0))


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(publishes=st.integers(1, 30),
       modes=st.lists(st.sampled_from(["read", "keys", "into"]), min_size=1, max_size=30),
       n=st.sampled_from([1, 1000, 70_000]), keep=st.integers(1, 3))
def test_no_read_mixes_two_versions(publishes: int, modes: list[str], n: int,
                                    keep: int) -> None:
    """Publishes as fast as the publisher can go, interleaved with reads of
    every kind from another process and from the owner's own: each read
    sees exactly one version, never older than one it saw before, and the
    store keeps at most ``keep`` versions once nobody reads."""

    async def run() -> None:
        store = WeightStore(f"hammer-{next(_counter)}", keep=keep)
        await store.publish(state(0, n), version=0)
        async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
            hammer = (await procs.spawn("hammer", Hammer)).slice(procs=0)

            async def publisher() -> None:
                for v in range(1, publishes + 1):
                    await store.publish(state(v, n), version=v)

            async def local_reader() -> list[list[float]]:
                return [sorted(versions_in(await store.read())) for _ in modes]

            _, remote, local = await asyncio.wait_for(asyncio.gather(
                publisher(), hammer.reads.call_one(store, modes, n), local_reader()), GUARD)
            for seen in (remote, local):
                assert all(len(s) == 1 for s in seen), seen
                firsts = [s[0] for s in seen]
                assert firsts == sorted(firsts), firsts
            assert len(store.kept) <= keep and store.kept[-1] == publishes

    meshio.run(run())  # (closes the loop's runtime: its socket and connections)


async def test_a_stopped_owner_gives_the_name_back() -> None:
    """Two live stores of one name in one process are refused; once the
    actor that created one is stopped, an actor spawned anew there (the
    learner rebuilt) creates it again."""
    async with meshio.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        first = await procs.spawn("learner", Learner)
        await first.step.call_one(1)
        with pytest.raises(meshio.ActorError, match="exists"):
            await procs.spawn("learner2", Learner)  # same process, same store name
        await first.stop()
        again = (await procs.spawn("learner3", Learner)).slice(procs=0)
        await again.step.call_one(1)  # a new store: version 1 is new again
        store = await again.handle.call_one()
        assert versions_in(await store.read()) == {1.0}
