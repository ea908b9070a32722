"""The two commonest ways to get an endpoint wrong, on an actor mesh and on
a service: a name that is not an endpoint (a typo, or a method without
``@endpoint``) raises :class:`meshio.UnknownEndpointError`, and an endpoint
called like a method raises a ``TypeError`` that names the adverbs.  Both
are decided on the controller: the in-process transport is enough."""

from __future__ import annotations

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
