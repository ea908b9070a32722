"""The commonest ways to get an endpoint wrong, on an actor mesh and on a
service: a name that is not an endpoint (a typo, or a method without
``@endpoint``) raises :class:`meshio.UnknownEndpointError`; an endpoint
called like a method, or through Ray's ``.remote()``, raises an error that
names the adverbs; Monarch's ``.get()`` on the future a call returns says
to ``await`` it.  All are decided on the controller: the in-process
transport is enough."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

import meshio
from meshio import Actor, endpoint
from meshio.testing import in_process_host


class Counter(Actor):
    @endpoint
    async def add(self, k: int) -> int:
        return k

    def helper(self) -> None:
        """A plain method: not reachable from the mesh."""


async def test_a_misspelled_endpoint_is_an_unknown_endpoint_error() -> None:
    async with in_process_host().spawn_procs(per_host={"procs": 2}) as procs:
        counters: Any = await procs.spawn("counters", Counter)
        service: Any = meshio.Service(counters)
        for target, what in ((counters, "Counter actor mesh 'counters'"),
                             (service, "service 'counters' of Counter")):
            with pytest.raises(meshio.UnknownEndpointError,
                               match=re.escape(f"{what} has no endpoint 'ad' (endpoints: ['add'])")
                               + "$"):
                target.ad.call(k=1)
            with pytest.raises(meshio.UnknownEndpointError,
                               match=r"no endpoint 'helper'.*Counter\.helper is a method "
                                     r"without @endpoint"):
                target.helper.call()
            # still an AttributeError: hasattr and getattr with a default answer
            assert not hasattr(target, "ad")
            assert getattr(target, "ad", None) is None
            assert hasattr(target, "add")
        assert (await counters.add.call(k=2)).values() == [2, 2]


async def test_an_endpoint_called_like_a_method_names_the_adverbs() -> None:
    async with in_process_host().spawn_procs(per_host={"procs": 2}) as procs:
        counters = await procs.spawn("counters", Counter)
        with pytest.raises(TypeError) as info:
            counters.add(k=1)  # type: ignore[operator]
        message = str(info.value)
        assert message.startswith(
            "Counter.add on actor mesh 'counters' is an endpoint, not a method: call it "
            "through an adverb: .add.call(...)")
        for adverb in ("call_one", "choose", "stream", "broadcast"):
            assert f".add.{adverb}(...)" in message
        assert "route" not in message

        service = meshio.Service(counters)
        with pytest.raises(TypeError, match=r"Counter.add on service 'counters' is an endpoint, "
                                            r"not a method: .*\.add\.route\(\.\.\.\)"):
            service.add(k=1)  # type: ignore[operator]
        assert await service.add.route(k=3) == 3


async def test_ray_remote_names_the_adverbs_and_monarch_get_says_await() -> None:
    """They were bare AttributeErrors naming the private future classes
    (``'_Gathered' object has no attribute 'get'``)."""
    async with in_process_host().spawn_procs(per_host={"procs": 2}) as procs:
        counters = await procs.spawn("counters", Counter)
        service = meshio.Service(counters)
        for target, first in ((counters, ".add.call(...)"), (service, ".add.route(...)")):
            ep: Any = target.add
            with pytest.raises(AttributeError) as info:
                ep.remote(k=1)
            what = "actor mesh" if target is counters else "service"
            assert str(info.value).startswith(
                f"Counter.add on {what} 'counters' has no .remote() (Ray's spelling): call it "
                f"through an adverb: {first}"), info.value
            assert not hasattr(ep, "nope") and getattr(ep, "nope", 1) == 1
        for fut in (counters.add.call(k=1), counters.slice(procs=0).add.call_one(k=1),
                    counters.add.choose(k=1), service.add.choose(k=1)):
            held: Any = fut
            with pytest.raises(AttributeError, match=(
                    r"^the future of a meshio call has no \.get\(\) \(Monarch's blocking "
                    r"spelling\): it is an asyncio\.Future: `await` it for its value")):
                held.get()
            assert not hasattr(held, "nope")
            await fut


async def test_spawn_given_the_class_first_or_an_instance_says_what_goes_where() -> None:
    """``procs.spawn(Counter, 5)`` (Ray's order, the name forgotten) said
    "'5' is not a subclass of meshio.Actor", about the argument that was
    right; ``procs.spawn("c", Counter())`` said "<... object at 0x..> is not
    a subclass", with no hint to pass the class."""
    async with in_process_host().spawn_procs(per_host={"procs": 1}) as procs:
        bad: Any = procs
        with pytest.raises(TypeError, match=re.escape(
                "spawn: the name of the actor mesh comes first, then the class: "
                "spawn('name', Counter, ...) (got Counter where the name goes)")):
            await bad.spawn(Counter, 5)
        with pytest.raises(TypeError, match=re.escape(
                "spawn 'c': got an instance of Counter; pass the class itself, then its "
                "constructor's arguments: spawn('c', Counter, ...)")):
            await bad.spawn("c", Counter())
        assert (await (await procs.spawn("c", Counter)).add.call(k=1)).values() == [1]


def test_an_adverb_read_on_the_class_says_to_spawn_first() -> None:
    """``Counter.add.call(k=1)``, the endpoint read on the class: it was
    "'EndpointDescriptor' object has no attribute 'call'", with no hint."""
    desc: Any = Counter.add
    for adverb, use in (("call", "await mesh.add.call(...)"),
                        ("call_one", "await mesh.add.call_one(...)"),
                        ("choose", "await mesh.add.choose(...)"),
                        ("stream", "async for point, value in mesh.add.stream(...)"),
                        ("broadcast", "await mesh.add.broadcast(...)"),
                        ("route", "await meshio.Service(mesh).add.route(...)"),
                        ("remote", "await mesh.add.call(...)")):
        with pytest.raises(AttributeError) as info:
            getattr(desc, adverb)
        assert str(info.value) == (
            f"Counter.add is read on the class Counter, not on actors: spawn them, then "
            f"call it through the mesh spawn returns: mesh = await procs.spawn('name', "
            f"Counter, ...); {use}"), info.value
    assert not hasattr(desc, "nope") and getattr(desc, "call", None) is None


async def test_the_future_of_a_call_says_what_it_is_and_to_await_it() -> None:
    """A call made without ``await`` (in a notebook its future is the
    cell's value) showed ``<_Gathered pending>``, a private class and no
    hint."""
    async with in_process_host().spawn_procs(per_host={"procs": 2}) as procs:
        counters = await procs.spawn("counters", Counter)
        gathered = counters.add.call(k=1)
        assert repr(gathered) == ("<call of Counter.add on 'counters' (2 actors): pending; "
                                  "await it for its value>")
        one = counters.slice(procs=1).add.call_one(k=2)
        assert repr(one) == ("<call of Counter.add on 'counters' rank 1: pending; await it for "
                             "its value>")
        timed = counters.add.options(timeout=60).call(k=3)
        assert repr(timed) == ("<call of Counter.add on actor mesh 'counters': pending; await "
                               "it for its value>")
        await asyncio.gather(gathered, one, timed)
        assert repr(gathered) == ("<call of Counter.add on 'counters' (2 actors): done; await "
                                  "it for its value>")
        assert repr(one).endswith(": done; await it for its value>"), one
        failing = counters.slice(procs=0).add.call_one("x")  # type: ignore[arg-type]
        with pytest.raises(meshio.SchemaError):
            await failing
        assert repr(failing).endswith(": failed (SchemaError); await it for the error>"), failing
